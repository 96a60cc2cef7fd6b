"""`rag-pipeline status`: pages by state, the delivery queue, the last hour, overdue pages and the checks."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from rag_pipeline.cli.common import dagster_storage_url, index_url
from rag_pipeline.settings import get_settings


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON (the same figures).")
def status(as_json: bool) -> None:
    """Pages by state, the delivery queue, the last hour, overdue pages, what embedding cost and
    saved, and the checks that fail (their newest evaluation in the Dagster instance)."""
    from rag_pipeline.store import db, deliveries, pages, schedule, spaces, text_search
    from rag_pipeline.store import sites as sites_store
    from rag_pipeline.store import status as status_store

    url = index_url()
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
            "lexical_scan": text_search.lexical_scan(conn),
        }
    from rag_pipeline.cli.site_views import declared_state

    declared = declared_state()
    window_s = _synced_window_s(get_settings())
    for row in report["sites"]:
        row["declared"] = row["site"] in declared["declared"]
        # A site no file of this shell names may still be declared where the location runs (its
        # SITES_DIR, an env var this shell lacks): its sensor synced it lately. Else it is gone.
        row["declared_by_running_location"] = (row["synced_at"] is not None
                                               and (row["now"] - row["synced_at"]).total_seconds() <= window_s)
    report["site_files_not_loading"] = declared["not_loading"]
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

    from rag_pipeline.definitions import whole_project
    from rag_pipeline.defs import check_states

    home = Path(os.environ.get("DAGSTER_HOME") or settings.rag_home / "dagster_home")
    report: dict = {"instance": str(home)}
    if not (home / "dagster.yaml").is_file():
        return {**report, "error": "no Dagster instance there (no dagster.yaml): `make run` makes it; "
                                   "or set DAGSTER_HOME to yours"}
    with dagster_storage_url(settings) as missing:
        if missing:
            return {**report, "error": missing}
        try:
            with check_states.instance_at(home) as instance, warnings.catch_warnings():
                # Loading the definitions for their check names: Dagster's beta notes are not news here.
                warnings.simplefilter("ignore", dg.BetaWarning)
                states = check_states.latest(instance, whole_project())
        except Exception as exc:  # an unreadable instance must not hide the index's own figures
            return {**report, "error": f"cannot read it: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
    return {**report, "failing": [s.as_dict() for s in states if s.failing],
            "passed": sum(s.state == "passed" for s in states),
            "not_evaluated": [s.check for s in states if s.state in ("never evaluated", "running")]}


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
                    ("vector search", report["vector_scan"]), ("lexical search", report["lexical_scan"])])
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
        # disallowed: pages robots.txt disallows, not crawled (store/disallowed.py); a column only
        # where some site has such pages, so the last reading's problem keeps its width otherwise.
        figures = ("live", "listed", "unlisted", "tombstoned", "due",
                   *(("disallowed",) if any(row["disallowed"] for row in report["sites"]) else ()))
        for column in ("site", *figures, "last reading"):
            t.add_column(column, justify="left" if column in ("site", "last reading") else "right")
        for row in report["sites"]:
            t.add_row(row["site"], *(f"{row[k]:,}" for k in figures), _site_state(row))
        console.print(t)
    for problem in report["site_files_not_loading"]:
        console.print(f"site {problem['name']} DOES NOT LOAD: {problem['problem']}", highlight=False, soft_wrap=True)
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


def _synced_window_s(settings) -> float:
    """How lately a running location's discovery sensor must have synced a site for it to count as
    declared there: three of its ticks (DISCOVERY_INTERVAL_S) and the minute its sync is held back."""
    return 3 * settings.discovery_interval_s + 120


def _site_state(row: dict) -> str:
    """The sites table's last column: the newest reading, and for a site no file of this shell
    names, whether the running code location still declares it (as `site show` says) or none does."""
    from rag_pipeline.crawl.cadence_rules import describe_time

    reading = row["last_reading"]
    if not row["declared"] and not row["declared_by_running_location"]:
        since = f" since {describe_time(row['synced_at'], row['now'])}" if row["synced_at"] else ""
        return (f"no longer declared: no site file of this shell names it, and no running code location has "
                f"synced it{since}: its pages stay, in no site's discovery")
    if reading is None:
        said = "never read"
    elif reading["finished_at"] is None:
        said = "reading now"
    elif reading["complete"]:
        said = "complete"
    else:
        said = _incomplete(reading, row["now"])
    if not row["declared"]:
        said = (f"declared by the running code location (synced {describe_time(row['synced_at'], row['now'])}), "
                f"not in this shell (its site file or an env var it reads is not here): {said}")
    return said


def _incomplete(reading: dict, now) -> str:
    """An incomplete reading's first problem, whole words only, and, when `site discover` made it,
    that it did and when the last complete one was: a shell's failed reading must not pass for the
    sensor's verdict."""
    from rag_pipeline.core.one_line import shorten
    from rag_pipeline.crawl.cadence_rules import describe_time

    said = "INCOMPLETE" + (" (read by `rag-pipeline site discover`)" if reading.get("from_cli") else "")
    if reading["problems"]:
        said += ": " + shorten(reading["problems"][0], 240)
    if reading.get("last_complete_at"):
        said += f"; last complete reading {describe_time(reading['last_complete_at'], now)}"
    return said
