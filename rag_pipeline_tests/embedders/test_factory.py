"""The provider switch: the right embedder for the settings, or a clear error before any work."""

from __future__ import annotations

import pytest

from rag_pipeline.embedders.base import EmbeddingError
from rag_pipeline.embedders.factory import make_embedder
from rag_pipeline.embedders.hash_embedder import HashEmbedder
from rag_pipeline.embedders.local import LocalEmbedder
from rag_pipeline.embedders.openai_embedder import OpenAIEmbedder
from rag_pipeline.settings import Settings

_ENV = ["EMBEDDING_PROVIDER", "OPENAI_API_KEY", "OPENAI_BASE_URL", "EMBEDDING_MODEL", "EMBEDDING_DIMENSIONS",
        "EMBEDDING_TIMEOUT_S", "EMBEDDING_MAX_RETRIES"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: object) -> None:
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # no stray .env


def settings(**env: object) -> Settings:
    return Settings(_env_file=None, **env)  # type: ignore[arg-type]


def test_hash_provider_with_default_and_explicit_dimensions() -> None:
    embedder = make_embedder(settings(EMBEDDING_PROVIDER="hash"))
    assert isinstance(embedder, HashEmbedder) and embedder.dimensions == 256
    assert make_embedder(settings(EMBEDDING_PROVIDER="hash", EMBEDDING_DIMENSIONS=32)).dimensions == 32


def test_local_is_the_default_without_a_key() -> None:
    embedder = make_embedder(settings())
    assert isinstance(embedder, LocalEmbedder) and embedder.dimensions == 384


def test_local_refuses_other_dimensions() -> None:
    with pytest.raises(EmbeddingError, match="always has 384"):
        make_embedder(settings(EMBEDDING_PROVIDER="local", EMBEDDING_DIMENSIONS=768))


def test_openai_needs_a_key() -> None:
    with pytest.raises(EmbeddingError, match="OPENAI_API_KEY"):
        make_embedder(settings(EMBEDDING_PROVIDER="openai"))


def test_openai_is_chosen_with_a_key_and_follows_the_settings() -> None:
    embedder = make_embedder(settings(OPENAI_API_KEY="sk-x", OPENAI_BASE_URL="http://127.0.0.1:9/v1",
                                      EMBEDDING_MODEL="text-embedding-3-large", EMBEDDING_DIMENSIONS=1024,
                                      EMBEDDING_MAX_RETRIES=2))
    assert isinstance(embedder, OpenAIEmbedder)
    assert (embedder.model, embedder.dimensions, embedder.max_retries) == ("text-embedding-3-large", 1024, 2)
