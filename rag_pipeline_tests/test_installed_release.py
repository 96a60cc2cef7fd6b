"""An installed release, not a checkout: the wheel `pip install .` builds for an image must load
its code location and create its database with nothing of the checkout beside it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from rag_pipeline.store import db, schema

CHECKOUT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "sql", "rag_pipeline", "webhook_sensor",
           "query_api")

PROBE = """
import json, sys
import rag_pipeline, rag_pipeline.definitions as location
from rag_pipeline.store import db, schema
defs = location.defs()
print(json.dumps({
    "package": rag_pipeline.__file__,
    "migrations": str(schema.SQL_DIR),
    "versions": [m.version for m in schema.migrations()],
    "jobs": sorted({job.name for job in defs.jobs}),
    "sensors": sorted(sensor.name for sensor in defs.sensors),
}))
"""


def _copy_sources(target: Path) -> Path:
    """The sources a release is built from, copied (the checkout is left as it is)."""
    target.mkdir()
    for name in SOURCES:
        path = CHECKOUT / name
        if path.is_dir():
            shutil.copytree(path, target / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "build"))
        else:
            shutil.copy2(path, target / name)
    return target


def _build_wheel(source: Path, wheels: Path) -> Path:
    _run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
          "--no-index", "-w", str(wheels), str(source)], cwd=source.parent)
    (wheel,) = wheels.glob("rag_pipeline-*.whl")
    return wheel


def _shipped_migrations(wheel: Path) -> list[str]:
    return sorted(Path(name).name for name in zipfile.ZipFile(wheel).namelist()
                  if name.startswith("rag_pipeline/migrations/"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path]:
    """The wheel built from a copy of the sources, installed alone into a folder of its own."""
    work = tmp_path_factory.mktemp("release")
    wheel = _build_wheel(_copy_sources(work / "source"), work / "wheels")
    site = work / "site"
    _run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", str(site),
          str(wheel)], cwd=work)
    return wheel, site


def _run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"{argv[:4]} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def _release_env(site: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAG_SQL_DIR", "DATABASE_URL")}
    env.update(PYTHONPATH=str(site), **extra)
    return env


def test_the_wheel_carries_every_migration(installed):
    wheel, _ = installed
    assert _shipped_migrations(wheel) == [path.name for path in schema.migration_files(CHECKOUT / "sql")]


def test_a_wheel_built_again_carries_only_the_migrations_there_are_now(tmp_path):
    """`pip install .` reuses the build folder: a migration renamed since the last build must not
    ride along under its old name (db migrate applies every numbered file it finds)."""
    source = _copy_sources(tmp_path / "source")
    first = _build_wheel(source, tmp_path / "first")
    newest = schema.migration_files(source / "sql")[-1]
    renamed = newest.with_name(f"{int(newest.name[:3]) + 1:03d}{newest.name[3:]}")
    newest.rename(renamed)
    second = _build_wheel(source, tmp_path / "second")
    assert newest.name in _shipped_migrations(first) and renamed.name not in _shipped_migrations(first)
    assert _shipped_migrations(second) == [path.name for path in schema.migration_files(source / "sql")]
    assert newest.name not in _shipped_migrations(second)


def test_an_installed_release_loads_its_code_location_away_from_any_checkout(installed, tmp_path):
    _, site = installed
    done = _run([sys.executable, "-c", PROBE], cwd=tmp_path, env=_release_env(
        site, RAG_HOME=str(tmp_path / "home"), SAMPLE_SITE_URL="http://127.0.0.1:8900"))
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(found["package"]).is_relative_to(site), found["package"]
    assert Path(found["migrations"]) == site / "rag_pipeline" / "migrations"
    assert found["versions"] == [m.version for m in schema.migrations(CHECKOUT / "sql")]
    assert {"index_batch", "index_page", "rechunk", "push", "prune"} <= set(found["jobs"])
    assert "delivery_sensor" in found["sensors"]
    # The sites declared in YAML under defs/ ship with it (the sample site, switched on here).
    assert {"sample_discovery", "sample_discovery_sensor"} <= set(found["jobs"]) | set(found["sensors"])


def test_an_installed_release_migrates_a_new_database(installed, tmp_path, pg_server_url):
    _, site = installed
    name = f"t_{uuid.uuid4().hex[:12]}"
    url = db.with_database(pg_server_url, name)
    try:
        env = _release_env(site, DATABASE_URL=url, RAG_HOME=str(tmp_path / "home"))
        _run([sys.executable, "-m", "rag_pipeline.cli", "db", "migrate"], cwd=tmp_path, env=env)
        with psycopg.connect(url) as conn:
            applied = [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY version")]
        assert applied == [m.version for m in schema.migrations(CHECKOUT / "sql")]
    finally:
        db.close_pools()
        with psycopg.connect(pg_server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
