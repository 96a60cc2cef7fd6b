"""`rag-pipeline ask`: retrieve as `search` does, ask a chat model, print only the sources it cited.

Never citing a tombstoned page. Retrieval reads `chunks`, and a tombstone deletes a page's chunks
in the same transaction that sets `deleted_at` (store/pages.py `tombstone`), so the passages sent
to the model are all of live pages at the moment of the scan (search also filters
`deleted_at IS NULL`). The model then takes seconds, and a page can be tombstoned (or become a
redirect) meanwhile: so once the reply is parsed, the cited URLs are checked again in one indexed
query, and a source whose page left search is withdrawn (its markers removed from the text,
reported as `withdrawn`) instead of printed. What is printed is the index as of that re-check; a
tombstone committed in the microseconds between it and the print is the only gap, and it is
the same one every read has.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from rag_pipeline.core.answering import Passage, build_prompt, parse_citations, remove_citations
from rag_pipeline.core.filters import SearchFilters
from rag_pipeline.embedders.base import Embedder
from rag_pipeline.query.chat import ChatReply, OpenAIChat
from rag_pipeline.query.retrieval import Mode, retrieve
from rag_pipeline.settings import Settings
from rag_pipeline.store.search import Citation, live_urls
from rag_pipeline.store.spaces import Space

NOT_CONFIGURED = (
    "`ask` needs a chat model and none is configured: set OPENAI_API_KEY (OpenAI), or ANSWER_API_KEY "
    "and ANSWER_BASE_URL for any OpenAI-compatible server, and ANSWER_MODEL to choose the model. "
    "`rag-pipeline search` works without one."
)


class NotConfigured(RuntimeError):
    """No chat endpoint is configured."""


@dataclass(frozen=True)
class CitedSource:
    """A source the answer cites: its number in the answer, and the passage it stands for."""

    number: int
    citation: Citation

    def as_dict(self) -> dict:
        return {"source": self.number, **self.citation.as_dict()}


@dataclass
class Answer:
    question: str
    #: None when retrieval found nothing and the model was not asked.
    text: str | None
    #: Only the sources the answer cites, in order of first use; all of pages live at the re-check.
    sources: list[CitedSource] = field(default_factory=list)
    #: Markers the model wrote that name no source sent (removed from ``text``).
    unknown_markers: list[int] = field(default_factory=list)
    #: Cited sources whose page was tombstoned (or redirected) while the model answered.
    withdrawn: list[CitedSource] = field(default_factory=list)
    retrieved: int = 0
    sources_sent: int = 0
    source_tokens: int = 0
    top_source_truncated: bool = False
    reply: ChatReply | None = None

    def as_dict(self) -> dict:
        return {
            "question": self.question,
            "answer": self.text,
            "citations": [s.as_dict() for s in self.sources],
            "unknown_markers": self.unknown_markers,
            "withdrawn": [{"source": s.number, "url": s.citation.url} for s in self.withdrawn],
            "retrieved": self.retrieved,
            "sources_sent": self.sources_sent,
            "source_tokens": self.source_tokens,
            "model": self.reply.model if self.reply else None,
            "finish_reason": self.reply.finish_reason if self.reply else None,
            "usage": self.reply.usage() if self.reply else None,
            "retries": self.reply.retries if self.reply else 0,
        }


def make_chat(settings: Settings) -> OpenAIChat:
    """The configured chat endpoint, or NotConfigured when there is no key at all."""
    api_key, base_url = settings.resolved_answer_endpoint()
    if not api_key:
        raise NotConfigured(NOT_CONFIGURED)
    return OpenAIChat(
        settings.answer_model,
        api_key=api_key,
        base_url=base_url,
        timeout_s=settings.answer_timeout_s,
        max_retries=settings.answer_max_retries,
        max_output_tokens=settings.answer_max_output_tokens,
    )


def answer(conn: psycopg.Connection, settings: Settings, question: str, k: int, chat: OpenAIChat,
           filters: SearchFilters = SearchFilters(),
           embedder_for: Callable[[Space], Embedder] | None = None, mode: Mode | None = None) -> Answer:
    """Retrieve ``k`` passages, answer from those that fit the budget, keep the live cited ones."""
    # Each read in its own short transaction: none stays open (locks held) while the model thinks.
    with conn.transaction():
        # Every passage of the nearest, however many of one page: an answer reads them together.
        hits = retrieve(conn, settings, question, k, per_page=None, filters=filters, embedder_for=embedder_for,
                        mode=mode)
    if not hits:
        return Answer(question=question, text=None)
    prompt = build_prompt(question, [Passage(h.url, h.content) for h in hits], settings.answer_max_context_tokens)
    reply = chat.complete(prompt.messages)
    parsed = parse_citations(reply.content, len(prompt.numbered))
    cited = [CitedSource(n, hits[prompt.passage_index(n)]) for n in parsed.cited]
    with conn.transaction():
        live = live_urls(conn, sorted({s.citation.page_url for s in cited}))
    sources = [s for s in cited if s.citation.page_url in live]
    withdrawn = [s for s in cited if s.citation.page_url not in live]
    return Answer(
        question=question,
        text=remove_citations(parsed.text, [s.number for s in withdrawn]),
        sources=sources,
        unknown_markers=parsed.unknown,
        withdrawn=withdrawn,
        retrieved=len(hits),
        sources_sent=len(prompt.numbered),
        source_tokens=prompt.source_tokens,
        top_source_truncated=prompt.truncated,
        reply=reply,
    )


def warnings(result: Answer) -> list[str]:
    """What a reader of the answer must know that the answer text does not say."""
    notes = []
    if result.unknown_markers:
        shown = ", ".join(f"[{n}]" for n in result.unknown_markers)
        notes.append(f"the model cited {shown}, which names no source it was given: removed")
    for s in result.withdrawn:
        notes.append(f"source [{s.number}] {s.citation.url} left the index while the answer was written "
                     "(tombstoned or redirected): not cited, and what the answer said with it is unsupported")
    if result.text is not None and not result.sources:
        notes.append("the answer cites no source")
    if result.reply is not None and result.reply.finish_reason == "length":
        notes.append("the answer was cut at the output token limit (ANSWER_MAX_OUTPUT_TOKENS)")
    return notes


def format_text(result: Answer) -> str:
    if result.text is None:
        return "no results: the index holds no live passage to answer from (the model was not asked)"
    lines = [result.text, ""]
    if result.sources:
        lines.append("Sources:")
        for s in result.sources:
            d = s.citation.as_dict()
            lines.append(f"[{s.number}] {d['url']}")
            lines.append(f"    verified {d['last_verified_at']}  changed {d['last_changed_at']}")
            lines.append(f"    {d['excerpt']}")
    else:
        lines.append("Sources: none cited")
    reply = result.reply
    if reply is not None:
        usage = (f", {reply.prompt_tokens} prompt + {reply.completion_tokens} completion tokens"
                 if reply.prompt_tokens is not None else "")
        lines.append("")
        lines.append(f"({reply.model}; {result.sources_sent} of {result.retrieved} retrieved passages sent{usage})")
    return "\n".join(lines)
