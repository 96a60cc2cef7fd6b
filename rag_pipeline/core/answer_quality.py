"""Answer quality on labelled questions: a site's `questions.jsonl`, read and scored.

A question is answered at rank r when the r-th passage search returns is of the question's page
and holds its marker (or, with no marker, is of its page at all). recall@k counts the questions
answered within k, MRR the mean of 1/r (0 past k). A question whose page holds no passage with
its marker is *stale*: the label no longer matches the site, and it is reported apart instead of
being counted as a search failure.

The same rules serve the site's `answer_quality` asset, its check, the gate of `space activate`
and bench/search_modes.py, so the figures of all four mean the same thing.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass, field

from rag_pipeline.core.one_line import shorten
from rag_pipeline.core.urls import normalize_url

#: Questions a set may hold: each is one search, and the gate asks every set twice.
MAX_QUESTIONS = 2_000
_KEYS = {"question", "url", "marker", "kind"}
_NOISE = re.compile(r"[`*\\]")


class QuestionsError(ValueError):
    """A questions file that cannot be used, in one line: `file:line: reason`."""


@dataclass(frozen=True)
class Question:
    question: str
    url: str                    # the answering page's key (normalized)
    marker: str | None = None   # held by every passage that answers it; None: any passage of the page
    kind: str = "question"
    line: int = 0


def plain(text: str) -> str:
    """Markup that a heading or a list item may carry (``code``, **bold**, \\s) left out, spaces
    made one: a marker is matched in what a reader sees."""
    return " ".join(_NOISE.sub("", text).split())


def parse_questions(text: str, source: str, base: str | None = None) -> list[Question]:
    """A JSON Lines file of {"question", "url", "marker"?, "kind"?}, blank lines and `#` lines
    skipped. A url that starts with `/` is a path on ``base`` (the site's own origin: the same
    file serves a staging and a production host). Anything else is a QuestionsError naming the
    line: a typo must not be scored as a question search fails."""
    out: list[Question] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue

        def bad(reason: str) -> QuestionsError:
            return QuestionsError(f"{source}:{number}: {reason}")

        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise bad(f"not JSON ({exc.msg})") from None
        if not isinstance(item, dict):
            raise bad('expected an object: {"question": …, "url": …, "marker": …}')
        unknown = sorted(set(item) - _KEYS)
        if unknown:
            raise bad(f"unknown key {unknown[0]!r} (a question has question, url, marker, kind)")
        for key in ("question", "url"):
            if not isinstance(item.get(key), str) or not item[key].strip():
                raise bad(f"{key}: expected a non-empty string")
        for key in ("marker", "kind"):
            if key in item and item[key] is not None and (not isinstance(item[key], str) or not item[key].strip()):
                raise bad(f"{key}: expected a non-empty string (or leave it out)")
        given = item["url"].strip()
        if given.startswith("/") and not given.startswith("//"):
            if base is None:
                raise bad(f"url: {given!r} is a path, and the site has no sitemap or seed to take its host from")
            given = base.rstrip("/") + given
        try:
            url = normalize_url(given)
        except ValueError as exc:
            raise bad(f"url: {exc}") from None
        out.append(Question(item["question"].strip(), url, plain(item["marker"]) if item.get("marker") else None,
                            item.get("kind") or "question", number))
        if len(out) > MAX_QUESTIONS:
            raise bad(f"more than {MAX_QUESTIONS:,} questions: split them over sites, or sample them")
    if not out:
        raise QuestionsError(f"{source}: no questions (one JSON object a line)")
    return out


def answering_keys(questions: list[Question], passages: dict[str, list[tuple[int, str]]]) -> list[set[str]]:
    """For each question, the keys (`page#chunk`) of its page's passages that answer it, from
    ``passages``: page key → (chunk index, embedded text). Empty: the question is stale."""
    out = []
    for q in questions:
        held = passages.get(q.url, [])
        out.append({f"{q.url}#{index}" for index, text in held if q.marker is None or q.marker in plain(text)})
    return out


@dataclass(frozen=True)
class Failure:
    """A question no passage within k answered."""

    question: str
    url: str
    kind: str


@dataclass
class Evaluation:
    """The figures of one question set against one space."""

    k: int
    asked: int = 0              # questions scored (stale ones left out)
    answered: int = 0           # within k
    reciprocal: float = 0.0     # sum of 1/rank within k
    stale: list[Question] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    kinds: dict[str, list[int]] = field(default_factory=lambda: defaultdict(lambda: [0, 0]))  # kind → [asked, answered]

    @property
    def recall(self) -> float:
        return self.answered / self.asked if self.asked else 0.0

    @property
    def mrr(self) -> float:
        return self.reciprocal / self.asked if self.asked else 0.0

    def by_kind(self) -> dict[str, float]:
        return {kind: answered / asked for kind, (asked, answered) in sorted(self.kinds.items()) if asked}

    def summary(self) -> str:
        stale = f", {len(self.stale)} stale" if self.stale else ""
        return f"recall@{self.k} {self.recall:.3f}, MRR {self.mrr:.3f} ({self.asked} questions{stale})"


def score(questions: list[Question], truth: list[set[str]], ranked: list[list[str]], k: int) -> Evaluation:
    """The evaluation of ``ranked`` (each question's returned passage keys, best first) against
    ``truth`` (answering_keys)."""
    result = Evaluation(k)
    for q, answers, keys in zip(questions, truth, ranked, strict=True):
        if not answers:
            result.stale.append(q)
            continue
        rank = next((i for i, key in enumerate(keys[:k], 1) if key in answers), None)
        result.asked += 1
        result.kinds[q.kind][0] += 1
        if rank is None:
            result.failures.append(Failure(q.question, q.url, q.kind))
            continue
        result.answered += 1
        result.kinds[q.kind][1] += 1
        result.reciprocal += 1 / rank
    return result


@dataclass(frozen=True)
class GateRow:
    name: str                   # the question set (its site)
    active: Evaluation
    candidate: Evaluation

    @property
    def drop(self) -> float:
        return self.active.recall - self.candidate.recall


def refused(rows: list[GateRow], margin: float) -> list[GateRow]:
    """The sets on which the candidate's recall is lower than the active space's by more than
    ``margin`` (a rounding hair is not a drop)."""
    return [r for r in rows if r.drop > margin + 1e-9]


def gate_lines(rows: list[GateRow], active_label: str, candidate_label: str, margin: float) -> list[str]:
    """The two spaces' figures side by side, a line a question set, each drop past the margin marked."""
    if not rows:
        return ["no question set declared (questions.jsonl beside a site's defs.yaml): nothing to compare"]
    k = rows[0].active.k
    lines = [f"recall@{k} and MRR, {active_label} (active) → {candidate_label} (candidate):"]
    down = refused(rows, margin)
    for r in rows:
        mark = f"  down {r.drop:.3f}, more than the margin {margin:.3f}" if r in down else ""
        lines.append(f"  {shorten(r.name, 24)}: {r.active.asked} questions, recall@{k} {r.active.recall:.3f} → "
                     f"{r.candidate.recall:.3f}, MRR {r.active.mrr:.3f} → {r.candidate.mrr:.3f}{mark}")
    return lines


def recent_best(history: list[float]) -> float | None:
    return max(history) if history else None


def regressed(recall: float, history: list[float], margin: float) -> bool:
    """True when ``recall`` is lower than the best of ``history`` by more than ``margin``."""
    best = recent_best(history)
    return best is not None and best - recall > margin + 1e-9
