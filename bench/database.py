"""A fresh, migrated database for one benchmark run: a new database on DATABASE_URL's server, or
an embedded server in a temporary folder, removed afterwards."""

from __future__ import annotations

import os
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from rag_pipeline.store import db, embedded, schema


@contextmanager
def bench_database(prefix: str, migrations: Path | None = None) -> Iterator[str]:
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    server = None
    url = os.environ.get("DATABASE_URL")
    if url:
        url = db.with_database(url, name)
    else:
        pgdata = Path(tempfile.mkdtemp(prefix="bench-pg-"))
        server = embedded.temporary_server(pgdata)
        url = server.get_uri(name)
    schema.prepare(url, migrations or schema.SQL_DIR)
    try:
        yield url
    finally:
        db.close_pools()
        if server is not None:
            server.cleanup()
