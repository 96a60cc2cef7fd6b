"""`rag-pipeline …`: the operator's commands. Errors end with a one-line message and exit 1/2."""

from __future__ import annotations

import gzip
import json
import os
import sys
import uuid
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import click

from rag_pipeline.settings import SettingsError, get_settings


class CliError(click.ClickException):
    exit_code = 1


class Commands(click.Group):
    """Turns the errors every command can meet (a bad setting, an unreachable or missing database)
    into one line and exit 1."""

    def invoke(self, ctx: click.Context):
        from rag_pipeline.store.db import DatabaseError

        try:
            return super().invoke(ctx)
        except (SettingsError, DatabaseError) as exc:
            raise CliError(str(exc)) from exc


def _app_url() -> str:
    """The index's URL, its schema checked and never changed (`rag-pipeline db migrate` is the one
    step that migrates). A missing embedded server, database or schema is an error saying where it
    looked and what to run: a command must never answer from an index it just made."""
    from rag_pipeline.store import db

    settings = get_settings()
    embedded = not settings.database_url
    was_stopped = embedded and db.embedded.exists(settings) and not db.embedded.running(settings)
    url = db.server_url(settings, create=False)
    if was_stopped:   # never silently: the operator stopped it
        click.echo(f"rag-pipeline: the embedded PostgreSQL at {db.embedded.pgdata_dir(settings)} was stopped; "
                   "started it for this command, and it keeps running (`rag-pipeline db stop` stops it)", err=True)
    if not db.database_exists(url):
        where = (f"DATABASE_URL ({db.redact(url)})" if settings.database_url
                 else f"the embedded server at {db.embedded.pgdata_dir(settings)} ({db.describe_home(settings)})")
        raise db.NoDatabase(f"no index database on {where}: create it with `rag-pipeline db migrate` "
                            f"(or `make run`), or point DATABASE_URL or RAG_HOME at your index")
    db.require_current(url)
    return url


@click.group(cls=Commands)
def main() -> None:
    """Incremental RAG index: crawler deliveries in, cited search results out."""


@main.group("db", cls=Commands)
def db_group() -> None:
    """The database (embedded unless DATABASE_URL is set)."""


@db_group.command("start")
def db_start() -> None:
    """Start the embedded server (checked by `db doctor` the first time) and print the index's URL
    (its database created if missing; `db migrate` gives it its schema)."""
    from rag_pipeline.store import db

    url = db.server_url(get_settings())
    db.ensure_database(url)
    click.echo(url)


@db_group.command("stop")
def db_stop() -> None:
    """Stop the embedded server."""
    from rag_pipeline.store import embedded

    settings = get_settings()
    if settings.database_url:
        raise CliError("DATABASE_URL is set: that server is not ours to stop")
    click.echo("stopped" if embedded.stop(settings) else "not running")


@db_group.command("watch")
@click.option("--every", "every_s", type=click.FloatRange(min=0.1), default=2.0, show_default=True,
              help="Seconds between looks at the server.")
def db_watch(every_s: float) -> None:
    """Keep the embedded server up: start it again whenever it is gone (`make run` runs this)."""
    from rag_pipeline.store import embedded

    settings = get_settings()
    if settings.database_url:
        raise CliError("DATABASE_URL is set: that server is kept up by its own service manager")
    if not embedded.exists(settings):
        raise CliError(f"no embedded database at {embedded.pgdata_dir(settings)}: `rag-pipeline db start` makes it")
    click.echo(f"watching the embedded server on {embedded.pgdata_dir(settings)} every {every_s:g} s")
    try:
        embedded.watch(settings, every_s, lambda line: click.echo(line, err=True))
    except KeyboardInterrupt:
        pass


@db_group.command("doctor")
def db_doctor() -> None:
    """Run every vector operation the project uses in a scratch database and report the server."""
    from rag_pipeline.store import db

    report = db.run_doctor(get_settings())
    for line in report.lines():
        click.echo(line)
    if not report.ok:
        raise CliError("the database cannot serve this index (see above)")


@db_group.command("url")
@click.option("--database", type=click.Choice(["rag", "dagster"]), default="rag", show_default=True,
              help="rag (the index) or dagster (its storage).")
def db_url(database: str) -> None:
    """Print a postgresql:// URL (creates the database; starts the embedded server if needed)."""
    from rag_pipeline.store import db

    url = db.server_url(get_settings(), database)
    db.ensure_database(url)
    click.echo(db.as_url(url))


@db_group.command("migrate")
def db_migrate() -> None:
    """Apply the numbered migrations (sql/, or the copy a wheel carries) that have not run yet; rebuild the lexical index if
    SEARCH_TEXT_CONFIG names another text search configuration than it was built with."""
    from rag_pipeline.store import db, text_search

    settings = get_settings()
    url = db.server_url(settings)
    applied = db.prepare(url)
    click.echo(f"applied: {', '.join(applied)}" if applied else "schema is up to date")
    with db.connection(url) as conn:
        try:
            if text_search.rebuild_for(conn, settings.search_text_config):
                click.echo(f"lexical index rebuilt with text search configuration {settings.search_text_config}")
        except text_search.UnknownTextConfig as exc:
            raise CliError(str(exc)) from exc


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8800, show_default=True, type=int)
@click.option("--workers", default=None, type=click.IntRange(1, 32),
              help="uvicorn worker processes [default: WEBHOOK_WORKERS, 2]")
def webhook(host: str, port: int, workers: int | None) -> None:
    """Serve the crawler webhook (POST /webhook, GET /healthz, GET /metrics)."""
    import os
    import tempfile

    import psycopg
    import uvicorn

    settings = get_settings()
    if not settings.resolved_webhook_token() and not settings.webhook_allow_no_token:
        raise CliError(f"WEBHOOK_TOKEN is not set and {settings.rag_home / 'webhook_token'} does not exist "
                       "(set WEBHOOK_ALLOW_NO_TOKEN=1 to run without one)")
    workers = workers or settings.webhook_workers
    from rag_pipeline.store import db

    url = db.server_url(settings)
    try:
        db.require_current(url)
    except db.DatabaseError as exc:
        if not isinstance(exc.__cause__, psycopg.OperationalError):
            raise
        # An outage, not a refusal: the receiver starts and answers 503 until the database does.
        click.echo(f"warning: {exc}; starting anyway, deliveries get 503 until it answers", err=True)
    if workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Each worker counts in its own process: a shared directory lets /metrics sum them all.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="rag-webhook-metrics-")
    # access_log=False: the app writes its own JSON access lines, with the token left out.
    uvicorn.run("webhook_sensor.main:app", host=host, port=port, workers=workers, log_level="info",
                access_log=False)


def _bound_statements(conn) -> None:
    """A search's or an answer's statements end within QUERY_STATEMENT_TIMEOUT_S, as the query API's."""
    timeout_ms = int(get_settings().query_statement_timeout_s * 1000)
    with conn.transaction():   # a session setting (is_local false): it outlives this transaction
        conn.execute("SELECT set_config('statement_timeout', %s, false)", (str(timeout_ms),))


def _retrieval_options(command):
    """--mode, and --max-age, --changed-since, --site: which pages a passage may come from (in the scan)."""
    for option in reversed([
        click.option("--mode", type=click.Choice(["vector", "lexical", "hybrid"]), default=None,
                     help="By meaning, by words, or both fused [default: SEARCH_MODE, hybrid]."),
        click.option("--max-age", "max_age", metavar="AGE",
                     help="Only pages verified within AGE (30m, 12h, 7d, 2w)."),
        click.option("--changed-since", "changed_since", metavar="DATE",
                     help="Only pages whose content changed at or after DATE (YYYY-MM-DD or ISO date and time; UTC)."),
        click.option("--site", "sites", multiple=True, metavar="GLOB",
                     help="Only pages whose URL matches GLOB (* and ?), e.g. 'https://docs.example.com/*'; repeat for several."),
    ]):
        command = option(command)
    return command


def _filters(max_age: str | None, changed_since: str | None, sites: tuple[str, ...]):
    from rag_pipeline.core.filters import FilterError, SearchFilters

    try:
        return SearchFilters.parse(max_age, changed_since, sites)
    except FilterError as exc:
        raise click.UsageError(str(exc)) from exc


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8810, show_default=True, type=click.IntRange(1, 65535))
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 32),
              help="uvicorn worker processes (each loads the embedding model once).")
def serve(host: str, port: int, workers: int) -> None:
    """Serve the query API: POST /search and /ask for applications (bearer token; schema at /docs)."""
    import psycopg
    import uvicorn

    from rag_pipeline.store import db

    settings = get_settings()
    if not settings.resolved_query_api_token() and not settings.query_api_allow_no_token:
        raise CliError(f"QUERY_API_TOKEN is not set and {settings.rag_home / 'query_api_token'} does not exist "
                       "(set QUERY_API_ALLOW_NO_TOKEN=1 to run without one)")
    try:
        _app_url()   # the index must exist, its schema current
    except db.DatabaseError as exc:
        if not isinstance(exc.__cause__, psycopg.OperationalError):
            raise
        click.echo(f"warning: {exc}; starting anyway, requests get 503 until it answers", err=True)
    uvicorn.run("query_api.main:app", host=host, port=port, workers=workers, log_level="info")


@main.command()
@click.argument("question")
@click.option("--k", "k", default=5, show_default=True, type=click.IntRange(1, 100))
@click.option("--per-page", "per_page", default=1, show_default=True, type=click.IntRange(1, 100),
              help="Passages of one page at most: 1 makes every result another source.")
@_retrieval_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def search(question: str, k: int, per_page: int, mode: str | None, max_age: str | None,
           changed_since: str | None, sites: tuple[str, ...], as_json: bool) -> None:
    """Top-k passages of live pages for QUESTION, with their freshness."""
    from rag_pipeline.query.retrieval import RetrievalError, retrieve
    from rag_pipeline.store import db, spaces

    if not question.strip():
        raise click.BadParameter("the question is empty", param_hint="QUESTION")
    filters = _filters(max_age, changed_since, sites)
    url = _app_url()
    with db.connection(url) as conn:
        _bound_statements(conn)
        try:
            hits = retrieve(conn, get_settings(), question, k, per_page=per_page, filters=filters, mode=mode)
        except RetrievalError as exc:
            raise CliError(str(exc)) from exc
        scan = spaces.search_scan(conn)
    if as_json:
        click.echo(json.dumps({"question": question, "vector_scan": scan, "results": [h.as_dict() for h in hits]},
                              indent=2))
        return
    if scan.startswith("exact"):
        click.echo(f"(search is {scan}: exact results, slower)", err=True)
    if not hits:
        click.echo("no results")
    for n, hit in enumerate(hits, 1):
        d = hit.as_dict()
        click.echo(f"[{n}] {hit.url}  (score {d['score']})")
        click.echo(f"    verified {d['last_verified_at']}  changed {d['last_changed_at']}")
        click.echo(f"    {hit.excerpt}")


@main.command()
@click.argument("question")
@click.option("--k", "k", default=8, show_default=True, type=click.IntRange(1, 50),
              help="Passages retrieved; the best that fit ANSWER_MAX_CONTEXT_TOKENS are sent.")
@_retrieval_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def ask(question: str, k: int, mode: str | None, max_age: str | None, changed_since: str | None,
        sites: tuple[str, ...], as_json: bool) -> None:
    """Answer QUESTION from live pages with a chat model, citing only the sources it used."""
    from rag_pipeline.query import answers
    from rag_pipeline.query.chat import ChatError
    from rag_pipeline.query.retrieval import RetrievalError
    from rag_pipeline.store import db

    if not question.strip():
        raise click.BadParameter("the question is empty", param_hint="QUESTION")
    filters = _filters(max_age, changed_since, sites)
    settings = get_settings()
    try:
        chat = answers.make_chat(settings)
    except (answers.NotConfigured, ChatError) as exc:
        raise CliError(str(exc)) from exc
    try:
        with db.connection(_app_url()) as conn:
            _bound_statements(conn)
            result = answers.answer(conn, settings, question, k, chat, filters=filters, mode=mode)
    except (RetrievalError, ChatError) as exc:
        raise CliError(str(exc)) from exc
    finally:
        chat.close()
    for note in answers.warnings(result):
        click.echo(f"warning: {note}", err=True)
    click.echo(json.dumps(result.as_dict(), indent=2) if as_json else answers.format_text(result))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the same figures).")
def status(as_json: bool) -> None:
    """Pages by state, the delivery queue, the last hour, overdue pages, what embedding cost and
    saved, and the checks that fail (their newest evaluation in the Dagster instance)."""
    from rag_pipeline.store import db, deliveries, pages, schedule, spaces
    from rag_pipeline.store import sites as sites_store
    from rag_pipeline.store import status as status_store

    url = _app_url()
    with db.connection(url) as conn:
        overdue, examples = schedule.overdue(conn)
        report = {
            "pages": pages.counts(conn),
            "chunks": status_store.chunk_count(conn),
            "queue": status_store.queue(conn),
            "last_hour": {"deliveries": status_store.outcomes_since(conn, 60),
                          "embedding": status_store.ledger_totals(conn, since_minutes=60)},
            "deliveries": deliveries.outcome_counts(conn),
            "embedding": status_store.ledger_totals(conn),
            "overdue": {"pages": overdue, "examples": examples},
            "sites": sites_store.overview(conn),
            "vector_scan": spaces.search_scan(conn),
        }
    settings = get_settings()
    report = {"database": (f"DATABASE_URL ({db.redact(url)})" if settings.database_url
                           else f"embedded at {db.embedded.pgdata_dir(settings)} ({settings.rag_home_source()})"),
              **report, "checks": _check_report(settings)}
    if as_json:
        click.echo(json.dumps(report, indent=2, default=str))
        return
    _print_status(report)


def _check_report(settings) -> dict:
    """The checks' newest evaluations, from the Dagster instance of `make run` (DAGSTER_HOME, else
    $RAG_HOME/dagster_home), or why they cannot be read: the index's figures are shown either way."""
    import warnings

    import dagster as dg

    from rag_pipeline.definitions import defs
    from rag_pipeline.defs import check_states

    home = Path(os.environ.get("DAGSTER_HOME") or settings.rag_home / "dagster_home")
    report: dict = {"instance": str(home)}
    if not (home / "dagster.yaml").is_file():
        return {**report, "error": "no Dagster instance there (no dagster.yaml): `make run` makes it; "
                                   "or set DAGSTER_HOME to yours"}
    with _dagster_storage_url(settings) as missing:
        if missing:
            return {**report, "error": missing}
        try:
            with check_states.instance_at(home) as instance, warnings.catch_warnings():
                # Loading the definitions for their check names: Dagster's beta notes are not news here.
                warnings.simplefilter("ignore", dg.BetaWarning)
                states = check_states.latest(instance, defs())
        except Exception as exc:  # an unreadable instance must not hide the index's own figures
            return {**report, "error": f"cannot read it: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    return {**report, "failing": [s.as_dict() for s in states if s.failing],
            "passed": sum(s.state == "passed" for s in states),
            "not_evaluated": [s.check for s in states if s.state in ("never evaluated", "running")]}


@contextmanager
def _dagster_storage_url(settings):
    """DAGSTER_POSTGRES_URL (which the project's deploy/dagster.yaml reads) for the time of the read: the
    `dagster` database of the index's server unless set. Yields why it cannot be set, or None."""
    from rag_pipeline.store import db

    if os.environ.get("DAGSTER_POSTGRES_URL"):
        yield None
        return
    url = db.server_url(settings, "dagster", create=False)
    if not db.database_exists(url):
        yield "its storage database `dagster` does not exist yet: `make run` creates it"
        return
    os.environ["DAGSTER_POSTGRES_URL"] = db.as_url(url)
    try:
        yield None
    finally:
        del os.environ["DAGSTER_POSTGRES_URL"]


def _print_status(report: dict) -> None:
    """Tables on a terminal; the same tables in plain text when piped (no colours, no wrapping)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console(soft_wrap=True) if sys.stdout.isatty() else Console(no_color=True, width=120)
    console.print(f"database: {report['database']}", highlight=False)

    def table(title: str, rows: list[tuple[str, object]]) -> None:
        t = Table(title=title, title_justify="left", box=box.SIMPLE, show_header=False)
        t.add_column(style="bold")
        t.add_column(justify="right")
        for name, value in rows:
            t.add_row(name, f"{value:,}" if isinstance(value, int) else str(value))
        console.print(t)

    pages, queue = report["pages"], report["queue"]
    table("pages", [*pages.items(), ("chunks", report["chunks"]), ("overdue for a recrawl", report["overdue"]["pages"]),
                    ("search", report["vector_scan"])])
    table("queue", [("unrouted", queue["unrouted"]), ("queued for a run", queue["queued"]),
                    ("failed, retrying", queue["failed_retrying"]), ("failed, not retried", queue["failed_for_good"]),
                    ("oldest waiting", "-" if queue["oldest_waiting_minutes"] is None
                     else f"{queue['oldest_waiting_minutes']} min")])
    hour = report["last_hour"]
    table("last hour", [*(hour["deliveries"] or {"deliveries": 0}).items(),
                        ("tokens embedded", hour["embedding"]["tokens_embedded"]),
                        ("tokens reused (vectors cached)", hour["embedding"]["tokens_reused"])])
    ever = report["embedding"]
    table("all time", [*(report["deliveries"] or {"deliveries": 0}).items(),
                       ("chunks switched", ever["chunks_switched"]), ("chunks embedded", ever["chunks_embedded"]),
                       ("tokens embedded", ever["tokens_embedded"]), ("tokens reused", ever["tokens_reused"]),
                       ("embedding requests", ever["requests"])])
    if report["overdue"]["examples"]:
        console.print("overdue, e.g.: " + ", ".join(report["overdue"]["examples"]), highlight=False)
    if report["sites"]:
        t = Table(title="sites", title_justify="left", box=box.SIMPLE)
        for column in ("site", "live", "listed", "unlisted", "tombstoned", "due", "last reading"):
            t.add_column(column, justify="left" if column in ("site", "last reading") else "right")
        for row in report["sites"]:
            reading = row["last_reading"]
            if reading is None:
                said = "never read"
            elif reading["finished_at"] is None:
                said = "reading now"
            elif reading["complete"]:
                said = "complete"
            else:
                said = f"INCOMPLETE: {reading['problems'][0][:120]}" if reading["problems"] else "INCOMPLETE"
            t.add_row(row["site"], *(f"{row[k]:,}" for k in ("live", "listed", "unlisted", "tombstoned", "due")),
                      said)
        console.print(t)
    checks = report["checks"]
    if "error" in checks:
        console.print(f"checks: {checks['instance']}: {checks['error']}", highlight=False)
        return
    summary = (f"checks: {len(checks['failing'])} failing, {checks['passed']} passing"
               + (f", not evaluated yet: {', '.join(checks['not_evaluated'])} (the index checks run every 15 "
                  "minutes, `index_checks`; the crawler's every minute)" if checks["not_evaluated"] else ""))
    console.print(summary, highlight=False)
    if checks["failing"]:
        t = Table(title="failing checks", title_justify="left", box=box.SIMPLE)
        for column in ("check", "severity", "minutes ago", "what it says"):
            t.add_column(column)
        for c in checks["failing"]:
            t.add_row(c["check"], c["severity"], f"{c['minutes_ago']:g}", c["description"])
        console.print(t)


@main.group()
def space() -> None:
    """Embedding spaces: switch models without a gap in search."""


@space.command("list")
def space_list() -> None:
    """Every embedding space, with its status and vector count."""
    from rag_pipeline.store import chunks as chunk_store
    from rag_pipeline.store import db, space_vectors, spaces

    with db.connection(_app_url()) as conn:
        for s in spaces.list_all(conn):
            cached = chunk_store.cached_count(conn, s)
            live = space_vectors.live_count(conn, s) if s.status != "retired" else None
            searchable = f", {live} live chunks" if live is not None else ""
            backlog = space_vectors.backlog_size(conn, s) if s.status == "building" else 0
            waiting = f", {backlog} waiting for a vector" if backlog else ""
            click.echo(f"{s.space_id}  {s.status:<8}  {s.model} ({s.dimensions} dims)  "
                       f"{cached} vectors cached{searchable}{waiting}")


@contextmanager
def _progress(label: str, total: int, *, every: int, show: bool = True):
    """advance(done, note): a bar with counts and ETA on a terminal (stderr); a plain line each
    ``every`` items when not attached to one (logs, CI); nothing unless ``show`` (`--json`)."""
    if not show:
        yield lambda done, note="": None
        return
    if sys.stderr.isatty():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                      TextColumn("{task.fields[note]}"), transient=True) as bar:
            task = bar.add_task(label, total=total or None, note="")
            yield lambda done, note="": bar.update(task, completed=done, note=note)
        return
    last = [0]

    def advance(done: int, note: str = "") -> None:
        if done - last[0] >= every or done == total:
            last[0] = done
            click.echo(f"  {done:,} of {total:,} {label}" + (f", {note}" if note else ""), err=True)

    yield advance


@space.command("build")
def space_build() -> None:
    """Fill the space of the configured embedder from the indexed chunk texts (search unaffected)."""
    from rag_pipeline.embedders.factory import make_embedder
    from rag_pipeline.ingest.model_switch import WALK_PAGE, ModelSwitchError, build
    from rag_pipeline.store import db

    from rag_pipeline.store.status import chunk_count

    settings = get_settings()
    embedder = make_embedder(settings)
    with db.connection(_app_url()) as conn:
        total = chunk_count(conn)
        conn.commit()
        with _progress("chunks walked", total, every=20 * WALK_PAGE) as advance:
            try:
                result = build(conn, embedder, maintenance_work_mem=settings.space_build_memory,
                               on_progress=lambda r: advance(r.chunks_walked, f"{r.texts_embedded} texts embedded"))
            except ModelSwitchError as exc:
                raise CliError(str(exc)) from exc
    index = f"; index built in {result.index_s:.1f} s" if result.index_built else ""
    click.echo(f"space {result.space.space_id} ({embedder.model}, {embedder.dimensions} dims, "
               f"{result.space.status}): {result.chunks_walked} chunks walked, {result.texts_embedded} texts, "
               f"{result.tokens_embedded} tokens embedded{index}")


@space.command("activate")
def space_activate() -> None:
    """Finish the build of the configured embedder's space and flip search to it (a status flip)."""
    from rag_pipeline.embedders.factory import make_embedder
    from rag_pipeline.ingest.model_switch import ModelSwitchError, activate
    from rag_pipeline.store import db

    embedder = make_embedder(get_settings())
    with db.connection(_app_url()) as conn:
        try:
            active = activate(conn, embedder)
        except ModelSwitchError as exc:
            raise CliError(str(exc)) from exc
    click.echo(f"active: space {active.space_id} ({active.model}, {active.dimensions} dims)")


@main.group()
def backfill() -> None:
    """Re-chunk backfills after a chunker or budget change."""


@backfill.command("plan")
@click.option("--json", "as_json", is_flag=True)
def backfill_plan(as_json: bool) -> None:
    """Price a re-chunk of outdated pages from stored text, without calling the embedder."""
    from rag_pipeline.embedders.factory import indexing_chunk_budget
    from rag_pipeline.core.chunking import chunker_signature
    from rag_pipeline.ingest.backfill import plan
    from rag_pipeline.store import db, pages, spaces

    settings = get_settings()
    with db.connection(_app_url()) as conn:
        active = spaces.active(conn)
        max_tokens, overlap_tokens = indexing_chunk_budget(settings, active)
        todo = pages.count_chunked_otherwise(conn, chunker_signature(max_tokens, overlap_tokens))
        with _progress("pages re-chunked", todo, every=max(200, todo // 10), show=not as_json) as advance:
            result = plan(conn, active, max_tokens, overlap_tokens, on_progress=advance)
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
        return
    click.echo(f"chunker {result.signature}: {result.pages} page(s) to re-chunk")
    click.echo(f"  their chunks once re-cut: {result.chunks_total}, {result.chunks_to_embed} of them to embed")
    click.echo(f"  tokens: {result.tokens_to_embed} to embed, {result.tokens_reused} reused")
    if result.pages:
        click.echo("  run it: turn on `rechunk_sensor` in the Dagster UI, or backfill the `rechunk` job")


def _across_tables(estimates: dict[str, int], advance):
    """(table, rows walked in it) → one count across the tables walked one after the other: a
    table done counts as its estimate, or what was walked in it if more."""
    done: dict[str, int] = {}

    def tell(table: str, walked: int) -> None:
        done[table] = walked
        finished = sum(max(estimates.get(t, 0), n) for t, n in done.items() if t != table)
        advance(finished + walked, table)

    return tell


@main.command()
@click.argument("which", type=click.Choice(["query", "webhook"]))
def token(which: str) -> None:
    """Print the query API's (or the receiver's) token: QUERY_API_TOKEN / WEBHOOK_TOKEN, else the one
    `make run` wrote under RAG_HOME. For `curl -H "Authorization: Bearer $(rag-pipeline token query)"`
    from any directory."""
    settings = get_settings()
    found = settings.resolved_query_api_token() if which == "query" else settings.resolved_webhook_token()
    if not found:
        variable, file = (("QUERY_API_TOKEN", "query_api_token") if which == "query"
                          else ("WEBHOOK_TOKEN", "webhook_token"))
        raise CliError(f"no {which} token: set {variable}, or run `make run` once (it writes one to "
                       f"{settings.rag_home / file})")
    click.echo(found)


@main.command()
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def prune(dry_run: bool, as_json: bool) -> None:
    """Delete settled deliveries, finished pushes and long-unused vectors past their retention
    (DELIVERY_RETENTION_DAYS, PUSH_RETENTION_DAYS, VECTOR_RETENTION_DAYS; 0 keeps forever)."""
    import psycopg
    from pydantic import ValidationError

    from rag_pipeline.store import db, retention

    try:
        policy = retention.Policy.from_settings(get_settings())
    except ValidationError as exc:
        raise CliError("; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors())) from exc
    with db.connection(_app_url()) as conn:
        # The observations walk goes by ranges of pages: counted in pages.
        estimates = {("observations" if table == "pages" else table): n
                     for table, n in retention.estimated_rows(conn).items()
                     if table == "pages" or policy.days()[table]}
        conn.commit()
        try:
            with _progress("rows walked", sum(estimates.values()),
                           every=max(policy.batch_size, sum(estimates.values()) // 10), show=not as_json) as advance:
                result = retention.prune(conn, policy, dry_run=dry_run,
                                         on_progress=_across_tables(estimates, advance))
        except retention.PruneBusy as exc:
            raise CliError(str(exc)) from exc
        except psycopg.errors.LockNotAvailable as exc:
            raise CliError(f"a row stayed locked over {retention.LOCK_TIMEOUT}; what was deleted stays "
                           f"deleted, run it again later ({exc})") from exc
    if as_json:
        click.echo(json.dumps({**result.as_dict(), "retention_days": policy.days()}, indent=2))
        return
    for line in result.lines(policy):
        click.echo(line)


@main.command()
@click.argument("url")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--webhook", "webhook_url", default="http://127.0.0.1:8800/webhook", show_default=True)
@click.option("--status", "original_status", default=200, show_default=True, type=int)
@click.option("--rid", default=None, help="Request id (default: a new UUID).")
def deliver(url: str, file: Path, webhook_url: str, original_status: int, rid: str | None) -> None:
    """POST FILE to the webhook as the crawler would deliver URL (gzip'd markdown).

    The delivery is recorded as the answer to a manual push of URL (the pushes table), so routing
    indexes it as it indexes what a crawler was asked for."""
    import httpx

    from rag_pipeline.core.urls import InvalidURL, normalize_url
    from rag_pipeline.store import db, pushes

    settings = get_settings()
    rid = rid or uuid.uuid4().hex
    try:
        page_url = normalize_url(url)
    except InvalidURL as exc:
        raise click.BadParameter(str(exc), param_hint="URL") from exc
    headers = {
        "rid": rid,
        "url": url,
        "Original-Status": str(original_status),
        "CB-Status": "200",
        "Content-Encoding": "gzip",
        "Content-Type": "text/markdown; charset=utf-8",
    }
    from rag_pipeline.crawl.fetching import answer_reason

    token = settings.resolved_webhook_token()
    params = {"token": token} if token else {}
    with db.connection(_app_url()) as conn:
        with conn.transaction():
            (push_id,) = pushes.begin(conn, [(url, page_url)], reason="manual", crawler="deliver", run_id=None)
        error = None
        try:
            resp = httpx.post(webhook_url, params=params, headers=headers,
                              content=gzip.compress(file.read_bytes()), timeout=30)
            if resp.status_code != 200:
                error = f"webhook answered {resp.status_code}: {answer_reason(resp)}"
        except httpx.HTTPError as exc:
            error = f"cannot reach the webhook at {webhook_url}: {exc}"
        with conn.transaction():
            pushes.finish(conn, [pushes.Outcome(push_id, None if error else rid, 1, error)])
    if error:
        raise CliError(error)
    click.echo(resp.text)


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--no-push", is_flag=True, help="Register the pages and their cadence only.")
@click.option("--wait", "wait_s", default=300.0, show_default=True,
              help="local crawler: seconds to wait for the fetches to be delivered.")
def seed(file: Path, no_push: bool, wait_s: float) -> None:
    """Register the URLs in FILE with their cadence and push them to the crawler.

    One URL per line, `#` starts a comment, `every=6h` sets that page's cadence
    (else cadence.yaml's default for its pattern)."""
    from rag_pipeline.crawl.cadence import CadenceError, load_rules, parse_seeds
    from rag_pipeline.crawl.factory import make_crawler
    from rag_pipeline.crawl.pushing import push_by_site, register_seeds
    from rag_pipeline.store import db

    settings = get_settings()
    try:
        seeds = parse_seeds(file.read_text(encoding="utf-8"), timedelta(seconds=settings.recrawl_interval_s))
        rules = load_rules(settings.cadence_file)
    except CadenceError as exc:
        raise CliError(f"{file}: {exc}") from exc
    with db.connection(_app_url()) as conn:
        targets, skipped = register_seeds(conn, seeds, rules)
        for line in skipped:
            click.echo(f"alias, not pushed: {line}")
        aliases = f" ({len(skipped)} of them redirect{'s' if len(skipped) == 1 else ''} elsewhere: not pushed)" if skipped else ""
        click.echo(f"registered {len(seeds)} page(s){aliases}")
        if no_push or not targets:
            return
        crawlers: dict = {}

        def crawler_for(kind):   # a site may ask for its own crawler; None: CRAWLER
            if kind not in crawlers:
                try:
                    crawlers[kind] = make_crawler(settings if kind is None
                                                  else settings.model_copy(update={"crawler": kind}))
                except ValueError as exc:
                    raise CliError(str(exc)) from exc
            return crawlers[kind]

        try:
            name = crawler_for(None).name
            with _progress(f"pushed to {name}", len(targets), every=max(1, len(targets) // 10)) as advance:
                done = [0]

                def pushed(n: int) -> None:
                    done[0] += n
                    advance(done[0])

                report = push_by_site(conn, crawler_for, targets, reason="seed",
                                      concurrency=settings.crawler_push_concurrency,
                                      tombstone_recheck=rules.tombstone_recheck, drain_timeout_s=wait_s,
                                      progress=pushed)
        finally:
            for crawler in crawlers.values():
                crawler.close()
    click.echo(f"pushed {report.pushed}, failed {report.failed}")
    for error in report.errors[:20]:
        click.echo(f"  failed: {error}", err=True)
    if report.undelivered_local:
        click.echo(f"{report.undelivered_local} page(s) were still being fetched after --wait {wait_s:g} s: "
                   "their pushes count as failed and their pages fall due again", err=True)
    if report.failed:
        raise CliError(f"{report.failed} push(es) failed (recorded in the pushes table)")


@main.group()
def cadence() -> None:
    """Per-page recrawl cadence (defaults by URL pattern: rag_pipeline/config/cadence.yaml)."""


@cadence.command("set")
@click.argument("url")
@click.argument("every")
@click.option("--register", is_flag=True, help="Add URL if it is not registered yet (due at the next tick).")
def cadence_set(url: str, every: str, register: bool) -> None:
    """Recrawl URL every EVERY (1m, 15m, 6h, 1d, 2w, 1h30m; at least RECRAWL_INTERVAL_S): fixed,
    never adapted. EVERY `auto` gives the page back to its rule and the adaptive cadence."""
    from datetime import timedelta

    from rag_pipeline.core.urls import InvalidURL, normalize_url
    from rag_pipeline.crawl.cadence import (CadenceError, check_honourable, format_interval, load_rules,
                                            parse_interval)
    from rag_pipeline.store import db, schedule

    auto = every.strip().lower() == "auto"
    try:
        page_url = normalize_url(url)
        interval = load_rules(get_settings().cadence_file).every_for(page_url) if auto else parse_interval(every)
    except (CadenceError, InvalidURL) as exc:
        raise click.BadParameter(str(exc)) from exc
    try:
        check_honourable(interval, timedelta(seconds=get_settings().recrawl_interval_s))
    except CadenceError as exc:
        raise CliError(f"{exc} (or lower RECRAWL_INTERVAL_S)") from exc
    with db.connection(_app_url()) as conn:
        with conn.transaction():
            row = schedule.set_cadence(conn, url, page_url, interval, register=register,
                                       source="default" if auto else "manual")
    if row is None:
        raise CliError(f"{page_url} is not registered: check the URL, or add it with --register")
    if row.alias_of:
        raise CliError(f"{page_url} redirects to {row.alias_of} and is not recrawled: set the cadence there "
                       f"(rag-pipeline cadence set {row.alias_of} {format_interval(interval)})")
    added = " (registered, first crawl at the next recrawl tick)" if row.created else ""
    adapts = "; adaptive from the next cadence refresh (CADENCE_REFRESH_S)" if auto else ""
    click.echo(f"{page_url}: every {format_interval(row.recrawl_every)}{added}{adapts}")


@cadence.command("show")
@click.argument("url")
def cadence_show(url: str) -> None:
    """The cadence of URL and why: its estimated change rate, the observations it rests on, its
    rule and bounds; its last and next crawl, redirect, tombstone."""
    from rag_pipeline.core.urls import InvalidURL, normalize_url
    from rag_pipeline.crawl.cadence import describe_time, format_interval, load_rules
    from rag_pipeline.store import cadence as cadence_store
    from rag_pipeline.store import db, schedule

    try:
        page_url = normalize_url(url)
    except InvalidURL as exc:
        raise click.BadParameter(str(exc)) from exc
    with db.connection(_app_url()) as conn:
        row = schedule.cadence_of(conn, page_url)
        if row is None:
            raise CliError(f"{page_url} is not registered (rag-pipeline seed FILE)")
        total, changed, newest = cadence_store.observations_of(conn, page_url, 5)
    rules = load_rules(get_settings().cadence_file)
    rule = rules.rule_for(page_url)
    adapts = row.source == "default" and rules.adaptive and rule.adapt
    label = (f"{row.source}, {'adaptive' if adapts else 'fixed'}" if row.source in ("default", "seed", "manual")
             else row.source or "not assigned yet")
    click.echo(f"{page_url}: every {format_interval(row.recrawl_every)} ({label})")
    click.echo(f"  last crawled {describe_time(row.last_crawled_at, row.now)}, "
               f"next crawl {describe_time(row.next_crawl_at, row.now, missing='not scheduled')}")
    if row.alias_of:
        click.echo(f"  redirects to {row.alias_of}: not recrawled")
    if row.deleted_at:
        click.echo(f"  tombstoned since {describe_time(row.deleted_at, row.now)}: re-checked slowly")
    click.echo(f"  rule {rule.label}: every {format_interval(rule.every)}, "
               f"{format_interval(rule.floor)}–{format_interval(rule.ceiling)}")
    rate = ("not estimated yet" if row.change_rate is None else
            f"{row.change_rate * 86400:.3g} changes/day estimated {describe_time(row.derived_at, row.now)}")
    click.echo(f"  change rate: {rate}; observations: {total} ({changed} changed)")
    for o in newest:
        click.echo(f"    {describe_time(o.crawled_at, row.now)}: {'changed' if o.changed else 'unchanged'} "
                   f"after {format_interval(timedelta(seconds=max(1, round(o.interval_s))))}")
    if adapts and row.why:
        click.echo(f"  why this interval: {row.why}")


def _register_groups() -> None:
    """Command groups that live in modules of their own."""
    from rag_pipeline.cli.sites import site

    main.add_command(site)


_register_groups()

if __name__ == "__main__":
    sys.exit(main())
