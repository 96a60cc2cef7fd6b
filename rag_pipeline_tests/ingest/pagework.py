"""Helpers for tests that drive the indexing steps directly (no Dagster): deliveries in, page runs."""

from __future__ import annotations

import gzip
import uuid

from rag_pipeline.embedders.hash_embedder import HashEmbedder
from rag_pipeline.ingest import indexing
from rag_pipeline.store import deliveries

MAX = 10_000_000


class CountingEmbedder(HashEmbedder):
    def __init__(self):
        super().__init__(dimensions=64)
        self.inputs: list[str] = []

    def embed(self, texts, token_counts=None):
        self.inputs.extend(texts)
        return super().embed(texts, token_counts)


def put(conn, url: str, text: str, status: int = 200) -> int:
    return deliveries.insert(
        conn, rid=uuid.uuid4().hex, url=url, pushed_url=None, crawler_status=200, original_status=status,
        content_type="text/markdown", body=gzip.compress(text.encode()), body_encoding="gzip",
    )


def index(conn, url: str, embedder, max_tokens=512, overlap=64):
    indexing.take_newest_delivery(conn, url, MAX)
    indexing.stage_chunks(conn, url, max_tokens, overlap)
    return indexing.embed_and_switch(conn, url, embedder)


def doc(n_sections: int, tag: str = "") -> str:
    parts = ["# Handbook"]
    for i in range(n_sections):
        body = " ".join(f"Section {i} sentence {j} about topic{i} and its details{tag}." for j in range(40))
        parts.append(f"## Part {i}\n\n{body}")
    return "\n\n".join(parts)
