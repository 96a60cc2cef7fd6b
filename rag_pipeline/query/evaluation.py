"""A labelled question set asked through the one retrieval path, as `search` asks with its
defaults (SEARCH_MODE, SEARCH_PER_PAGE), and scored by core/answer_quality.py."""

from __future__ import annotations

import psycopg

from rag_pipeline.core.answer_quality import Evaluation, Question, answering_keys, score
from rag_pipeline.embedders.base import Embedder
from rag_pipeline.query.retrieval import retrieve
from rag_pipeline.settings import Settings
from rag_pipeline.store import evaluations as store
from rag_pipeline.store import spaces

#: recall@K and MRR@K: the ten results a user reads.
K = 10


def answers(conn: psycopg.Connection, questions: list[Question]) -> list[set[str]]:
    """Each question's answering passages, read once a set (the same whatever space is asked)."""
    return answering_keys(questions, store.passages_of(conn, [q.url for q in questions]))


def evaluate(conn: psycopg.Connection, settings: Settings, questions: list[Question], truth: list[set[str]],
             space: spaces.Space, embedder: Embedder, k: int = K) -> Evaluation:
    """``questions`` asked of ``space``, its questions embedded by ``embedder``. A stale question
    (``truth`` empty: its page holds no passage with its marker) is not asked."""
    ranked = [[c.key for c in retrieve(conn, settings, q.question, k, space=space, embedder_for=lambda _s: embedder)]
              if held else [] for q, held in zip(questions, truth, strict=True)]
    return score(questions, truth, ranked, k)
