"""The lines `make run` shows in its terminal: one a batch run that ended, one a run that failed,
one an error a service logged. Everything else goes to the log files (scripts/run.sh).

Pure: the follower (`rag-pipeline follow`) reads the runs and the logs and hands them here, so
what is shown, and what is left to the logs, is decided and tested without Dagster or files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

BATCH_JOB = "index_batch"
# Longest line shown for an error a service logged; the whole of it is in its log.
MAX_ERROR_CHARS = 220
# An error repeated (a sensor failing every tick) is shown once in this many seconds.
REPEAT_WINDOW_S = 600.0

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# Dagster's log format (`… - dagster.daemon.SensorDaemon - ERROR - …`), uvicorn's (`ERROR:    …`),
# and the receiver's JSON lines (`"level":"error"`). A traceback is `LogErrors`'.
_ERROR = re.compile(r" - (ERROR|CRITICAL) - |^(ERROR|CRITICAL):|\"level\":\s*\"(error|critical)\"")
_TRACEBACK = re.compile(r"^Traceback \(most recent call last\)")
# Between the tracebacks of a chained exception: the last one's exception is the one raised.
_CHAINED = re.compile(r"^(During handling of the above exception|The above exception was the direct cause)")
# A traceback's last line: the exception's (dotted) class, and its message if it has one; not a
# log line's level (uvicorn's `INFO:     …`).
_EXCEPTION = re.compile(r"^(?![A-Z]+:)[A-Za-z_][\w.]*(: |$)")
# `rag-pipeline db watch` writes only when the server went down, came back or cannot be started.
_DB_INCIDENT = re.compile(r"^(embedded server .* (is down|is back|is stopped)|could not start it)")
_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d[ T][\d:.,]+( ?[+-]\d{4}|Z)?( - )?")


@dataclass(frozen=True)
class RunEnd:
    """A run that has ended, with what the index recorded for it (the ledger's switches)."""

    run_id: str
    job_name: str
    status: str                       # SUCCESS, FAILURE or CANCELED
    duration_s: Optional[float]
    pages_planned: Optional[int] = None   # a batch run's `rag/pages` tag
    pages_indexed: int = 0
    tokens_embedded: int = 0
    reason: str = ""                  # the first line of why it failed


def run_line(end: RunEnd) -> Optional[str]:
    """One line for a batch run that ended or any run that failed or was canceled; None for a
    run that did its job (a push, a discovery reading, a snapshot), which only the UI needs."""
    took = f" in {end.duration_s:.1f} s" if end.duration_s is not None else ""
    short = end.run_id[:8]
    if end.job_name == BATCH_JOB:
        done = f"{_count(end.pages_indexed, 'page')} indexed, {_count(end.tokens_embedded, 'token')} embedded"
        if end.status == "SUCCESS":
            return f"batch {short}: {done}{took}"
        of = f" of {end.pages_planned}" if end.pages_planned is not None else ""
        return f"batch {short} {_ended(end.status)}{took}: {done.replace(' indexed', f'{of} indexed', 1)}" \
               + (f"; {end.reason}" if end.reason else "")
    if end.status == "SUCCESS":
        return None
    return f"run {end.job_name} {short} {_ended(end.status)}{took}" + (f": {end.reason}" if end.reason else "")


def first_line(message: str) -> str:
    """The first non-empty line of an error message, cut to fit a terminal line."""
    line = next((part.strip() for part in (message or "").splitlines() if part.strip()), "")
    return line if len(line) <= MAX_ERROR_CHARS else line[:MAX_ERROR_CHARS - 1] + "…"


def error_in_log(log_name: str, line: str) -> Optional[str]:
    """The line to show for a line a service logged, if it is an error (or, in the database
    keeper's log, an incident); None for the rest."""
    plain = _ANSI.sub("", line).rstrip()
    if not (_ERROR.search(plain) or (log_name == "db.log" and _DB_INCIDENT.match(plain))):
        return None
    return f"{log_name}: {first_line(_TIMESTAMP.sub('', plain))}"


class LogErrors:
    """One log file's new lines in, the lines to show out. A traceback is shown as its last line,
    the exception's class and message: its first line is the same for every traceback, so shown
    (and keyed by `Repeats`) as that, one would hide every other for a whole window. That line is
    held until the log goes on past it or a look finds it quiet, since a chained exception's
    traceback may follow, whose exception is the one raised."""

    def __init__(self, log_name: str):
        self.log_name = log_name
        self._in_traceback = False
        self._held: Optional[str] = None

    def lines(self, new: list[str]) -> list[str]:
        """The lines to show for `new`, the lines a look read (none: the log was quiet)."""
        shown = [out for line in new for out in self._line(_ANSI.sub("", line).rstrip())]
        if not new:
            shown.extend(self._release())
        return shown

    def _line(self, plain: str) -> list[str]:
        if self._in_traceback:
            if not plain or plain[0].isspace():     # a frame, its source line, a caret line
                return []
            self._in_traceback = False
            if not _EXCEPTION.match(plain):         # its end never logged (a process killed mid-write)
                return [f"{self.log_name}: a traceback cut short (see the log)", *self._line(plain)]
            self._held = plain
            return []
        if self._held is not None:
            if not plain:
                return []
            if _CHAINED.match(plain):
                self._held = None
                return []
            return [*self._release(), *self._line(plain)]
        if _TRACEBACK.match(plain):
            self._in_traceback = True
            return []
        shown = error_in_log(self.log_name, plain)
        return [shown] if shown else []

    def _release(self) -> list[str]:
        held, self._held = self._held, None
        return [f"{self.log_name}: {first_line(held)}"] if held else []


class Repeats:
    """Which lines were shown lately: an error that comes back every tick is shown once a window."""

    def __init__(self, window_s: float = REPEAT_WINDOW_S):
        self.window_s = window_s
        self._shown: dict[str, float] = {}

    def fresh(self, line: str, now: float) -> bool:
        key = re.sub(r"\d+", "#", line)   # run ids, counts and times differ from one repeat to the next
        last = self._shown.get(key)
        if last is not None and now - last < self.window_s:
            return False
        self._shown = {k: t for k, t in self._shown.items() if now - t < self.window_s}
        self._shown[key] = now
        return True


def _ended(status: str) -> str:
    return {"FAILURE": "failed", "CANCELED": "was canceled"}.get(status, status.lower())


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"
