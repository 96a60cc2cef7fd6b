"""The Crawlbase Enterprise Crawler over its HTTP API, through one verifying httpx client.

A push is `GET {api_url}?token=…&crawler=…&callback=true&format=md&callback_headers=…&url=…`; the
JSON answer carries the rid, and Crawlbase later POSTs the page to the crawler's webhook. The query
is the one the official `crawlbase` SDK sent (its parameters, order and encoding), so the
simulator reads it unchanged. The SDK itself is not used: it turned TLS verification off
(`ssl.SSLContext(ssl.PROTOCOL_TLS)`), and the token rides in the query, so whoever sat on the path
read it. Crawlbase wants the token in the query (or, for stats, the path): every message and log
line that could carry a URL is redacted.
"""

from __future__ import annotations

import json
import logging
import re
import ssl
import time
from urllib.parse import urlencode

import httpx

from rag_pipeline.core.retrying import Backoff, is_retryable_status, parse_retry_after
from rag_pipeline.crawl.base import (CrawlerHealth, PushError, Pushed, callback_headers,
                                     encode_callback_headers)
from rag_pipeline.crawl.ratelimit import RateLimiter

_TOKEN_PARAM = re.compile(r"(token=)[^&\s\"'#]+")
# Every crawler's token, for the log filter: the stats URL carries it in its path.
_tokens: set[str] = set()


def redact(text: str, token: str | None = None) -> str:
    """`text` without the token: a URL or an answer that echoed it never reaches a log or a row."""
    if token:
        text = text.replace(token, "***")
    return _TOKEN_PARAM.sub(r"\1***", text)


class _RedactTokens(logging.Filter):
    """httpx logs every request's full URL at INFO: without this, the token with it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(_redact_all(str(a)) if isinstance(a, (str, httpx.URL)) else a
                                for a in record.args)
        if isinstance(record.msg, str):
            record.msg = _redact_all(record.msg)
        return True


def _redact_all(text: str) -> str:
    for token in tuple(_tokens):
        text = text.replace(token, "***")
    return redact(text)


if not any(isinstance(f, _RedactTokens) for f in logging.getLogger("httpx").filters):
    logging.getLogger("httpx").addFilter(_RedactTokens())


class CrawlbaseCrawler:
    name = "crawlbase"

    def __init__(self, *, token: str, crawler_name: str, api_url: str = "https://api.crawlbase.com/",
                 rate: float = 20.0, max_retries: int = 5, backoff_s: float = 0.5, timeout_s: float = 30.0,
                 page_wait_ms: int | None = None, ajax_wait: bool = False,
                 ssl_context: ssl.SSLContext | None = None):
        """`ssl_context` lets a test trust its own CA; it must verify. Unset (production): the
        system's defaults, certifi's CAs with the host name checked."""
        if not token:
            raise ValueError("CRAWLBASE_TOKEN is not set")
        if not crawler_name:
            raise ValueError("CRAWLER_NAME is not set (the name of your Crawlbase crawler)")
        if ssl_context is not None and (ssl_context.verify_mode != ssl.CERT_REQUIRED
                                        or not ssl_context.check_hostname):
            raise ValueError("the Crawlbase client verifies TLS: ssl_context must require a "
                             "certificate and check the host name")
        self.token = token
        _tokens.add(token)
        self.crawler_name = crawler_name
        self.api_url = api_url if api_url.endswith("/") else api_url + "/"
        self.limiter = RateLimiter(rate)
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self.page_wait_ms = page_wait_ms
        self.ajax_wait = ajax_wait
        # One client for every thread (httpx's Client is thread-safe): one pool, one TLS setup.
        self._client = httpx.Client(verify=ssl_context if ssl_context is not None else True,
                                    timeout=timeout_s)

    def _options(self, url: str, push_id: int | None) -> dict:
        options = {
            "crawler": self.crawler_name,
            "callback": "true",
            "format": "md",
            "callback_headers": encode_callback_headers(callback_headers(url, push_id)),
        }
        if self.page_wait_ms:
            options["page_wait"] = str(self.page_wait_ms)
        if self.ajax_wait:
            options["ajax_wait"] = "true"
        return options

    def push_url(self, url: str, push_id: int | None = None) -> str:
        """The SDK's request: token first, the options, `url` last, all `urlencode`d (quote_plus).
        Built as a string, not `params=`, because httpx encodes parameters differently."""
        return f"{self.api_url}?{urlencode({'token': self.token, **self._options(url, push_id), 'url': url})}"

    def _redact(self, text: str) -> str:
        return redact(text, self.token)

    def push(self, url: str, *, push_id: int | None = None) -> Pushed:
        last = "no attempt"
        status = None
        for attempt in range(self.max_retries + 1):
            self.limiter.acquire()
            retry_after = None
            try:
                response = self._client.get(self.push_url(url, push_id))
            except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError) as exc:
                status, last = None, self._redact(f"{type(exc).__name__}: {exc}")
            else:
                status = response.status_code
                if status == 200:
                    rid = _rid(response.content)
                    if rid:
                        return Pushed(rid, attempt + 1)
                    last = self._redact(f"answer without rid: {response.text[:200]}")
                elif is_retryable_status(status):
                    last = f"HTTP {status}"
                    retry_after = parse_retry_after(response.headers)
                else:  # 401 bad token, 400 bad URL: retrying changes nothing
                    raise PushError(f"Crawlbase refused the push: HTTP {status}", attempts=attempt + 1,
                                    status=status)
            if attempt < self.max_retries:
                time.sleep(Backoff(self.backoff_s).delay(attempt, retry_after))
        raise PushError(f"push failed after {self.max_retries + 1} attempts: {last}",
                        attempts=self.max_retries + 1, status=status)

    def health(self) -> CrawlerHealth:
        try:
            response = self._client.get(f"{self.api_url}crawler/{self.token}/stats")
            if response.status_code != 200:
                return CrawlerHealth("unknown", error=f"stats unreadable: HTTP {response.status_code}")
            stats = response.json()
        except (httpx.HTTPError, httpx.InvalidURL, OSError, ValueError) as exc:
            return CrawlerHealth("unknown", error=self._redact(f"stats unreadable: {type(exc).__name__}: {exc}"))
        if not isinstance(stats, dict):
            return CrawlerHealth("unknown", error=f"stats unreadable: a JSON {type(stats).__name__}, not an object")
        return parse_stats(stats, self.crawler_name)

    def drain(self, timeout_s: float) -> int:
        return 0  # Crawlbase crawls on its side

    def delivery_failures(self, rids: list[str]) -> dict[str, str]:
        return {}  # and retries its deliveries there

    def robots_refusals(self, rids: list[str]) -> dict:
        return {}  # it reads no robots.txt: its sites' readings mark what robots.txt disallows

    def close(self) -> None:
        self._client.close()


def _rid(body: bytes) -> str | None:
    """The rid of a push answer: `{"rid": …}`, or, as the SDK also read it, inside a `body` field
    holding an object or JSON text."""
    try:
        answer = json.loads(body or b"{}")
    except ValueError:
        return None
    if isinstance(answer, dict) and not answer.get("rid") and "body" in answer:
        answer = answer["body"]
        if isinstance(answer, str):
            try:
                answer = json.loads(answer)
            except ValueError:
                return None
    return str(answer["rid"]) if isinstance(answer, dict) and answer.get("rid") else None


def parse_stats(stats: dict, crawler_name: str) -> CrawlerHealth:
    """Find our crawler in the stats answer. Its exact shape is not published, so this reads the
    fields tolerantly: a list or a dict of crawlers, `status`/`state` or a `paused` flag, and
    `waiting`/`waiting_queue` and `retry`/`retry_queue` as numbers."""
    crawlers = stats.get("crawlers", stats)
    entry = None
    if isinstance(crawlers, list):
        entry = next((c for c in crawlers if isinstance(c, dict) and c.get("name") == crawler_name), None)
    elif isinstance(crawlers, dict):
        entry = crawlers.get(crawler_name)
    if not isinstance(entry, dict):
        return CrawlerHealth("unknown", error=f"crawler {crawler_name!r} is not in the stats", detail=stats)
    state = str(entry.get("status") or entry.get("state") or "").lower()
    paused = bool(entry.get("paused")) or state == "paused"
    return CrawlerHealth(
        "paused" if paused else "active",
        waiting=_num(entry, "waiting", "waiting_queue"),
        retrying=_num(entry, "retry", "retry_queue", "retrying"),
        detail=entry,
    )


def _num(entry: dict, *names: str) -> int:
    for name in names:
        value = entry.get(name)
        if isinstance(value, dict):
            value = value.get("count", value.get("size"))
        if isinstance(value, (int, float)):
            return int(value)
    return 0
