"""How much text the chunker tokenizes: a count is added up from its parts wherever cl100k cuts
too, so a page is tokenized about once and a half; real documentation (reST turned markdown:
indented code, lists, directive bodies) must not fall back to counting each chunk again."""

from __future__ import annotations

import random

import pytest

from rag_pipeline.core import embed_text, text_pieces, tokens
from rag_pipeline.core.chunking import chunk_markdown
from rag_pipeline.core.tokens import count_tokens, joins_cleanly


def test_a_line_end_before_an_indented_line_is_a_clean_cut() -> None:
    assert joins_cleanly("a\n    b", 2) and joins_cleanly("a\n\n\tb", 3)
    # Not before the run's last line end, nor before indentation that ends the text or a line.
    assert not joins_cleanly("a\n  \n  b", 2) and not joins_cleanly("a\n   ", 2)
    assert not joins_cleanly("a\n  \nb", 2) and not joins_cleanly("a\n \x85b", 2)


def test_counts_add_up_across_cuts_before_indented_lines() -> None:
    pieces = ["\n", "\n", " ", "  ", "    ", "\t", "word", "x", "1", "23", ".", "-", "'s", "é", "\u00a0", "\u3000",
              "中", "\r", "\x0b", "\x1c", "(", "`", "*", "e\u0301", "🙂", "\u2028", "\x85", "::"]
    rng = random.Random(11)
    checked = 0
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(2, 16)))
        for i in range(1, len(text)):
            if joins_cleanly(text, i):
                checked += 1
                assert count_tokens(text) == count_tokens(text[:i]) + count_tokens(text[i:]), (text, i)
    assert checked > 2_000


def _rest_page(rng: random.Random) -> str:
    words = "the salt master minion state file pillar grains returns module config runs on each of".split()

    def sentence() -> str:
        return " ".join(rng.choice(words) for _ in range(rng.randint(6, 16))).capitalize() + "."

    parts = []
    for s in range(12):
        parts.append(f"## Section {s}\n")
        for _ in range(rng.randint(2, 5)):
            kind = rng.random()
            if kind < 0.3:
                parts.append("Example::\n\n" + "\n".join(f"    {rng.choice(words)}: {rng.randint(0, 99)}"
                                                         for _ in range(rng.randint(3, 12))) + "\n")
            elif kind < 0.5:
                parts.append(".. code-block:: yaml\n\n" + "\n".join(f"    - {sentence()}" for _ in range(6)) + "\n")
            elif kind < 0.7:
                parts.append("\n".join(f"- {sentence()}\n  {sentence()}" for _ in range(4)) + "\n")
            else:
                parts.append(" ".join(sentence() for _ in range(rng.randint(3, 9))) + "\n")
    return "\n".join(parts)


def _record_tokenized(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every text the chunker tokenizes from now on, in order (the encoding wrapped where the
    chunker, the token counts and the breadcrumbs look it up)."""
    encoding = tokens.encoding()
    seen: list[str] = []

    class Recording:
        def encode_ordinary(self, text: str) -> list[int]:
            seen.append(text)
            return encoding.encode_ordinary(text)

        def __getattr__(self, name: str):
            return getattr(encoding, name)

    recording = Recording()
    for module in (tokens, text_pieces, embed_text):
        monkeypatch.setattr(module, "encoding", lambda: recording)
    return seen


def test_an_indented_page_is_tokenized_about_once_and_a_half(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _record_tokenized(monkeypatch)
    pages = [_rest_page(random.Random(seed)) for seed in range(8)]
    for page in pages:
        assert "".join(c.content for c in chunk_markdown(page, 512, 64)) == page
    assert sum(map(len, seen)) <= 2.0 * sum(map(len, pages)), sum(map(len, seen)) / sum(map(len, pages))


def test_an_oversized_block_is_not_counted_again_before_it_is_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    # A release note's list: one block of ~6,000 tokens, cut at its lines.
    seen = _record_tokenized(monkeypatch)
    rng = random.Random(3)
    words = "fix the salt master minion state file pillar grains returns module config".split()
    page = "# Changelog\n\n" + "\n".join(f"- **PR** `#{rng.randint(1000, 60000)}`: ({rng.choice(words)}) "
                                         + " ".join(rng.choice(words) for _ in range(12)) for _ in range(300)) + "\n"
    chunks = chunk_markdown(page, 512, 64)
    assert len(chunks) > 10 and "".join(c.content for c in chunks) == page
    assert sum(map(len, seen)) <= 3.0 * len(page), sum(map(len, seen)) / len(page)


def test_a_breadcrumb_the_chunks_of_a_section_share_is_counted_once_a_page(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _record_tokenized(monkeypatch)
    rng = random.Random(4)
    words = "state file pillar grains returns module config master minion".split()
    body = "\n\n".join(" ".join(rng.choice(words) for _ in range(60)) + "." for _ in range(40))
    chunks = chunk_markdown(f"# Salt states\n\n## The top file\n\n{body}\n", 128, 16)
    crumb = "Salt states > The top file\n\n"
    assert sum(c.embed_text.startswith(crumb) for c in chunks) > 5
    assert seen.count(crumb) <= 2   # made (its count checked against the cap), then counted
