"""Resources shared by every definition: the Postgres database and the embedder."""


import threading
from contextlib import contextmanager
from typing import Iterator

import dagster as dg
import psycopg

from rag_pipeline.embedders.base import Embedder
from rag_pipeline.settings import Settings, get_settings
from rag_pipeline.store import db
from rag_pipeline.store.spaces import Space

_embedders: dict[tuple, Embedder] = {}
_embedders_lock = threading.Lock()


class PostgresResource(dg.ConfigurableResource):
    """The index database. Unset URL: DATABASE_URL, else the embedded server under RAG_HOME."""

    database_url: str | None = None

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        # Checked once per run or evaluation, never migrated here: `rag-pipeline db migrate` is the
        # deploy step, and a code location running against an older schema must say so at once.
        db.require_current(self.url())

    def url(self) -> str:
        return self.database_url or db.server_url(get_settings())

    @contextmanager
    def connect(self) -> Iterator[psycopg.Connection]:
        with db.connection(self.url()) as conn:
            yield conn


class EmbedderResource(dg.ConfigurableResource):
    """The embedding model. Unset fields fall back to the environment (see README).

    The configured model makes the first space of an empty index (and is what `space build` /
    `space activate` switch to); once a space is active, pages are embedded with its model
    (`for_space`), whatever provider or key is configured.
    """

    provider: str | None = None
    model: str | None = None
    dimensions: int | None = None
    base_url: str | None = None

    def settings(self) -> Settings:
        base = get_settings()
        overrides = {
            "embedding_provider": self.provider,
            "embedding_model": self.model,
            "embedding_dimensions": self.dimensions,
            "openai_base_url": self.base_url,
        }
        return base.model_copy(update={k: v for k, v in overrides.items() if v is not None})

    def get(self) -> Embedder:
        from rag_pipeline.embedders.factory import make_embedder

        settings = self.settings()
        key = (settings.resolved_embedding_provider(), settings.embedding_model,
               settings.embedding_dimensions, settings.openai_base_url)
        with _embedders_lock:
            if key not in _embedders:
                _embedders[key] = make_embedder(settings)
            return _embedders[key]

    def for_space(self, active: Space | None) -> Embedder:
        """The embedder of the active space (the configured one while the index has none)."""
        from rag_pipeline.embedders.factory import make_indexing_embedder

        if active is None:
            return self.get()
        settings = self.settings()
        key = ("space", active.model, active.dimensions, settings.openai_base_url, settings.openai_api_key,
               settings.embedding_timeout_s, settings.embedding_max_retries)
        with _embedders_lock:
            if key not in _embedders:
                _embedders[key] = make_indexing_embedder(settings, active)
            return _embedders[key]

    def chunk_budget(self, active: Space | None) -> tuple[int, int]:
        """(max, overlap) tokens of a chunk, sized to the model pages are embedded with."""
        from rag_pipeline.embedders.factory import indexing_chunk_budget

        return indexing_chunk_budget(self.settings(), active)

    def note(self, active: Space | None) -> str | None:
        """A line for the run when the configured model is not the active space's (not an error)."""
        from rag_pipeline.embedders.factory import configured_differs

        return configured_differs(self.settings(), active)


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(
        resources={"postgres": PostgresResource(), "embedder": EmbedderResource()},
        # One process per run: a page run costs ~2.5 s in process against ~8 s multiprocess.
        executor=dg.in_process_executor,
    )
