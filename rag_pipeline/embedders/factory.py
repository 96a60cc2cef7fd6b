"""Builds the embedder the settings ask for, failing early on a configuration that cannot work."""

from __future__ import annotations

from rag_pipeline.embedders.base import Embedder, EmbeddingError
from rag_pipeline.settings import Settings


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
        from rag_pipeline.embedders.local import DIMENSIONS, LocalEmbedder

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
