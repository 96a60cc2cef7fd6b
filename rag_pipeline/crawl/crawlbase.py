"""The Crawlbase Enterprise Crawler through the official `crawlbase` SDK.

A push is `CrawlingAPI.get(url, {crawler, callback: true, format: md, callback_headers, …})`; the
JSON answer carries the rid, and Crawlbase later POSTs the page to the crawler's webhook. The SDK
has no base-URL option: it reads `crawlbase.base_api.CRAWLBASE_API_URL` at call time, which is
how CRAWLBASE_API_URL points it at the simulator.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request

from rag_pipeline.crawl.base import (CrawlerHealth, PushError, Pushed, callback_headers,
                                     encode_callback_headers)
from rag_pipeline.core.retrying import Backoff, is_retryable_status
from rag_pipeline.crawl.ratelimit import RateLimiter

log = logging.getLogger(__name__)
_sdk_lock = threading.Lock()


def _point_sdk(api_url: str) -> None:
    """The SDK reads this module global at call time; it is the only way to point it elsewhere."""
    import crawlbase.base_api

    if crawlbase.base_api.CRAWLBASE_API_URL != api_url:
        with _sdk_lock:
            crawlbase.base_api.CRAWLBASE_API_URL = api_url


def _sdk(api_url: str):
    from crawlbase import CrawlingAPI

    _point_sdk(api_url)
    return CrawlingAPI


class CrawlbaseCrawler:
    name = "crawlbase"

    def __init__(self, *, token: str, crawler_name: str, api_url: str = "https://api.crawlbase.com/",
                 rate: float = 20.0, max_retries: int = 5, backoff_s: float = 0.5, timeout_s: float = 30.0,
                 page_wait_ms: int | None = None, ajax_wait: bool = False):
        if not token:
            raise ValueError("CRAWLBASE_TOKEN is not set")
        if not crawler_name:
            raise ValueError("CRAWLER_NAME is not set (the name of your Crawlbase crawler)")
        self.token = token
        self.crawler_name = crawler_name
        self.api_url = api_url if api_url.endswith("/") else api_url + "/"
        self.limiter = RateLimiter(rate)
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.timeout_s = timeout_s
        self.page_wait_ms = page_wait_ms
        self.ajax_wait = ajax_wait
        # The SDK keeps each answer on the instance (`self.response`): one instance per thread,
        # or concurrent pushes read each other's rids.
        self._local = threading.local()

    @property
    def _api(self):
        api = getattr(self._local, "api", None)
        if api is None:
            api = self._local.api = _sdk(self.api_url)({"token": self.token, "timeout": self.timeout_s})
        return api

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

    def push(self, url: str, *, push_id: int | None = None) -> Pushed:
        last = "no attempt"
        status = None
        for attempt in range(self.max_retries + 1):
            self.limiter.acquire()
            try:
                # A fresh dict each time: the SDK writes `url` into the options it is given.
                api = self._api
                _point_sdk(self.api_url)
                response = api.get(url, self._options(url, push_id))
            except (urllib.error.URLError, OSError, ValueError) as exc:
                status, last = None, f"{type(exc).__name__}: {exc}"
            else:
                status = int(response.get("status_code") or 0)
                if status == 200:
                    rid = _rid(response)
                    if rid:
                        return Pushed(rid, attempt + 1)
                    last = f"answer without rid: {str(response.get('body'))[:200]}"
                elif is_retryable_status(status):
                    last = f"HTTP {status}"
                else:  # 401 bad token, 400 bad URL: retrying changes nothing
                    raise PushError(f"Crawlbase refused the push: HTTP {status}", attempts=attempt + 1,
                                    status=status)
            if attempt < self.max_retries:
                time.sleep(Backoff(self.backoff_s).delay(attempt))   # the SDK's answer carries no headers
        raise PushError(f"push failed after {self.max_retries + 1} attempts: {last}",
                        attempts=self.max_retries + 1, status=status)

    def health(self) -> CrawlerHealth:
        url = f"{self.api_url}crawler/{self.token}/stats"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_s) as resp:
                stats = json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            return CrawlerHealth("unknown", error=f"stats unreadable: {type(exc).__name__}: {exc}")
        return parse_stats(stats, self.crawler_name)

    def drain(self, timeout_s: float) -> int:
        return 0  # Crawlbase crawls on its side

    def delivery_failures(self, rids: list[str]) -> dict[str, str]:
        return {}  # and retries its deliveries there

    def close(self) -> None:
        pass


def _rid(response: dict) -> str | None:
    body = response.get("json")
    if body is None:
        try:
            body = json.loads(response.get("body") or b"{}")
        except ValueError:
            return None
    return str(body["rid"]) if isinstance(body, dict) and body.get("rid") else None


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
