"""What every command shares: the one-line error, the group that turns setting and database errors into
one, and the index's URL checked before a command reads it."""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager

import click

from rag_pipeline.settings import SettingsError, get_settings
from rag_pipeline.settings_sources import deployment_environment


class CliError(click.ClickException):
    exit_code = 1


class OneLineUsage(click.UsageError):
    """A usage error as one line, `rag-pipeline: <message> (see <command> --help)`, exit 2: click's
    four lines (usage, hint, blank, error) bury the message, and a script's log keeps one line."""

    def show(self, file=None) -> None:
        where = self.ctx.command_path if self.ctx is not None else "rag-pipeline"
        message = " ".join(self.format_message().split("\n")).rstrip(".")   # "Did you mean" comes on a line of its own
        click.echo(f"rag-pipeline: {message} (see {where} --help)", file=file, err=True)


def _one_line(exc: click.UsageError) -> click.UsageError:
    if isinstance(exc, (OneLineUsage, click.exceptions.NoArgsIsHelpError)):   # that one is the help itself
        return exc
    one = OneLineUsage(exc.format_message(), exc.ctx)
    one.exit_code = exc.exit_code
    return one


class Commands(click.Group):
    """Turns the errors every command can meet (a bad setting, an unreachable or missing database)
    into one line and exit 1, and a usage error of any command, at any depth, into one line and exit 2."""

    def make_context(self, info_name, args, parent=None, **extra):
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as exc:   # the top level's own options, or no command given
            raise _one_line(exc) from None

    def invoke(self, ctx: click.Context):
        from rag_pipeline.store.db import DatabaseError

        try:
            # The deployment's environment (`.env`, `make run`'s run.env) under the shell's: a runbook
            # command gives the answer it gives inside `make run`.
            with deployment_environment():
                return super().invoke(ctx)
        except (SettingsError, DatabaseError) as exc:
            raise CliError(str(exc)) from exc
        except click.UsageError as exc:   # a subcommand's arguments, or its own BadParameter
            raise _one_line(exc) from None


def index_url() -> str:
    """The index's URL, its schema checked and never changed (`rag-pipeline db migrate` is the one
    step that migrates). A missing embedded server, database or schema is an error saying where it
    looked and what to run: a command must never answer from an index it just made."""
    from rag_pipeline.store import db, schema

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
    schema.require_current(url)
    return url


@contextmanager
def progress(label: str, total: int, *, every: int, show: bool = True):
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


def across_tables(estimates: dict[str, int], advance):
    """(table, rows walked in it) → one count across the tables walked one after the other: a
    table done counts as its estimate, or what was walked in it if more."""
    done: dict[str, int] = {}

    def tell(table: str, walked: int) -> None:
        done[table] = walked
        finished = sum(max(estimates.get(t, 0), n) for t, n in done.items() if t != table)
        advance(finished + walked, table)

    return tell


@contextmanager
def dagster_storage_url(settings):
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
