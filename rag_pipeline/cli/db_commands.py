"""`rag-pipeline db …` and `prune`: the index database, its server, its schema and its housekeeping."""

from __future__ import annotations

import json

import click

from rag_pipeline.cli.common import CliError, Commands, across_tables, index_url, progress
from rag_pipeline.settings import get_settings


@click.group("db", cls=Commands)
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
    from rag_pipeline.store import db, schema, text_search

    settings = get_settings()
    url = db.server_url(settings)
    applied = schema.prepare(url)
    click.echo(f"applied: {', '.join(applied)}" if applied else "schema is up to date")
    with db.connection(url) as conn:
        try:
            if text_search.rebuild_for(conn, settings.search_text_config):
                click.echo(f"lexical index rebuilt with text search configuration {settings.search_text_config}")
        except text_search.UnknownTextConfig as exc:
            raise CliError(str(exc)) from exc


@click.command()
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def prune(dry_run: bool, as_json: bool) -> None:
    """Delete settled deliveries, finished pushes and long-unused vectors past their retention, roll
    up old ledger rows and drop retired spaces' tables (DELIVERY_, PUSH_, VECTOR_, LEDGER_,
    RETIRED_SPACE_RETENTION_DAYS; 0 keeps forever). Dagster's runs are pruned by the `prune` job."""
    import psycopg
    from pydantic import ValidationError

    from rag_pipeline.store import db, retention

    try:
        policy = retention.Policy.from_settings(get_settings())
    except ValidationError as exc:
        raise CliError("; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors())) from exc
    with db.connection(index_url()) as conn:
        # The observations walk goes by ranges of pages: counted in pages.
        estimates = {("observations" if table == "pages" else table): n
                     for table, n in retention.estimated_rows(conn).items()
                     if table == "pages" or policy.days()[table]}
        try:
            with progress("rows walked", sum(estimates.values()),
                           every=max(policy.batch_size, sum(estimates.values()) // 10), show=not as_json) as advance:
                result = retention.prune(conn, policy, dry_run=dry_run,
                                         on_progress=across_tables(estimates, advance))
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
