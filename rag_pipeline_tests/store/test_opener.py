"""A thread's own connection reaches the server, database and user of the one it was made from,
whatever the PG* environment says (libpq would read it for every setting left out)."""

from __future__ import annotations

import psycopg
import pytest

from rag_pipeline.store import db


def test_a_connection_opened_like_another_reaches_the_same_database_whatever_the_environment(database_url,
                                                                                            monkeypatch):
    with psycopg.connect(database_url, autocommit=True) as conn:
        open_like = db.opener(conn)
        expected = conn.execute("SELECT current_database(), current_user, inet_server_port()").fetchone()
        for name, value in (("PGPORT", "1"), ("PGDATABASE", "elsewhere"), ("PGUSER", "nobody"),
                            ("PGHOST", "/nonexistent")):
            monkeypatch.setenv(name, value)
        with open_like() as other:
            assert other.execute("SELECT current_database(), current_user, inet_server_port()").fetchone() == expected
            assert other.autocommit   # set up as the pool's connections are
            other.execute("SELECT '[1,2]'::vector").fetchone()   # and with vectors registered
        monkeypatch.undo()
        conn.execute("SELECT 1")


def test_a_connection_that_cannot_be_set_up_is_closed(database_url, monkeypatch):
    opened = []
    real_connect = psycopg.connect

    def connect(*args, **kwargs):
        opened.append(real_connect(*args, **kwargs))
        return opened[-1]

    def broken(_conn):
        raise psycopg.OperationalError("set-up failed")

    with psycopg.connect(database_url, autocommit=True) as conn:
        open_like = db.opener(conn)
        monkeypatch.setattr(psycopg, "connect", connect)
        monkeypatch.setattr(db, "_configure", broken)
        with pytest.raises(psycopg.OperationalError, match="set-up failed"):
            open_like()
    assert len(opened) == 1 and opened[0].closed
