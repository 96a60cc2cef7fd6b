"""Every knob of the pipeline, read from the environment (and `.env`), documented in the README."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_file=".env", extra="ignore")

    # Where the embedded database and other local state live when DATABASE_URL is unset.
    rag_home: Path = Field(default=Path(".rag"), alias="RAG_HOME")
    database_url: str | None = Field(default=None, alias="DATABASE_URL")

    # Embeddings. `local` is the offline default when no OpenAI key is set.
    embedding_provider: Literal["openai", "local", "hash"] | None = Field(
        default=None, alias="EMBEDDING_PROVIDER"
    )
    openai_api_key: str | None = Field(default=None, alias="OPENAI_API_KEY")
    openai_base_url: str | None = Field(default=None, alias="OPENAI_BASE_URL")
    embedding_model: str = Field(default="text-embedding-3-small", alias="EMBEDDING_MODEL")
    embedding_dimensions: int | None = Field(default=None, alias="EMBEDDING_DIMENSIONS")
    embedding_timeout_s: float = Field(default=60.0, alias="EMBEDDING_TIMEOUT_S")
    embedding_max_retries: int = Field(default=6, alias="EMBEDDING_MAX_RETRIES")

    # Chunking. Unset: sized to the embedding model's window (see chunk_budget).
    chunk_max_tokens: int | None = Field(default=None, alias="CHUNK_MAX_TOKENS", ge=32, le=8000)
    chunk_overlap_tokens: int | None = Field(default=None, alias="CHUNK_OVERLAP_TOKENS", ge=0, le=1000)

    # Webhook receiver.
    webhook_token: str | None = Field(default=None, alias="WEBHOOK_TOKEN")
    webhook_allow_no_token: bool = Field(default=False, alias="WEBHOOK_ALLOW_NO_TOKEN")
    webhook_max_body_bytes: int = Field(default=20 * 1024 * 1024, alias="WEBHOOK_MAX_BODY_BYTES")
    webhook_max_page_bytes: int = Field(default=50 * 1024 * 1024, alias="WEBHOOK_MAX_PAGE_BYTES")

    # Delivery sensor.
    sensor_batch_size: int = Field(default=500, alias="SENSOR_BATCH_SIZE")

    def chunk_budget(self) -> tuple[int, int]:
        """(max tokens, overlap tokens) of a chunk, in cl100k_base tokens.

        The local MiniLM model reads only 256 wordpieces (~200 cl100k tokens): a 512-token
        chunk would be embedded from its first half only, so its default budget is smaller.
        """
        if self.resolved_embedding_provider() == "local":
            default = (160, 32)
        else:
            default = (512, 64)
        return (self.chunk_max_tokens or default[0],
                default[1] if self.chunk_overlap_tokens is None else self.chunk_overlap_tokens)

    def resolved_embedding_provider(self) -> str:
        if self.embedding_provider:
            return self.embedding_provider
        return "openai" if self.openai_api_key else "local"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
