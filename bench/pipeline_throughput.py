"""Pipeline throughput: pages per minute from the crawler's POST to searchable, through the real
webhook receiver, the real Dagster daemon and delivery_sensor's `index_batch` runs, against a plain
Python loop doing the same work with no Dagster, in one run (issue 10, point 5).

Both paths get the same generated documentation pages (300 to 5,000 tokens each, log-uniform),
POSTed as a crawler would (gzip'd markdown, 8 threads, retried under the same rid on a 5xx) to
`rag-pipeline webhook`, each path on a fresh database of its own throwaway server, all embedded by
the loopback OpenAI fake of the tests (served from this process; its CPU is in the "bench" figure):

  dagster   `dagster api grpc` (the code server, as `dg dev` and deploy/ start it) and
            `dagster-daemon run` on a `grpc_server` workspace entry for it, with the repo's
            deploy/dagster.yaml (storage: a `dagster` database on the same server). A daemon given
            the module entry itself would start a new code server at each of its 60 s workspace
            reloads, importing the project again, which neither `make run` nor a deployment does.
            delivery_sensor ticks by itself (15 s minimum
            interval, on the daemon's 5 s loop) and leases the changed pages into index_batch runs.
            Delivery starts just after a tick: the worst phase for the wait on the next one.
  plain     a subprocess looping route_batch → queued_work → apply_batch in the sensor's batch
            bounds (no leases), again at once while there is work, 0.2 s after a pass with none

Then a recrawl: every page delivered again under a new rid, `--changed-fraction` of them with one
paragraph rewritten (unchanged pages are stamped verified, without a run). Measured from the first
POST until the poller (every 0.5 s) sees each watched page's indexed_hash equal to the hash of what
was delivered; per-page latency is the database's own `applied_at - received_at` of each delivery.
For the Dagster path also: runs, event-log rows per page, delivery_sensor's ticks, each run's
timeline from its events (enqueued → starting → RUN_START → STEP_START, which waits for an
`embedding_api` pool slot → STEP_SUCCESS → RUN_SUCCESS) and the daemon's log (when the sensor
returned, when the daemon had added the partitions), peak RSS of the daemon, the code server and
each run worker (sampled every 0.5 s), and CPU seconds by process, next to the plain loop's.

    .venv/bin/python bench/pipeline_throughput.py [--pages 2000] [--changed-fraction 0.1]
        [--timeout 900] [--keep] [--seed 7] [--sample-queries] [--code-rev REV | --code-dir DIR]
        [--dagster-only [--skip-recrawl]] [--ui]

At site scale (issue 24): `--pages 100000 --dagster-only --ui --timeout 5400` loads 100,000 pages
through the receiver and daemon alone, then prints the databases' sizes and times the UI's
asset-page queries (bench/ui_partitions.py's documents) on the loaded instance.

--code-rev runs the receiver, the daemon and the plain loop from `git archive REV` (the checkout is
edited concurrently, and run workers import the code when they start), and migrates the databases
with that commit's sql/. --sample-queries samples pg_stat_activity every 50 ms (where the
database's time goes; adds a little load). The last line is
`THROUGHPUT dagster=… pages/min plain=… pages/min ratio=… searchable_p95=… s` (initial load).
With DATABASE_URL set, the bench databases are made on that server (and a `<bench db>_dagster`
database for Dagster, dropped at the end).
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parents[1]
# The code the pipeline's processes run: the checkout, or (--code-rev) a `git archive` of one commit.
CODE = Path(os.environ.get("BENCH_CODE_ROOT") or ROOT)
sys.path.insert(0, str(CODE))

import httpx  # noqa: E402
import psutil  # noqa: E402
import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402
from psycopg.conninfo import conninfo_to_dict  # noqa: E402

from bench.corpus import PageGenerator, render  # noqa: E402
from rag_pipeline.core.text import content_hash, normalize_markdown  # noqa: E402
from rag_pipeline.core.tokens import count_tokens  # noqa: E402
from rag_pipeline.core.urls import normalize_url  # noqa: E402
from rag_pipeline.store import db  # noqa: E402
from rag_pipeline_tests.waiting import wait_until  # noqa: E402

# This bench plays the crawler: its deliveries answer no push recorded here (docs/security.md).
os.environ.setdefault("WEBHOOK_ACCEPT_UNSOLICITED", "true")

TOKEN = "bench-throughput-token"
DIMENSIONS = 256
MIN_TOKENS, MAX_TOKENS = 300, 5_000
DELIVERY_THREADS = 8
POLL_S = 0.5
SAMPLE_S = 0.5
BIN = Path(sys.executable).parent
TERMINAL_RUN_STATUSES = ("SUCCESS", "FAILURE", "CANCELED")


class BenchFailure(RuntimeError):
    """The bench cannot go on; the message says what was pending."""


# -- corpus --------------------------------------------------------------------------------------


@dataclass
class Page:
    url: str          # as delivered
    key: str          # normalized: pages.url
    blocks: list[str]
    tokens: int


def is_paragraph(block: str) -> bool:
    return block[:1].isalpha() and not block.startswith(("#", "```", "|", "-"))


def make_corpus(n: int, seed: int) -> list[Page]:
    """Documentation pages, log-uniform between 300 and 5,000 tokens (docs skew small). Each page
    has a generator of its own (its seed), so a large corpus is made on every core, the same pages
    as one core would make. A large one (11 minutes at 100,000 pages) is kept in the bench cache,
    under a digest of the code that makes it."""
    if n < 20_000:
        return _generate(n, seed)
    import hashlib
    import inspect
    import pickle

    import bench.corpus as corpus_module
    code = inspect.getsource(corpus_module) + inspect.getsource(_generate) + inspect.getsource(_make_page)
    digest = hashlib.sha256(code.encode()).hexdigest()[:16]
    path = Path.home() / ".cache" / "rag-pipeline-bench" / f"corpus-{n}-{seed}-{digest}.pickle"
    if path.is_file():
        class Unpickler(pickle.Unpickler):
            # Written by this file run as a program: its pages are `__main__.Page`, whoever reads them.
            def find_class(self, module: str, name: str):
                return Page if (module, name) == ("__main__", "Page") else super().find_class(module, name)

        with path.open("rb") as cached:
            return Unpickler(cached).load()
    pages = _generate(n, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_bytes(pickle.dumps(pages, protocol=pickle.HIGHEST_PROTOCOL))
    partial.replace(path)
    return pages


def _generate(n: int, seed: int) -> list[Page]:
    rng = random.Random(seed)
    targets = [int(math.exp(rng.uniform(math.log(MIN_TOKENS), math.log(MAX_TOKENS)))) for _ in range(n)]
    jobs = [(seed, i, targets[i]) for i in range(n)]
    if n < 5_000:
        return [_make_page(job) for job in jobs]
    import multiprocessing
    with multiprocessing.get_context("fork").Pool(os.cpu_count() or 1) as pool:
        return pool.map(_make_page, jobs, chunksize=500)


def _make_page(job: tuple[int, int, int]) -> Page:
    seed, i, target = job
    blocks = PageGenerator(seed * 100_003 + i).page(target)
    # page() stops at the first section past the target: drop trailing blocks not needed to
    # reach it, and cut back to the upper bound.
    sizes = [count_tokens(b) + 1 for b in blocks]
    while len(blocks) > 3 and sum(sizes[:-1]) >= target:
        blocks.pop(), sizes.pop()
    while len(blocks) > 3 and sum(sizes) > MAX_TOKENS:
        blocks.pop(), sizes.pop()
    url = f"https://docs.example.com/guide/{i:05d}"
    return Page(url, normalize_url(url), blocks, count_tokens(render(blocks)))


def edit_paragraphs(pages: list[Page], fraction: float, seed: int) -> dict[str, list[str]]:
    """key → new blocks for `fraction` of the pages: one paragraph of each rewritten."""
    rng = random.Random(seed + 1)
    gen = PageGenerator(seed + 2)
    changed = {}
    for page in rng.sample(pages, round(len(pages) * fraction)):
        spots = [j for j, b in enumerate(page.blocks) if is_paragraph(b)] or [len(page.blocks) - 1]
        blocks = list(page.blocks)
        j = rng.choice(spots)
        while blocks[j] == page.blocks[j]:
            blocks[j] = gen.paragraph(2, 5)
        changed[page.key] = blocks
    return changed


def expected_hash(key: str, text: str, rules) -> str:
    return content_hash(normalize_markdown(text, rules, url=key))


# -- processes -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Service:
    """A subprocess in its own session: stopped by its process group, SIGTERM then SIGKILL, and
    any descendant seen meanwhile that escaped the group is killed by its pid."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], logdir: Path, cwd: Path):
        self.name = name
        self.out_path, self.err_path = logdir / f"{name}.out", logdir / f"{name}.err"
        self._out, self._err = open(self.out_path, "wb"), open(self.err_path, "wb")
        self.proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=self._out, stderr=self._err,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.seen: dict[int, psutil.Process] = {}

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def descendants(self) -> list[psutil.Process]:
        try:
            kids = psutil.Process(self.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        for kid in kids:
            self.seen.setdefault(kid.pid, kid)
        return kids

    def tail(self, lines: int = 30, stream: str = "err") -> str:
        path = self.err_path if stream == "err" else self.out_path
        try:
            text = path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, grace_s: float = 20.0) -> None:
        self.descendants()
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            members = [p for p in list(self.seen.values()) if _running(p)]
            if self.alive():
                try:
                    self.proc.wait(timeout=wait_s)
                except subprocess.TimeoutExpired:
                    pass
            _, members = psutil.wait_procs(members, timeout=wait_s if sig == signal.SIGTERM else 2.0)
            if not self.alive() and not members:
                break
        for p in list(self.seen.values()):   # left its process group: by its pid, only ours
            if _running(p):
                try:
                    p.kill()
                except psutil.Error:
                    pass
        if self.alive():
            self.proc.kill()
        self.proc.wait()
        self._out.close()
        self._err.close()


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def base_env(database_url: str, rag_home: Path, fake_url: str, code: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DAGSTER_", "EMBEDDING_", "OPENAI_", "ANSWER_", "WEBHOOK_", "CRAWL"))}
    if code != ROOT:   # ahead of the checkout's editable install
        env.update({"PYTHONPATH": str(code), "BENCH_CODE_ROOT": str(code)})
    env.update({
        "DATABASE_URL": database_url, "RAG_HOME": str(rag_home), "EMBEDDING_PROVIDER": "openai",
        "OPENAI_API_KEY": "sk-bench", "OPENAI_BASE_URL": fake_url, "EMBEDDING_DIMENSIONS": str(DIMENSIONS),
        "WEBHOOK_TOKEN": TOKEN, "PYTHONUNBUFFERED": "1",
        # The bench plays the crawler: its deliveries answer no push recorded here.
        "WEBHOOK_ACCEPT_UNSOLICITED": "true",
    })
    return env


def start_receiver(env: dict[str, str], logdir: Path, name: str, code: Path) -> tuple[Service, str]:
    port = free_port()
    service = Service(name, [str(BIN / "rag-pipeline"), "webhook", "--host", "127.0.0.1", "--port", str(port)],
                      env, logdir, cwd=code)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if not service.alive():
            raise BenchFailure(f"the receiver exited ({service.proc.returncode}):\n{service.tail()}")
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return service, base
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise BenchFailure(f"the receiver did not answer /healthz within 90 s:\n{service.tail()}")


# -- measuring -----------------------------------------------------------------------------------


# The code server (`dagster api grpc`) evaluates the sensors and starts each run worker as a
# multiprocessing spawn child.
ROLE_DAEMON, ROLE_CODE, ROLE_WORKER, ROLE_OTHER = "daemon", "code server", "run worker", "other"


def daemon_role(p: psutil.Process, root_pid: int) -> str:
    if p.pid == root_pid:
        return ROLE_DAEMON
    try:
        cmd = " ".join(p.cmdline())
    except psutil.Error:
        return ROLE_OTHER
    if "spawn_main" in cmd or "execute_run" in cmd:
        return ROLE_WORKER
    if " grpc" in cmd or "code-server" in cmd or "code_server" in cmd:
        return ROLE_CODE
    # e.g. the compute-log tailers of a run (`tail -F`, `watch_orphans.py`)
    return f"{ROLE_OTHER}: {' '.join(Path(a).name for a in p.cmdline()[:3] if not a.isdigit())[:60]}"


def code_server_role(p: psutil.Process, root_pid: int) -> str:
    return ROLE_CODE if p.pid == root_pid else daemon_role(p, root_pid)


def start_code_server(env: dict[str, str], work: Path, code: Path, timeout_s: float = 120.0) -> tuple[Service, Path]:
    """`dagster api grpc` on a free port, listening, and a workspace file naming it."""
    port = free_port()
    server = Service("code-server", [str(BIN / "dagster"), "api", "grpc", "--module-name", "rag_pipeline.definitions",
                                     "--location-name", "rag_pipeline", "--working-directory", str(code),
                                     "--host", "127.0.0.1", "--port", str(port)], env, work, cwd=code)

    def listening() -> bool:
        if not server.alive():
            raise BenchFailure(f"the code server exited ({server.proc.returncode}):\n{server.tail()}")
        # It listens once the project is loaded; a TCP probe costs nothing against the ~1 s of CPU
        # of a `dagster api grpc-health-check` process. The daemon's first tick proves the rest.
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
        except OSError:
            return False
        return True

    try:
        wait_until(listening, timeout_s, "the code server to listen")
    except AssertionError as exc:
        server.stop()
        raise BenchFailure(f"{exc}:\n{server.tail()}") from None
    workspace = work / "workspace.yaml"
    workspace.write_text(json.dumps({"load_from": [{"grpc_server": {
        "host": "127.0.0.1", "port": port, "location_name": "rag_pipeline"}}]}))
    return server, workspace


class TreeMonitor(threading.Thread):
    """Peak RSS and CPU time of every process of a tree, sampled every 0.5 s, by role."""

    def __init__(self, service: Service, role: Callable[[psutil.Process, int], str]):
        super().__init__(daemon=True, name=f"monitor-{service.name}")
        self.service, self.role = service, role
        self.stopping = threading.Event()
        self.peak: dict[int, tuple[str, int]] = {}
        self.cpu: dict[int, tuple[str, float]] = {}    # pid → (role, CPU seconds at its last sample)
        self.peak_total = 0

    def run(self) -> None:
        while not self.stopping.is_set():
            self.sample()
            self.stopping.wait(SAMPLE_S)

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)

    def sample(self) -> None:
        try:
            procs = [psutil.Process(self.service.pid)] + self.service.descendants()
        except psutil.NoSuchProcess:
            return
        total = 0
        for p in procs:
            try:
                rss = p.memory_info().rss
                t = p.cpu_times()
                role = self.peak.get(p.pid, (None,))[0] or self.role(p, self.service.pid)
            except psutil.Error:
                continue
            total += rss
            self.cpu[p.pid] = (role, t.user + t.system)
            if rss > self.peak.get(p.pid, ("", 0))[1]:
                self.peak[p.pid] = (role, rss)
        self.peak_total = max(self.peak_total, total)

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds so far of every process seen (one that exited: as of its last sample, so
        at most 0.5 s of its time is missed), by role."""
        self.sample()
        out: Counter = Counter()
        for role, seconds in list(self.cpu.values()):
            out[ROLE_OTHER if role.startswith(ROLE_OTHER) else role] += seconds
        return out

    def by_role(self) -> dict[str, tuple[int, int]]:
        """role → (processes seen, max RSS of any one of them)."""
        out: dict[str, tuple[int, int]] = {}
        for role, rss in self.peak.values():
            n, top = out.get(role, (0, 0))
            out[role] = (n + 1, max(top, rss))
        return out


def tree_cpu(root_pid: int | None) -> dict[str, float]:
    """CPU seconds so far of a long-lived process tree (a server): each live process's own time and
    its reaped children's (counted by the kernel on the parent)."""
    out: Counter = Counter()
    if root_pid is None:
        return out
    try:
        root = psutil.Process(root_pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return out
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        out["all"] += t.user + t.system + t.children_user + t.children_system
    return out


def cpu_delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in sorted(set(after) | set(before))}


def postmaster_pid(url: str) -> int | None:
    """The server's postmaster, when it runs on this machine (its backends are its children)."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            parent = psutil.Process(backend).parent()   # while the backend lives
        return parent.pid if parent else None
    except (psycopg.Error, psutil.Error):
        return None


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


class Poller(threading.Thread):
    """Every 0.5 s: which pages show the delivered content (indexed_hash), and when first seen."""

    def __init__(self, url: str, expected: dict[str, str]):
        super().__init__(daemon=True, name="poller")
        self.url, self.expected = url, expected
        self.seen: dict[str, float] = {}
        self.done = threading.Event()
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while not self.stopping.is_set():
                    pending = [k for k in self.expected if k not in self.seen]
                    rows = conn.execute("SELECT url, indexed_hash FROM pages WHERE url = ANY(%s)",
                                        (pending,)).fetchall()
                    # A look at every pending page costs the server the CPU the load needs (at
                    # 5,000 pages twice a second: ~10% of its statements' time, pg_stat_statements):
                    # the wait grows with what is pending (0.5 s at 1,000 or fewer, 2.5 s at 5,000).
                    # The latency figures are the database's own (applied_at), not the poller's.
                    wait_s = POLL_S * max(1.0, len(pending) / 1_000)
                    now = time.time()
                    for key, indexed in rows:
                        if indexed == self.expected[key]:
                            self.seen[key] = now
                    if len(self.seen) == len(self.expected):
                        self.done.set()
                        return
                    self.stopping.wait(wait_s)
        except BaseException as exc:  # noqa: BLE001 - reported by the phase
            self.error = exc
            self.done.set()


class QuerySampler(threading.Thread):
    """--sample-queries: every 50 ms, what each client backend of the server is doing (a poor
    man's profile of the database: samples x 50 ms ~ seconds spent per statement, per database)."""

    INTERVAL_S = 0.05

    def __init__(self, url: str):
        super().__init__(daemon=True, name="query-sampler")
        self.url = db.with_database(url, "postgres")
        self.counts: Counter = Counter()
        self.samples = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        import re

        literal, number, space = re.compile(r"'(?:[^']|'')*'"), re.compile(r"\b\d+\b"), re.compile(r"\s+")
        try:
            with psycopg.connect(self.url, autocommit=True) as conn:
                while not self.stopping.is_set():
                    rows = conn.execute(
                        "SELECT datname, state, query FROM pg_stat_activity WHERE backend_type = 'client backend'"
                        " AND pid <> pg_backend_pid() AND state IN ('active', 'idle in transaction')").fetchall()
                    self.samples += 1
                    for datname, state, query in rows:
                        text = space.sub(" ", number.sub("N", literal.sub("?", query or ""))).strip()
                        self.counts[(datname, state, text[:120])] += 1
                    self.stopping.wait(self.INTERVAL_S)
        except psycopg.Error as exc:
            print(f"  (query sampler stopped: {exc})")

    def stop(self) -> list[str]:
        self.stopping.set()
        self.join(5)
        by_db: Counter = Counter()
        for (datname, state, _), n in self.counts.items():
            by_db[(datname, state)] += n
        lines = ["busy backends (seconds ~ samples x 50 ms): " + ", ".join(
            f"{d} {st} {n * self.INTERVAL_S:.1f} s" for (d, st), n in by_db.most_common())]
        for (datname, state, text), n in self.counts.most_common(14):
            lines.append(f"  {n * self.INTERVAL_S:6.2f} s  {datname:>8} {'idle-in-tx' if state != 'active' else 'active':10} {text}")
        return lines


def deliver(base_url: str, bodies: list[tuple[str, bytes]], stop: threading.Event) -> tuple[float, float, int]:
    """POST every body as a crawler would, 8 at a time; a transport error or 5xx is retried (same
    rid), a 4xx fails the bench. Returns (first POST, last answer, retries) in epoch seconds."""
    lock = threading.Lock()
    queue = iter([(url, body, uuid.uuid4().hex) for url, body in bodies])
    errors: list[str] = []
    retries = [0]

    def worker() -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set() and not errors:
                with lock:
                    job = next(queue, None)
                if job is None:
                    return
                url, body, rid = job
                for attempt in range(6):
                    try:
                        resp = client.post(
                            f"{base_url}/webhook", params={"token": TOKEN}, content=body,
                            headers={"rid": rid, "url": url, "Original-Status": "200", "CB-Status": "200",
                                     "Content-Encoding": "gzip"})
                        if resp.status_code == 200:
                            break
                        if resp.status_code < 500:
                            errors.append(f"{url}: the receiver answered {resp.status_code} {resp.text[:200]}")
                            return
                    except httpx.TransportError as exc:
                        if attempt == 5:
                            errors.append(f"{url}: {exc!r}")
                            return
                    with lock:
                        retries[0] += 1
                    time.sleep(0.2 * 2 ** attempt)
                else:
                    errors.append(f"{url}: still refused after 6 tries")

    threads = [threading.Thread(target=worker, daemon=True, name=f"deliver-{i}") for i in range(DELIVERY_THREADS)]
    first = time.time()
    for t in threads:
        t.start()
    for t in threads:
        while t.is_alive():
            t.join(0.2)
    if errors:
        raise BenchFailure(f"{len(errors)} deliveries failed, e.g. {errors[0]}")
    return first, time.time(), retries[0]


@dataclass
class PhaseResult:
    name: str
    delivered: int
    watched: int                    # pages whose new content must become searchable
    t0: float                       # first POST
    delivered_at: float             # last POST answered
    searchable_at: float            # poller saw the last watched page
    settled_at: float               # every delivery of the phase routed and applied
    seen: dict[str, float]
    outcomes: dict[str, int]
    latency_db: list[float]         # applied_at - received_at of each embedded delivery
    latency_poll: list[float]       # poller's first sight - received_at
    exact_span: float               # max(applied_at) - min(received_at) over embedded deliveries
    first_id: int
    last_id: int
    load: tuple[float, float, float]
    fake_requests: int = 0
    fake_tokens: int = 0
    cpu: dict[str, float] = field(default_factory=dict)
    cpu_read_at: float | None = None  # when `cpu` was read (a Dagster phase: once its indexes were valid)
    runs_ended: bool = True           # every run had ended when `cpu` was read
    queries: list[str] = field(default_factory=list)
    index_ready_at: float | None = None   # the search indexes (HNSW, GIN) valid again after the phase
    scans: list[str] = field(default_factory=list)   # how search read the index, sampled during the phase

    @property
    def searchable_s(self) -> float:
        return self.searchable_at - self.t0

    @property
    def hnsw_throughout(self) -> bool:
        return bool(self.scans) and all(scan == "hnsw" for scan in self.scans)

    @property
    def pages_per_min(self) -> float:
        return self.watched / self.searchable_s * 60


def run_phase(name: str, url: str, base_url: str, bodies: list[tuple[str, bytes]], expected: dict[str, str],
              timeout_s: float, on_timeout: Callable[[], str], sample_queries: bool = False) -> PhaseResult:
    with psycopg.connect(url, autocommit=True) as conn:
        before = conn.execute("SELECT coalesce(max(id), 0) FROM deliveries").fetchone()[0]
    poller = Poller(url, expected)
    stop = threading.Event()
    sampler = QuerySampler(url) if sample_queries else None
    if sampler:
        sampler.start()
    poller.start()
    try:
        t0, delivered_at, _ = deliver(base_url, bodies, stop)
        deadline = t0 + timeout_s
        while not poller.done.wait(0.2):
            if time.time() > deadline:
                raise BenchFailure(f"{name}: {len(expected) - len(poller.seen)} of {len(expected)} pages "
                                   f"not searchable after {timeout_s:.0f} s\n{on_timeout()}")
        if poller.error:
            raise BenchFailure(f"{name}: the poller failed: {poller.error!r}")
        searchable_at = max(poller.seen.values())
        with psycopg.connect(url, autocommit=True) as conn:
            while True:
                unsettled = conn.execute(
                    "SELECT count(*) FROM deliveries WHERE id > %s AND (outcome IS NULL OR outcome = 'queued')",
                    (before,)).fetchone()[0]
                if not unsettled:
                    break
                if time.time() > deadline:
                    raise BenchFailure(f"{name}: {unsettled} deliveries not settled after {timeout_s:.0f} s\n"
                                       f"{on_timeout()}")
                time.sleep(POLL_S)
            settled_at = time.time()
            last = conn.execute("SELECT coalesce(max(id), 0) FROM deliveries").fetchone()[0]
            outcomes = dict(conn.execute(
                "SELECT coalesce(outcome, 'unrouted'), count(*) FROM deliveries WHERE id > %s GROUP BY 1",
                (before,)).fetchall())
            rows = conn.execute(
                "SELECT page_url, extract(epoch FROM received_at)::float8, extract(epoch FROM applied_at)::float8"
                " FROM deliveries WHERE id > %s AND outcome = 'embedded'", (before,)).fetchall()
    finally:
        stop.set()
        poller.stopping.set()
        queries = sampler.stop() if sampler else []
    latency_db = [applied - received for _, received, applied in rows]
    latency_poll = [poller.seen[key] - received for key, received, _ in rows if key in poller.seen]
    span = (max(r[2] for r in rows) - min(r[1] for r in rows)) if rows else float("nan")
    return PhaseResult(name, len(bodies), len(expected), t0, delivered_at, searchable_at, settled_at,
                       dict(poller.seen), outcomes, latency_db, latency_poll, span, before, last,
                       os.getloadavg(), queries=queries)


# -- the Dagster path ----------------------------------------------------------------------------


@contextmanager
def fresh_database(prefix: str, code: Path) -> Iterator[str]:
    """bench_database() migrated with the schema of the code under test (`code`/sql), which on a
    shared server (DATABASE_URL) leaves its database behind: dropped here."""
    from bench.database import bench_database

    with bench_database(prefix, code / "sql") as url:
        try:
            yield url
        finally:
            if os.environ.get("DATABASE_URL"):
                db.close_pools()
                with psycopg.connect(db.with_database(url, "postgres"), autocommit=True) as conn:
                    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                        sql.Identifier(conninfo_to_dict(url)["dbname"])))


@contextmanager
def dagster_database(url: str) -> Iterator[str]:
    """The `dagster` database on the bench server (unique and dropped afterwards on a shared one)."""
    shared = bool(os.environ.get("DATABASE_URL"))
    name = f"{conninfo_to_dict(url)['dbname']}_dagster" if shared else db.DAGSTER_DATABASE
    target = db.with_database(url, name)
    db.ensure_database(target)
    try:
        yield db.as_url(target)
    finally:
        if shared:
            with psycopg.connect(db.with_database(url, "postgres"), autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _tick_bodies(dconn) -> list[dict]:
    """delivery_sensor's ticks, oldest first (tick bodies are serialized TickData)."""
    ticks = []
    for (body,) in dconn.execute("SELECT tick_body FROM job_ticks ORDER BY id").fetchall():
        data = json.loads(body)
        origin = json.dumps(data.get("instigator_origin") or data.get("job_origin") or {})
        name = data.get("instigator_name") or data.get("job_name")
        if name == "delivery_sensor" or (name is None and '"delivery_sensor"' in origin):
            status = data.get("status")
            data["status"] = status.get("__enum__", "").split(".")[-1] if isinstance(status, dict) else str(status)
            ticks.append(data)
    return ticks


def wait_for_first_tick(dagster_url: str, daemon: Service, timeout_s: float = 300.0) -> float:
    """Block until the daemon has evaluated delivery_sensor once (its code location is loaded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not daemon.alive():
            raise BenchFailure(f"dagster-daemon exited ({daemon.proc.returncode}):\n{daemon.tail()}")
        try:
            with psycopg.connect(dagster_url, autocommit=True) as dconn:
                ticks = _tick_bodies(dconn)
            if ticks:
                return float(ticks[-1].get("timestamp") or time.time())
        except (psycopg.errors.UndefinedTable, psycopg.OperationalError):
            pass
        time.sleep(0.3)
    raise BenchFailure(f"delivery_sensor did not tick within {timeout_s:.0f} s of the daemon's start:\n"
                       f"{daemon.tail()}")


class ScanWatch:
    """How search reads the active space (`hnsw`, or exact while its index is away), every 0.5 s."""

    def __init__(self, url: str):
        self.url = url
        self.seen: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True, name="scan-watch")

    def __enter__(self) -> ScanWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)

    def _watch(self) -> None:
        from rag_pipeline.store import spaces

        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self.stop.is_set():
                self.seen.append(spaces.search_scan(conn).split(" ")[0])
                self.stop.wait(0.5)


def wait_for_indexes(url: str, timeout_s: float) -> float:
    """When the search indexes (the active space's HNSW, the GIN of chunks.text_search) are valid
    again (at once if they never went away)."""
    from rag_pipeline.store import spaces, text_search

    deadline = time.monotonic() + timeout_s
    with psycopg.connect(url, autocommit=True) as conn:
        while (scan := (spaces.search_scan(conn), text_search.lexical_scan(conn))) != ("hnsw", "gin"):
            if time.monotonic() > deadline:
                raise BenchFailure(f"the search indexes were not built again within {timeout_s:.0f} s ({scan})")
            time.sleep(0.5)
    return time.time()


def quiesce(dagster_url: str, timeout_s: float = 180.0) -> bool:
    """Wait until no run is queued or in progress, so its events are all counted; False if some
    still were at the timeout."""
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(dagster_url, autocommit=True) as dconn:
        while time.monotonic() < deadline:
            busy = dconn.execute("SELECT count(*) FROM runs WHERE status <> ALL(%s)",
                                 (list(TERMINAL_RUN_STATUSES),)).fetchone()[0]
            if not busy:
                return True
            time.sleep(0.5)
    print(f"  (runs still in progress after {timeout_s:.0f} s)")
    return False


def pending_report(url: str, dagster_url: str, daemon: Service | None, code_server: Service | None = None) -> str:
    lines = []
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            outcomes = dict(conn.execute(
                "SELECT coalesce(outcome, 'unrouted'), count(*) FROM deliveries GROUP BY 1").fetchall())
            lines.append(f"deliveries by outcome: {outcomes}")
            errors = conn.execute("SELECT left(error, 300), count(*) FROM deliveries WHERE outcome = 'failed'"
                                  " GROUP BY 1 ORDER BY 2 DESC LIMIT 3").fetchall()
            for error, n in errors:
                lines.append(f"  failed x{n}: {error}")
            leased = conn.execute("SELECT count(*) FROM pages WHERE leased_until > now()").fetchone()[0]
            lines.append(f"pages leased to a batch now: {leased}")
    except psycopg.Error as exc:
        lines.append(f"(deliveries unreadable: {exc})")
    if dagster_url:
        try:
            with psycopg.connect(dagster_url, autocommit=True) as dconn:
                runs = dconn.execute("SELECT pipeline_name, status, count(*) FROM runs GROUP BY 1, 2"
                                     " ORDER BY 1, 2").fetchall()
                lines.append("runs by status: " + (", ".join(f"{j} {s}: {n}" for j, s, n in runs) or "none"))
                ticks = _tick_bodies(dconn)[-3:]
                for t in ticks:
                    lines.append(f"  delivery_sensor tick {t.get('status')} at {_clock(t.get('timestamp'))}: "
                                 f"{len(t.get('run_ids') or [])} run(s) {t.get('skip_reason') or ''}"
                                 f"{(t.get('error') or {}).get('message', '')[:300]}")
        except psycopg.Error as exc:
            lines.append(f"(dagster storage unreadable: {exc})")
    if daemon is not None:
        lines.append(f"dagster-daemon {'running' if daemon.alive() else 'exited'}; its stderr, last lines:")
        lines.append(daemon.tail(30) or "  (empty)")
        lines.append("its stdout (the daemons), last lines:")
        lines.append(daemon.tail(12, stream="out") or "  (empty)")
    if code_server is not None:
        lines.append(f"code server {'running' if code_server.alive() else 'exited'}; its stderr (sensors, run "
                     "workers), last lines:")
        lines.append(code_server.tail(30) or "  (empty)")
    return "\n".join(lines)


def _clock(ts) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts)) + f".{int((ts % 1) * 10)}" if ts else "?"


@dataclass
class RunTimeline:
    run_id: str
    job: str
    status: str
    pages: int
    tick_at: float | None = None
    marks: dict[str, float] = field(default_factory=dict)        # event type → first timestamp
    last: dict[str, float] = field(default_factory=dict)         # event type → last timestamp
    events: Counter = field(default_factory=Counter)


def run_timelines(dconn, run_ids: set[str] | None = None) -> list[RunTimeline]:
    runs = {}
    for run_id, job, status in dconn.execute("SELECT run_id, pipeline_name, status FROM runs").fetchall():
        if run_ids is None or run_id in run_ids:
            runs[run_id] = RunTimeline(run_id, job, status, 0)
    for run_id, value in dconn.execute("SELECT run_id, value FROM run_tags WHERE key = 'rag/pages'").fetchall():
        if run_id in runs:
            runs[run_id].pages = int(value)
    rows = dconn.execute(
        "SELECT run_id, dagster_event_type, coalesce(asset_key, ''), count(*),"
        " min((event::json->>'timestamp')::float8), max((event::json->>'timestamp')::float8)"
        " FROM event_logs WHERE run_id = ANY(%s) GROUP BY 1, 2, 3", (list(runs),)).fetchall()
    for run_id, kind, asset, n, first, last in rows:
        kind = kind or "LOG"
        if kind.startswith("PIPELINE_"):   # stored under the legacy names (PIPELINE_START, ...)
            kind = "RUN_" + kind.removeprefix("PIPELINE_")
        if kind == "ASSET_MATERIALIZATION":
            kind = f"MAT {json.loads(asset)[-1] if asset.startswith('[') else asset}"
        timeline = runs[run_id]
        timeline.events[kind] += n
        timeline.marks[kind] = min(first, timeline.marks.get(kind, first))
        timeline.last[kind] = max(last, timeline.last.get(kind, last))
    return sorted(runs.values(), key=lambda r: r.marks.get("RUN_ENQUEUED", r.marks.get("RUN_START", 0)))


@dataclass
class DagsterStats:
    runs: dict[tuple[str, str], int]
    batch_runs: list[RunTimeline]
    ticks: list[dict]
    event_rows: int                  # every event_logs row written during the phase
    event_rows_batch: int            # rows of the phase's index_batch runs
    events_by_type: Counter
    event_bytes: int = 0             # the rows' stored size (pg_column_size of each row)
    materialization_bytes: float = 0.0   # the mean stored size of an ASSET_MATERIALIZATION row
    log_timeline: list[str] = field(default_factory=list)


def dagster_stats(dagster_url: str, before_runs: set[str], before_event_id: int, t0: float) -> DagsterStats:
    with psycopg.connect(dagster_url, autocommit=True) as dconn:
        all_runs = {r for (r,) in dconn.execute("SELECT run_id FROM runs").fetchall()}
        new = all_runs - before_runs
        timelines = run_timelines(dconn, new)
        runs = Counter()
        for t in timelines:
            runs[(t.job, t.status)] += 1
        ticks = [t for t in _tick_bodies(dconn) if (t.get("timestamp") or 0) >= t0 - 20]
        by_run = {rid: t for t in ticks for rid in t.get("run_ids") or []}
        for t in timelines:
            if t.run_id in by_run:
                t.tick_at = by_run[t.run_id].get("timestamp")
        event_rows, event_bytes, materialization_bytes = dconn.execute(
            "SELECT count(*), coalesce(sum(pg_column_size(e.*)), 0),"
            " coalesce(avg(pg_column_size(e.*)) FILTER (WHERE dagster_event_type = 'ASSET_MATERIALIZATION'), 0)"
            " FROM event_logs e WHERE id > %s", (before_event_id,)).fetchone()
        batch = [t for t in timelines if t.job == "index_batch"]
        by_type = Counter()
        for t in batch:
            by_type.update(t.events)
    return DagsterStats(dict(runs), batch, ticks, event_rows, sum(by_type.values()), by_type, event_bytes=int(event_bytes),
                        materialization_bytes=float(materialization_bytes))


def dagster_marks(dagster_url: str) -> tuple[set[str], int]:
    with psycopg.connect(dagster_url, autocommit=True) as dconn:
        runs = {r for (r,) in dconn.execute("SELECT run_id FROM runs").fetchall()}
        last_event = dconn.execute("SELECT coalesce(max(id), 0) FROM event_logs").fetchone()[0]
    return runs, last_event


def run_dagster(pages: list[Page], initial: list[tuple[str, bytes]], recrawl: list[tuple[str, bytes]],
                expected_initial: dict[str, str], expected_recrawl: dict[str, str], fake, args,
                work: Path, code: Path) -> dict:
    out: dict = {}
    with ExitStack() as stack:
        url = stack.enter_context(fresh_database("bench_tput_dagster", code))
        dagster_url = stack.enter_context(dagster_database(url))
        home = work / "dagster_home"
        home.mkdir()
        shutil.copy(instance_yaml(code), home / "dagster.yaml")
        env = base_env(url, work / "rag_home_dagster", fake.base_url, code)
        env.update({"DAGSTER_HOME": str(home), "DAGSTER_POSTGRES_URL": dagster_url})
        receiver, base = start_receiver(env, work, "receiver-dagster", code)
        stack.callback(receiver.stop)
        t_start = time.time()
        code_server, workspace = start_code_server(env, work, code)
        stack.callback(code_server.stop)
        daemon = Service("daemon", [str(BIN / "dagster-daemon"), "run", "-w", str(workspace)], env, work, cwd=code)
        stack.callback(daemon.stop)
        monitors = [TreeMonitor(daemon, daemon_role), TreeMonitor(code_server, code_server_role)]
        for monitor in monitors:
            monitor.start()
            stack.callback(monitor.stop)

        def cpu_by_role() -> Counter:
            return sum((Counter(m.cpu_by_role()) for m in monitors), Counter())
        first_tick = wait_for_first_tick(dagster_url, daemon)
        pg = postmaster_pid(url)
        print(f"dagster: daemon up, first delivery_sensor tick {first_tick - t_start:.1f} s after its start "
              f"(postmaster {pg or 'not found: no postgres CPU figure'})")

        def on_timeout() -> str:
            return pending_report(url, dagster_url, daemon, code_server)

        phases = [("initial load", initial, expected_initial), ("recrawl", recrawl, expected_recrawl)]
        for name, bodies, expected in phases[:1] if args.skip_recrawl else phases:
            quiesce(dagster_url)
            before_runs, before_event = dagster_marks(dagster_url)
            cpu_before = (cpu_by_role(), tree_cpu(receiver.pid), tree_cpu(pg), _self_cpu())
            fake_before = (fake.requests, fake.total_tokens)
            with ScanWatch(url) as scans:
                phase = run_phase(f"dagster {name}", url, base, bodies, expected, args.timeout, on_timeout,
                                  args.sample_queries)
            phase.scans = scans.seen
            # A bulk load is done when its search indexes are built again (delivery_sensor requests
            # the build once the backlog drained): that time counts in the load.
            phase.index_ready_at = wait_for_indexes(url, args.timeout)
            phase.runs_ended = quiesce(dagster_url)
            cpu_after = (cpu_by_role(), tree_cpu(receiver.pid), tree_cpu(pg), _self_cpu())
            phase.cpu_read_at = time.time()
            phase.fake_requests = fake.requests - fake_before[0]
            phase.fake_tokens = fake.total_tokens - fake_before[1]
            phase.cpu = {**{f"dagster {k}": v for k, v in cpu_delta(cpu_after[0], cpu_before[0]).items()},
                         "receiver": cpu_delta(cpu_after[1], cpu_before[1]).get("all", 0.0),
                         "postgres": cpu_delta(cpu_after[2], cpu_before[2]).get("all", 0.0),
                         "bench (fake OpenAI, delivery, poller)": cpu_after[3] - cpu_before[3]}
            stats = dagster_stats(dagster_url, before_runs, before_event, phase.t0)
            stats.log_timeline = daemon_log_timeline([daemon, code_server], phase.t0, phase.settled_at)
            out[name] = (phase, stats)
        by_role: dict[str, tuple[int, int]] = {}
        for monitor in monitors:
            for role, (n, top) in monitor.by_role().items():
                seen, peak = by_role.get(role, (0, 0))
                by_role[role] = (seen + n, max(peak, top))
        # The two trees peak apart: the sum of their peaks bounds the whole's from above.
        out["rss"] = (by_role, sum(m.peak_total for m in monitors))
        out["tick_interval"] = _tick_intervals(dagster_url)
        out["sizes"] = {"index database": _database_size(url), "dagster database": _database_size(dagster_url)}
        if args.ui:
            out["ui"] = ui_times(home, env, code, len(pages))
        if not daemon.alive():
            raise BenchFailure(f"dagster-daemon exited during the bench:\n{daemon.tail()}")
        if not code_server.alive():
            raise BenchFailure(f"the code server exited during the bench:\n{code_server.tail()}")
    return out


def _database_size(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]


def ui_times(home: Path, env: dict[str, str], code: Path, pages: int, warm: int = 3) -> dict[str, tuple[float, float]]:
    """The UI's asset-page queries on the loaded instance, as bench/ui_partitions.py makes them
    (its documents from dagster-webserver's own UI): the lineage's live data of the catch-all's
    assets, and the `pages` partition health bar. (cold s, warm median s) each."""
    import statistics

    from bench import ui_partitions as ui

    (home / "workspace.yaml").write_text(
        (code / "workspace.yaml").read_text().replace("working_directory: .", f"working_directory: {code}"))
    graph = [{"path": ["index"]}] + [{"path": [step]} for step in ("pages", "chunks", "embeddings")]
    ui.EXPECTED.clear()
    ui.EXPECTED.update({"PartitionHealthQuery": pages, "AssetGraphLiveQuery": pages})
    queries = [("lineage", "AssetGraphLiveQuery", ui.ASSET_GRAPH_LIVE_QUERY, [{"assetKeys": graph}]),
               ("health", "PartitionHealthQuery", ui.PARTITION_HEALTH_QUERY, [{"assetKey": {"path": ["pages"]}}])]
    server = ui.Webserver(home, env, "ui")
    times = {}
    try:
        times["location load"] = (server.wait_loaded(), 0.0)
        for what, op, document, variables in queries:
            cold = server.query_batches(op, document, variables)[0]
            times[what] = (cold, statistics.median(server.query_batches(op, document, variables)[0]
                                                   for _ in range(warm)))
    finally:
        server.stop()
    return times


_LOG_EVENTS = (
    ("Checking for new runs for sensor: delivery_sensor", "tick starts"),
    ("delivery_sensor - routed", "sensor returns"),
    ("Added partition keys to dynamic partitions definition 'pages'", "daemon added the partitions"),
    ("Completed launch of run", "run submitted"),
    ("QueuedRunCoordinatorDaemon - INFO - Launched", "queue launched run(s)"),
    # The daemon reloads its workspace every 60 s (dagster's RELOAD_WORKSPACE_INTERVAL), starting a new
    # code server per location; the old one, no longer pinged, exits 20 s later.
    ("No heartbeat received", "a code server exits (replaced by the daemon's 60 s workspace reload)"),
)


def daemon_log_timeline(services: list[Service], t0: float, t1: float) -> list[str]:
    """The daemon's and code server's log lines that time a tick (1 s resolution): when the
    tick started, when the sensor function returned, when the daemon had added the partitions."""
    import re
    from datetime import datetime

    stamp = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4})")
    color = re.compile(r"\x1b\[[0-9;]*m")
    events = []
    for path in [path for service in services for path in (service.out_path, service.err_path)]:
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            line = color.sub("", line)
            match = stamp.match(line)
            if not match:
                continue
            ts = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S %z").timestamp()
            if not t0 - 20 <= ts <= t1 + 1:
                continue
            for needle, label in _LOG_EVENTS:
                if needle in line:
                    detail = line.split(needle, 1)[1][:60].strip(" :'") if label != "tick starts" else ""
                    events.append((ts, label, detail if label.startswith(("sensor", "queue")) else ""))
    order = {label: i for i, (_, label) in enumerate(_LOG_EVENTS)}
    events.sort(key=lambda e: (e[0], order[e[1]]))
    # A tick start is worth a line only when that tick had work (the sensor logged what it routed).
    keep = []
    for i, (ts, label, detail) in enumerate(events):
        if label == "tick starts":
            following = next((e for e in events[i + 1:] if e[1] in ("tick starts", "sensor returns")), None)
            if not following or following[1] != "sensor returns":
                continue
        keep.append(f"{ts - t0:6.0f} s  {label} {detail}".rstrip())
    return keep


def _tick_intervals(dagster_url: str) -> list[float]:
    with psycopg.connect(dagster_url, autocommit=True) as dconn:
        stamps = [t.get("timestamp") for t in _tick_bodies(dconn) if t.get("timestamp")]
    return [b - a for a, b in zip(stamps, stamps[1:])]


def instance_yaml(code: Path) -> Path:
    """The instance configuration of the code under test (at the checkout's root before deploy/)."""
    moved = code / "deploy" / "dagster.yaml"
    return moved if moved.is_file() else code / "dagster.yaml"


def instance_settings(path: Path) -> str:
    """The dagster.yaml settings that bound a batch load: concurrent runs and embedding_api slots."""
    import yaml

    concurrency = (yaml.safe_load(path.read_text()) or {}).get("concurrency") or {}
    runs = (concurrency.get("runs") or {}).get("max_concurrent_runs", "unset")
    pools = (concurrency.get("pools") or {}).get("default_limit", "unset")
    return f"max_concurrent_runs {runs}, pool default_limit (embedding_api) {pools}"


def _self_cpu() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


# -- the plain loop ------------------------------------------------------------------------------


def plain_loop_main() -> int:
    """The subprocess of the plain path: route, pick the queued work, apply it in the sensor's batch
    bounds, again at once while there is work; one JSON line per pass and per batch on stdout."""
    from rag_pipeline.core.batch_sizing import plan_batches
    from rag_pipeline.embedders.factory import indexing_chunk_budget, make_embedder
    from rag_pipeline.ingest.batch_apply import RetryPolicy, Skipped, Sourced, Staged, Switched, Failed, apply_batch
    from rag_pipeline.ingest.routing import route_batch
    from rag_pipeline.settings import get_settings
    from rag_pipeline.store import deliveries

    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    settings = get_settings()
    embedder = make_embedder(settings)
    retry = RetryPolicy.from_settings(settings)
    url = settings.database_url
    print(json.dumps({"ready": time.time()}), flush=True)
    while not stopping.is_set():
        with db.connection(url) as conn:
            t_route = time.time()
            routed = route_batch(conn, settings.sensor_batch_size, settings.webhook_max_page_bytes)
            deliveries.claim_due_retries(conn, settings.sensor_batch_size)
            work = deliveries.queued_work(conn, settings.sensor_batch_size)
            if routed.routed or work:
                print(json.dumps({"route": t_route, "end": time.time(), "outcomes": dict(routed.outcomes),
                                  "work": len(work)}), flush=True)
            for batch in plan_batches(work, settings.batch_max_pages, settings.batch_max_tokens, settings.batch_spread):
                marks: dict[str, list[float]] = defaultdict(list)
                t_batch = time.time()
                events = apply_batch(conn, batch, batch_key=None, embedder_for=lambda space: embedder,
                                     chunk_budget=lambda space: indexing_chunk_budget(settings, space),
                                     max_page_bytes=settings.webhook_max_page_bytes, retry=retry)
                for event in events:
                    kind = {Sourced: "MAT pages", Staged: "MAT chunks", Switched: "MAT embeddings",
                            Failed: "FAILED", Skipped: "SKIPPED"}[type(event)]
                    marks[kind].append(time.time())
                print(json.dumps({"batch": t_batch, "end": time.time(), "pages": len(batch),
                                  "first": {k: v[0] for k, v in marks.items()},
                                  "last": {k: v[-1] for k, v in marks.items()},
                                  "count": {k: len(v) for k, v in marks.items()}}), flush=True)
        if not routed.routed and not work:
            stopping.wait(0.2)
    return 0


def run_plain(initial, recrawl, expected_initial, expected_recrawl, fake, args, work: Path, code: Path) -> dict:
    out: dict = {}
    with ExitStack() as stack:
        url = stack.enter_context(fresh_database("bench_tput_plain", code))
        env = base_env(url, work / "rag_home_plain", fake.base_url, code)
        receiver, base = start_receiver(env, work, "receiver-plain", code)
        stack.callback(receiver.stop)
        loop = Service("plain-loop", [sys.executable, str(Path(__file__).resolve()), "--plain-loop"], env, work,
                       cwd=code)
        stack.callback(loop.stop)
        deadline = time.monotonic() + 120
        while "ready" not in loop.out_path.read_text():
            if not loop.alive() or time.monotonic() > deadline:
                raise BenchFailure(f"the plain loop did not start:\n{loop.tail()}")
            time.sleep(0.1)
        monitor = TreeMonitor(loop, lambda p, root: "plain loop" if p.pid == root else ROLE_OTHER)
        monitor.start()
        stack.callback(monitor.stop)
        pg = postmaster_pid(url)

        def on_timeout() -> str:
            return pending_report(url, "", None) + f"\nplain loop's stderr:\n{loop.tail()}"

        for name, bodies, expected in (("initial load", initial, expected_initial),
                                       ("recrawl", recrawl, expected_recrawl)):
            lines_before = len(loop.out_path.read_text().splitlines())
            cpu_before = (tree_cpu(loop.pid), tree_cpu(receiver.pid), tree_cpu(pg), _self_cpu())
            fake_before = (fake.requests, fake.total_tokens)
            phase = run_phase(f"plain {name}", url, base, bodies, expected, args.timeout, on_timeout,
                              args.sample_queries)
            time.sleep(0.5)
            cpu_after = (tree_cpu(loop.pid), tree_cpu(receiver.pid), tree_cpu(pg), _self_cpu())
            phase.cpu_read_at = time.time()
            phase.fake_requests = fake.requests - fake_before[0]
            phase.fake_tokens = fake.total_tokens - fake_before[1]
            phase.cpu = {"plain loop": cpu_delta(cpu_after[0], cpu_before[0]).get("all", 0.0),
                         "receiver": cpu_delta(cpu_after[1], cpu_before[1]).get("all", 0.0),
                         "postgres": cpu_delta(cpu_after[2], cpu_before[2]).get("all", 0.0),
                         "bench (fake OpenAI, delivery, poller)": cpu_after[3] - cpu_before[3]}
            lines = loop.out_path.read_text().splitlines()[lines_before:]
            out[name] = (phase, [json.loads(line) for line in lines if line.startswith("{")])
        out["rss"] = (monitor.by_role(), monitor.peak_total)
        if not loop.alive():
            raise BenchFailure(f"the plain loop exited:\n{loop.tail()}")
    return out


def checkout_code(rev: str | None, work: Path) -> Path:
    """The code the receiver, the daemon and the plain loop run: the checkout itself, or a clean
    `git archive` of `rev` (other engineers' uncommitted edits then change nothing mid-run)."""
    if not rev:
        return ROOT
    import io
    import tarfile

    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], capture_output=True, check=True).stdout
    dest = work / "code"
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest


def code_version(rev: str | None = None) -> str:
    """What the runs load: `rev`, or HEAD and the uncommitted changes of the checkout (which may be
    edited meanwhile: run workers import it when they start)."""
    import hashlib

    def git(*argv: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(ROOT), *argv], capture_output=True, text=True,
                                  timeout=30).stdout.rstrip("\n")
        except (OSError, subprocess.SubprocessError):
            return ""

    if rev:
        return f"git archive of {rev} ({git('rev-parse', '--short', rev) or 'unknown'})"
    head = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = [line[3:] for line in git("status", "--porcelain", "--", "rag_pipeline", "webhook_sensor", "sql",
                                      "deploy", "workspace.yaml", "pyproject.toml").splitlines()]
    if not dirty:
        return head
    digest = hashlib.sha256()
    for name in sorted(dirty):
        path = ROOT / name
        digest.update(name.encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return f"{head} + uncommitted {', '.join(sorted(dirty))} (content {digest.hexdigest()[:10]})"


# -- report --------------------------------------------------------------------------------------


def mib(n: int) -> str:
    return f"{n / 2 ** 20:.0f} MiB"


def print_phase(phase: PhaseResult) -> None:
    print(f"  delivered {phase.delivered} pages in {phase.delivered_at - phase.t0:.1f} s "
          f"({phase.delivered / max(phase.delivered_at - phase.t0, 1e-9):.0f}/s, {DELIVERY_THREADS} threads)")
    print(f"  all {phase.watched} watched pages searchable {phase.searchable_s:.1f} s after the first POST "
          f"(poller, 0.5 s): {phase.pages_per_min:.0f} pages/min; exact span first received → last applied "
          f"{phase.exact_span:.1f} s; every delivery settled at {phase.settled_at - phase.t0:.1f} s")
    print(f"  deliveries: {dict(sorted(phase.outcomes.items()))}")
    if phase.latency_db:
        d, p = phase.latency_db, phase.latency_poll
        print(f"  delivery → searchable (applied_at - received_at): p50 {percentile(d, 50):.1f} s, "
              f"p95 {percentile(d, 95):.1f} s, max {max(d):.1f} s; as polled: p50 {percentile(p, 50):.1f} s, "
              f"p95 {percentile(p, 95):.1f} s")
    print(f"  embedding requests {phase.fake_requests}, tokens {phase.fake_tokens:,}; "
          f"load average after {phase.load[0]:.2f} {phase.load[1]:.2f} {phase.load[2]:.2f}")
    print("  CPU seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in phase.cpu.items() if abs(v) >= 0.05 or k == "postgres")
          + f"; total {sum(phase.cpu.values()):.1f} in {cpu_span(phase)}")
    for line in phase.queries:
        print(f"  {line}")


def _rel(ts: float | None, t0: float) -> str:
    return f"{ts - t0:7.1f}" if ts else "      -"


def print_dagster_runs(stats: DagsterStats, phase: PhaseResult) -> dict[str, float]:
    t0 = phase.t0
    print("  runs: " + ", ".join(f"{job} {status}: {n}" for (job, status), n in sorted(stats.runs.items())))
    for t in stats.ticks:
        if (t.get("timestamp") or 0) >= t0 - 16 and (t.get("timestamp") or 0) <= phase.settled_at:
            took = (t.get("end_timestamp") or 0) - (t.get("timestamp") or 0)
            print(f"    tick {_rel(t.get('timestamp'), t0)} s  {t.get('status'):8} "
                  f"{len(t.get('run_ids') or []):2d} run(s)" + (f", evaluation {took:.1f} s" if took > 0 else "")
                  + (f"  ({t.get('skip_reason')})" if t.get("skip_reason") else ""))
    if stats.log_timeline:
        print("  from the daemon's log (seconds after the first POST, 1 s resolution):")
        for line in stats.log_timeline:
            print(f"    {line}")
    pages_total = sum(r.pages for r in stats.batch_runs) or 1
    print(f"  event_logs rows: {stats.event_rows} written in the phase, {stats.event_rows_batch} by index_batch "
          f"runs = {stats.event_rows_batch / pages_total:.2f} per page applied "
          f"({stats.event_rows / pages_total:.2f} per page counting every row)")
    print("    by type: " + ", ".join(f"{k} {v}" for k, v in stats.events_by_type.most_common()))
    print(f"  event_logs bytes: {stats.event_bytes:,} written in the phase = {stats.event_bytes / pages_total:,.0f} "
          f"per page applied; a materialization row {stats.materialization_bytes:,.0f} bytes on average")
    print("  index_batch runs (seconds after the first POST; a materialization's time is when it was written,"
          " which is a flush when events are written in batches):")
    print("    pages    tick enqueued starting RUN_START STEP_START first-MAT  last-MAT STEP_END  RUN_END"
          " | launch to-step op ms/page")
    agg: Counter = Counter()
    busy: list[tuple[float, float]] = []
    for r in stats.batch_runs:
        m, last = r.marks, r.last
        enq, start, step = m.get("RUN_ENQUEUED"), m.get("RUN_START"), m.get("STEP_START")
        deq = m.get("RUN_DEQUEUED") or m.get("RUN_STARTING")
        mats = [v for k, v in m.items() if k.startswith("MAT ")]
        last_mats = [v for k, v in last.items() if k.startswith("MAT ")]
        step_end = m.get("STEP_SUCCESS") or m.get("STEP_FAILURE")
        end = m.get("RUN_SUCCESS") or m.get("RUN_FAILURE")
        launch = (start - enq) if start and enq else float("nan")
        wait = (step - start) if step and start else float("nan")
        op = (step_end - step) if step_end and step else float("nan")
        print(f"    {r.pages:5d} {_rel(r.tick_at, t0)} {_rel(enq, t0)} {_rel(deq, t0)} {_rel(start, t0)}  "
              f"{_rel(step, t0)}   {_rel(min(mats) if mats else None, t0)} {_rel(max(last_mats) if last_mats else None, t0)}"
              f"  {_rel(step_end, t0)} {_rel(end, t0)} | {launch:6.1f} {wait:9.1f} {op / max(r.pages, 1) * 1000:7.1f}"
              f"  {r.status}")
        if step and step_end:
            busy.append((step, step_end))
            agg["op"] += op
            agg["op pages"] += r.pages
        for key, a, b in (("tick→enqueued", r.tick_at, enq), ("enqueued→starting", enq, deq),
                          ("starting→RUN_START", deq, start), ("to step", start, step),
                          ("STEP_END→RUN_END", step_end, end)):
            if a and b:
                agg[key] += b - a
        agg["pages"] += r.pages
    # Wall time during which at least one op was applying pages (runs overlap, 2 at a time).
    covered, edge = 0.0, float("-inf")
    for a, b in sorted(busy):
        covered += max(0.0, b - max(a, edge))
        edge = max(edge, b)
    agg["op busy wall"] = covered
    return dict(agg)


def plain_aggregates(lines: list[dict]) -> dict[str, float]:
    agg = Counter()
    for line in lines:
        if "route" in line:
            agg["route"] += line["end"] - line["route"]
            agg["passes"] += 1
            continue
        first, last = line["first"], line["last"]
        agg["batches"] += 1
        agg["pages"] += line["pages"]
        if "MAT chunks" in last:
            agg["stage"] += last["MAT chunks"] - line["batch"]
        if "MAT embeddings" in first and "MAT chunks" in last:
            agg["embed"] += first["MAT embeddings"] - last["MAT chunks"]
            agg["switch"] += last["MAT embeddings"] - first["MAT embeddings"]
        agg["batch wall"] += line["end"] - line["batch"]
    return dict(agg)


def print_breakdown(d: dict[str, float], p: dict[str, float]) -> None:
    dn, pn = max(d.get("op pages", 0), 1), max(p.get("pages", 0), 1)
    runs = int(d.get("runs", 0))
    print(f"  applying pages: dagster ops {d.get('op', 0):.1f} s in {runs} run(s) = {d.get('op', 0) / dn * 1000:.1f} ms "
          f"a page each ({d.get('op busy wall', 0):.1f} s of wall with an op running = "
          f"{d.get('op busy wall', 0) / dn * 1000:.1f} ms a page); plain loop {p.get('batch wall', 0):.1f} s in "
          f"{int(p.get('batches', 0))} batch(es) = {p.get('batch wall', 0) / pn * 1000:.1f} ms a page "
          f"(source+stage {p.get('stage', 0) / pn * 1000:.1f}, shared embedding {p.get('embed', 0) / pn * 1000:.1f}, "
          f"switch {p.get('switch', 0) / pn * 1000:.1f})")
    print(f"  dagster per run, summed over {runs}: tick→enqueued {d.get('tick→enqueued', 0):.1f} s, enqueued→starting "
          f"{d.get('enqueued→starting', 0):.1f} s, starting→RUN_START {d.get('starting→RUN_START', 0):.1f} s, "
          f"RUN_START→STEP_START {d.get('to step', 0):.1f} s (the embedding_api pool's slot is waited for in the queue, "
          f"enqueued→starting), STEP_END→RUN_END "
          f"{d.get('STEP_END→RUN_END', 0):.1f} s")
    print(f"  plain loop: {int(p.get('passes', 0))} routing pass(es), {p.get('route', 0):.1f} s routing")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--changed-fraction", type=float, default=0.1)
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds each Dagster (and plain) phase may take before the bench fails")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, DAGSTER_HOME)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--code-rev", metavar="REV",
                        help="run the receiver, daemon and plain loop from `git archive REV` instead of the "
                             "checkout's working tree")
    parser.add_argument("--code-dir", metavar="DIR", type=Path,
                        help="run them from this copy of the project instead (an experiment's patched tree)")
    parser.add_argument("--sample-queries", action="store_true",
                        help="sample pg_stat_activity every 50 ms and print where the database's time goes "
                             "(diagnosis; adds a little load)")
    parser.add_argument("--dagster-only", action="store_true",
                        help="the Dagster path alone, no plain loop beside it (a 100,000-page run: the loop "
                             "would double its hour)")
    parser.add_argument("--skip-recrawl", action="store_true",
                        help="with --dagster-only: the initial load alone")
    parser.add_argument("--ui", action="store_true",
                        help="time the UI's asset-page queries on the loaded instance at the end")
    parser.add_argument("--plain-loop", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_loop:
        return plain_loop_main()
    if args.skip_recrawl and not args.dagster_only:
        parser.error("--skip-recrawl needs --dagster-only (the plain loop is compared on both phases)")

    def interrupted(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)

    from rag_pipeline.ingest.rules import configured_boilerplate_rules
    from rag_pipeline_tests.fakes.openai_server import FakeOpenAI

    t = time.time()
    pages = make_corpus(args.pages, args.seed)
    changed = edit_paragraphs(pages, args.changed_fraction, args.seed)
    rules = configured_boilerplate_rules()
    texts = {p.key: render(p.blocks) for p in pages}
    new_texts = {k: render(b) for k, b in changed.items()}
    expected_initial = {k: expected_hash(k, text, rules) for k, text in texts.items()}
    expected_recrawl = {k: expected_hash(k, text, rules) for k, text in new_texts.items()}
    rng = random.Random(args.seed + 3)
    initial = [(p.url, gzip.compress(texts[p.key].encode())) for p in pages]
    recrawl = [(p.url, gzip.compress(new_texts.get(p.key, texts[p.key]).encode())) for p in pages]
    rng.shuffle(initial)
    rng.shuffle(recrawl)
    tokens = [p.tokens for p in pages]
    print(f"pipeline throughput: {len(pages)} pages, {sum(tokens):,} tokens (min {min(tokens)}, median "
          f"{int(percentile(tokens, 50))}, max {max(tokens)}), {len(changed)} changed in the recrawl; "
          f"corpus built in {time.time() - t:.1f} s")
    version = f"the copy in {args.code_dir}" if args.code_dir else code_version(args.code_rev)
    print(f"code: {version}")
    print(f"machine: {os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    work = Path(tempfile.mkdtemp(prefix="bench-throughput-"))
    status = 1
    try:
        with FakeOpenAI(dimensions=DIMENSIONS) as fake:
            code = args.code_dir.resolve() if args.code_dir else checkout_code(args.code_rev, work)
            print(f"dagster.yaml: {instance_settings(instance_yaml(code))}")
            dag = run_dagster(pages, initial, recrawl, expected_initial, expected_recrawl, fake, args, work, code)
            print(f"dagster path done; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
            plain = None if args.dagster_only else run_plain(initial, recrawl, expected_initial, expected_recrawl,
                                                             fake, args, work, code)
        status = report(dag, plain, len(changed), version, frozen=bool(args.code_rev or args.code_dir))
    except BenchFailure as exc:
        print(f"\nFAILED: {exc}", flush=True)
    except KeyboardInterrupt as exc:
        print(f"\ninterrupted ({str(exc) or 'Ctrl-C'}): processes stopped, databases removed", flush=True)
        status = 130
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return status


def cpu_span(phase: PhaseResult) -> str:
    """The wall time the CPU figures cover: for a Dagster phase, from the first POST until its
    search indexes were valid and no run was left, later than `settled_at`."""
    end = phase.cpu_read_at if phase.cpu_read_at is not None else phase.settled_at
    span = f"{end - phase.t0:.1f} s wall"
    if phase.index_ready_at is None:
        return span
    runs = "the runs ended" if phase.runs_ended else "some runs were still going"
    return (f"{span} (from the first POST until the search indexes were valid and {runs}; every "
            f"delivery settled at {phase.settled_at - phase.t0:.1f} s)")


def hnsw_line(phase: PhaseResult) -> str:
    """The load with its index builds counted: from the first delivery to HNSW and GIN valid again."""
    ready = max(phase.index_ready_at or phase.searchable_at, phase.searchable_at)
    minutes = (ready - phase.t0) / 60
    return (f"{phase.name} with the search indexes built again: {minutes:.1f} min "
            f"({phase.watched / minutes:,.0f} pages/min)")


def recrawl_scan_line(phase: PhaseResult) -> str:
    exact = sum(scan != "hnsw" for scan in phase.scans)
    return (f"search used the HNSW index throughout the recrawl: {'yes' if phase.hnsw_throughout else 'no'} "
            f"({len(phase.scans)} samples, {exact} exact)")


def report(dag: dict, plain: dict, changed: int, version: str, frozen: bool) -> int:
    print()
    figures = {}
    for name in [n for n in ("initial load", "recrawl") if n in dag]:
        phase, stats = dag[name]
        print(f"== dagster, {name} ==")
        print_phase(phase)
        d = print_dagster_runs(stats, phase)
        d["runs"] = len(stats.batch_runs)
        if plain is None:
            figures[name] = (phase, stats, None)
            print()
            continue
        pphase, lines = plain[name]
        print(f"== plain loop, {name} ==")
        print_phase(pphase)
        p = plain_aggregates(lines)
        print(f"== breakdown, {name} ==")
        print_breakdown(d, p)
        figures[name] = (phase, stats, pphase)
        print()
    roles, total = dag["rss"]
    print("== memory (peak RSS, sampled every 0.5 s) ==")
    for role in sorted(roles, key=lambda r: (r.startswith(ROLE_OTHER), r)):
        n, top = roles[role]
        print(f"  {role:12} {mib(top):>9} (max of {n} process{'es' if n > 1 else ''})")
    print(f"  daemon tree  {mib(total):>9} (peak of the sum)")
    if plain is not None:
        proles, ptotal = plain["rss"]
        print(f"  plain loop   {mib(proles.get('plain loop', (0, 0))[1]):>9}")
    intervals = dag["tick_interval"]
    if intervals:
        print(f"  delivery_sensor tick interval: median {percentile(intervals, 50):.1f} s, max {max(intervals):.1f} s")

    print("== sizes at the end ==")
    for name, size in dag["sizes"].items():
        print(f"  {name:17} {size / 1e6:>10,.1f} MB")
    if "ui" in dag:
        print("== the UI's asset pages on the loaded instance (dagster-webserver, its own queries) ==")
        for what, (cold, warm) in dag["ui"].items():
            print(f"  {what:14} {cold:6.2f} s" + (f" cold, {warm:.2f} s warm (median of 3)" if what != "location load" else ""))
    d0, s0, p0 = figures["initial load"]
    if p0 is None:
        p95 = percentile(d0.latency_db, 95)
        recrawled = ""
        if "recrawl" in figures:
            d1, s1, _ = figures["recrawl"]
            recrawled = f"; recrawl p95 {percentile(d1.latency_db, 95):.1f} s in {len(s1.batch_runs)} runs"
        print(f"\n  initial load: {d0.watched:,} pages searchable in {d0.searchable_s / 60:.1f} min "
              f"({d0.pages_per_min:.0f} pages/min) in {len(s0.batch_runs)} runs{recrawled}")
        print(f"  {hnsw_line(d0)}" + (f"; {recrawl_scan_line(figures['recrawl'][0])}" if "recrawl" in figures else ""))
        print(f"THROUGHPUT dagster={d0.pages_per_min:.0f} pages/min plain=- ratio=- searchable_p95={p95:.1f} s")
        return 0
    d1, s1, p1 = figures["recrawl"]
    ratio = d0.pages_per_min / p0.pages_per_min
    p95 = percentile(d0.latency_db, 95)
    runs_changed = len(s1.batch_runs) / max(changed, 1) * 1000
    print("\n== acceptance (issue 10) ==")
    checks = [
        (f"dagster ≥ 0.8 × plain pages/min: {d0.pages_per_min:.0f} vs {p0.pages_per_min:.0f} (x{ratio:.2f})",
         ratio >= 0.8),
        (f"dagster ≥ 2,550 pages/min: {d0.pages_per_min:.0f}", d0.pages_per_min >= 2550),
        (f"delivery → searchable p95 ≤ 30 s: {p95:.1f} s (recrawl {percentile(d1.latency_db, 95):.1f} s)",
         p95 <= 30),
        (f"runs per 1,000 changed pages ≤ 10: {runs_changed:.1f} ({len(s1.batch_runs)} runs for {changed} "
         f"changed pages; initial load {len(s0.batch_runs)} runs for {d0.watched} pages)", runs_changed <= 10),
    ]
    checks.append((recrawl_scan_line(d1), d1.hnsw_throughout))
    for text, ok in checks:
        print(f"  [{'met' if ok else 'NOT met'}] {text}")
    print(f"  {hnsw_line(d0)}")
    print(f"  recrawl: changed pages searchable after {d1.searchable_s:.1f} s (dagster) vs "
          f"{p1.searchable_s:.1f} s (plain); all {d1.delivered} deliveries settled after "
          f"{d1.settled_at - d1.t0:.1f} s vs {p1.settled_at - p1.t0:.1f} s")
    now = version if frozen else code_version()
    if now != version:
        print(f"WARNING: the code changed during the bench (was {version}, now {now}): its runs may have "
              "loaded different versions")
    print(f"THROUGHPUT dagster={d0.pages_per_min:.0f} pages/min plain={p0.pages_per_min:.0f} pages/min "
          f"ratio={ratio:.2f} searchable_p95={p95:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
