"""The one retrieval path of `search`, `ask` and the query API: by meaning (embed the question, one
HNSW scan of the active space), by words (full-text rank), or both fused."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

import psycopg

from rag_pipeline.core.filters import SearchFilters
from rag_pipeline.embedders.base import Embedder, EmbeddingError
from rag_pipeline.settings import Settings
from rag_pipeline.store import search as search_store
from rag_pipeline.store import spaces, text_search
from rag_pipeline.store.search import Citation


log = logging.getLogger(__name__)

Mode = Literal["vector", "lexical", "hybrid"]
MODES: tuple[Mode, ...] = ("vector", "lexical", "hybrid")


class RetrievalError(RuntimeError):
    """Nothing can be retrieved as configured; the message says why."""


def retrieve(conn: psycopg.Connection, settings: Settings, question: str, k: int,
             per_page: int | None | Literal["default"] = "default", filters: SearchFilters = SearchFilters(),
             embedder_for: Callable[[spaces.Space], Embedder] | None = None,
             mode: Mode | None = None, space: spaces.Space | None = None) -> list[Citation]:
    """The ``k`` passages of live pages best for ``question`` by ``mode`` (None: SEARCH_MODE),
    best first, at most ``per_page`` of one page (None: no limit; "default": SEARCH_PER_PAGE), of
    pages that pass ``filters``.

    The question is embedded with the active space's own model, not the configured one: keys set
    for answers must not change it, and switching the index's model is `space build`/`activate`.
    The embedder is built only once the index is known to have a space, so an empty index says
    so without loading a model. ``embedder_for`` gives a space's embedder (a long-lived process
    keeps one per space instead of building it for every question). ``space``: another space than
    the active one (the gate of `space activate` asks the candidate as search would).
    """
    from rag_pipeline.embedders.factory import make_embedder_for_space

    mode = mode or settings.search_mode
    per_page = settings.search_per_page if per_page == "default" else per_page
    space = space or spaces.active(conn)
    if space is None:
        raise RetrievalError("the index is empty: no embedding space yet (deliver and index some pages first)")
    config = _text_config(conn, settings) if mode != "vector" else None
    if mode == "lexical":
        return search_store.lexical(conn, question, k, config=config, per_page=per_page, filters=filters)
    try:
        embedder = (embedder_for or (lambda s: make_embedder_for_space(settings, s)))(space)
        vector = embedder.embed([question]).vectors[0]
    except EmbeddingError as exc:
        raise RetrievalError(f"cannot embed the question: {exc}") from exc
    if mode == "vector":
        return search_store.nearest(conn, space, vector, k, ef_search=settings.search_ef_search,
                                    per_page=per_page, filters=filters)
    fusion = search_store.Fusion(settings.search_vector_weight, settings.search_lexical_weight, settings.search_rrf_k,
                                 settings.search_fusion)
    return search_store.hybrid(conn, space, vector, question, k, config=config, fusion=fusion,
                               ef_search=settings.search_ef_search, per_page=per_page, filters=filters)


def _text_config(conn: psycopg.Connection, settings: Settings) -> str:
    """The configuration the lexical index is built with: a question must be parsed with it."""
    config = text_search.config(conn)
    if config != settings.search_text_config:
        log.warning("SEARCH_TEXT_CONFIG=%s, but the lexical index is built with %s (used here): "
                    "`rag-pipeline db migrate` rebuilds it", settings.search_text_config, config)
    return config
