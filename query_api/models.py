"""The query API's request and response bodies: what /search and /ask take and answer, described
in the OpenAPI schema, and checked here so that a bad request is a 422 naming the field."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from rag_pipeline.core.filters import FilterError, SearchFilters, parse_question

MAX_QUESTION_CHARS = 2000
MAX_SITES = 20


class _Filtered(BaseModel):
    """The question and the filters both endpoints take."""

    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS)
    mode: Literal["vector", "lexical", "hybrid"] | None = Field(
        None, description="By meaning, by words, or both fused (null: the server's SEARCH_MODE).")
    max_age: str | None = Field(None, description="Only pages verified within this age: 30m, 12h, 7d, 2w.",
                                examples=["7d"])
    changed_since: str | None = Field(None, description="Only pages whose content changed at or after this "
                                      "date (YYYY-MM-DD, or an ISO date and time; UTC unless it says).",
                                      examples=["2026-11-01"])
    site: list[str] = Field(default_factory=list, max_length=MAX_SITES,
                            description="URL globs (* and ?); a page matching any one passes.",
                            examples=[["https://docs.example.com/*"]])
    _filters: SearchFilters = PrivateAttr(default_factory=SearchFilters)

    @field_validator("question")
    @classmethod
    def _searchable(cls, value: str) -> str:
        try:
            return parse_question(value)
        except FilterError as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _parse_filters(self):
        try:
            self._filters = SearchFilters.parse(self.max_age, self.changed_since, self.site)
        except FilterError as exc:
            raise ValueError(str(exc)) from None
        return self

    @property
    def filters(self) -> SearchFilters:
        return self._filters


class SearchRequest(_Filtered):
    k: int = Field(5, ge=1, le=100, description="Results wanted.")
    per_page: int | None = Field(None, ge=1, le=100, description=(
        "Passages of one page at most (null: no limit); 1 makes every result another source. "
        "Left out: SEARCH_PER_PAGE (3)."))

    def per_page_asked(self) -> int | None | Literal["default"]:
        """What was sent, or "default" when the field was left out (null is sent: no limit)."""
        return self.per_page if "per_page" in self.model_fields_set else "default"


class AskRequest(_Filtered):
    k: int = Field(8, ge=1, le=50, description="Passages retrieved; the best that fit ANSWER_MAX_CONTEXT_TOKENS are sent.")


class CitationOut(BaseModel):
    url: str
    page_url: str
    excerpt: str
    chunk_index: int
    score: float
    last_verified_at: str | None
    last_changed_at: str | None


class SearchResponse(BaseModel):
    question: str
    # `hnsw` and `gin`, or `exact (…)` while an index makes way for a bulk load: exact, only slower.
    vector_scan: str
    lexical_scan: str
    results: list[CitationOut]


class ErrorResponse(BaseModel):
    """Every answer but a 200, whatever refused it (the guard, validation, routing, the work)."""

    error: str = Field(description="What went wrong, for a person.")
    reason: str = Field(description="A stable word a program can switch on (bad_token, invalid_request, …).")
