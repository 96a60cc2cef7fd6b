"""The test embedder must be deterministic everywhere and lexical enough to make search tests meaningful."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

from rag_pipeline.core.tokens import count_tokens
from rag_pipeline.embedders.base import Embedder
from rag_pipeline.embedders.hash_embedder import HashEmbedder

REPO_ROOT = Path(__file__).resolve().parents[2]
CHUNKS = [
    "pgvector is a PostgreSQL extension that stores vectors and runs HNSW nearest-neighbour search.",
    "Dagster is an orchestrator: assets, sensors and jobs describe how data is produced.",
    "Crawlbase crawls pages asynchronously and delivers them to a webhook with a request id.",
    "tiktoken counts tokens with the cl100k_base encoding used by OpenAI embedding models.",
]


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


def test_shape_name_and_unit_norm() -> None:
    embedder = HashEmbedder()
    assert isinstance(embedder, Embedder)
    assert (embedder.model, embedder.dimensions) == ("hash-v1-256", 256)
    result = embedder.embed(CHUNKS + [""])
    assert len(result.vectors) == len(CHUNKS) + 1
    for v in result.vectors:
        assert len(v) == 256
        assert math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, rel_tol=1e-9)
    assert result.tokens == sum(count_tokens(t) for t in CHUNKS)
    assert HashEmbedder(32).model == "hash-v1-32"


def test_deterministic_across_instances_and_processes() -> None:
    text = "The same text always gets the same vector."
    here = HashEmbedder(64).embed([text]).vectors[0]
    assert here == HashEmbedder(64).embed([text, "other"]).vectors[0]
    # A fresh interpreter has a different str hash salt: the vector must not depend on it.
    code = (
        "from rag_pipeline.embedders.hash_embedder import HashEmbedder;"
        f"print(repr(HashEmbedder(64).vector({text!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env={"PYTHONHASHSEED": "12345", "PYTHONPATH": str(REPO_ROOT)}).stdout
    assert eval(out) == here  # repr of a list of floats round-trips exactly


def test_lexically_similar_texts_are_close() -> None:
    embedder = HashEmbedder()
    vectors = embedder.embed(CHUNKS).vectors
    for question, expected in [
        ("what is pgvector", 0),
        ("what is Dagster", 1),
        ("how does crawlbase deliver pages", 2),
        ("what is tiktoken", 3),
    ]:
        q = embedder.embed([question]).vectors[0]
        scores = [_cos(q, v) for v in vectors]
        assert scores.index(max(scores)) == expected, (question, scores)
    same_words = embedder.vector("vector search in postgres")
    assert _cos(same_words, embedder.vector("Vector search in Postgres!")) > 0.999
    assert _cos(same_words, embedder.vector("postgres vector search")) > 0.5  # unigrams shared, bigrams not


def test_empty_list_does_no_work() -> None:
    result = HashEmbedder().embed([])
    assert (result.vectors, result.tokens, result.requests, result.retries) == ([], 0, 0, 0)
