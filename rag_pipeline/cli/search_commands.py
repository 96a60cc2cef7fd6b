"""`rag-pipeline search` and `ask`: read the index as an application would, from a shell."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import click

from rag_pipeline.cli.common import CliError, index_url
from rag_pipeline.settings import get_settings


def _bound_statements(conn) -> None:
    """A search's or an answer's statements end within QUERY_STATEMENT_TIMEOUT_S, as the query API's."""
    from rag_pipeline.store import db

    db.bound_statements(conn, db.statement_timeout_ms(get_settings().query_statement_timeout_s))


def _question(question: str) -> str:
    """The question, or a usage error saying why it cannot be searched (blank, a NUL character)."""
    from rag_pipeline.core.filters import FilterError, parse_question

    try:
        return parse_question(question)
    except FilterError as exc:
        raise click.BadParameter(str(exc), param_hint="QUESTION") from exc


@contextmanager
def _timed_out_is_one_line(what: str) -> Iterator[None]:
    """QUERY_STATEMENT_TIMEOUT_S cancelling a statement: one line and exit 1, not a traceback."""
    import psycopg

    try:
        yield
    except psycopg.errors.QueryCanceled as exc:
        timeout_s = get_settings().query_statement_timeout_s
        raise CliError(f"the {what} took longer than QUERY_STATEMENT_TIMEOUT_S ({timeout_s:g} s) and was "
                       "cancelled: narrow it (--site, --max-age, a shorter question) or raise the timeout") from exc


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


@click.command()
@click.argument("question")
@click.option("--k", "k", default=5, show_default=True, type=click.IntRange(1, 100))
@click.option("--per-page", "per_page", default=None, type=click.IntRange(1, 100),
              help="Passages of one page at most: 1 makes every result another source  [default: SEARCH_PER_PAGE, 3]")
@_retrieval_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def search(question: str, k: int, per_page: int | None, mode: str | None, max_age: str | None,
           changed_since: str | None, sites: tuple[str, ...], as_json: bool) -> None:
    """Top-k passages of live pages for QUESTION, with their freshness."""
    from rag_pipeline.query.retrieval import RetrievalError, retrieve
    from rag_pipeline.store import db, spaces, text_search

    question = _question(question)
    filters = _filters(max_age, changed_since, sites)
    url = index_url()
    with db.connection(url) as conn, _timed_out_is_one_line("search"):
        _bound_statements(conn)
        try:
            hits = retrieve(conn, get_settings(), question, k, per_page=per_page or "default", filters=filters,
                            mode=mode)
        except RetrievalError as exc:
            raise CliError(str(exc)) from exc
        scan, lexical = spaces.search_scan(conn), text_search.lexical_scan(conn)
    if as_json:
        click.echo(json.dumps({"question": question, "vector_scan": scan, "lexical_scan": lexical,
                               "results": [h.as_dict() for h in hits]}, indent=2))
        return
    for what in (scan, lexical):
        if what.startswith("exact"):
            click.echo(f"(search is {what}: exact results, slower)", err=True)
    if not hits:
        click.echo("no results")
    for n, hit in enumerate(hits, 1):
        d = hit.as_dict()
        click.echo(f"[{n}] {hit.url}  (score {d['score']})")
        click.echo(f"    verified {d['last_verified_at']}  changed {d['last_changed_at']}")
        click.echo(f"    {hit.excerpt}")


@click.command()
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

    question = _question(question)
    filters = _filters(max_age, changed_since, sites)
    settings = get_settings()
    try:
        chat = answers.make_chat(settings)
    except (answers.NotConfigured, ChatError) as exc:
        raise CliError(str(exc)) from exc
    try:
        with db.connection(index_url()) as conn, _timed_out_is_one_line("search for the answer's sources"):
            _bound_statements(conn)
            result = answers.answer(conn, settings, question, k, chat, filters=filters, mode=mode)
    except (RetrievalError, ChatError) as exc:
        raise CliError(str(exc)) from exc
    finally:
        chat.close()
    for note in answers.warnings(result):
        click.echo(f"warning: {note}", err=True)
    click.echo(json.dumps(result.as_dict(), indent=2) if as_json else answers.format_text(result))
