"""A realistic, varied, deterministic corpus of markdown documentation pages, and its recrawls.

Shared by the recrawl benchmark and the chunking tests: headings at several levels, paragraphs,
lists, code blocks and tables, from 500 to 20,000 tokens a page.
"""

from __future__ import annotations

import random

from rag_pipeline.core.tokens import count_tokens


class PageGenerator:
    """Realistic documentation pages, deterministic per seed, as a list of blocks."""

    _FUNCTION_WORDS = (
        "the a an of to in for on with by from and or but is are was be can will should may "
        "this that these it its we you they when then if not all each more most"
    ).split()

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        syllables = "ka lo mi ne tu ra si po de fa gu ber con dex ion ter val sync node ver".split()
        self.words = sorted(
            {"".join(self.rng.choice(syllables) for _ in range(self.rng.randint(1, 4))) for _ in range(3000)}
        )

    def word(self) -> str:
        if self.rng.random() < 0.35:
            return self.rng.choice(self._FUNCTION_WORDS)
        return self.rng.choice(self.words)

    def sentence(self) -> str:
        words = [self.word() for _ in range(self.rng.randint(6, 22))]
        if self.rng.random() < 0.15:
            words.insert(self.rng.randrange(len(words)), f"`{self.rng.choice(self.words)}()`")
        if self.rng.random() < 0.1:
            target = self.rng.choice(self.words)
            words.insert(self.rng.randrange(len(words)), f"[{target}](https://example.com/{target})")
        words[0] = words[0].capitalize()
        return " ".join(words) + self.rng.choice(".....?!")

    def paragraph(self, low: int = 1, high: int = 7) -> str:
        return " ".join(self.sentence() for _ in range(self.rng.randint(low, high)))

    def bullet_list(self) -> str:
        ordered = self.rng.random() < 0.3
        return "\n".join(
            f"{f'{i + 1}.' if ordered else '-'} {self.sentence()}" for i in range(self.rng.randint(3, 8))
        )

    def code_block(self) -> str:
        lines = []
        for _ in range(self.rng.randint(4, 25)):
            indent = "    " * self.rng.randint(0, 2)
            name, other = self.rng.choice(self.words), self.rng.choice(self.words)
            lines.append(f"{indent}{name} = {other}({self.rng.randint(0, 999)}, '{self.word()}')")
        return "```python\n" + "\n".join(lines) + "\n```"

    def table(self) -> str:
        cols = self.rng.randint(2, 4)
        rows = ["| " + " | ".join(self.word().title() for _ in range(cols)) + " |", "|" + "---|" * cols]
        for _ in range(self.rng.randint(2, 8)):
            cells = (" ".join(self.word() for _ in range(self.rng.randint(1, 4))) for _ in range(cols))
            rows.append("| " + " | ".join(cells) + " |")
        return "\n".join(rows)

    def body_block(self) -> str:
        r = self.rng.random()
        if r < 0.6:
            return self.paragraph()
        if r < 0.78:
            return self.bullet_list()
        if r < 0.93:
            return self.code_block()
        return self.table()

    def title(self) -> str:
        return " ".join(self.rng.choice(self.words).capitalize() for _ in range(self.rng.randint(1, 4)))

    def page(self, target_tokens: int = 10_000) -> list[str]:
        blocks = [f"# {self.title()}", self.paragraph(2, 6), self.paragraph(2, 6)]
        tokens = count_tokens("\n\n".join(blocks))
        long_sections_left = 2
        while tokens < target_tokens:
            section = [f"## {self.title()}"]
            if long_sections_left and self.rng.random() < 0.3:
                # Long stretches without subheadings: there, only the packing decides.
                long_sections_left -= 1
                section += [self.body_block() for _ in range(self.rng.randint(12, 22))]
            else:
                section += [self.body_block() for _ in range(self.rng.randint(1, 6))]
                for _ in range(self.rng.randint(0, 3)):
                    section.append(f"{'###' if self.rng.random() < 0.8 else '####'} {self.title()}")
                    section += [self.body_block() for _ in range(self.rng.randint(1, 6))]
            blocks += section
            tokens += count_tokens("\n\n".join(section)) + 1
        return blocks


def render(blocks: list[str]) -> str:
    return "\n\n".join(blocks) + "\n"
