"""In front of FastAPI: the bearer token, each token's rate, the requests in flight and the body.

Checked before FastAPI reads or validates anything, so a request without the token is answered
401 before its body is read, and one over the cap 413 before it is all read. A POST to /search or
/ask must carry a body, as JSON: an empty one, or one sent with another content type (`curl -d`
sends application/x-www-form-urlencoded), is refused here with a reason that says what to send,
rather than FastAPI's "Field required" or "the body must be a JSON object"."""

from __future__ import annotations

import hmac
import math

from rag_pipeline.crawl.ratelimit import RateLimiter
from webhook_sensor.app import ClientGone, read_capped, token_digest
from webhook_sensor.intake import HeaderIndex, Refused

from query_api.errors import error_response

MAX_BODY_BYTES = 64 * 1024
# Paths anyone may read: health for load balancers. The schema and its docs join them only when
# QUERY_API_PUBLIC_DOCS makes them public (else they are not served at all).
PUBLIC_PATHS = frozenset({"/healthz"})
DOCS_PATHS = frozenset({"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
# The routes whose POST carries a JSON body.
BODY_PATHS = frozenset({"/search", "/ask"})
EXAMPLE_BODY = '{"question": "how do I rotate the webhook token?"}'


class RateLimited(Refused):
    def __init__(self, wait_s: float):
        super().__init__(429, "rate_limited", f"too many requests for this token; retry in {wait_s:.1f} s")
        self.retry_after = max(1, math.ceil(wait_s))


def check_body(path: str, method: str, headers: HeaderIndex, body: bytes) -> None:
    """A POST to a route that takes a body: there is one, and it is declared as JSON (FastAPI
    reads a body as JSON only when its Content-Type says so)."""
    if method != "POST" or path not in BODY_PATHS:
        return
    if not body.strip():
        raise Refused(422, "empty_body", f"the body is empty: send a JSON object with the question, "
                                         f"e.g. {EXAMPLE_BODY}, as Content-Type: application/json")
    declared = headers.getlist("content-type")
    if not declared:
        raise Refused(415, "unsupported_media_type",
                      "the body has no Content-Type: send it as JSON, with Content-Type: application/json")
    media = declared[0].split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise Refused(415, "unsupported_media_type",
                      f"the body is sent as {declared[0][:80]!r}: send it as JSON, with Content-Type: application/json")


class Guard:
    """The bearer token (401), its rate (429), the in-flight limit (503), the body cap (413,
    before the body is read when Content-Length says so) and the body's form (422, 415), for
    every path but the public ones."""

    def __init__(self, app, expected_digest: bytes | None, max_inflight: int, rate: float = 20.0, burst: int = 40,
                 public_paths: frozenset[str] = PUBLIC_PATHS):
        self.app, self.expected_digest, self.max_inflight = app, expected_digest, max_inflight
        self.public_paths = public_paths
        self.inflight = 0
        self.rate, self.burst = rate, burst
        self.buckets: dict[bytes, RateLimiter] = {}    # per token (its digest): one client cannot starve the rest

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in self.public_paths:
            await self.app(scope, receive, send)
            return
        headers = HeaderIndex(scope["headers"])
        try:
            self._check_rate(self._check_token(headers))
            if self.inflight >= self.max_inflight:
                raise Refused(503, "busy", f"{self.max_inflight} requests in flight already; retry shortly")
            body = await read_capped(headers, receive, MAX_BODY_BYTES)
            check_body(scope["path"], scope["method"], headers, body)
        except Refused as exc:
            await error_response(exc.status, exc.reason, exc.message,
                                 retry_after=getattr(exc, "retry_after", None))(scope, receive, send)
            return
        except ClientGone:
            return
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        self.inflight += 1
        try:
            await self.app(scope, replay, send)
        finally:
            self.inflight -= 1

    def _check_token(self, headers: HeaderIndex) -> bytes:
        """The token's digest (what its rate is counted under); 401 for a missing or wrong one."""
        if self.expected_digest is None:
            return b""
        values = headers.getlist("authorization")
        scheme, _, given = (values[0] if values else "").partition(" ")
        digest = token_digest(given.strip())
        if scheme.lower() != "bearer" or not hmac.compare_digest(digest, self.expected_digest):
            raise Refused(401, "bad_token", "missing or wrong token: send Authorization: Bearer <QUERY_API_TOKEN>")
        return digest

    def _check_rate(self, digest: bytes) -> None:
        bucket = self.buckets.get(digest)
        if bucket is None:
            bucket = self.buckets[digest] = RateLimiter(self.rate, self.burst)
        wait_s = bucket.try_acquire()
        if wait_s > 0:
            raise RateLimited(wait_s)
