"""Faults: a crawler's worst day through the real receiver, daemon and database, then the index
checked page by page against a clean rebuild of each page's newest crawl (issue 11, point 6).

By default 10,000 deliveries over 300 pages, sent by 8 threads at `--rate` a second, each re-sent
(same rid) until the receiver acknowledges it, as the crawler does:
  - crawls in push order with local reordering (windows of 8 shuffled); each crawl's push is in
    the `pushes` table, so the newest crawl is known by push time whatever the arrival order;
    about half change the page, 5% answer 404/410 (a tombstone; the next 200 is a comeback),
    3% are crawler failures (CB-Status 503);
  - 30% of the sends are same-rid re-sends of an earlier crawl;
  - 5% are bad inputs of 24 kinds, each with the 4xx it must get;
  - 20% of embedding requests answer 429 or 500 (the loopback fake of the tests);
and, as the load goes: the receiver's process group SIGKILLed twice (restarted 2 s later), the
daemon's process group once (daemon, code server and run worker), a run worker alone, the code
server alone, the embedded PostgreSQL postmaster (`rag-pipeline db watch` starts it again; skipped
with DATABASE_URL, a server that is not ours), and the embedding API down for `--outage-s`
(default 600 s: every request 503).

Then it waits for the pipeline to settle (nothing queued, unrouted, due for a retry or leased;
no run queued or in progress) and prints: deliveries sent, acknowledged, duplicates, bad inputs
by kind, kills survived by kind, lost, 5xx, duplicate chunks, resurrected tombstones, pages whose
index differs from a clean rebuild of their newest crawl, stuck deliveries, zombie runs and the
time to settle after the last fault. Last line:
`FAULTS lost=0 mismatches=0 stuck=0 zombies=0 500s=0 duplicate_chunks=0 resurrected=0 … settle=…s …`
(settle: from the end of the last fault until settled; the bench fails above 300 s).

    .venv/bin/python bench/faults.py [--deliveries 10000] [--pages 300] [--rate 20] [--outage-s 600]
        [--settle-timeout 900] [--seed 11] [--keep]

The settings are the production defaults (retry backoff 60 s ×4 up to 300 s, 6 tries; heartbeat
10 s, timeout 60 s), so the settle time is what an operator would see.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import psutil  # noqa: E402
import psycopg  # noqa: E402

from bench.pipeline_throughput import (  # noqa: E402
    BIN, ROLE_CODE, ROLE_WORKER, BenchFailure, Service, base_env, daemon_role, dagster_database, fresh_database,
    free_port, wait_for_first_tick,
)
from rag_pipeline.core.chunking import chunk_markdown  # noqa: E402
from rag_pipeline.core.text import content_hash, embed_hash, normalize_markdown  # noqa: E402
from rag_pipeline.core.urls import normalize_url, page_id  # noqa: E402
from rag_pipeline.embedders.factory import indexing_chunk_budget  # noqa: E402
from rag_pipeline.ingest.rules import default_boilerplate_rules  # noqa: E402
from rag_pipeline.settings import Settings  # noqa: E402
from rag_pipeline.store import spaces  # noqa: E402
from rag_pipeline_tests.fakes.openai_server import FakeOpenAI  # noqa: E402

# This bench plays the crawler: its deliveries answer no push recorded here (docs/security.md).
os.environ.setdefault("WEBHOOK_ACCEPT_UNSOLICITED", "true")

TOKEN = "bench-throughput-token"   # base_env's
DIMENSIONS = 256
THREADS = 8
MAX_BODY = 1024 * 1024
MAX_PAGE = 2 * 1024 * 1024
TERMINAL = ("SUCCESS", "FAILURE", "CANCELED")


# -- the scenario --------------------------------------------------------------------------------


@dataclass
class Send:
    """One delivery as the crawler sends it, and what the receiver must answer."""

    rid: str
    headers: dict[str, str]
    body: bytes
    params: dict[str, str]
    kind: str                      # "crawl", "resend" or a bad input's kind
    expect: int = 200
    crawl: int | None = None       # index into Scenario.crawls
    answers: list[int | None] = field(default_factory=list)


@dataclass
class Crawl:
    page: int
    rid: str
    status: int                    # original status: 200, 404, 410
    crawler_status: int            # 200, or 503 (the crawler failed: no content)
    text: str | None


def page_url(n: int) -> str:
    return f"https://docs.example.com/faults/{n}"


def page_text(rng: random.Random, n: int, version: int) -> str:
    sections = []
    for s in range(rng.randint(2, 5)):
        words = " ".join(f"w{rng.randrange(5000)}" for _ in range(rng.randint(40, 160)))
        sections.append(f"## Section {s} of page {n}\n\nVersion {version} of section {s}: {words}.")
    return f"# Page {n}\n\n" + "\n\n".join(sections)


def crawl_headers(crawl: Crawl) -> dict[str, str]:
    return {"rid": crawl.rid, "url": page_url(crawl.page), "Original-Status": str(crawl.status),
            "CB-Status": str(crawl.crawler_status), "Content-Encoding": "gzip"}


def bad_inputs(rng: random.Random) -> list[tuple[str, int, dict, bytes, dict]]:
    """(kind, expected status, headers, body, params) of each kind of bad input."""
    ok_body = gzip.compress(b"# A page\n\nWith text.")
    url = page_url(rng.randrange(10_000, 20_000))

    def h(**extra) -> dict:
        base = {"rid": f"bad-{uuid.uuid4().hex}", "url": url, "Original-Status": "200", "CB-Status": "200",
                "Content-Encoding": "gzip"}
        base.update({k.replace("_", "-"): v for k, v in extra.items()})
        return {k: v for k, v in base.items() if v is not None}

    good = {"token": TOKEN}
    json_h = {**h(), "Content-Type": "gzip/json"}
    garbage = b"\x1f\x8b\x08\x00" + rng.randbytes(64)
    reserved = bytearray(gzip.compress(b"# Reserved\n\nflags")); reserved[3] |= 0xE0  # noqa: E702
    kinds = [
        ("no_token", 401, h(), ok_body, {}),
        ("wrong_token", 401, h(), ok_body, {"token": "not-the-token"}),
        ("missing_rid", 400, h(rid=None), ok_body, good),
        ("blank_rid", 400, json_h, gzip.compress(json.dumps({"rid": "   ", "url": url, "original_status": 200,
                                                               "pc_status": 200, "body": "# x\n\ny"}).encode()), good),
        ("rid_too_long", 400, h(rid="r" * 300), ok_body, good),
        ("rid_with_space", 400, h(rid="two words"), ok_body, good),
        ("missing_url", 400, h(url=None), ok_body, good),
        ("ftp_url", 400, h(url="ftp://docs.example.com/file"), ok_body, good),
        ("relative_url", 400, h(url="/docs/page"), ok_body, good),
        ("garbled_port", 400, h(url="http://docs.example.com:99999999/x"), ok_body, good),
        ("url_too_long", 400, h(url="https://docs.example.com/" + "a" * 2100), ok_body, good),
        ("status_not_a_number", 400, h(Original_Status="abc"), ok_body, good),
        ("status_out_of_range", 400, h(Original_Status="42"), ok_body, good),
        ("bad_gzip", 400, h(), garbage, good),
        ("truncated_gzip", 400, h(), gzip.compress(b"# T\n\n" + b"text " * 400)[:-12], good),
        ("gzip_reserved_flags", 400, h(), bytes(reserved), good),
        ("empty_body", 400, h(), b"", good),
        ("blank_page", 400, h(), gzip.compress(b"  \n\t \n"), good),
        ("gzip_bomb", 413, h(), gzip.compress(b"\0" * (MAX_PAGE + 4096)), good),
        ("body_too_large", 413, h(Content_Encoding=None), b"x" * (MAX_BODY + 1), good),
        ("json_garbage", 400, json_h, gzip.compress(b"{not json"), good),
        ("json_not_object", 400, {**h(), "Content-Type": "gzip/json"}, gzip.compress(b"[1, 2]"), good),
        ("json_body_not_string", 400, {**h(), "Content-Type": "gzip/json"},
         gzip.compress(json.dumps({"rid": f"bad-{uuid.uuid4().hex}", "url": url, "original_status": 200,
                                   "pc_status": 200, "body": 5}).encode()), good),
        ("json_status_boolean", 400, {**h(), "Content-Type": "gzip/json"},
         gzip.compress(json.dumps({"rid": f"bad-{uuid.uuid4().hex}", "url": url, "original_status": True,
                                   "pc_status": 200, "body": "# x\n\ny"}).encode()), good),
    ]
    return kinds


class Scenario:
    def __init__(self, deliveries: int, pages: int, seed: int):
        rng = random.Random(seed)
        self.crawls: list[Crawl] = []
        self.sends: list[Send] = []
        versions = [0] * pages
        texts: list[str | None] = [None] * pages
        n_bad = round(deliveries * 0.05)
        n_resend = round(deliveries * 0.30)
        n_crawls = deliveries - n_bad - n_resend
        for i in range(n_crawls):
            # Every page first, then at random: each page has a crawl.
            p = i if i < pages else rng.randrange(pages)
            roll = rng.random()
            rid = f"crawl-{i}-{uuid.uuid4().hex[:8]}"
            if i >= pages and roll < 0.05:
                crawl = Crawl(p, rid, rng.choice((404, 410)), 200, f"# Gone\n\nNot found ({i}).")
            elif i >= pages and roll < 0.08:
                crawl = Crawl(p, rid, 200, 503, "")
            else:
                if texts[p] is None or rng.random() < 0.5:
                    versions[p] += 1
                    texts[p] = page_text(rng, p, versions[p])
                crawl = Crawl(p, rid, 200, 200, texts[p])
            self.crawls.append(crawl)
        # Local reordering: windows of 8 crawls shuffled (push order stays the crawl order).
        order = list(range(n_crawls))
        for start in range(0, n_crawls, 8):
            window = order[start:start + 8]
            rng.shuffle(window)
            order[start:start + 8] = window
        sends = [Send(c.rid, crawl_headers(c), gzip.compress((c.text or "").encode()), {"token": TOKEN}, "crawl",
                      crawl=i) for i, c in ((i, self.crawls[i]) for i in order)]
        for _ in range(n_resend):   # a re-send of a crawl already sent, later in the stream
            at = rng.randrange(1, len(sends) + 1)
            original = sends[rng.randrange(at)]
            sends.insert(at, Send(original.rid, original.headers, original.body, original.params, "resend",
                                  crawl=original.crawl))
        kinds = bad_inputs(rng)
        for j in range(n_bad):
            kind, status, headers, body, params = kinds[j % len(kinds)]
            sends.insert(rng.randrange(len(sends) + 1),
                         Send(headers.get("rid", f"bad-{j}"), dict(headers), body, dict(params), kind, status))
        self.sends = sends
        self.kinds = [k[0] for k in kinds]


# -- the running pipeline ------------------------------------------------------------------------


class Stack:
    """db watch (embedded only), receiver on a fixed port, daemon; each can be killed and restarted."""

    def __init__(self, env: dict[str, str], logdir: Path, home: Path | None):
        self.env, self.logdir, self.home = env, logdir, home
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.generation = Counter()
        self.watch = None
        if home is not None:   # the embedded server's own watch: RAG_HOME, never DATABASE_URL
            watch_env = {k: v for k, v in env.items() if k != "DATABASE_URL"} | {"RAG_HOME": str(home)}
            self.watch = Service("watch", [str(BIN / "rag-pipeline"), "db", "watch", "--every", "1"], watch_env,
                                 logdir, cwd=ROOT)
        self.receiver = self.start_receiver()
        self.daemon = self._service("daemon", [str(BIN / "dagster-daemon"), "run", "-w", str(ROOT / "workspace.yaml")])

    def _service(self, name: str, cmd: list[str]) -> Service:
        self.generation[name] += 1
        return Service(f"{name}{self.generation[name]}", cmd, self.env, self.logdir, cwd=ROOT)

    def start_receiver(self) -> Service:
        service = self._service("receiver", [str(BIN / "rag-pipeline"), "webhook", "--host", "127.0.0.1",
                                             "--port", str(self.port)])
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if not service.alive():
                raise BenchFailure(f"the receiver exited ({service.proc.returncode}):\n{service.tail()}")
            try:
                if httpx.get(f"{self.base}/healthz", timeout=2).status_code in (200, 503):
                    return service
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise BenchFailure(f"the receiver did not answer within 90 s:\n{service.tail()}")

    def kill_receiver(self) -> str:
        os.killpg(self.receiver.pid, signal.SIGKILL)
        self.receiver.stop(grace_s=1)
        time.sleep(2)
        self.receiver = self.start_receiver()
        return "receiver process group"

    def kill_daemon(self) -> str:
        self.daemon.descendants()
        os.killpg(self.daemon.pid, signal.SIGKILL)
        self.daemon.stop(grace_s=1)
        time.sleep(2)
        self.daemon = self._service("daemon", [str(BIN / "dagster-daemon"), "run", "-w", str(ROOT / "workspace.yaml")])
        return "daemon process group (daemon, code server, run workers)"

    def _role(self, role: str, timeout_s: float) -> psutil.Process | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for p in self.daemon.descendants():
                if daemon_role(p, self.daemon.pid) == role:
                    return p
            time.sleep(0.2)
        return None

    def kill_worker(self) -> str | None:
        worker = self._role(ROLE_WORKER, 120)
        if worker is None:
            return None
        worker.kill()
        return "run worker"

    def kill_code_server(self) -> str | None:
        server = self._role(ROLE_CODE, 30)
        if server is None:
            return None
        server.kill()
        return "code server"

    def kill_postmaster(self) -> str | None:
        if self.home is None:
            return None
        pid_file = self.home / "pgdata" / "postmaster.pid"
        try:
            pid = int(pid_file.read_text().split()[0])
            os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            return None
        return "postmaster (SIGKILL)"

    def stop(self) -> None:
        for service in (self.daemon, self.receiver, self.watch):
            if service is not None:
                service.stop()


class Sender:
    """8 threads POSTing the sends in order at `rate` a second; each re-sent until it gets a final answer."""

    def __init__(self, stack: Stack, sends: list[Send], rate: float):
        self.stack, self.sends, self.rate = stack, sends, rate
        self.next = 0
        self.done = 0
        self.lock = threading.Lock()
        self.started = time.monotonic()
        self.in_flight: dict[str, Send] = {}
        self.last_answer = time.monotonic()
        self.threads = [threading.Thread(target=self._work, daemon=True, name=f"send-{i}") for i in range(THREADS)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def alive(self) -> bool:
        return any(t.is_alive() for t in self.threads)

    def _take(self) -> Send | None:
        with self.lock:
            if self.next >= len(self.sends):
                return None
            due = self.started + self.next / self.rate
            send = self.sends[self.next]
            self.next += 1
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        return send

    def _work(self) -> None:
        with httpx.Client(timeout=30) as client:
            while (send := self._take()) is not None:
                self.in_flight[threading.current_thread().name] = send
                deadline = time.monotonic() + 600   # then counted as never acknowledged
                while True:
                    try:
                        status: int | None = client.post(f"{self.stack.base}/webhook", params=send.params,
                                                         headers=send.headers, content=send.body).status_code
                    except httpx.LocalProtocolError:
                        status = -1     # the client itself cannot send this: a defect of the bench
                    except httpx.TransportError:
                        status = None
                    send.answers.append(status)
                    if status is not None and status < 500:
                        self.last_answer = time.monotonic()
                        break       # final: 200 acknowledged, or the 4xx a bad input gets
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.3)
                with self.lock:
                    self.done += 1
                self.in_flight.pop(threading.current_thread().name, None)

    def report(self) -> str:
        stuck = [f"{s.kind} {s.rid[:24]} answers {s.answers[-3:]}" for s in list(self.in_flight.values())
                 if len(s.answers) > 3]
        return f"{self.done:,}/{len(self.sends):,} sent" + (f"; re-sending: {stuck[:3]}" if stuck else "")


# -- checks --------------------------------------------------------------------------------------


def insert_pushes(url: str, scenario: Scenario) -> None:
    """What the crawler push path writes before each push: the crawl's time, by its rid."""
    base = datetime.now(timezone.utc) - timedelta(hours=1)
    with psycopg.connect(url, autocommit=True) as conn, conn.cursor() as cur:
        with cur.copy("COPY pushes (url, page_url, reason, crawler, pushed_at, result, rid, finished_at)"
                      " FROM STDIN") as copy:
            for i, c in enumerate(scenario.crawls):
                at = base + timedelta(milliseconds=10 * i)
                copy.write_row((page_url(c.page), normalize_url(page_url(c.page)), "schedule", "local", at,
                                "pushed", c.rid, at))


def settled(conn, dconn) -> tuple[bool, str]:
    waiting = conn.execute(
        "SELECT count(*) FILTER (WHERE processed_at IS NULL),"
        " count(*) FILTER (WHERE outcome = 'queued'),"
        " count(*) FILTER (WHERE outcome = 'failed' AND retry_at IS NOT NULL)"
        " FROM deliveries").fetchone()
    leased = conn.execute("SELECT count(*) FROM pages WHERE batch_key IS NOT NULL AND leased_until > now()").fetchone()[0]
    busy = dconn.execute("SELECT count(*) FROM runs WHERE status <> ALL(%s)", (list(TERMINAL),)).fetchone()[0]
    state = f"unrouted {waiting[0]}, queued {waiting[1]}, retry due later {waiting[2]}, leased {leased}, runs busy {busy}"
    return not any(waiting) and not leased and not busy, state


def expected_state(scenario, acknowledged: set[str]) -> dict[int, Crawl]:
    """Each page's newest acknowledged crawl with content or a tombstone (push order)."""
    newest: dict[int, Crawl] = {}
    for c in scenario.crawls:   # in push order
        if c.rid in acknowledged and c.crawler_status == 200:
            newest[c.page] = c
    return newest


def check_index(conn, scenario, acknowledged: set[str], settings: Settings, url_of=page_url) -> dict:
    """Each page's index against a clean rebuild of its newest acknowledged crawl (`url_of`: a
    crawl's page number → its URL), and the duplicates: the figures and a few examples."""
    rules = default_boilerplate_rules()
    active = spaces.active(conn)
    budget = indexing_chunk_budget(settings, active)   # the model's window too (ChunkBudget)
    figures = Counter()
    examples: list[str] = []
    for p, crawl in sorted(expected_state(scenario, acknowledged).items()):
        key = normalize_url(url_of(p))
        row = conn.execute("SELECT page_id, source_hash, indexed_hash, deleted_at IS NOT NULL FROM pages WHERE url = %s",
                           (key,)).fetchone()
        chunks = conn.execute(
            "SELECT c.chunk_index, c.content, c.embed_hash, v.embed_hash FROM chunks c"
            " LEFT JOIN space_vectors v ON v.chunk_id = c.chunk_id AND v.space_id = %s"
            " WHERE c.page_id = %s ORDER BY c.chunk_index",
            (active.space_id if active else -1, page_id(key))).fetchall()
        if crawl.status in (404, 410):
            if row is None or not row[3] or chunks:
                figures["resurrected"] += 1 if chunks else 0
                figures["mismatches"] += 1
                examples.append(f"{key}: newest crawl {crawl.status}, page row {row}, {len(chunks)} chunk(s)")
            continue
        text = normalize_markdown(crawl.text or "", rules, url=key)
        pieces = chunk_markdown(text, *budget)
        want = [(c.index, c.content, embed_hash(c.embed_text)) for c in pieces]
        have = [(i, content, bytes(h)) for i, content, h, _ in chunks]
        vectors_ok = all(v is not None and bytes(v) == bytes(h) for _, _, h, v in chunks)
        if (row is None or row[1] != content_hash(text) or row[2] != row[1] or row[3] or have != want
                or not vectors_ok):
            figures["mismatches"] += 1
            examples.append(f"{key}: source {'ok' if row and row[1] == content_hash(text) else 'differs'}, "
                            f"indexed {'ok' if row and row[2] == row[1] else 'differs'}, chunks "
                            f"{len(have)} (rebuild {len(want)}), vectors {'ok' if vectors_ok else 'missing/wrong'}")
    figures["duplicate_chunks"] = conn.execute(
        "SELECT count(*) FROM (SELECT page_id, chunk_index FROM chunks GROUP BY 1, 2 HAVING count(*) > 1) d"
    ).fetchone()[0]
    figures["duplicate_rows"] = conn.execute(
        "SELECT count(*) FROM (SELECT rid FROM deliveries GROUP BY rid HAVING count(*) > 1) d").fetchone()[0]
    return {"figures": figures, "examples": examples}


# -- main ----------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=10_000)
    parser.add_argument("--pages", type=int, default=300)
    parser.add_argument("--rate", type=float, default=20.0, help="deliveries sent per second")
    parser.add_argument("--outage-s", type=float, default=600.0, help="how long the embedding API is down")
    parser.add_argument("--settle-timeout", type=float, default=900.0)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs, data)")
    args = parser.parse_args()
    # `timeout` or Ctrl-C: stop every process this started and remove the work folder.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.pages < 1 or args.deliveries < args.pages * 2:
        parser.error("--deliveries must be at least twice --pages")

    scenario = Scenario(args.deliveries, args.pages, args.seed)
    work = Path(tempfile.mkdtemp(prefix="bench-faults-"))
    os.chmod(work, 0o755)   # the embedded server's service user (as root) walks down to its pgdata
    (work / "logs").mkdir()
    print(f"faults: {len(scenario.sends):,} deliveries over {args.pages} pages at {args.rate:g}/s, "
          f"embedding outage {args.outage_s:g} s; work folder {work}")
    try:
        with ExitStack() as exits, FakeOpenAI(dimensions=DIMENSIONS) as fake:
            home: Path | None = None
            if os.environ.get("DATABASE_URL"):
                url = exits.enter_context(fresh_database("faults", ROOT))
                dagster_url = exits.enter_context(dagster_database(url))
            else:
                home = work / "home"
                cli_env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"} | {"RAG_HOME": str(home)}

                def cli(*a: str) -> str:
                    done = subprocess.run([str(BIN / "rag-pipeline"), *a], env=cli_env, capture_output=True,
                                          text=True, timeout=300)
                    if done.returncode:
                        raise BenchFailure(f"rag-pipeline {' '.join(a)}: {done.stderr.strip()}")
                    return done.stdout.strip()
                url = cli("db", "start")
                exits.callback(lambda: cli("db", "stop"))
                cli("db", "migrate")
                dagster_url = cli("db", "url", "--database", "dagster")
            env = base_env(url, work / "rag_home", fake.base_url, ROOT)
            dagster_home = work / "dagster_home"
            dagster_home.mkdir()
            shutil.copy(ROOT / "deploy" / "dagster.yaml", dagster_home / "dagster.yaml")
            env.update({"DAGSTER_HOME": str(dagster_home), "DAGSTER_POSTGRES_URL": dagster_url,
                        "WEBHOOK_MAX_BODY_BYTES": str(MAX_BODY), "WEBHOOK_MAX_PAGE_BYTES": str(MAX_PAGE)})
            insert_pushes(url, scenario)
            fake.flaky(0.2, (429, 500), seed=args.seed)
            stack = Stack(env, work / "logs", home)
            exits.callback(stack.stop)
            wait_for_first_tick(dagster_url, stack.daemon)
            return run(args, scenario, stack, fake, url, dagster_url)
    except BenchFailure as exc:
        print(f"FAULTS failed: {exc}")
        return 2
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def run(args, scenario: Scenario, stack: Stack, fake: FakeOpenAI, url: str, dagster_url: str) -> int:
    total = len(scenario.sends)
    plan = [(0.10, "receiver", stack.kill_receiver), (0.25, "daemon", stack.kill_daemon),
            (0.40, "worker", stack.kill_worker), (0.50, "receiver", stack.kill_receiver),
            (0.60, "postmaster", stack.kill_postmaster), (0.70, "code server", stack.kill_code_server),
            (0.80, "outage", None)]
    survived: Counter = Counter()
    skipped: list[str] = []
    sender = Sender(stack, scenario.sends, args.rate)
    started = time.monotonic()
    sender.start()
    outage_end = None
    last_fault = started
    for fraction, name, kill in plan:
        while sender.done < fraction * total and sender.alive():
            time.sleep(0.2)
        if name == "outage":
            fake.outage(503)
            outage_end = time.monotonic() + args.outage_s
            print(f"  {time.monotonic() - started:7.1f} s  embedding API down for {args.outage_s:g} s")
            continue
        what = kill()
        last_fault = time.monotonic()
        if what is None:
            skipped.append(name)
            print(f"  {last_fault - started:7.1f} s  {name}: nothing to kill (skipped)")
        else:
            survived[what] += 1
            print(f"  {last_fault - started:7.1f} s  killed the {what}")
    shown = time.monotonic()
    while sender.alive() or (outage_end and time.monotonic() < outage_end):
        if time.monotonic() - shown > 30:
            shown = time.monotonic()
            down = f"; embedding API back in {outage_end - shown:.0f} s" if outage_end else ""
            print(f"  {shown - started:7.1f} s  {sender.report()}{down}")
        if outage_end and time.monotonic() >= outage_end:
            fake.recover()
            last_fault = time.monotonic()
            print(f"  {last_fault - started:7.1f} s  embedding API back")
            outage_end = None
        time.sleep(0.5)
    if outage_end:
        fake.recover()
        last_fault = time.monotonic()
        print(f"  {last_fault - started:7.1f} s  embedding API back")
    sent_s = sender.last_answer - started

    deadline = time.monotonic() + args.settle_timeout
    state = ""
    with psycopg.connect(url, autocommit=True) as conn, psycopg.connect(dagster_url, autocommit=True) as dconn:
        while time.monotonic() < deadline:
            try:
                done, state = settled(conn, dconn)
            except psycopg.Error as exc:
                done, state = False, f"(database: {exc})"
            if done:
                break
            if time.monotonic() - shown > 30:
                shown = time.monotonic()
                print(f"  {shown - started:7.1f} s  settling: {state}")
            time.sleep(1)
        settle_s = time.monotonic() - last_fault
        after_last_send_s = time.monotonic() - max(last_fault, sender.last_answer)
        is_settled = done

        answers = Counter(a for s in scenario.sends for a in s.answers)
        acknowledged = {s.rid for s in scenario.sends if s.kind in ("crawl", "resend") and s.answers[-1:] == [200]}
        stored = {r[0] for r in conn.execute("SELECT rid FROM deliveries").fetchall()}
        lost = acknowledged - stored
        bad = [s for s in scenario.sends if s.kind not in ("crawl", "resend")]
        bad_wrong = [s for s in bad if s.answers[-1:] != [s.expect]]
        bad_stored = [s for s in bad if s.rid in stored]
        good_refused = [s for s in scenario.sends if s.kind in ("crawl", "resend") and s.answers[-1:] != [200]]
        outcomes = dict(conn.execute("SELECT coalesce(outcome, 'unrouted'), count(*) FROM deliveries GROUP BY 1"))
        stuck = conn.execute(
            "SELECT count(*) FROM deliveries WHERE processed_at IS NULL OR outcome IN ('queued', 'failed')").fetchone()[0]
        stuck_examples = conn.execute(
            "SELECT page_url, outcome, attempts, left(error, 160) FROM deliveries"
            " WHERE processed_at IS NULL OR outcome IN ('queued', 'failed') LIMIT 5").fetchall()
        zombies = dconn.execute("SELECT count(*) FROM runs WHERE status <> ALL(%s)", (list(TERMINAL),)).fetchone()[0]
        runs = dict(dconn.execute("SELECT status, count(*) FROM runs GROUP BY 1").fetchall())
        settings = Settings(EMBEDDING_PROVIDER="openai", OPENAI_API_KEY="sk-bench", EMBEDDING_DIMENSIONS=str(DIMENSIONS))
        index = check_index(conn, scenario, acknowledged, settings)
    figures = index["figures"]
    fives = {k: v for k, v in answers.items() if k is not None and k >= 500}
    print(f"sent {total:,} deliveries in {sent_s:.0f} s ({sum(len(s.answers) for s in scenario.sends):,} POSTs); "
          f"acknowledged {len(acknowledged):,} distinct crawls; same-rid re-sends {sum(s.kind == 'resend' for s in scenario.sends):,}")
    print(f"answers: {dict(sorted((str(k), v) for k, v in answers.items()))} (None: connection refused or cut)")
    by_kind = Counter(s.kind for s in bad)
    print(f"bad inputs: {len(bad)} of {len(by_kind)} kinds, {len(bad_wrong)} answered otherwise than expected, "
          f"{len(bad_stored)} stored")
    for kind in scenario.kinds:
        wrong = [s.answers[-1:] for s in bad_wrong if s.kind == kind]
        print(f"  {kind:22} {by_kind[kind]:4}  expected {next(s.expect for s in bad if s.kind == kind)}"
              + (f"  got {wrong[0]}" if wrong else ""))
    if good_refused:
        print(f"  {len(good_refused)} good deliveries never acknowledged, e.g. {good_refused[0].answers[-3:]}")
    print(f"kills survived: {dict(survived)}" + (f"; skipped: {skipped}" if skipped else ""))
    print(f"deliveries by outcome: {outcomes}; duplicate rows per rid: {figures['duplicate_rows']}")
    print(f"runs: {runs}")
    print(f"embedding requests {fake.requests:,}, inputs embedded {len(fake.inputs):,} "
          f"({len(fake.inputs) - len(set(fake.inputs)):,} texts embedded more than once)")
    print(f"index: {figures['mismatches']} page(s) differ from a clean rebuild of their newest crawl, "
          f"{figures['duplicate_chunks']} duplicate chunk(s), {figures['resurrected']} resurrected tombstone(s)")
    for line in index["examples"][:5]:
        print(f"  {line}")
    for row in stuck_examples:
        print(f"  stuck: {row}")
    print(f"settled: {is_settled} ({state}), {settle_s:.0f} s after the last fault, "
          f"{after_last_send_s:.0f} s after the last fault or delivery, whichever came later")
    ok = (not lost and not fives.get(500) and not figures["mismatches"] and not stuck and not zombies
          and not figures["duplicate_chunks"] and not figures["resurrected"] and not bad_wrong and not bad_stored and not good_refused
          and is_settled and settle_s <= 300)
    print(f"FAULTS lost={len(lost)} mismatches={figures['mismatches']} stuck={stuck} zombies={zombies} "
          f"500s={fives.get(500, 0)} duplicate_chunks={figures['duplicate_chunks']} resurrected={figures['resurrected']} "
          f"bad_misanswered={len(bad_wrong)} settle={settle_s:.0f}s deliveries={total} pages={args.pages}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
