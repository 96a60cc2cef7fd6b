"""Fetch a page, turn it into markdown, and deliver it to a receiver exactly as Crawlbase does:
POST, gzip body, `rid`/`url`/`Original-Status`/`PC-Status` headers plus the callback headers.

Shared by the local crawler and the simulator, so both deliver byte-for-byte the same way.
"""

from __future__ import annotations

import gzip
import re
import time
from dataclasses import dataclass

import httpx
from bs4 import BeautifulSoup
from markdownify import MarkdownConverter

from rag_pipeline.core.retrying import Backoff, is_retryable_status
from rag_pipeline.crawl.guarded_http import FetchError, Refused, fetch

# Crawlbase's own "the crawl failed" statuses are 5xx in PC-Status; we use 520 for a fetch that
# failed at the network level (timeout, refused, TLS) and keep the site's status when there is one.
CRAWL_FAILED = 520
MAX_PAGE_BYTES = 20 * 1024 * 1024
# The whole fetch, redirects and a slow body included: a site that drips bytes frees its worker.
FETCH_DEADLINE_S = 120.0
_DROP = ("script", "style", "noscript", "template", "iframe", "svg")


@dataclass(frozen=True)
class Fetched:
    final_url: str
    original_status: int | None   # the site's answer (after redirects)
    crawler_status: int           # 200 when the crawl itself worked
    markdown: str
    error: str | None = None


def html_to_markdown(html: str) -> str:
    """The readable part of an HTML page as markdown (ATX headings), scripts and styles dropped."""
    soup = BeautifulSoup(html, "html.parser")
    for tag in soup(_DROP):
        tag.decompose()
    root = soup.find("main") or soup.find("article") or soup.body or soup
    text = MarkdownConverter(heading_style="ATX", bullets="-", strip=["img"]).convert_soup(root)
    if not (root.find("h1") if hasattr(root, "find") else None) and soup.title and soup.title.string:
        text = f"# {soup.title.string.strip()}\n\n{text}"
    return text.strip() + "\n"


def fetch_markdown(client: httpx.Client, url: str, *, max_bytes: int = MAX_PAGE_BYTES,
                   deadline_s: float = FETCH_DEADLINE_S, check=None) -> Fetched:
    """GET `url` through the guard (`guarded_http.fetch`) and convert it.

    A failure of the network or of the answer's form is a crawl that failed (status 520 with its
    reason), as Crawlbase delivers one. A hop the guard refuses raises `Refused`: nothing of it
    may be delivered, not even a failure under its URL. `check`: robots.txt's word on each hop
    (`guarded_http.fetch`).
    """
    try:
        with fetch(client, url, deadline_s=deadline_s, check=check) as answer:
            body = answer.read(max_bytes)
            content_type, charset = answer.content_type, answer.charset
            final_url, status = answer.url, answer.status
    except Refused:
        raise
    except FetchError as exc:
        return Fetched(url, None, CRAWL_FAILED, "", str(exc))
    try:
        text = body.decode(charset or "utf-8", errors="replace")
    except LookupError:   # a charset Python does not know
        text = body.decode("utf-8", errors="replace")
    if "html" in content_type or text.lstrip()[:15].lower().startswith(("<!doctype html", "<html")):
        text = html_to_markdown(text)
    return Fetched(final_url, status, 200, text)


class DeliveryFailed(RuntimeError):
    """A delivery the receiver refused, or never took after the retries: the push it belongs to
    failed (the message is the reason recorded on it)."""


def delivery_headers(rid: str, fetched: Fetched, extra: dict[str, str]) -> dict[str, str]:
    headers = {
        **extra,
        "rid": rid,
        "url": fetched.final_url,
        "PC-Status": str(fetched.crawler_status),
        "CB-Status": str(fetched.crawler_status),
        "Content-Type": "text/plain; charset=utf-8",
        "Content-Encoding": "gzip",
    }
    if fetched.original_status is not None:
        headers["Original-Status"] = str(fetched.original_status)
    return headers


def post_delivery(client: httpx.Client, callback_url: str, headers: dict[str, str], body: bytes) -> int:
    """One delivery attempt; returns the receiver's status, or 0 when it could not be reached."""
    return send_delivery(client, callback_url, headers, body)[0]


def send_delivery(client: httpx.Client, callback_url: str, headers: dict[str, str],
                  body: bytes) -> tuple[int, str]:
    """One delivery attempt: (the receiver's status, its reason), status 0 when unreachable."""
    try:
        resp = client.post(callback_url, headers=headers, content=gzip.compress(body))
    except httpx.HTTPError as exc:
        return 0, f"{type(exc).__name__}: {exc}"
    return resp.status_code, "" if resp.is_success else answer_reason(resp)


def answer_reason(resp: httpx.Response) -> str:
    """The receiver's reason on one line: its JSON `error`, else the body's text without tags."""
    try:
        data = resp.json()
    except ValueError:
        data = None
    if isinstance(data, dict) and data.get("error"):
        text = str(data["error"])
    else:
        text = re.sub(r"<[^>]*>", " ", resp.text)
    return " ".join(text.split())[:200] or resp.reason_phrase


def deliver(client: httpx.Client, callback_url: str, rid: str, fetched: Fetched, extra: dict[str, str],
            *, retries: int, backoff_s: float) -> int:
    """Deliver with bounded retries (same rid each time); returns the attempts used."""
    headers = delivery_headers(rid, fetched, extra)
    body = fetched.markdown.encode("utf-8")
    status, reason = 0, ""
    for attempt in range(retries + 1):
        status, reason = send_delivery(client, callback_url, headers, body)
        if 200 <= status < 300:
            return attempt + 1
        if not is_retryable_status(status):   # 401 bad token, 400 bad delivery, 413 too large
            raise DeliveryFailed(f"receiver refused the delivery: {status} {reason}")
        if attempt < retries:
            time.sleep(Backoff(backoff_s).delay(attempt))
    answered = f"receiver answered {status} {reason}" if status else f"receiver unreachable: {reason}"
    raise DeliveryFailed(f"delivery failed after {retries + 1} attempt(s): {answered}")
