"""Every resource of the code location: the settings, the database, the embedder, the crawler.

Each resource owns its configuration: its fields (secrets and endpoints as `dg.EnvVar`, so the
UI shows where a value comes from, never the value) over the environment's settings
(docs/configuration.md), read when a run or a sensor evaluation starts. A changed variable takes effect
at the next run or tick without restarting the code location, and a bad value fails that run or
tick with its one-line message instead of the code location. Each resource also owns its clients:
made on first use within the run or evaluation and closed at its end. The CLI builds the same
clients from the same settings, through the same factories.
"""

import os
import threading
from contextlib import contextmanager
from typing import Any, ClassVar, Iterator, Optional

import dagster as dg
import psycopg
from pydantic import PrivateAttr

from rag_pipeline.core.chunk_budget import ChunkBudget
from rag_pipeline.crawl.base import Crawler
from rag_pipeline.embedders.base import Embedder
from rag_pipeline.settings import Settings, load_settings
from rag_pipeline.store import db, schema
from rag_pipeline.store.spaces import Space


class _Configured(dg.ConfigurableResource):
    """A resource whose set fields win over the environment's settings of the same variables."""

    # field name → the environment variable it stands for (docs/configuration.md)
    VARIABLES: ClassVar[dict[str, str]] = {}

    _settings: Optional[Settings] = PrivateAttr(default=None)

    def variables_set(self) -> dict[str, Any]:
        values = {}
        for field, var in self.VARIABLES.items():
            value = getattr(self, field)
            if isinstance(value, dg.EnvVar):   # used outside a run (inside one, Dagster resolved it)
                value = value.get_value()
            if value is not None:
                values[var] = value
        return values

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self._settings = load_settings(self.variables_set())

    def settings(self) -> Settings:
        if self._settings is None:   # used outside a run or an evaluation: a script, a test
            self._settings = load_settings(self.variables_set())
        return self._settings


class SettingsResource(_Configured):
    """The pipeline's knobs (batch sizes, retries, checks, retention, cadence: docs/configuration.md).

    ``overrides`` (variable name → value) win over the environment; a deployment sets them here
    when it wants a value fixed in code rather than in the environment.
    """

    overrides: dict[str, str] = {}

    def variables_set(self) -> dict[str, Any]:
        return dict(self.overrides)

    def get(self) -> Settings:
        return self.settings()


class PostgresResource(_Configured):
    """The index database: DATABASE_URL, else the embedded server under RAG_HOME."""

    VARIABLES: ClassVar[dict[str, str]] = {"database_url": "DATABASE_URL"}

    database_url: Optional[str] = None

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        super().setup_for_execution(context)
        # Checked once per run or evaluation, never migrated here: `rag-pipeline db migrate` is the
        # deploy step, and a code location running against an older schema must say so at once.
        schema.require_current(self.url())

    def url(self) -> str:
        return db.server_url(self.settings())

    @contextmanager
    def connect(self) -> Iterator[psycopg.Connection]:
        with db.connection(self.url()) as conn:
            yield conn


class _OwnsClients(_Configured):
    """Clients made once per run or evaluation (per key), closed when it ends."""

    _clients: dict = PrivateAttr(default_factory=dict)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)

    def _client(self, key: tuple, make):
        with self._lock:
            if key not in self._clients:
                self._clients[key] = make()
            return self._clients[key]

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            close = getattr(client, "close", None)
            if close is not None:
                close()


class EmbedderResource(_OwnsClients):
    """The embedding model. Unset fields fall back to the environment (see docs/configuration.md).

    The configured model makes the first space of an empty index (and is what `space build` /
    `space activate` switch to); once a space is active, pages are embedded with its model
    (`for_space`), whatever provider or key is configured.
    """

    VARIABLES: ClassVar[dict[str, str]] = {
        "provider": "EMBEDDING_PROVIDER", "model": "EMBEDDING_MODEL", "dimensions": "EMBEDDING_DIMENSIONS",
        "base_url": "OPENAI_BASE_URL", "api_key": "OPENAI_API_KEY",
    }

    provider: Optional[str] = None
    model: Optional[str] = None
    dimensions: Optional[int] = None
    base_url: Optional[str] = None
    api_key: Optional[str] = None

    def get(self) -> Embedder:
        from rag_pipeline.embedders.factory import make_embedder

        return self._client(("configured",), lambda: make_embedder(self.settings()))

    def for_space(self, active: Space | None) -> Embedder:
        """The embedder of the active space (the configured one while the index has none)."""
        from rag_pipeline.embedders.factory import make_indexing_embedder

        if active is None:
            return self.get()
        return self._client(("space", active.model, active.dimensions),
                            lambda: make_indexing_embedder(self.settings(), active))

    def for_questions(self, space: Space) -> Embedder:
        """The embedder of a question asked of ``space`` (any space: the gate asks a candidate too)."""
        from rag_pipeline.embedders.factory import make_embedder_for_space

        return self._client(("questions", space.model, space.dimensions),
                            lambda: make_embedder_for_space(self.settings(), space))

    def chunk_budget(self, active: Space | None) -> ChunkBudget:
        """(max, overlap) tokens of a chunk and the model's window, sized to the model pages are
        embedded with."""
        from rag_pipeline.embedders.factory import indexing_chunk_budget

        return indexing_chunk_budget(self.settings(), active)

    def note(self, active: Space | None) -> str | None:
        """A line for the run when the configured model is not the active space's (not an error)."""
        from rag_pipeline.embedders.factory import configured_differs

        return configured_differs(self.settings(), active)


class CrawlerResource(_OwnsClients):
    """CRAWLER=crawlbase|local behind one interface (push a URL, read health). Unset fields fall
    back to the environment (CRAWLER, CRAWLBASE_API_URL, … see docs/configuration.md)."""

    VARIABLES: ClassVar[dict[str, str]] = {
        "kind": "CRAWLER", "api_url": "CRAWLBASE_API_URL", "callback_url": "CRAWLER_CALLBACK_URL",
        "token": "CRAWLBASE_TOKEN",
    }

    kind: Optional[str] = None
    api_url: Optional[str] = None
    callback_url: Optional[str] = None
    token: Optional[str] = None

    def get(self) -> Crawler:
        from rag_pipeline.crawl.factory import make_crawler

        return self._client(("crawler",), lambda: make_crawler(self.settings()))

    def for_kind(self, kind: Optional[str]) -> Crawler:
        """The crawler a site asks for (local or crawlbase); None: the configured one (`get`)."""
        from rag_pipeline.crawl.factory import make_crawler

        if kind is None:
            return self.get()
        return self._client(("crawler", kind),
                            lambda: make_crawler(self.settings().model_copy(update={"crawler": kind})))


def _from_environment(name: str) -> Optional[dg.EnvVar]:
    """The variable as a `dg.EnvVar` when it is set (else the settings' .env files or defaults)."""
    return dg.EnvVar(name) if os.environ.get(name) else None


@dg.definitions
def defs() -> dg.Definitions:
    return dg.Definitions(
        resources={
            "settings": SettingsResource(),
            "postgres": PostgresResource(database_url=_from_environment("DATABASE_URL")),
            "embedder": EmbedderResource(api_key=_from_environment("OPENAI_API_KEY"),
                                         base_url=_from_environment("OPENAI_BASE_URL")),
            "crawler": CrawlerResource(token=_from_environment("CRAWLBASE_TOKEN")),
        },
        # One process per run: a page run costs ~2.5 s in process against ~8 s multiprocess.
        executor=dg.in_process_executor,
    )
