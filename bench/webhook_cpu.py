"""The receiver's own CPU per delivery, in process: its ASGI app driven directly with the benchmark's
gzip'd pages, the database stubbed out and no network, so only what the receiver itself does per
delivery is counted (token, header parsing, inflating and checking the gzip body, metrics, the
access line, the answer). `bench/webhook_load.py` measures the whole thing over loopback.

    .venv/bin/python bench/webhook_cpu.py [--requests 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from rag_pipeline.settings import Settings  # noqa: E402
from webhook_load import TOKEN, make_bodies  # noqa: E402
from webhook_sensor.app import create_app  # noqa: E402
from webhook_sensor.observability import ACCESS_LOGGER  # noqa: E402


class _Cursor:
    async def fetchone(self):
        return (1,)


class _Connection:
    async def execute(self, *args, **kwargs):
        return _Cursor()


class _Checkout:
    async def __aenter__(self):
        return _Connection()

    async def __aexit__(self, *exc):
        return False


class _Pool:
    def connection(self, *args, **kwargs):
        return _Checkout()


def cpu_per_delivery(requests: int, access_log: bool) -> float:
    app = create_app(Settings(WEBHOOK_TOKEN=TOKEN, WEBHOOK_ACCESS_LOG=access_log), database_url="stubbed")
    for handler in logging.getLogger(ACCESS_LOGGER).handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(open(os.devnull, "w"))  # noqa: SIM115 - written like stderr, read by nobody
    app.state.pool = _Pool()
    bodies = make_bodies()
    prepared = []
    for i in range(200):
        body = bodies[i % len(bodies)]
        prepared.append(([(b"host", b"127.0.0.1"), (b"rid", uuid.uuid4().hex.encode()),
                          (b"url", f"https://bench.example.com/page/{i}".encode()), (b"cb-status", b"200"),
                          (b"original-status", b"200"), (b"content-encoding", b"gzip"),
                          (b"content-type", b"text/markdown; charset=utf-8"),
                          (b"content-length", str(len(body)).encode())], body))
    statuses = []

    async def drive(n: int) -> None:
        for i in range(n):
            headers, body = prepared[i % len(prepared)]
            scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
                     "scheme": "http", "path": "/webhook", "raw_path": b"/webhook",
                     "query_string": f"token={TOKEN}".encode(), "root_path": "", "headers": headers,
                     "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8800), "state": {}}
            messages = [{"type": "http.request", "body": body, "more_body": False}]

            async def receive():
                return messages.pop() if messages else {"type": "http.disconnect"}

            async def send(message):
                if message["type"] == "http.response.start":
                    statuses.append(message["status"])

            await app(scope, receive, send)

    asyncio.run(drive(min(2000, requests)))  # warm-up
    began = time.process_time()
    asyncio.run(drive(requests))
    spent = time.process_time() - began
    assert set(statuses) == {200}, set(statuses)
    return spent / requests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    args = parser.parse_args()
    for access_log in (True, False):
        cost = cpu_per_delivery(args.requests, access_log)
        print(f"receiver CPU per delivery, database stubbed, access line {'on ' if access_log else 'off'}: "
              f"{cost * 1e6:.0f} µs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
