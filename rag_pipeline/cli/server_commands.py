"""`rag-pipeline webhook`, `serve` and `token`: the two HTTP servers and the tokens their clients send."""

from __future__ import annotations

import click

from rag_pipeline.cli.common import CliError, index_url
from rag_pipeline.settings import get_settings


@click.command()
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
    from rag_pipeline.store import db, schema

    url = db.server_url(settings)
    try:
        schema.require_current(url)
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


@click.command()
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
        index_url()   # the index must exist, its schema current
    except db.DatabaseError as exc:
        if not isinstance(exc.__cause__, psycopg.OperationalError):
            raise
        click.echo(f"warning: {exc}; starting anyway, requests get 503 until it answers", err=True)
    uvicorn.run("query_api.main:app", host=host, port=port, workers=workers, log_level="info")


@click.command()
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
