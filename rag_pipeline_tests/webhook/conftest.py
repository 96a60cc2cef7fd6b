"""Fixtures of the receiver tests: a real app on a real (fresh) database, and its log lines."""

from __future__ import annotations

import gzip
import json
import logging

import pytest
from fastapi.testclient import TestClient

from rag_pipeline.settings import Settings
from webhook_sensor.app import create_app
from webhook_sensor.observability import ACCESS_LOGGER, JsonFormatter

TOKEN = "s3cret-token"
PAGE = b"# Title\n\nSome text about pgvector.\n"


def headers(**extra) -> dict[str, str]:
    base = {"rid": "rid-1", "url": "https://example.com/a", "Original-Status": "200", "CB-Status": "200",
            "Content-Encoding": "gzip"}
    base.update(extra)
    return {k: v for k, v in base.items() if v is not None}


def post(client, *, token=TOKEN, body=gzip.compress(PAGE), **hdrs):
    params = {"token": token} if token is not None else {}
    return client.post("/webhook", params=params, headers=headers(**hdrs), content=body)


def rows(conn):
    return conn.execute(
        "SELECT rid, url, crawler_status, original_status, body_encoding FROM deliveries ORDER BY id"
    ).fetchall()


class LogLines(logging.Handler):
    """The access logger's lines, formatted exactly as they would be written."""

    def __init__(self):
        super().__init__()
        self.setFormatter(JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(self.format(record))

    def parsed(self) -> list[dict]:
        return [json.loads(line) for line in self.lines]


@pytest.fixture
def log_lines():
    handler = LogLines()
    logger = logging.getLogger(ACCESS_LOGGER)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def make_app(database_url, **overrides):
    values = {"WEBHOOK_TOKEN": TOKEN, "WEBHOOK_MAX_PAGE_BYTES": 1_000_000, **overrides}
    return create_app(Settings(**values), database_url=database_url)


@pytest.fixture
def client(database_url):
    with TestClient(make_app(database_url)) as c:
        yield c
