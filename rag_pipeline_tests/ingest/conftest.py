import pytest

from rag_pipeline.store import db


@pytest.fixture
def db_conn(database_url):
    with db.connection(database_url) as conn:
        conn.autocommit = True
        yield conn


@pytest.fixture
def hash_embedded(monkeypatch):
    """Call it to record, from then on, every text any HashEmbedder is asked to embed, in order
    (what a change costs): it returns the list it fills."""
    from rag_pipeline.embedders.hash_embedder import HashEmbedder

    def start() -> list[str]:
        texts: list[str] = []
        original = HashEmbedder.embed

        def counting(self, batch, token_counts=None):
            texts.extend(batch)
            return original(self, batch, token_counts)

        monkeypatch.setattr(HashEmbedder, "embed", counting)
        return texts

    return start
