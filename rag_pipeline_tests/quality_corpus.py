"""A small labelled site for answer-quality tests: topic pages, filler pages that crowd the top
ten, and questions in two wordings: the pages' own words (any search finds them) and other words
(only a model that reads meaning does)."""

from __future__ import annotations

import json
from pathlib import Path

BASE = "https://docs.example.com"

TOPICS = {
    "otters": ("Sea otters", "Sea otters hold hands while they sleep so that they do not drift apart on the water."),
    "bees": ("Honey bees", "A honey bee tells its hive where flowers are by dancing in a figure of eight."),
    "tides": ("Tides", "The pull of the moon on the oceans raises the water twice a day along the coast."),
    "volcanoes": ("Volcanoes", "Molten rock rises through cracks in the crust and erupts as lava and ash."),
    "bread": ("Baking bread", "Yeast eats sugar in the dough and releases gas, which makes the loaf rise in the oven."),
    "rust": ("Rust", "Iron left in wet air slowly turns into a flaky red oxide that weakens the metal."),
    "owls": ("Owls", "An owl turns its head almost all the way round because its eyes cannot move in their sockets."),
    "glaciers": ("Glaciers", "Packed snow becomes ice that creeps downhill and carves deep valleys over centuries."),
}

# (topic, words of the page, other words)
QUESTIONS = [
    ("otters", "Why do sea otters hold hands while they sleep?",
     "Which marine mammals link paws during rest to stay together?"),
    ("bees", "How does a honey bee tell its hive where flowers are?",
     "How do insects that make nectar syrup communicate locations to their colony?"),
    ("tides", "What raises the water of the oceans twice a day?",
     "Why does the sea level at the shore go up and down daily?"),
    ("volcanoes", "How does molten rock erupt as lava?",
     "What makes a mountain spew fire and smoke?"),
    ("bread", "Why does the loaf rise in the oven?",
     "What makes a baked dough puff up?"),
    ("rust", "Why does iron in wet air turn red and flaky?",
     "What corrodes steel tools left out in the rain?"),
    ("owls", "Why does an owl turn its head almost all the way round?",
     "How can night birds of prey look behind themselves?"),
    ("glaciers", "How does packed snow carve valleys?",
     "How do huge frozen rivers shape mountain landscapes?"),
]

FILLER_WORDS = ["release", "version", "module", "config", "parser", "cache", "router", "queue", "schema", "client"]


def url(topic: str) -> str:
    return f"{BASE}/{topic}"


def pages() -> dict[str, str]:
    """Topic pages, and 32 filler pages of release notes."""
    out = {url(t): f"# {title}\n\n{text}\n" for t, (title, text) in TOPICS.items()}
    for n in range(32):
        a, b = FILLER_WORDS[n % 10], FILLER_WORDS[(n * 3 + 1) % 10]
        out[f"{BASE}/notes/{n}"] = (f"# Release notes {n}\n\nVersion {n}.0 changes the {a} and the {b}. "
                                    f"The {a} now reads its {b} lazily; upgrade notes follow in section {n}.\n")
    return out


def questions_jsonl(other_words: bool) -> str:
    """The questions file: each question's page by path, its marker the topic sentence's start."""
    lines = []
    for topic, own, other in QUESTIONS:
        marker = " ".join(TOPICS[topic][1].split()[:4])
        lines.append(json.dumps({"question": other if other_words else own, "url": f"/{topic}",
                                 "marker": marker, "kind": "other words" if other_words else "own words"}))
    return "\n".join(lines) + "\n"


def declare(folder: Path, *, other_words: bool) -> Path:
    """A SITES_DIR with the site `docs` (seeded at BASE) and its questions file."""
    folder.mkdir(exist_ok=True)
    (folder / "docs.yaml").write_text(f"attributes:\n  seeds: [\"{BASE}/\"]\n  discover_every: 1d\n")
    path = folder / "docs.questions.jsonl"
    path.write_text(questions_jsonl(other_words))
    return path
