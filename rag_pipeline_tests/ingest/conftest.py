import pytest

from rag_pipeline.store import db


@pytest.fixture
def db_conn(database_url):
    with db.connection(database_url) as conn:
        conn.autocommit = True
        yield conn
