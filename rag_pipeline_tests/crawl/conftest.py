"""Loopback parts for crawl tests: the real receiver, a site, an outage gate, the simulator."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dagster as dg
import httpx
import pytest

from rag_pipeline.crawl.simulator import CrawlbaseSimulator
from rag_pipeline.crawl.loopback_site import LoopbackSite
from rag_pipeline.settings import Settings, get_settings
from rag_pipeline_tests.harness import TOKEN
from rag_pipeline_tests.servers import TLS, serve
from webhook_sensor.app import create_app

CB_TOKEN = "cb-test-token"
CRAWLER_NAME = "rag-test"


class OutageGate:
    """A loopback front for the receiver that can go down (answers 503, like a failing load
    balancer) and come back, so the crawler's retries meet a real outage."""

    def __init__(self, upstream: str):
        self.upstream = upstream
        self.down = threading.Event()
        self.refused = 0
        gate = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if gate.down.is_set():
                    gate.refused += 1
                    status, payload = 503, b'{"error": "receiver down"}'
                else:
                    headers = {k: v for k, v in self.headers.items()
                               if k.lower() not in ("host", "content-length", "connection")}
                    resp = httpx.post(gate.upstream + self.path, headers=headers, content=body, timeout=10,
                                      verify=TLS)
                    status, payload = resp.status_code, resp.content
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        daemon=True)
        self._thread.start()

    @property
    def webhook_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/webhook?token={TOKEN}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def receiver(database_url):
    app = create_app(Settings(WEBHOOK_TOKEN=TOKEN), database_url=database_url)
    with serve(app, health_path="/healthz") as base:
        yield base


@pytest.fixture
def site():
    with LoopbackSite() as s:
        yield s


@pytest.fixture
def gate(receiver):
    g = OutageGate(receiver)
    yield g
    g.close()


@pytest.fixture
def crawl_env(database_url, monkeypatch):
    """The index database, the deterministic embedder, and Crawlbase pointed at `sim` (set later)."""
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.setenv("EMBEDDING_PROVIDER", "hash")
    monkeypatch.setenv("CRAWLER", "crawlbase")
    monkeypatch.setenv("CRAWLBASE_TOKEN", CB_TOKEN)
    monkeypatch.setenv("CRAWLER_NAME", CRAWLER_NAME)
    monkeypatch.setenv("CRAWLER_PUSH_BACKOFF_S", "0.01")
    get_settings.cache_clear()
    return monkeypatch


def make_sim(callback_url: str, monkeypatch, **kwargs) -> CrawlbaseSimulator:
    sim = CrawlbaseSimulator(token=CB_TOKEN, crawler_name=CRAWLER_NAME, callback_url=callback_url,
                             retry_backoff_s=kwargs.pop("retry_backoff_s", 0.05), **kwargs)
    monkeypatch.setenv("CRAWLBASE_API_URL", sim.api_url)
    get_settings.cache_clear()
    return sim.start()


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst
