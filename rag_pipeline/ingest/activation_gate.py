"""The gate before a model switch: the candidate space and the active one answer every declared
question set (each site's questions.jsonl) as `search` would, and a candidate that answers worse
than the active space by more than SPACE_GATE_MARGIN on any set is refused, with the figures side
by side. `force` switches anyway; the switch is recorded as forced (space_activations)."""

from __future__ import annotations

from dataclasses import dataclass, field

import psycopg

from rag_pipeline.core.answer_quality import GateRow, Question, gate_lines, refused
from rag_pipeline.embedders.base import Embedder
from rag_pipeline.settings import Settings
from rag_pipeline.store import spaces


class GateRefused(RuntimeError):
    """The candidate answers worse; the message holds the figures, a line a question set."""


def label(space: spaces.Space) -> str:
    return f"space {space.space_id} ({space.model})"


@dataclass
class Gate:
    settings: Settings
    question_sets: dict[str, list[Question]]
    margin: float
    force: bool = False
    rows: list[GateRow] = field(default_factory=list)
    forced: bool = False            # refused, and switched anyway
    lines: list[str] = field(default_factory=list)

    def judge(self, conn: psycopg.Connection, active: spaces.Space, candidate: spaces.Space,
              candidate_embedder: Embedder) -> None:
        """Both spaces asked every set; GateRefused when the candidate loses more than the margin
        on one (unless forced)."""
        from rag_pipeline.embedders.factory import make_embedder_for_space
        from rag_pipeline.query.evaluation import answers, evaluate

        active_embedder = make_embedder_for_space(self.settings, active)
        for name, questions in sorted(self.question_sets.items()):
            truth = answers(conn, questions)
            self.rows.append(GateRow(name, evaluate(conn, self.settings, questions, truth, active, active_embedder),
                                     evaluate(conn, self.settings, questions, truth, candidate, candidate_embedder)))
        self.lines = gate_lines(self.rows, label(active), label(candidate), self.margin)
        down = refused(self.rows, self.margin)
        if down and not self.force:
            names = ", ".join(r.name for r in down)
            raise GateRefused(
                f"refused: {label(candidate)} answers worse than {label(active)} on {names} "
                f"(recall@{self.rows[0].active.k} down more than SPACE_GATE_MARGIN {self.margin}); nothing "
                "changed. --force switches anyway (recorded).\n" + "\n".join(self.lines))
        self.forced = bool(down)

    def figures(self) -> list[dict]:
        return [{"set": r.name, "questions": r.active.asked,
                 "active_recall": round(r.active.recall, 4), "candidate_recall": round(r.candidate.recall, 4),
                 "active_mrr": round(r.active.mrr, 4), "candidate_mrr": round(r.candidate.mrr, 4)}
                for r in self.rows]


def declared_question_sets() -> dict[str, list[Question]]:
    """Every loaded site's questions (a file that cannot be used: QuestionsError)."""
    from rag_pipeline.components.site_files import declarations, question_sets

    return question_sets(declarations())
