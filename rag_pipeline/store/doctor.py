"""`rag-pipeline db doctor`: prove that the server's pgvector runs on this CPU before anything relies on it.

A pgvector build compiled for instructions the CPU lacks (AVX-512 on most AMD machines before
Zen 4 and many Intel desktops) kills its backend with SIGILL on the first vector operation, and
PostgreSQL then restarts every backend in crash recovery, Dagster's storage included. The doctor
runs each vector operation the project uses, one statement at a time, in a scratch database, so
that a death is attributed to one operation and reported as one message with the way out,
never as a crashed server behind a traceback. Committed data survives the crash restart.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psycopg
from psycopg import sql

DIMS = 384  # the local model's size: the operations that crashed were sized like this
HALF_DIMS = 2048  # above HNSW's 2,000-dim limit for `vector`: spaces this wide are indexed as halfvec
ROWS = 300
RECOVERY_TIMEOUT_S = 60.0

_vec = f"(SELECT array_agg(random()::real) FROM generate_series(1, {DIMS}) WHERE g > 0)"
_half = f"(SELECT array_agg(random()::real) FROM generate_series(1, {HALF_DIMS}) WHERE id > 0)"
_query = f"(SELECT array_agg((i % 7)::real / 7) FROM generate_series(1, {DIMS}) i)"

# (name, statement): each is one round trip, so a dying backend names its operation.
PROBES: list[tuple[str, str]] = [
    ("create extension", "CREATE EXTENSION IF NOT EXISTS vector"),
    ("text to vector cast", f"SELECT ('[' || array_to_string(array_fill(0.25::real, ARRAY[{DIMS}]), ',') || ']')::vector({DIMS})"),
    ("array to vector cast", f"SELECT {_query}::vector({DIMS})"),
    ("binary vector parameter", f"SELECT %s::vector({DIMS})"),
    ("vector_norm", f"SELECT vector_norm({_query}::vector({DIMS}))"),
    ("cosine distance <=>", f"SELECT {_query}::vector({DIMS}) <=> array_fill(0.5::real, ARRAY[{DIMS}])::vector({DIMS})"),
    ("table", "CREATE TABLE doctor_probe (id int PRIMARY KEY, embedding vector, half halfvec)"),
    ("HNSW index", f"CREATE INDEX doctor_probe_hnsw ON doctor_probe USING hnsw ((embedding::vector({DIMS})) vector_cosine_ops)"),
    ("HNSW insert", f"INSERT INTO doctor_probe (id, embedding) SELECT g, {_vec}::vector FROM generate_series(1, {ROWS}) g"),
    ("HNSW search", f"SELECT id FROM doctor_probe ORDER BY embedding::vector({DIMS}) <=> {_query}::vector({DIMS}) LIMIT 10"),
    ("halfvec cast and <=>", f"SELECT {_query}::halfvec({DIMS}) <=> array_fill(0.5::real, ARRAY[{DIMS}])::halfvec({DIMS})"),
    ("halfvec HNSW index", f"CREATE INDEX doctor_probe_half ON doctor_probe USING hnsw ((half::halfvec({HALF_DIMS})) halfvec_cosine_ops)"),
    ("halfvec HNSW insert", f"UPDATE doctor_probe SET half = {_half}::halfvec WHERE id <= 50"),
    ("halfvec HNSW search", f"SELECT id FROM doctor_probe WHERE half IS NOT NULL ORDER BY half::halfvec({HALF_DIMS}) <=> array_fill(0.5::real, ARRAY[{HALF_DIMS}])::halfvec({HALF_DIMS}) LIMIT 5"),
]

# "client backend (PID 123) was terminated by signal 4: Illegal instruction" (older: "server process").
_SIGNAL_LINE = re.compile(r"\(PID (\d+)\) was terminated by (signal \d+: [^\n]+|exception [^\n]+)")


@dataclass
class Probe:
    name: str
    ok: bool
    ms: float
    error: str | None = None


@dataclass
class Report:
    source: str
    server_version: str | None = None
    pgvector_available: str | None = None
    cpu: str | None = None
    probes: list[Probe] = field(default_factory=list)
    failure: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def conclusive(self) -> bool:
        """A verdict on the server's pgvector, not on reaching the server (which may be transient)."""
        return self.ok or bool(self.probes) or (self.server_version is not None and self.pgvector_available is None)

    def lines(self) -> list[str]:
        out = [
            f"server      : {self.source}",
            f"PostgreSQL  : {self.server_version or 'unknown'}",
            f"pgvector    : {self.pgvector_available or 'not available'}",
        ]
        if self.cpu:
            out.append(f"CPU         : {self.cpu}")
        for probe in self.probes:
            state = "ok" if probe.ok else "FAILED"
            out.append(f"  {probe.name:<24} {state:>6}  {probe.ms:7.1f} ms")
        out.append("vector operations: all ok" if self.ok else f"error: {self.failure}")
        return out


def cpu_summary(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The model and the SIMD levels pgvector builds target (Linux; elsewhere unknown)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags_line = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
    flags = set(flags_line.group(1).split()) if flags_line else set()
    levels = [f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vpopcntdq") if f in flags]
    has = ", ".join(levels) if levels else "no AVX2"
    lacks = "" if "avx512f" in flags else " (no AVX-512)"
    return f"{model.group(1).strip() if model else 'unknown model'}: {has}{lacks}"


def diagnose(url: str, *, source: str, log_file: Path | None = None,
             before_probe: Callable[[str, int], None] | None = None) -> Report:
    """Run every probe in a scratch database of the server at `url`; never raises for a probe's failure.

    `before_probe(name, backend_pid)` runs before each probe (tests use it to kill the backend).
    """
    report = Report(source=source, cpu=cpu_summary())
    log_offset = log_file.stat().st_size if log_file and log_file.exists() else 0
    admin_url = _with_database(url, "postgres")
    scratch = f"rag_doctor_{uuid.uuid4().hex[:10]}"
    try:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as admin:
            report.server_version = admin.execute("SHOW server_version").fetchone()[0]
            row = admin.execute("SELECT default_version FROM pg_available_extensions WHERE name = 'vector'").fetchone()
            report.pgvector_available = row[0] if row else None
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(scratch)))
    except psycopg.Error as exc:
        report.failure = f"cannot prepare a scratch database on {source}: {_one_line(exc)}"
        return report
    if report.pgvector_available is None:
        report.failure = "pgvector is not installed on this server (CREATE EXTENSION vector is impossible)"
        _drop(admin_url, scratch)
        return report
    try:
        _run_probes(_with_database(url, scratch), report, before_probe)
    finally:
        if report.failure and _crashed(report):
            reason = _crash_reason(log_file, log_offset) if log_file else None
            recovered = _wait_for_recovery(admin_url)
            report.failure = _crash_message(report, reason, recovered)
        _drop(admin_url, scratch)
    return report


def _run_probes(url: str, report: Report, before_probe) -> None:
    import numpy as np
    from pgvector.psycopg import register_vector

    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        pid = conn.info.backend_pid
        for name, statement in PROBES:
            if before_probe:
                before_probe(name, pid)
            params = (np.linspace(0, 1, DIMS, dtype=np.float32),) if "%s" in statement else None
            started = time.perf_counter()
            try:
                cursor = conn.execute(statement, params)
                if cursor.description is not None:
                    cursor.fetchall()
            except psycopg.Error as exc:
                report.probes.append(Probe(name, False, _ms(started), _one_line(exc)))
                report.failure = f"{name}: {_one_line(exc)}"
                return
            report.probes.append(Probe(name, True, _ms(started)))
            if name == "create extension":
                register_vector(conn)


def _crashed(report: Report) -> bool:
    last = report.probes[-1] if report.probes else None
    if last is None or last.ok or last.error is None:
        return False
    markers = ("server closed the connection unexpectedly", "terminating connection because of crash",
               "connection is lost", "consuming input failed", "the connection is closed", "no connection to the server")
    return any(marker in last.error for marker in markers)


def _crash_reason(log_file: Path, offset: int) -> str | None:
    """What the postmaster logged about the death ('terminated by signal 4: Illegal instruction')."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            with log_file.open("rb") as f:
                f.seek(offset)
                found = _SIGNAL_LINE.search(f.read().decode("utf-8", "replace"))
        except OSError:
            return None
        if found:
            return found.group(2)
        time.sleep(0.1)
    return None


def _crash_message(report: Report, reason: str | None, recovered: bool) -> str:
    op = report.probes[-1].name
    how = f"was killed by {reason}" if reason else "died"
    cause = ("its pgvector build uses CPU instructions this machine lacks"
             if reason is None or "signal 4" in reason or "Illegal" in reason else "pgvector crashed")
    if report.cpu and "no AVX-512" in report.cpu:
        cause += " (this CPU has no AVX-512)"
    state = ("the server restarted in crash recovery; committed data is intact"
             if recovered else f"the server did not accept connections within {RECOVERY_TIMEOUT_S:.0f} s")
    return (f"the PostgreSQL backend {how} on `{op}`: {cause}; {state}. Way out: set DATABASE_URL to a "
            f"PostgreSQL >= 15 with pgvector of your own (docs/configuration.md, 'Database and local state'), then run `rag-pipeline db doctor` again")


def _wait_for_recovery(admin_url: str) -> bool:
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as conn:
                conn.execute("SELECT 1")
                return True
        except psycopg.Error:
            time.sleep(0.25)
    return False


def _drop(admin_url: str, name: str) -> None:
    try:
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    except psycopg.Error:
        pass  # a server that is gone keeps nothing worth dropping now; the name is unique


def _with_database(url: str, database: str) -> str:
    from rag_pipeline.store.db import with_database

    return with_database(url, database)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000
