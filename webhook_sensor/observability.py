"""What the receiver tells its operator: Prometheus metrics and one JSON log line per request.

The token never reaches a log: access lines carry the path without its query string, and a
filter masks `token=` in uvicorn's own access log for anyone who leaves it on.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from urllib.parse import unquote_plus

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector

ACCESS_LOGGER = "webhook_sensor.access"
NOTE_KEY = "webhook.note"  # per-request facts (rid, outcome, reason) the endpoint leaves in the ASGI scope
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# The crawler wants an answer within 200 ms: the buckets resolve well below that.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0)

# A query parameter: its name as written (any spelling: `%74oken` is `token` to the parser).
_QUERY_PARAM = re.compile(r"((?:^|[?&])([^=&?\s\"]*)=)([^&\s\"]*)")


def mask_token(text: str) -> str:
    """Every `token` query parameter masked, however its name is spelt (percent escapes, case)."""
    def masked(match: re.Match) -> str:
        name = unquote_plus(match.group(2)).strip().lower()
        return match.group(1) + "***" if name == "token" else match.group(0)

    return _QUERY_PARAM.sub(masked, text)


@dataclass
class Metrics:
    """Counters of one app. With several uvicorn workers, each process writes its own values to
    PROMETHEUS_MULTIPROC_DIR and /metrics sums them (the `webhook` command sets that up)."""

    registry: CollectorRegistry
    deliveries: Counter
    refusals: Counter
    invalid_utf8: Counter
    latency: Histogram

    @classmethod
    def create(cls) -> Metrics:
        registry = CollectorRegistry(auto_describe=True)
        return cls(
            registry=registry,
            deliveries=Counter("webhook_deliveries", "Deliveries answered 200, by outcome (stored, duplicate, probe)",
                               ["outcome"], registry=registry),
            refusals=Counter("webhook_refusals", "Requests refused (4xx/5xx), by reason",
                             ["reason"], registry=registry),
            invalid_utf8=Counter("webhook_invalid_utf8", "Stored pages whose body is not valid UTF-8 "
                                 "(kept; the sensor replaces the bad bytes and notes it on the row)",
                                 registry=registry),
            latency=Histogram("webhook_request_duration_seconds", "Time to answer POST /webhook",
                              buckets=LATENCY_BUCKETS, registry=registry),
        )

    def exposition(self) -> bytes:
        if os.environ.get(MULTIPROC_ENV):
            registry = CollectorRegistry()
            MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {"ts": round(record.created, 3), "level": record.levelname.lower(), "logger": record.name}
        fields = getattr(record, "fields", None)
        if fields:
            line.update(fields)
        else:
            line["message"] = mask_token(record.getMessage())
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, separators=(",", ":"), default=str)


class MaskToken(logging.Filter):
    """For uvicorn's access log (`client - "POST /webhook?token=… HTTP/1.1" 200`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args and isinstance(record.args, tuple):
            record.args = tuple(mask_token(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.msg, str):
            record.msg = mask_token(record.msg)
        return True


def access_logger() -> logging.Logger:
    """JSON lines on stderr, set up once per process."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(h.formatter, JsonFormatter) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(JsonFormatter())
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    uvicorn_access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, MaskToken) for f in uvicorn_access.filters):
        uvicorn_access.addFilter(MaskToken())
    return logger


class AccessLog:
    """Pure ASGI middleware (cheap, unlike BaseHTTPMiddleware): times each request, feeds the
    latency histogram and writes the access line. Refusals are always logged, with their reason;
    successful deliveries only when `log_all`. POST /webhook, served before this middleware (see
    `app.WebhookApp`), calls `finish` itself."""

    def __init__(self, app, *, metrics: Metrics, logger: logging.Logger, log_all: bool):
        self.app = app
        self.metrics = metrics
        self.logger = logger
        self.log_all = log_all

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        note: dict = {}
        scope[NOTE_KEY] = note
        answered = {"status": 500}

        async def send_and_watch(message):
            if message["type"] == "http.response.start":
                answered["status"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            self.finish(scope, answered["status"], time.perf_counter() - start, note)

    def finish(self, scope, status: int, elapsed: float, note: dict) -> None:
        """Latency histogram (POST /webhook) and the access line of one answered request."""
        path = scope.get("path", "")
        if path == "/webhook":
            self.metrics.latency.observe(elapsed)
        if status >= 400 or self.log_all:
            client = scope.get("client")
            fields = {"event": "access", "method": scope.get("method"), "path": path, "status": status,
                      "ms": round(elapsed * 1000, 2), "client": client[0] if client else None, **note}
            level = logging.WARNING if status >= 400 else logging.INFO
            if self.logger.isEnabledFor(level):
                # makeRecord + handle is Logger.log without findCaller's stack walk (a third of
                # its cost); the line is still written (and flushed) before the next request.
                record = self.logger.makeRecord(self.logger.name, level, __file__, 0, "access", None, None)
                record.fields = fields
                self.logger.handle(record)
