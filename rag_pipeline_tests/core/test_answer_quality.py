"""Labelled questions: a bad file is refused naming its line; scores count what a user reads."""

from __future__ import annotations

import json

import pytest

from rag_pipeline.core.answer_quality import (
    GateRow, Question, QuestionsError, answering_keys, gate_lines, parse_questions, refused, regressed, score,
)

BASE = "https://docs.example.com"


def lines(*items) -> str:
    return "\n".join(i if isinstance(i, str) else json.dumps(i) for i in items)


def test_a_file_of_questions_is_read_with_paths_on_the_site_and_markers_made_plain():
    text = lines("# comment", "", {"question": "Rotate the token?", "url": "/ops/", "marker": "Set a `new` **token**"},
                 {"question": "Cost?", "url": "https://Docs.Example.com/pricing", "kind": "fact"})
    first, second = parse_questions(text, "q.jsonl", BASE)
    assert first == Question("Rotate the token?", "https://docs.example.com/ops", "Set a new token", "question", 3)
    assert (second.url, second.marker, second.kind, second.line) == ("https://docs.example.com/pricing", None, "fact", 4)


@pytest.mark.parametrize("line, base, reason", [
    ("{not json", BASE, "q.jsonl:2: not JSON"),
    ('["a list"]', BASE, "q.jsonl:2: expected an object"),
    ('{"question": "q", "url": "/a", "answer": "x"}', BASE, "q.jsonl:2: unknown key 'answer'"),
    ('{"question": "", "url": "/a"}', BASE, "q.jsonl:2: question: expected a non-empty string"),
    ('{"question": "q"}', BASE, "q.jsonl:2: url: expected a non-empty string"),
    ('{"question": "q", "url": "/a", "marker": 3}', BASE, "q.jsonl:2: marker: expected a non-empty string"),
    ('{"question": "q", "url": "/a"}', None, "q.jsonl:2: url: '/a' is a path, and the site has no sitemap"),
    ('{"question": "q", "url": "ftp://x/a"}', BASE, "q.jsonl:2: url: only http and https URLs can be indexed, got 'ftp://x/a'"),
])
def test_a_bad_line_is_refused_with_its_number(line, base, reason):
    good = json.dumps({"question": "fine", "url": f"{BASE}/fine"})
    with pytest.raises(QuestionsError) as caught:
        parse_questions(f"{good}\n{line}\n", "q.jsonl", base)
    assert str(caught.value).startswith(reason)
    assert "\n" not in str(caught.value)


def test_an_empty_file_is_refused():
    with pytest.raises(QuestionsError, match="q.jsonl: no questions"):
        parse_questions("# nothing yet\n", "q.jsonl", BASE)


def test_scores_count_ranks_within_k_and_leave_stale_questions_apart():
    qs = [Question("a", f"{BASE}/a", "alpha", "k1"), Question("b", f"{BASE}/b", "beta", "k1"),
          Question("c", f"{BASE}/c", None, "k2"), Question("d", f"{BASE}/d", "gone", "k2")]
    passages = {f"{BASE}/a": [(0, "intro"), (1, "the **alpha** part")], f"{BASE}/b": [(0, "beta")],
                f"{BASE}/c": [(0, "x"), (1, "y")], f"{BASE}/d": [(0, "nothing here")]}
    truth = answering_keys(qs, passages)
    assert truth == [{f"{BASE}/a#1"}, {f"{BASE}/b#0"}, {f"{BASE}/c#0", f"{BASE}/c#1"}, set()]
    ranked = [[f"{BASE}/a#0", f"{BASE}/a#1"],          # rank 2 (the page's other passage first)
              [f"{BASE}/x#0"] * 3 + [f"{BASE}/b#0"],   # rank 4: past k=3
              [f"{BASE}/c#1"],                         # rank 1
              []]
    result = score(qs, truth, ranked, k=3)
    assert (result.asked, result.answered) == (3, 2)
    assert result.recall == pytest.approx(2 / 3) and result.mrr == pytest.approx((1 / 2 + 1) / 3)
    assert [q.question for q in result.stale] == ["d"]
    assert [f.question for f in result.failures] == ["b"]
    assert result.by_kind() == {"k1": 0.5, "k2": 1.0}
    assert result.summary() == "recall@3 0.667, MRR 0.500 (3 questions, 1 stale)"


def evaluation(recall_answered: int, asked: int = 10):
    qs = [Question(str(i), f"{BASE}/{i}", None) for i in range(asked)]
    truth = [{f"{BASE}/{i}#0"} for i in range(asked)]
    ranked = [[f"{BASE}/{i}#0"] if i < recall_answered else [] for i in range(asked)]
    return score(qs, truth, ranked, k=10)


def test_the_gate_refuses_a_drop_past_the_margin_on_any_set_and_shows_both():
    rows = [GateRow("docs", evaluation(9), evaluation(9)), GateRow("blog", evaluation(9), evaluation(6))]
    assert [r.name for r in refused(rows, 0.02)] == ["blog"]
    assert refused(rows, 0.30) == []                        # a drop of 0.3 is within a margin of 0.3
    shown = gate_lines(rows, "space 1 (a)", "space 2 (b)", 0.02)
    assert shown[0] == "recall@10 and MRR, space 1 (a) (active) → space 2 (b) (candidate):"
    assert shown[1] == "  docs: 10 questions, recall@10 0.900 → 0.900, MRR 0.900 → 0.900"
    assert shown[2].startswith("  blog: 10 questions, recall@10 0.900 → 0.600") and "more than the margin 0.020" in shown[2]
    assert gate_lines([], "a", "b", 0.02) == [
        "no question set declared (questions.jsonl beside a site's defs.yaml): nothing to compare"]


def test_a_regression_is_a_fall_below_the_recent_best_past_the_margin():
    assert not regressed(0.5, [], 0.05)                     # nothing to compare with yet
    assert not regressed(0.86, [0.9, 0.7], 0.05)
    assert regressed(0.84, [0.9, 0.7], 0.05)
