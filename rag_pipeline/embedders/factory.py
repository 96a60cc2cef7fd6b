"""Builds the embedder the settings ask for, or the one an existing embedding space was built with.

Once the index has an active space, everything embeds with that space's own model: questions
(`search`, `ask`) and pages (the `embeddings` step). The configured embedder (EMBEDDING_PROVIDER,
EMBEDDING_MODEL, EMBEDDING_DIMENSIONS, keys) decides only the first space of an empty index and
what `space build` / `space activate` switch to, so a key set for answers changes nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rag_pipeline.core.chunk_budget import ChunkBudget
from rag_pipeline.embedders.base import Embedder, EmbeddingError
from rag_pipeline.settings import Settings

if TYPE_CHECKING:
    from rag_pipeline.store.spaces import Space


def make_embedder(settings: Settings) -> Embedder:
    """`openai` (needs OPENAI_API_KEY), `local` (offline MiniLM, 384 dims) or `hash` (tests only)."""
    provider = settings.resolved_embedding_provider()
    if provider == "openai":
        if not settings.openai_api_key:
            raise EmbeddingError(
                "EMBEDDING_PROVIDER=openai needs OPENAI_API_KEY (any non-empty key for a "
                "self-hosted OpenAI-compatible server at OPENAI_BASE_URL); "
                "unset EMBEDDING_PROVIDER to use the offline local model instead"
            )
        from rag_pipeline.embedders.openai_embedder import OpenAIEmbedder

        return OpenAIEmbedder(
            settings.embedding_model,
            settings.embedding_dimensions,
            api_key=settings.openai_api_key,
            base_url=settings.openai_base_url,
            timeout_s=settings.embedding_timeout_s,
            max_retries=settings.embedding_max_retries,
        )
    if provider == "local":
        from rag_pipeline.embedders.local_embedder import DIMENSIONS, LocalEmbedder

        if settings.embedding_dimensions not in (None, DIMENSIONS):
            raise EmbeddingError(
                f"EMBEDDING_DIMENSIONS={settings.embedding_dimensions} but the local model "
                f"always has {DIMENSIONS} dimensions; unset it or choose another provider"
            )
        return LocalEmbedder()
    if provider == "hash":
        from rag_pipeline.embedders.hash_embedder import HashEmbedder

        return HashEmbedder(dimensions=settings.embedding_dimensions or 256)
    raise EmbeddingError(f"unknown EMBEDDING_PROVIDER {provider!r}: expected openai, local or hash")


#: The Dagster asset kind of each provider: what the UI shows on `embeddings`.
PROVIDER_KINDS = {"openai": "openai", "local": "onnx", "hash": "python"}


def provider_kind(settings: Settings) -> str:
    return PROVIDER_KINDS[settings.resolved_embedding_provider()]


def space_provider(model: str, dimensions: int) -> str:
    """Which provider made a space, from its name: the local and hash models have fixed names."""
    from rag_pipeline.embedders import local_embedder
    from rag_pipeline.embedders.hash_embedder import MODEL_PREFIX

    if (model, dimensions) == (local_embedder.MODEL_NAME, local_embedder.DIMENSIONS):
        return "local"
    if model == f"{MODEL_PREFIX}{dimensions}":
        return "hash"
    return "openai"


def make_embedder_for_space(settings: Settings, space: Space) -> Embedder:
    """An embedder whose vectors live in ``space``, whatever provider or model is configured.

    Only the OpenAI-compatible endpoint (OPENAI_API_KEY, OPENAI_BASE_URL) and its timeouts come
    from the settings: the model and size are the space's.
    """
    provider = space_provider(space.model, space.dimensions)
    if provider == "local":
        from rag_pipeline.embedders.local_embedder import LocalEmbedder

        return LocalEmbedder()
    if provider == "hash":
        from rag_pipeline.embedders.hash_embedder import HashEmbedder

        return HashEmbedder(dimensions=space.dimensions)
    if not settings.openai_api_key:
        raise EmbeddingError(
            f"the index was built with {space.model} ({space.dimensions} dims), which needs OPENAI_API_KEY "
            "(and OPENAI_BASE_URL for a self-hosted server); a chat key alone cannot embed questions or pages"
        )
    from rag_pipeline.embedders.openai_embedder import KNOWN_DIMENSIONS, OpenAIEmbedder

    # A model's native size is not sent, as when the space was built without EMBEDDING_DIMENSIONS.
    native = KNOWN_DIMENSIONS.get(space.model) == space.dimensions
    return OpenAIEmbedder(
        space.model,
        None if native else space.dimensions,
        api_key=settings.openai_api_key,
        base_url=settings.openai_base_url,
        timeout_s=settings.embedding_timeout_s,
        max_retries=settings.embedding_max_retries,
    )


def configured_space(settings: Settings) -> tuple[str, str, int | None]:
    """(provider, model, dimensions) the settings ask for, without building the embedder.

    The dimensions are None for an OpenAI-compatible model of unknown size with none configured."""
    provider = settings.resolved_embedding_provider()
    if provider == "local":
        from rag_pipeline.embedders import local_embedder

        return provider, local_embedder.MODEL_NAME, local_embedder.DIMENSIONS
    if provider == "hash":
        from rag_pipeline.embedders.hash_embedder import MODEL_PREFIX

        dimensions = settings.embedding_dimensions or 256
        return provider, f"{MODEL_PREFIX}{dimensions}", dimensions
    from rag_pipeline.embedders.openai_embedder import KNOWN_DIMENSIONS

    model = settings.embedding_model
    return provider, model, settings.embedding_dimensions or KNOWN_DIMENSIONS.get(model)


def make_indexing_embedder(settings: Settings, active: Space | None) -> Embedder:
    """What pages are embedded with: the active space's model, or the configured one for the
    first space of an empty index."""
    return make_embedder(settings) if active is None else make_embedder_for_space(settings, active)


def indexing_chunk_budget(settings: Settings, active: Space | None) -> ChunkBudget:
    """The chunk budget of the model pages are embedded with (see Settings.chunk_budget): a key
    set for answers must not re-cut a local index into chunks its model would truncate. The local
    model's chunks also fit its window of wordpieces, which cl100k counts do not bound."""
    provider = settings.resolved_embedding_provider() if active is None else space_provider(active.model, active.dimensions)
    max_tokens, overlap_tokens = settings.model_copy(update={"embedding_provider": provider}).chunk_budget()
    if provider == "local":
        from rag_pipeline.embedders import local_embedder

        return ChunkBudget(max_tokens, overlap_tokens, local_embedder.window())
    return ChunkBudget(max_tokens, overlap_tokens)


def configured_differs(settings: Settings, active: Space | None) -> str | None:
    """A note when the configured embedder is not the active space's model, else None.

    Not an error: indexing goes on in the active space; the switch is `space build` / `space activate`."""
    if active is None:
        return None
    provider, model, dimensions = configured_space(settings)
    if (model, dimensions) == (active.model, active.dimensions):
        return None
    size = f"{dimensions} dims" if dimensions is not None else "size unknown"
    return (
        f"the configured embedder is {model} ({size}, provider {provider}) but the active embedding "
        f"space is {active.model} ({active.dimensions} dims): pages are embedded in the active space. "
        "To switch the index to the configured model, run `rag-pipeline space build`, then "
        "`rag-pipeline space activate` (docs/operations.md, 'Switching models')."
    )
