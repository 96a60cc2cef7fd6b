"""A Crawlbase Enterprise Crawler on loopback, for tests, benchmarks and demos without an account.

It speaks the push API (`GET /?token=…&url=…&crawler=…&callback=true…` → `{"rid": …}`), the stats
endpoint (`GET /crawler/{token}/stats`) and pause/unpause (`POST /crawler/{token}/{name}/pause`),
fetches each pushed page from a (loopback) site, and delivers it like the real crawler: POST to the
crawler's callback URL, gzip body, `rid`/`url`/`Original-Status`/`PC-Status` headers plus the
push's `callback_headers`. A failed delivery is crawled and delivered again later with the same
rid; monitoring probes (`User-Agent: Crawlbase Monitoring Bot 1.0`, `rid: dummyrequest`) run every
`probe_interval_s`, and enough failed probes in a row pause the crawler until it is unpaused
(or, with `auto_resume`, until a probe succeeds again).

Faults on demand (`faults` attribute, changeable while running): delivery delays, duplicate
deliveries, out-of-order delivery, crawler status 503, push API errors (429/503), and pages that
answer 404/410 or redirect whatever the site says. The loopback site (`rag_pipeline.crawl.loopback_site`)
can also serve real 404/410s and redirects.
"""

from __future__ import annotations

import argparse
import json
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import httpx

from rag_pipeline.core.addresses import parse_networks
from rag_pipeline.crawl.base import decode_callback_headers
from rag_pipeline.crawl.guarded_http import Refused, guarded_client
from rag_pipeline.crawl.fetching import CRAWL_FAILED, Fetched, fetch_markdown, post_delivery, delivery_headers

PROBE_USER_AGENT = "Crawlbase Monitoring Bot 1.0"


@dataclass
class Faults:
    delay_s: tuple[float, float] = (0.0, 0.0)   # random delay before each delivery
    duplicate_rate: float = 0.0                  # deliver the same rid twice
    reorder_window: int = 0                      # hold this many deliveries, send them shuffled
    crawler_503_rate: float = 0.0                # deliver a crawl failure (PC-Status 503, no body)
    push_error_rate: float = 0.0                 # the push API answers `push_error_status`
    push_error_status: int = 503
    gone: dict[str, int] = field(default_factory=dict)        # URL → 404/410, whatever the site says
    redirects: dict[str, str] = field(default_factory=dict)   # URL → the URL it lands on


@dataclass
class Job:
    rid: str
    url: str
    extra: dict[str, str]
    attempt: int = 0


@dataclass
class Ledger:
    """What happened, for tests and benchmarks to check against."""
    pushes: dict[str, str] = field(default_factory=dict)          # rid → pushed URL
    delivered: dict[str, int] = field(default_factory=dict)       # rid → successful deliveries
    failed: set[str] = field(default_factory=set)                 # rids given up on
    attempts: int = 0                                             # delivery POSTs, probes excluded
    probes: list[int] = field(default_factory=list)               # probe answers (0: unreachable)


class CrawlbaseSimulator:
    def __init__(self, *, token: str, crawler_name: str, callback_url: str, concurrency: int = 4,
                 max_delivery_retries: int = 5, retry_backoff_s: float = 0.2,
                 probe_interval_s: float | None = None, probe_failures_to_pause: int = 3,
                 auto_resume: bool = False, faults: Faults | None = None, seed: int = 0,
                 host: str = "127.0.0.1", port: int = 0, fetch_timeout_s: float = 10.0):
        self.token = token
        self.crawler_name = crawler_name
        self.callback_url = callback_url
        self.concurrency = concurrency
        self.max_delivery_retries = max_delivery_retries
        self.retry_backoff_s = retry_backoff_s
        self.probe_interval_s = probe_interval_s
        self.probe_failures_to_pause = probe_failures_to_pause
        self.auto_resume = auto_resume
        self.faults = faults or Faults()
        self.ledger = Ledger()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._work = threading.Condition(self._lock)
        self._queue: list[Job] = []
        self._in_flight = 0
        self._retrying = 0
        self._held: list[tuple[Job, Fetched]] = []
        self._paused = False
        self._probe_failures = 0
        self._stop = threading.Event()
        # It stands in for Crawlbase's crawlers, which crawl the loopback sites of tests and benches.
        self._fetch = guarded_client(allowed=parse_networks("127.0.0.0/8, ::1/128"), timeout_s=fetch_timeout_s,
                                     user_agent="Mozilla/5.0 (compatible; CrawlbaseSimulator)")
        self._post = httpx.Client(timeout=10.0, headers={"User-Agent": "Crawlbase Crawler"})
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._threads: list[threading.Thread] = []

    # --- lifecycle -----------------------------------------------------------------------------
    @property
    def api_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/"

    def start(self) -> "CrawlbaseSimulator":
        targets = [self._server.serve_forever] + [self._worker] * self.concurrency
        if self.probe_interval_s:
            targets.append(self._prober)
        for n, target in enumerate(targets):
            thread = threading.Thread(target=target, name=f"crawlbase-sim-{n}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._work:
            self._work.notify_all()
        self._server.shutdown()
        self._server.server_close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._fetch.close()
        self._post.close()

    def __enter__(self) -> "CrawlbaseSimulator":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- state -----------------------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self) -> None:
        with self._work:
            self._paused = True

    def unpause(self) -> None:
        with self._work:
            self._paused = False
            self._probe_failures = 0
            self._work.notify_all()

    def stats(self) -> dict:
        with self._lock:
            return {"crawlers": [{
                "name": self.crawler_name,
                "status": "paused" if self._paused else "active",
                "concurrency": self.concurrency,
                "waiting": len(self._queue),
                "running": self._in_flight,
                "retry": self._retrying,
                "history": {"pushed": len(self.ledger.pushes), "delivered": len(self.ledger.delivered),
                            "failed": len(self.ledger.failed)},
            }]}

    def idle(self) -> bool:
        with self._lock:
            return not (self._queue or self._in_flight or self._retrying or self._held)

    def wait_idle(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.idle():
                return True
            time.sleep(0.02)
        return self.idle()

    def flush_held(self) -> None:
        """Deliver what the reorder fault is holding back (shuffled)."""
        with self._lock:
            held, self._held = self._held, []
        self._rng.shuffle(held)
        for job, fetched in held:
            self._deliver(job, fetched)

    # --- push API --------------------------------------------------------------------------------
    def _push(self, query: dict[str, str]) -> tuple[int, dict]:
        if query.get("token") != self.token:
            return 401, {"error": "invalid token"}
        url = query.get("url", "")
        if urlsplit(url).scheme not in ("http", "https"):
            return 400, {"error": "invalid url"}
        if query.get("crawler") != self.crawler_name:
            return 400, {"error": f"unknown crawler {query.get('crawler')!r}"}
        if query.get("callback") != "true":
            return 400, {"error": "crawler pushes need callback=true"}
        with self._lock:
            if self.faults.push_error_rate and self._rng.random() < self.faults.push_error_rate:
                return self.faults.push_error_status, {"error": "simulated push failure"}
            rid = uuid.uuid4().hex[:24]
            self.ledger.pushes[rid] = url
            self._queue.append(Job(rid, url, decode_callback_headers(query.get("callback_headers", ""))))
            self._work.notify()
        return 200, {"rid": rid}

    def _handler(self):
        sim = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self, status: int, payload: dict) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                # Crawlbase's own clients parse JSON only for this exact content type.
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):  # noqa: N802
                parts = urlsplit(self.path)
                segments = [s for s in parts.path.split("/") if s]
                if not segments:
                    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                    self._answer(*sim._push(query))
                elif len(segments) == 3 and segments[0] == "crawler" and segments[2] == "stats":
                    if segments[1] != sim.token:
                        self._answer(401, {"error": "invalid token"})
                    else:
                        self._answer(200, sim.stats())
                else:
                    self._answer(404, {"error": "not found"})

            def do_POST(self):  # noqa: N802
                segments = [s for s in urlsplit(self.path).path.split("/") if s]
                if len(segments) == 4 and segments[0] == "crawler" and segments[3] in ("pause", "unpause"):
                    if segments[1] != sim.token or segments[2] != sim.crawler_name:
                        self._answer(401, {"error": "invalid token or crawler"})
                        return
                    sim.pause() if segments[3] == "pause" else sim.unpause()
                    self._answer(200, {"success": True})
                else:
                    self._answer(404, {"error": "not found"})

            def log_message(self, *args):
                pass

        return Handler

    # --- crawling and delivery ------------------------------------------------------------------
    def _worker(self) -> None:
        while not self._stop.is_set():
            with self._work:
                self._work.wait_for(lambda: self._stop.is_set() or (self._queue and not self._paused),
                                    timeout=0.5)
                if self._stop.is_set():
                    return
                if not self._queue or self._paused:
                    continue
                job = self._queue.pop(0)
                self._in_flight += 1
            try:
                self._crawl(job)
            finally:
                with self._lock:
                    self._in_flight -= 1

    def _fetched(self, url: str) -> Fetched:
        try:
            return fetch_markdown(self._fetch, url)
        except Refused as exc:   # a crawl that failed, as Crawlbase would deliver it
            return Fetched(url, None, CRAWL_FAILED, "", str(exc))

    def _crawl(self, job: Job) -> None:
        faults = self.faults
        low, high = faults.delay_s
        if high > 0:
            time.sleep(self._rng.uniform(low, high))
        with self._lock:
            failure = faults.crawler_503_rate and self._rng.random() < faults.crawler_503_rate
        if failure:
            fetched = Fetched(job.url, None, 503, "", "simulated crawler failure")
        elif job.url in faults.gone:
            fetched = Fetched(job.url, faults.gone[job.url], 200, "Not Found\n")
        elif job.url in faults.redirects:
            # Crawlbase follows the redirect and reports the final URL in the `url` header.
            landed = self._fetched(faults.redirects[job.url])
            fetched = Fetched(faults.redirects[job.url], landed.original_status, landed.crawler_status,
                              landed.markdown, landed.error)
        else:
            fetched = self._fetched(job.url)
        if faults.reorder_window > 1:
            with self._lock:
                self._held.append((job, fetched))
                full = len(self._held) >= faults.reorder_window
            if full:
                self.flush_held()
            else:
                # Never hold a delivery forever: whatever is held goes out within a second.
                threading.Timer(1.0, self.flush_held).start()
            return
        self._deliver(job, fetched)

    def _deliver(self, job: Job, fetched: Fetched) -> None:
        if self._stop.is_set():
            return
        headers = delivery_headers(job.rid, fetched, job.extra)
        body = fetched.markdown.encode("utf-8")
        with self._lock:
            copies = 2 if self.faults.duplicate_rate and self._rng.random() < self.faults.duplicate_rate else 1
        ok = False
        for _ in range(copies):
            status = post_delivery(self._post, self.callback_url, headers, body)
            with self._lock:
                self.ledger.attempts += 1
            if 200 <= status < 300:
                ok = True
                with self._lock:
                    self.ledger.delivered[job.rid] = self.ledger.delivered.get(job.rid, 0) + 1
        if ok:
            return
        # Like Crawlbase: a failed delivery is crawled again and delivered again, same rid.
        if job.attempt >= self.max_delivery_retries:
            with self._lock:
                self.ledger.failed.add(job.rid)
            return
        job.attempt += 1
        with self._lock:
            self._retrying += 1
        delay = self.retry_backoff_s * (2 ** (job.attempt - 1))

        def requeue() -> None:
            with self._work:
                self._retrying -= 1
                if not self._stop.is_set():
                    self._queue.append(job)
                    self._work.notify()

        timer = threading.Timer(delay, requeue)
        timer.daemon = True
        timer.start()

    def _prober(self) -> None:
        while not self._stop.wait(self.probe_interval_s):
            status = 0
            try:
                status = self._post.post(
                    self.callback_url,
                    headers={"User-Agent": PROBE_USER_AGENT, "rid": "dummyrequest", "url": "https://crawlbase.com",
                             "Content-Encoding": "gzip", "PC-Status": "200", "Original-Status": "200"},
                    content=b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\x03\x00\x00\x00\x00\x00\x00\x00\x00\x00",
                ).status_code
            except httpx.HTTPError:
                status = 0
            with self._work:
                self.ledger.probes.append(status)
                if 200 <= status < 300:
                    self._probe_failures = 0
                    if self._paused and self.auto_resume:
                        self._paused = False
                        self._work.notify_all()
                else:
                    self._probe_failures += 1
                    if self._probe_failures >= self.probe_failures_to_pause:
                        self._paused = True


def main() -> None:
    parser = argparse.ArgumentParser(description="Run the Crawlbase simulator on loopback.")
    parser.add_argument("--port", type=int, default=8901)
    parser.add_argument("--token", required=True)
    parser.add_argument("--crawler", default="rag-pipeline")
    parser.add_argument("--callback", required=True, help="the receiver URL, token included")
    parser.add_argument("--probe-interval", type=float, default=60.0)
    args = parser.parse_args()
    sim = CrawlbaseSimulator(token=args.token, crawler_name=args.crawler, callback_url=args.callback,
                             probe_interval_s=args.probe_interval, port=args.port, auto_resume=True)
    sim.start()
    print(f"Crawlbase simulator at {sim.api_url} (crawler {args.crawler})", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        sim.stop()


if __name__ == "__main__":
    main()
