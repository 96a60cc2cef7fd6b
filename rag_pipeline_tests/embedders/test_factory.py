"""The provider switch: the right embedder for the settings, or a clear error before any work."""

from __future__ import annotations

import pytest

from rag_pipeline.embedders.base import EmbeddingError
from rag_pipeline.embedders.factory import (
    configured_differs,
    indexing_chunk_budget,
    make_embedder,
    make_embedder_for_space,
    make_indexing_embedder,
    space_provider,
)
from rag_pipeline.embedders.hash_embedder import HashEmbedder
from rag_pipeline.embedders.local_embedder import LocalEmbedder
from rag_pipeline.embedders.openai_embedder import OpenAIEmbedder
from rag_pipeline.settings import Settings
from rag_pipeline.store.spaces import Space
from rag_pipeline_tests.fakes.openai_server import FakeOpenAI

_ENV = ["EMBEDDING_PROVIDER", "OPENAI_API_KEY", "ANSWER_API_KEY", "OPENAI_BASE_URL", "EMBEDDING_MODEL", "EMBEDDING_DIMENSIONS",
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
    assert (embedder.model, embedder.dimensions, embedder.retrying.max_retries) == ("text-embedding-3-large", 1024, 2)


# -- the embedder of an existing space (how questions are embedded) --------------------------


def space(model: str, dimensions: int) -> Space:
    return Space(space_id=1, model=model, dimensions=dimensions, status="active")


def test_a_space_is_recognised_by_its_model_name() -> None:
    assert space_provider(LocalEmbedder.model, 384) == "local"
    assert space_provider(HashEmbedder(48).model, 48) == "hash"
    assert space_provider("hash-v1-48", 64) == "openai"      # a name and a size that disagree: not ours
    assert space_provider("text-embedding-3-small", 1536) == "openai"
    assert space_provider("nomic-embed-text", 768) == "openai"


@pytest.mark.parametrize("env", [{}, {"OPENAI_API_KEY": "sk-x"}, {"EMBEDDING_PROVIDER": "hash"}])
def test_local_and_hash_spaces_get_their_own_embedder_whatever_is_configured(env: dict) -> None:
    local = make_embedder_for_space(settings(**env), space(LocalEmbedder.model, 384))
    assert isinstance(local, LocalEmbedder)
    hashed = make_embedder_for_space(settings(**env), space("hash-v1-48", 48))
    assert isinstance(hashed, HashEmbedder) and (hashed.model, hashed.dimensions) == ("hash-v1-48", 48)


def test_an_openai_space_needs_the_openai_key_not_a_chat_key() -> None:
    with pytest.raises(EmbeddingError, match=r"built with text-embedding-3-small \(512 dims\), which needs OPENAI_API_KEY"):
        make_embedder_for_space(settings(ANSWER_API_KEY="sk-chat"), space("text-embedding-3-small", 512))


@pytest.mark.parametrize(("dimensions", "sent"), [(1536, None), (64, 64)])
def test_an_openai_space_is_asked_for_its_model_and_size(dimensions: int, sent: int | None) -> None:
    with FakeOpenAI(dimensions=1536) as fake:
        embedder = make_embedder_for_space(
            settings(EMBEDDING_PROVIDER="local", EMBEDDING_MODEL="text-embedding-3-large",
                     OPENAI_API_KEY="sk-x", OPENAI_BASE_URL=fake.base_url),
            space("text-embedding-3-small", dimensions))
        assert len(embedder.embed(["a question"]).vectors[0]) == dimensions
        (call,) = fake.calls
        # The native size is not sent, exactly as when the space was built without EMBEDDING_DIMENSIONS.
        assert (call.model, call.dimensions) == ("text-embedding-3-small", sent)


# -- what pages are embedded with: the active space, the configured model only for the first ------


def test_the_configured_embedder_makes_only_the_first_space() -> None:
    keyed = settings(OPENAI_API_KEY="sk-chat")
    assert isinstance(make_indexing_embedder(keyed, None), OpenAIEmbedder)       # empty index
    assert isinstance(make_indexing_embedder(keyed, space(LocalEmbedder.model, 384)), LocalEmbedder)
    hashed = make_indexing_embedder(settings(EMBEDDING_PROVIDER="local"), space("hash-v1-64", 64))
    assert isinstance(hashed, HashEmbedder) and hashed.dimensions == 64


def test_the_chunk_budget_is_the_active_models() -> None:
    keyed = settings(OPENAI_API_KEY="sk-chat")
    assert indexing_chunk_budget(keyed, None) == (512, 64, None)
    local = indexing_chunk_budget(keyed, space(LocalEmbedder.model, 384))
    # The local model's chunks also fit its 256 wordpieces, which cl100k counts do not bound.
    assert local[:2] == (160, 32) and (local.window.name, local.window.limit) == ("wp256", 256)
    assert indexing_chunk_budget(settings(), space("text-embedding-3-small", 1536)) == (512, 64, None)
    assert indexing_chunk_budget(settings(CHUNK_MAX_TOKENS=300), space(LocalEmbedder.model, 384))[:2] == (300, 32)
    assert indexing_chunk_budget(settings(), None).window.name == "wp256"   # the first space: local


def test_a_configured_model_other_than_the_active_one_is_noted_not_refused() -> None:
    local_space = space(LocalEmbedder.model, 384)
    assert configured_differs(settings(), local_space) is None
    assert configured_differs(settings(OPENAI_API_KEY="sk-chat"), None) is None
    note = configured_differs(settings(OPENAI_API_KEY="sk-chat"), local_space)
    assert note is not None
    assert "text-embedding-3-small (1536 dims" in note and f"{LocalEmbedder.model} (384 dims)" in note
    assert "space build" in note and "space activate" in note
    assert configured_differs(settings(EMBEDDING_PROVIDER="hash", EMBEDDING_DIMENSIONS=64), space("hash-v1-64", 64)) is None
    assert "hash-v1-32" in configured_differs(settings(EMBEDDING_PROVIDER="hash", EMBEDDING_DIMENSIONS=32),
                                              space("hash-v1-64", 64))
    unknown = configured_differs(settings(OPENAI_API_KEY="k", EMBEDDING_MODEL="nomic-embed-text"), local_space)
    assert "nomic-embed-text (size unknown" in unknown
