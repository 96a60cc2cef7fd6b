"""Every knob of the pipeline, read from the environment (and `.env`), documented in docs/configuration.md.

Where the values come from is settings_sources.py; how a bad one is told, settings_errors.py."""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, DotEnvSettingsSource, SettingsConfigDict

from rag_pipeline.core.addresses import Network, parse_networks
from rag_pipeline.settings_errors import SettingsError, describe_errors
from rag_pipeline.settings_sources import checkout_dir, default_rag_home, env_files, run_env_file, token_file

__all__ = ["LocationSettings", "Settings", "SettingsError", "at_load", "get_settings", "load_settings",
           "location_settings"]


class LocationSettings(BaseSettings):
    """What decides which definitions a code location has. Read alone when it loads (`at_load_strict`):
    a bad value here fails the load, while another setting's bad value fails only the ticks."""

    model_config = SettingsConfigDict(env_file=env_files(), extra="ignore")

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                   file_secret_settings):
        # Below the environment and `.env`: what `make run` set for its own processes, so that a
        # command in another shell reads the settings the deployment runs with (settings_sources).
        run_env = DotEnvSettingsSource(settings_cls, env_file=run_env_file())
        return init_settings, env_settings, dotenv_settings, run_env, file_secret_settings

    # Sites declared outside the package: a folder of `<name>.yaml` files in a site's defs.yaml form
    # (a Kubernetes ConfigMap, say), so a deployment adds sites without building a new image.
    sites_dir: Path | None = Field(default=None, alias="SITES_DIR")
    # What this code location serves, when sites are spread over several locations (and hosts):
    # `all`, or `main` (the catch-all and the index-wide objects), site names, `site:shard`.
    location_holds: str = Field(default="all", alias="LOCATION_HOLDS")

    @field_validator("location_holds")
    @classmethod
    def _holds(cls, value: str) -> str:
        cls.holds_of(value)
        return value

    def holds(self):
        return self.holds_of(self.location_holds)

    @staticmethod
    def holds_of(value: str):
        from rag_pipeline.core.location_holds import parse_holds   # core/location_holds.Holds

        return parse_holds(value)


_MEMORY = r"^(auto|[0-9]+\s*(kB|MB|GB))$"   # `auto`, or a PostgreSQL memory size


class Settings(LocationSettings):

    # Where the embedded database and other local state live when DATABASE_URL is unset.
    rag_home: Path = Field(default_factory=default_rag_home, alias="RAG_HOME")
    database_url: str | None = Field(default=None, alias="DATABASE_URL")

    # Embeddings. `local` is the offline default when no OpenAI key is set.
    embedding_provider: Literal["openai", "local", "hash"] | None = Field(default=None, alias="EMBEDDING_PROVIDER")
    openai_api_key: str | None = Field(default=None, alias="OPENAI_API_KEY")
    openai_base_url: str | None = Field(default=None, alias="OPENAI_BASE_URL")
    embedding_model: str = Field(default="text-embedding-3-small", alias="EMBEDDING_MODEL")
    embedding_dimensions: int | None = Field(default=None, alias="EMBEDDING_DIMENSIONS")
    embedding_timeout_s: float = Field(default=60.0, alias="EMBEDDING_TIMEOUT_S")
    embedding_max_retries: int = Field(default=6, alias="EMBEDDING_MAX_RETRIES")

    # Answers (`rag-pipeline ask`): any OpenAI-compatible chat completions endpoint. The key and
    # base URL fall back to the OPENAI_* ones; without any key `ask` refuses (search still works).
    answer_model: str = Field(default="gpt-5.6-luna", alias="ANSWER_MODEL")
    answer_api_key: str | None = Field(default=None, alias="ANSWER_API_KEY")
    answer_base_url: str | None = Field(default=None, alias="ANSWER_BASE_URL")
    # The sources' share of the prompt, in cl100k_base tokens (highest-ranked sources first).
    answer_max_context_tokens: int = Field(default=6000, alias="ANSWER_MAX_CONTEXT_TOKENS", ge=100, le=1_000_000)
    answer_max_output_tokens: int | None = Field(default=None, alias="ANSWER_MAX_OUTPUT_TOKENS", ge=16)
    answer_timeout_s: float = Field(default=120.0, alias="ANSWER_TIMEOUT_S", gt=0)
    answer_max_retries: int = Field(default=4, alias="ANSWER_MAX_RETRIES", ge=0, le=20)

    # Chunking. Unset: sized to the embedding model's window (see chunk_budget).
    chunk_max_tokens: int | None = Field(default=None, alias="CHUNK_MAX_TOKENS", ge=32, le=8000)
    chunk_overlap_tokens: int | None = Field(default=None, alias="CHUNK_OVERLAP_TOKENS", ge=0, le=1000)

    # Extra boilerplate rules (YAML, same format as rag_pipeline/config/boilerplate.yaml).
    boilerplate_rules: Path | None = Field(default=None, alias="BOILERPLATE_RULES")

    # Webhook receiver.
    webhook_token: str | None = Field(default=None, alias="WEBHOOK_TOKEN")
    webhook_allow_no_token: bool = Field(default=False, alias="WEBHOOK_ALLOW_NO_TOKEN")
    # Token rotation: the receiver takes this one too until it is unset (set the new WEBHOOK_TOKEN,
    # move the old one here, update the crawler, then unset this).
    webhook_token_previous: str | None = Field(default=None, alias="WEBHOOK_TOKEN_PREVIOUS")
    # /metrics and /docs of the receiver: behind the webhook token unless made public here.
    webhook_public_metrics: bool = Field(default=False, alias="WEBHOOK_PUBLIC_METRICS")
    webhook_public_docs: bool = Field(default=False, alias="WEBHOOK_PUBLIC_DOCS")
    # A delivery whose rid answers no push of ours is stored as `unsolicited` and never indexed:
    # whoever holds the webhook token cannot write pages nobody asked for. True lets such
    # deliveries in (a crawler whose pushes are not recorded here, the test suite).
    webhook_accept_unsolicited: bool = Field(default=False, alias="WEBHOOK_ACCEPT_UNSOLICITED")
    webhook_max_body_bytes: int = Field(default=20 * 1024 * 1024, alias="WEBHOOK_MAX_BODY_BYTES")
    webhook_max_page_bytes: int = Field(default=50 * 1024 * 1024, alias="WEBHOOK_MAX_PAGE_BYTES")
    # Connections per receiver process, and processes: sized for 2 cores (bench/README.md, bench/webhook_load.py).
    webhook_pool_size: int = Field(default=4, alias="WEBHOOK_POOL_SIZE", ge=1, le=64)
    webhook_workers: int = Field(default=2, alias="WEBHOOK_WORKERS", ge=1, le=32)
    # One JSON line per request; refusals are logged whatever this says.
    webhook_access_log: bool = Field(default=True, alias="WEBHOOK_ACCESS_LOG")

    # Delivery sensor: deliveries routed per tick, and the batch runs it requests for the changed
    # pages (a run costs seconds, a page milliseconds; bench/README.md measured these sizes).
    sensor_batch_size: int = Field(default=4000, alias="SENSOR_BATCH_SIZE", ge=1, le=100_000)
    batch_max_pages: int = Field(default=2000, alias="BATCH_MAX_PAGES", ge=1, le=10_000)
    batch_max_tokens: int = Field(default=4_000_000, alias="BATCH_MAX_TOKENS", ge=1_000)
    # A tick's pages go into at least this many runs (of 100 pages or more each), which run at
    # once and share the cores: the `embedding_api` pool limit of deploy/dagster.yaml.
    batch_spread: int = Field(default=2, alias="BATCH_SPREAD", ge=1, le=64)
    # PostgreSQL's maintenance_work_mem while an HNSW index is built: `auto` sizes it from the vectors,
    # up to SPACE_BUILD_MEMORY_MAX (core/build_memory.py); a graph that fits builds several times faster.
    space_build_memory: str = Field(default="auto", alias="SPACE_BUILD_MEMORY", pattern=_MEMORY)
    space_build_memory_max: str = Field(default="auto", alias="SPACE_BUILD_MEMORY_MAX", pattern=_MEMORY)
    # Bulk loads (core/bulk_load.py): the HNSW and GIN search indexes are dropped while the vectors
    # waiting to be written are at least HNSW_DEFER_RATIO of those indexed and HNSW_DEFER_FLOOR,
    # and built again (concurrently, SPACE_BUILD_MEMORY, HNSW_BUILD_WORKERS) once the backlog drained.
    # Measured (bench/hnsw_threshold.py): a rebuild is cheaper from ~0.25-0.3 x the rows indexed.
    hnsw_defer_ratio: float = Field(default=0.3, alias="HNSW_DEFER_RATIO", gt=0)
    hnsw_defer_floor: int = Field(default=2_000, alias="HNSW_DEFER_FLOOR", ge=1)
    hnsw_build_workers: int = Field(default=1, alias="HNSW_BUILD_WORKERS", ge=0, le=16)
    # Recovery (the reconciler on every delivery_sensor tick): a batch run's worker beats this often;
    # silent this long, it is gone (killed, its machine down) and its pages go into a new batch.
    batch_heartbeat_s: float = Field(default=10.0, alias="BATCH_HEARTBEAT_S", gt=0)
    batch_heartbeat_timeout_s: float = Field(default=60.0, alias="BATCH_HEARTBEAT_TIMEOUT_S", gt=0)
    # A batch with no run this long after its request was never launched; a run started this long
    # before its op first beat is stuck in its start (loading code, connecting).
    batch_start_grace_s: float = Field(default=120.0, alias="BATCH_START_GRACE_S", gt=0)
    batch_startup_s: float = Field(default=120.0, alias="BATCH_STARTUP_S", gt=0)
    # A batch's hold on its pages: a run that never starts, or dies, frees them this long after.
    batch_lease_s: float = Field(default=1800.0, alias="BATCH_LEASE_S", gt=0)
    # A failed page run is tried again after backoff, backoff x4, ... (at most the cap) until this
    # many runs failed: by default 1, 4, 5, 5, 5 minutes, which outlasts a 15-minute API outage and
    # applies every page within 5 minutes of its end.
    run_retry_max_attempts: int = Field(default=6, alias="RUN_RETRY_MAX_ATTEMPTS", ge=1, le=20)
    run_retry_backoff_s: float = Field(default=60.0, alias="RUN_RETRY_BACKOFF_S", ge=0)
    run_retry_backoff_max_s: float = Field(default=300.0, alias="RUN_RETRY_BACKOFF_MAX_S", ge=0)

    # Search: candidates the HNSW scan looks at (at least 2k); more is better recall and slower
    # (measured by bench/search_quality.py; see bench/README.md).
    search_ef_search: int = Field(default=200, alias="SEARCH_EF_SEARCH", ge=10, le=1000)
    # vector (HNSW), lexical (full-text, GIN) or hybrid (both, fused by reciprocal rank):
    # the default chosen by bench/search_modes.py (see bench/README.md).
    search_mode: Literal["vector", "lexical", "hybrid"] = Field(default="hybrid", alias="SEARCH_MODE")
    # The PostgreSQL text search configuration of the lexical index; `db migrate` rebuilds it.
    search_text_config: str = Field(default="english", alias="SEARCH_TEXT_CONFIG", pattern=r"^[a-z_][a-z0-9_]*$")
    search_vector_weight: float = Field(default=1.0, alias="SEARCH_VECTOR_WEIGHT", ge=0)
    search_lexical_weight: float = Field(default=1.0, alias="SEARCH_LEXICAL_WEIGHT", ge=0)
    # How hybrid fuses its two lists: `scores` (each list's score scaled within the pool, weighted:
    # a passage first by a wide margin keeps it) or `rrf` (reciprocal rank fusion: a result's share
    # from one list is weight / (SEARCH_RRF_K + rank)). Chosen by bench/search_modes.py.
    search_fusion: Literal["scores", "rrf"] = Field(default="scores", alias="SEARCH_FUSION")
    search_rrf_k: int = Field(default=60, alias="SEARCH_RRF_K", ge=1, le=10_000)
    # Passages of one page at most in `search` and the query API's /search unless asked otherwise:
    # a page's second and third passages come only when they outrank every other page's best.
    search_per_page: int = Field(default=3, alias="SEARCH_PER_PAGE", ge=1, le=100)

    # Answer quality on a site's labelled questions (questions.jsonl beside its defs.yaml): each
    # site's `answer_quality` asset is evaluated after a batch changed its pages, and at least
    # this often; its check fails when recall@10 falls more than QUALITY_CHECK_MARGIN below the
    # best of its recent evaluations on the same space.
    quality_every_s: int = Field(default=86_400, alias="QUALITY_EVERY_S", ge=60)
    quality_check_margin: float = Field(default=0.05, alias="QUALITY_CHECK_MARGIN", ge=0, le=1)
    # `space activate` refuses a space whose recall@10 on any declared question set is lower than
    # the active space's by more than this (`--force` switches anyway, and is recorded).
    space_gate_margin: float = Field(default=0.02, alias="SPACE_GATE_MARGIN", ge=0, le=1)

    # The query API (`rag-pipeline serve`): POST /search and /ask for applications.
    query_api_token: str | None = Field(default=None, alias="QUERY_API_TOKEN")
    query_api_allow_no_token: bool = Field(default=False, alias="QUERY_API_ALLOW_NO_TOKEN")
    # /docs, /redoc and /openapi.json of the query API: not served unless made public here (as the receiver's).
    query_api_public_docs: bool = Field(default=False, alias="QUERY_API_PUBLIC_DOCS")
    # Requests served at once per process; one more is answered 503 at once (the client retries).
    query_api_max_inflight: int = Field(default=16, alias="QUERY_API_MAX_INFLIGHT", ge=1, le=1000)
    query_api_pool_size: int = Field(default=4, alias="QUERY_API_POOL_SIZE", ge=1, le=64)
    # Requests a second each token may make (bursts of QUERY_API_BURST); past it: 429 with Retry-After.
    query_api_rate: float = Field(default=20.0, alias="QUERY_API_RATE", gt=0)
    query_api_burst: int = Field(default=40, alias="QUERY_API_BURST", ge=1)
    # Every statement of a search or an answer (query API, and `search`/`ask` in the CLI) ends within this.
    # At least 1 ms, PostgreSQL's unit: less would round to 0, which PostgreSQL reads as no timeout.
    query_statement_timeout_s: float = Field(default=10.0, alias="QUERY_STATEMENT_TIMEOUT_S", ge=0.001, le=600)

    # Crawling (issue 4). `crawlbase` when a Crawlbase token is set, else the built-in `local` crawler.
    crawler: Literal["crawlbase", "local"] | None = Field(default=None, alias="CRAWLER")
    crawlbase_token: str | None = Field(default=None, alias="CRAWLBASE_TOKEN")
    crawler_name: str | None = Field(default=None, alias="CRAWLER_NAME")
    crawlbase_api_url: str = Field(default="https://api.crawlbase.com/", alias="CRAWLBASE_API_URL")
    crawler_push_rate: float = Field(default=20.0, alias="CRAWLER_PUSH_RATE", gt=0)
    crawler_push_concurrency: int = Field(default=8, alias="CRAWLER_PUSH_CONCURRENCY", ge=1, le=64)
    crawler_push_max_retries: int = Field(default=5, alias="CRAWLER_PUSH_MAX_RETRIES", ge=0, le=20)
    crawler_push_backoff_s: float = Field(default=0.5, alias="CRAWLER_PUSH_BACKOFF_S", ge=0)
    crawler_page_wait_ms: int | None = Field(default=None, alias="CRAWLER_PAGE_WAIT_MS")
    crawler_ajax_wait: bool = Field(default=False, alias="CRAWLER_AJAX_WAIT")
    # The local crawler: where it delivers (unset: the receiver on WEBHOOK_PORT), and how politely.
    crawler_callback_url: str | None = Field(default=None, alias="CRAWLER_CALLBACK_URL")
    webhook_port: int = Field(default=8800, alias="WEBHOOK_PORT")
    crawler_user_agent: str = Field(default="rag-pipeline-crawler/0.1 (+local)", alias="CRAWLER_USER_AGENT")
    # The local crawler obeys robots.txt for the User-Agent's product token, read again after the TTL.
    crawler_obey_robots: bool = Field(default=True, alias="CRAWLER_OBEY_ROBOTS")
    crawler_robots_ttl_s: float = Field(default=3600.0, alias="CRAWLER_ROBOTS_TTL_S", gt=0)
    crawler_timeout_s: float = Field(default=30.0, alias="CRAWLER_TIMEOUT_S", gt=0)
    crawler_per_host: int = Field(default=2, alias="CRAWLER_PER_HOST", ge=1, le=32)
    crawler_delivery_retries: int = Field(default=5, alias="CRAWLER_DELIVERY_RETRIES", ge=0, le=20)
    # The network guard of every fetch (pages, redirects, robots.txt, sitemaps): only globally
    # routable addresses, plus these networks (comma-separated CIDRs; `make run`: 127.0.0.0/8).
    crawler_allow_networks: str = Field(default="", alias="CRAWLER_ALLOW_NETWORKS")
    # One fetch, redirects and body included, ends within this.
    crawler_fetch_deadline_s: float = Field(default=120.0, alias="CRAWLER_FETCH_DEADLINE_S", gt=0, le=3600)
    # Recrawls: pages pushed per sensor tick, cadence defaults, and crawler health thresholds.
    recrawl_batch_size: int = Field(default=500, alias="RECRAWL_BATCH_SIZE", ge=1)
    recrawl_interval_s: int = Field(default=60, alias="RECRAWL_INTERVAL_S", ge=1)
    # delivery_sensor's interval. The daemon evaluates sensors on a 5 s loop, and a tick is timed
    # from a moment after its loop turn began: a 15 s minimum ticks every 20 s (measured: median
    # 19.7 s), 14 s every 15 s.
    delivery_interval_s: int = Field(default=14, alias="DELIVERY_INTERVAL_S", ge=1)
    # How often each site's discovery sensor looks whether a reading is due (its cadence is the site's).
    discovery_interval_s: int = Field(default=60, alias="DISCOVERY_INTERVAL_S", ge=1)
    cadence_file: Path | None = Field(default=None, alias="CADENCE_FILE")
    push_delivery_timeout_s: float = Field(default=3600.0, alias="PUSH_DELIVERY_TIMEOUT_S", gt=0)
    # Adaptive cadence: pushes a day for all pages (unset: CADENCE_BUDGET_SHARE of what the rules'
    # intervals would push), how often recrawl_sensor re-derives the cadences, observations per page.
    crawl_budget_per_day: float | None = Field(default=None, alias="CRAWL_BUDGET_PER_DAY", gt=0)
    cadence_budget_share: float = Field(default=0.4, alias="CADENCE_BUDGET_SHARE", gt=0, le=10)
    cadence_refresh_s: float = Field(default=600.0, alias="CADENCE_REFRESH_S", ge=0)
    cadence_history: int = Field(default=32, alias="CADENCE_HISTORY", ge=1, le=1000)
    crawler_waiting_max: int = Field(default=10_000, alias="CRAWLER_WAITING_MAX", ge=0)

    # The `index` asset: index_snapshot_sensor records the index as a whole this often (Dagster plots it).
    index_snapshot_every_s: float = Field(default=300.0, alias="INDEX_SNAPSHOT_EVERY_S", ge=0)
    # What embedding costs, in dollars per million tokens, for the `index` asset's cost and saving
    # figures. Unset: 0.02 (text-embedding-3-small) for the openai provider, 0 for the others.
    embedding_price_per_mtok: float | None = Field(default=None, alias="EMBEDDING_PRICE_PER_MTOK", ge=0)
    # What a hosted model would charge, to price what the hash gate and reuse avoid when the model
    # is local and costs nothing (text-embedding-3-small's list price).
    embedding_reference_price_per_mtok: float = Field(default=0.02, alias="EMBEDDING_REFERENCE_PRICE_PER_MTOK", ge=0)

    # Index checks (with each `index` snapshot, every INDEX_SNAPSHOT_EVERY_S). The window
    # delivery_queue_drains looks back over: a queue that stopped moving for this long is red.
    check_window_minutes: int = Field(default=15, alias="CHECK_WINDOW_MINUTES", ge=1, le=1440)
    # This many index runs failing in a row, the newest ones, turns index_runs_succeed red.
    check_failed_runs: int = Field(default=2, alias="CHECK_FAILED_RUNS", ge=1, le=100)
    # How long a page may show older content than its newest crawl, or a delivery wait, before the
    # WARN checks say so (work in progress is not a fault).
    check_grace_minutes: int = Field(default=30, alias="CHECK_GRACE_MINUTES", ge=1, le=10_080)

    # Retention (`rag-pipeline prune`, the daily `prune` schedule): days each kind of row is kept
    # once it is no longer needed; 0 keeps that kind forever. Rows in use are never pruned.
    delivery_retention_days: int = Field(default=14, alias="DELIVERY_RETENTION_DAYS", ge=0, le=36_500)
    push_retention_days: int = Field(default=30, alias="PUSH_RETENTION_DAYS", ge=0, le=36_500)
    vector_retention_days: int = Field(default=30, alias="VECTOR_RETENTION_DAYS", ge=0, le=36_500)
    # Ledger rows older than this roll up into one row a day and space (the totals stay exact).
    ledger_retention_days: int = Field(default=90, alias="LEDGER_RETENTION_DAYS", ge=0, le=36_500)
    # A retired space's vector table is dropped this long after its retirement (`space keep` keeps one).
    retired_space_retention_days: int = Field(default=14, alias="RETIRED_SPACE_RETENTION_DAYS", ge=0, le=36_500)
    # Finished Dagster runs (with their event logs) older than this are deleted by the `prune` job.
    dagster_run_retention_days: int = Field(default=30, alias="DAGSTER_RUN_RETENTION_DAYS", ge=0, le=36_500)
    # Rows examined per prune transaction (each commits on its own: short row locks and snapshots).
    prune_batch_size: int = Field(default=2000, alias="PRUNE_BATCH_SIZE", ge=1, le=100_000)

    @field_validator("openai_api_key", "answer_api_key", "webhook_token", "query_api_token", "crawlbase_token",
                     "webhook_token_previous")
    @classmethod
    def _sendable_secret(cls, value: str | None) -> str | None:
        # Sent in an HTTP header or a query string: a pasted placeholder ("sk-…") or a stray space
        # would only fail later, deep in a request, as an encoding error.
        if value is not None and not (value.isascii() and value.isprintable() and " " not in value):
            raise ValueError("must be printable ASCII without spaces (a placeholder pasted as it is?)")
        return value

    @field_validator("crawler_allow_networks")
    @classmethod
    def _networks(cls, value: str) -> str:
        parse_networks(value)   # a bad entry is refused when settings load, not at the first fetch
        return value

    def allowed_networks(self) -> tuple[Network, ...]:
        return parse_networks(self.crawler_allow_networks)

    @field_validator("rag_home")
    @classmethod
    def _absolute_home(cls, value: Path) -> Path:
        # A relative RAG_HOME is the user's explicit choice: fix it once, against where they typed it.
        return value.expanduser().absolute()

    @model_validator(mode="after")
    def _heartbeat_within_its_timeout(self):
        # A timeout shorter than two beats would fail live runs whose beat is a moment late.
        if self.batch_heartbeat_timeout_s < 2 * self.batch_heartbeat_s:
            raise ValueError(
                f"BATCH_HEARTBEAT_TIMEOUT_S ({self.batch_heartbeat_timeout_s:g}) must be at least twice "
                f"BATCH_HEARTBEAT_S ({self.batch_heartbeat_s:g})")
        return self

    def rag_home_source(self) -> str:
        """How RAG_HOME was found, for messages that say where a command looked."""
        if "rag_home" in self.model_fields_set:
            return "set in the environment"
        return "default: the checkout's .rag" if checkout_dir() else "default: the per-user data directory"

    def chunk_budget(self) -> tuple[int, int]:
        """(max tokens, overlap tokens) of a chunk, in cl100k_base tokens.

        The local MiniLM model reads only 256 wordpieces (~200 cl100k tokens): a 512-token
        chunk would be embedded from its first half only, so its default budget is smaller.
        """
        if self.resolved_embedding_provider() == "local":
            default = (160, 32)
        else:
            default = (512, 64)
        return (self.chunk_max_tokens or default[0],
                default[1] if self.chunk_overlap_tokens is None else self.chunk_overlap_tokens)

    def resolved_embedding_provider(self) -> str:
        if self.embedding_provider:
            return self.embedding_provider
        return "openai" if self.openai_api_key else "local"

    def resolved_webhook_token(self) -> str | None:
        """WEBHOOK_TOKEN, else the token `make run` generated in $RAG_HOME/webhook_token: the
        receiver and everything that delivers to it (the CLI, the local crawler) read it here, so
        they agree in a shell where WEBHOOK_TOKEN was never exported."""
        return self.webhook_token or token_file(self.rag_home / "webhook_token")

    def resolved_embedding_price(self) -> float:
        if self.embedding_price_per_mtok is not None:
            return self.embedding_price_per_mtok
        return 0.02 if self.resolved_embedding_provider() == "openai" else 0.0

    def resolved_query_api_token(self) -> str | None:
        """QUERY_API_TOKEN, else the token `make run` generated in $RAG_HOME/query_api_token."""
        return self.query_api_token or token_file(self.rag_home / "query_api_token")

    def resolved_answer_endpoint(self) -> tuple[str | None, str | None]:
        """(API key, base URL) of the chat endpoint: ANSWER_* first, else the OPENAI_* ones."""
        return (self.answer_api_key or self.openai_api_key, self.answer_base_url or self.openai_base_url)


def at_load(field: str):
    """A setting Dagster fixes when the code location loads (a sensor's interval). A bad value
    must fail the ticks that read the settings, with its message, not the code location: the
    default stands in here."""
    try:
        return getattr(load_settings(), field)
    except SettingsError:
        return Settings.model_fields[field].default


def location_settings() -> LocationSettings:
    """LOCATION_HOLDS and SITES_DIR, read when the code location loads, strictly: a location that
    fell back to a default would serve every site a second time, or none of SITES_DIR's."""
    return _read(LocationSettings)


def load_settings(overrides: Mapping[str, object] | None = None) -> Settings:
    """Settings from the environment, ``overrides`` (variable name → value) winning; a bad value
    is one line, never a pydantic traceback."""
    return _read(Settings, overrides)


def _read(cls, overrides: Mapping[str, object] | None = None):
    try:
        return cls(**(overrides or {}))
    except ValidationError as exc:
        raise SettingsError(describe_errors(exc)) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return load_settings()
