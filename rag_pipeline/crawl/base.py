"""The crawler interface: push a URL (the crawler answers with a request id, and delivers the page
later to our receiver), and read the crawler's health."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class PushError(RuntimeError):
    """A push the crawler did not accept, after the retries it deserved."""

    def __init__(self, message: str, *, attempts: int = 1, status: int | None = None):
        super().__init__(message)
        self.attempts = attempts
        self.status = status


@dataclass(frozen=True)
class Pushed:
    rid: str
    attempts: int = 1


@dataclass(frozen=True)
class RobotsRefusal:
    """A push the crawler took but did not fetch, because robots.txt (as read, not an unreachable
    one) disallows it: no failure of the crawler, a verdict that stands until robots.txt is read
    again, `holds_s` from now (the crawler's robots.txt TTL). `url`: the URL disallowed, the
    page's own or a hop its redirect led to."""

    rule: str
    holds_s: float
    url: str


@dataclass(frozen=True)
class CrawlerHealth:
    """What the crawler says about itself. `status`: active, paused, or unknown (stats unreadable)."""

    status: str
    waiting: int = 0              # pages queued at the crawler, not crawled yet
    retrying: int = 0             # pages the crawler will crawl again (failed crawl or delivery)
    error: str | None = None      # why the stats could not be read
    detail: dict = field(default_factory=dict)


class Crawler(Protocol):
    name: str

    def push(self, url: str, *, push_id: int | None = None) -> Pushed:
        """Ask for one crawl; the page arrives later at the receiver under the returned rid."""
        ...

    def health(self) -> CrawlerHealth:
        ...

    def drain(self, timeout_s: float) -> int:
        """Wait until work this process started is delivered; returns what is still pending.
        The local crawler fetches in this process, so a run must not end before it is done."""
        ...

    def delivery_failures(self, rids: list[str]) -> dict[str, str]:
        """rid → reason for the pushes among `rids` whose delivery this process gave up on (the
        local crawler; Crawlbase retries its deliveries on its side and reports none)."""
        ...

    def robots_refusals(self, rids: list[str]) -> dict[str, RobotsRefusal]:
        """rid → why, for the pushes among `rids` not fetched because robots.txt disallows them
        (the local crawler; Crawlbase reads no robots.txt: a reading of the site marks those)."""
        ...

    def close(self) -> None:
        ...


def callback_headers(url: str, push_id: int | None) -> dict[str, str]:
    """What every delivery of this push carries back to the receiver: the pushed URL (redirects)
    and our push id. `|` separates Crawlbase callback headers, so it never appears raw in a value."""
    headers = {"pushed-url": url.replace("|", "%7C")}
    if push_id is not None:
        headers["push-id"] = str(push_id)
    return headers


def encode_callback_headers(headers: dict[str, str]) -> str:
    """Crawlbase's `callback_headers` format: NAME:VALUE|NAME2:VALUE2 (URL-encoded by the SDK)."""
    return "|".join(f"{k}:{v}" for k, v in headers.items())


def decode_callback_headers(value: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in value.split("|"):
        name, sep, val = part.partition(":")
        if sep and name.strip():
            out[name.strip()] = val
    return out
