"""A labelled question set asked through the one retrieval path, as `search` asks with its
defaults (SEARCH_MODE, SEARCH_PER_PAGE), and scored by core/answer_quality.py."""

from __future__ import annotations

from collections.abc import Callable

import psycopg

from rag_pipeline.core.answer_quality import Evaluation, Question, answering_keys, score
from rag_pipeline.embedders.base import Embedder
from rag_pipeline.query.retrieval import retrieve
from rag_pipeline.settings import Settings
from rag_pipeline.store import evaluations as store
from rag_pipeline.store import spaces

#: recall@K and MRR@K: the ten results a user reads.
K = 10


def evaluate(conn: psycopg.Connection, settings: Settings, questions: list[Question], *,
             space: spaces.Space | None = None, k: int = K,
             embedder_for: Callable[[spaces.Space], Embedder] | None = None) -> Evaluation:
    """``questions`` asked of ``space`` (None: the active one). A stale question (its page holds
    no passage with its marker) is not asked."""
    if embedder_for is None:
        from rag_pipeline.embedders.factory import make_embedder_for_space

        built: dict[int, Embedder] = {}

        def embedder_for(s: spaces.Space) -> Embedder:   # one model load for the whole set
            if s.space_id not in built:
                built[s.space_id] = make_embedder_for_space(settings, s)
            return built[s.space_id]

    truth = answering_keys(questions, store.passages_of(conn, [q.url for q in questions]))
    ranked = [[c.key for c in retrieve(conn, settings, q.question, k, space=space, embedder_for=embedder_for)]
              if answers else [] for q, answers in zip(questions, truth, strict=True)]
    return score(questions, truth, ranked, k)
