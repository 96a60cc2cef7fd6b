"""Load the webhook receiver over loopback and compare it with a minimal receiver in the same run.

    .venv/bin/python bench/webhook_load.py [--duration 30] [--open-duration 30] [--levels 1,8,32,128]
                                           [--rate 1000] [--workers 2] [--pool-size 4]
                                           [--with-ingestion] [--pg-set NAME=VALUE ...]

Both receivers (`webhook_sensor.main:app` and `bench/webhook_baseline.py`, one INSERT and nothing
else) run as uvicorn processes with the same workers and pool size, each against a fresh
database of one embedded PostgreSQL (or DATABASE_URL's server). The levels alternate between them
so drift hits both alike, and each phase starts from a settled server (CHECKPOINT, then the page
cache written back), so it pays for its own writes and not for the previous phase's. The load
generator is light on purpose: one process, raw asyncio sockets (keep-alive HTTP/1.1, prebuilt
requests), no HTTP client library. Posted pages are 5-100 KB of markdown, gzip'd; rids are unique
and 10% of requests repeat an acknowledged rid. Closed loop at each concurrency, then an open-loop
phase at a fixed offered rate with at most 32 in flight (latency counted from the scheduled send
time, so queueing shows). Afterwards every acknowledged rid must be in the table exactly once.
Bounded: each phase stops at its deadline.

The generator shares the cores it measures: each phase prints its CPU and the servers' (per delivery
too). The open loop splits its latency into "sent late" (every connection busy, so requests due
meanwhile queue) and "write to answer", and a 1 ms ticker on the generator's own event loop shows
whether the generator itself ever stalled, so a late generator is not mistaken for a slow receiver.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import gzip
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import psycopg.sql

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rag_pipeline.store import db, embedded, schema  # noqa: E402

TOKEN = "bench-token"
WORDS = ("index vector page crawl delivery token chunk embedding search query postgres hash "
         "receiver sensor partition freshness redirect status webhook latency throughput the a of "
         "and to in is for with on that this by from at as be are it").split()


def markdown_page(rng: random.Random, size: int) -> bytes:
    out, n = [], 0
    while n < size:
        if rng.random() < 0.1:
            line = "## " + " ".join(rng.choices(WORDS, k=rng.randint(2, 6))).title()
        else:
            line = " ".join(rng.choices(WORDS, k=rng.randint(40, 120))) + "."
        out.append(line)
        n += len(line) + 2
    return ("# " + " ".join(rng.choices(WORDS, k=4)) + "\n\n" + "\n\n".join(out)).encode()[:size]


def make_bodies(count: int = 48, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    return [gzip.compress(markdown_page(rng, rng.randint(5_000, 100_000)), 6) for _ in range(count)]


@dataclass
class Result:
    name: str
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    elapsed: float = 0.0
    acked: list[str] = field(default_factory=list)
    # Open loop only. `late`: from the scheduled send time to the write. A request is sent late
    # when all max-in-flight connections are busy (the receiver is slow: the requests due meanwhile
    # queue behind it) or when the generator itself stalls; `loop_stalls` tells which, from a 1 ms
    # ticker on the generator's own event loop. `service`: from the write to the answer.
    late: list[float] = field(default_factory=list)
    service: list[float] = field(default_factory=list)
    loop_stalls: list[float] = field(default_factory=list)
    gc_max_pause: float = 0.0
    max_in_flight: int = 0

    def line(self) -> str:
        lat = sorted(self.latencies)
        if not lat:
            return f"{self.name:<28} no answers, errors={self.errors}"

        def pct(p: float) -> float:
            return lat[min(len(lat) - 1, int(p * len(lat)))] * 1000

        text = (f"{self.name:<28} {len(lat) / self.elapsed:8.0f}/s  p50 {pct(.5):7.1f}  p95 {pct(.95):7.1f}  "
                f"p99 {pct(.99):7.1f}  max {lat[-1] * 1000:7.1f} ms  errors {self.errors}  (n={len(lat)})")
        if self.late:
            late, service, stalls = sorted(self.late), sorted(self.service), sorted(self.loop_stalls)
            text += (f"\n{'':<28} of which: sent late p50/p99 {_ms(late, .5):.1f}/{_ms(late, .99):.1f} ms "
                     f"(all {self.max_in_flight} connections busy, or the generator stalled), "
                     f"from write to answer p50/p99 {_ms(service, .5):.1f}/{_ms(service, .99):.1f} ms; "
                     f"generator loop stalls p99/max {_ms(stalls, .99):.1f}/{_ms(stalls, 1):.1f} ms, "
                     f"longest GC pause {self.gc_max_pause * 1000:.1f} ms")
        return text

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0

    def p99(self) -> float:
        lat = sorted(self.latencies)
        return lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1000 if lat else float("inf")


def _ms(sorted_values: list[float], p: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(p * len(sorted_values)))] * 1000


class Traffic:
    """Prebuilt requests: unique rids, 10% repeats of acknowledged ones, ~2,000 page URLs."""

    def __init__(self, port: int, bodies: list[bytes], seed: int):
        self.port = port
        self.bodies = bodies
        self.rng = random.Random(seed)
        self.acked: list[str] = []
        self.n = 0

    def next(self) -> tuple[str, bytes]:
        self.n += 1
        if self.n % 10 == 0 and self.acked:
            rid = self.rng.choice(self.acked)
        else:
            rid = uuid.uuid4().hex
        body = self.bodies[self.n % len(self.bodies)]
        head = (f"POST /webhook?token={TOKEN} HTTP/1.1\r\nhost: 127.0.0.1:{self.port}\r\n"
                f"rid: {rid}\r\nurl: https://bench.example.com/page/{self.rng.randrange(2000)}\r\n"
                f"CB-Status: 200\r\nOriginal-Status: 200\r\nContent-Encoding: gzip\r\n"
                f"Content-Type: text/markdown; charset=utf-8\r\ncontent-length: {len(body)}\r\n\r\n")
        return rid, head.encode() + body


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes) -> int:
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    for line in head.split(b"\r\n"):
        if line[:15].lower() == b"content-length:":
            length = int(line[15:])
    if length:
        await reader.readexactly(length)
    return status


async def closed_loop(port: int, traffic: Traffic, concurrency: int, duration: float, name: str) -> Result:
    result = Result(name)
    deadline = time.perf_counter() + duration

    async def user():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            while time.perf_counter() < deadline:
                rid, request = traffic.next()
                start = time.perf_counter()
                try:
                    status = await asyncio.wait_for(exchange(reader, writer, request), 30)
                except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
                    result.errors += 1
                    writer.close()
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                    continue
                result.latencies.append(time.perf_counter() - start)
                if status == 200:
                    traffic.acked.append(rid)
                else:
                    result.errors += 1
        finally:
            writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(user() for _ in range(concurrency)))
    result.elapsed = time.perf_counter() - start
    return result


async def open_loop(port: int, traffic: Traffic, rate: float, duration: float, max_in_flight: int,
                    name: str) -> Result:
    result = Result(name, max_in_flight=max_in_flight)
    idle: asyncio.Queue = asyncio.Queue()
    for _ in range(max_in_flight):
        idle.put_nowait(await asyncio.open_connection("127.0.0.1", port))
    tasks = set()

    async def one(scheduled: float, conn) -> None:
        reader, writer = conn
        rid, request = traffic.next()
        written = time.perf_counter()
        result.late.append(max(0.0, written - scheduled))  # uvloop's ms timers may fire early
        try:
            status = await asyncio.wait_for(exchange(reader, writer, request), 30)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            result.errors += 1
            writer.close()
            idle.put_nowait(await asyncio.open_connection("127.0.0.1", port))
            return
        answered = time.perf_counter()
        result.latencies.append(answered - scheduled)  # queueing included
        result.service.append(answered - written)
        if status == 200:
            traffic.acked.append(rid)
        else:
            result.errors += 1
        idle.put_nowait(conn)

    # The generator's own garbage collector must not pause it: what earlier phases left (acked
    # rids, latencies) is frozen out of the collections, and the longest pause is reported.
    gc.collect()
    gc.freeze()
    pauses: list[float] = []
    began = [0.0]

    def watch_gc(phase: str, info: dict) -> None:
        if phase == "start":
            began[0] = time.perf_counter()
        else:
            pauses.append(time.perf_counter() - began[0])

    gc.callbacks.append(watch_gc)

    async def ticker() -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            result.loop_stalls.append(max(0.0, time.perf_counter() - before - 0.001))

    ticking = asyncio.create_task(ticker())
    start = time.perf_counter()
    total = int(rate * duration)
    for i in range(total):
        scheduled = start + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        conn = await idle.get()  # at most max_in_flight outstanding; waiting here is latency too
        task = asyncio.create_task(one(scheduled, conn))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    ticking.cancel()
    result.elapsed = time.perf_counter() - start
    gc.callbacks.remove(watch_gc)
    gc.unfreeze()
    result.gc_max_pause = max(pauses, default=0.0)
    while not idle.empty():
        idle.get_nowait()[1].close()
    return result


class Server:
    """A receiver as a uvicorn subprocess on a socket bound here."""

    def __init__(self, name: str, app: str, database_url: str, workers: int, pool_size: int, log: Path,
                 app_dir: str | None = None):
        self.name = name
        # A free port, handed over by number: uvicorn's --fd treats the socket as AF_UNIX, so
        # TCP_NODELAY is never set and every answer waits ~40 ms for a delayed ACK.
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        env = {**os.environ, "DATABASE_URL": database_url, "WEBHOOK_TOKEN": TOKEN,
               "WEBHOOK_POOL_SIZE": str(pool_size), "WEBHOOK_ACCESS_LOG": "1"}
        if workers > 1:
            env["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="bench-metrics-")
        cmd = [sys.executable, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(self.port),
               "--workers", str(workers),
               "--no-access-log", "--log-level", "warning"]
        if app_dir:
            cmd += ["--app-dir", app_dir]
        self.log = open(log, "wb")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT, cwd=ROOT)
        self.wait_ready()

    def wait_ready(self) -> None:
        import http.client

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited; see {self.log.name}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("POST", "/webhook", body=b"")
                conn.getresponse().read()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not start")

    def cpu_seconds(self) -> float:
        """User+system CPU of the server's processes so far (children included via /proc)."""
        pids = [self.proc.pid] + _children(self.proc.pid)
        total = 0.0
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except OSError:
                pass
        return total

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def _children(pid: int) -> list[int]:
    try:
        kids = [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []
    return kids + [g for k in kids for g in _children(k)]


def verify(database_url: str, acked: list[str]) -> tuple[int, int]:
    """(acknowledged rids, of which missing or not exactly once)."""
    unique = list(set(acked))
    bad = 0
    with psycopg.connect(database_url) as conn:
        for i in range(0, len(unique), 20_000):
            part = unique[i:i + 20_000]
            found = dict(conn.execute("SELECT rid, count(*) FROM deliveries WHERE rid = ANY(%s) GROUP BY rid",
                                      (part,)).fetchall())
            bad += sum(1 for rid in part if found.get(rid) != 1)
    return len(unique), bad


def settle(server_url: str) -> None:
    """Start each phase from a settled server: checkpoint, then write back the page cache, so a
    phase pays for its own writes (its checkpoints included) and not for the previous phase's."""
    try:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
    except psycopg.errors.InsufficientPrivilege:
        pass  # a server we may not checkpoint: the phase then inherits the previous one's debt
    os.sync()


def fresh_database(server_url: str, name: str) -> str:
    url = db.with_database(server_url, name)
    schema.prepare(url)
    return url


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=30.0, help="seconds per level and phase")
    parser.add_argument("--levels", default="1,8,32,128")
    parser.add_argument("--open-duration", type=float, default=30.0,
                        help="seconds of the open-loop phase (90 or more includes its own checkpoint and "
                             "several of the kernel's 30 s write-back cycles)")
    parser.add_argument("--rate", type=float, default=1000.0, help="open-loop offered rate (deliveries/s)")
    parser.add_argument("--max-in-flight", type=int, default=32)
    parser.add_argument("--workers", type=int, default=int(os.environ.get("WEBHOOK_WORKERS", "2")))
    parser.add_argument("--pool-size", type=int, default=int(os.environ.get("WEBHOOK_POOL_SIZE", "4")))
    parser.add_argument("--pg-set", action="append", default=[], metavar="NAME=VALUE",
                        help="embedded PostgreSQL only: a server setting on top of the project's (repeatable)")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop",
                        help="the generator's event loop (uvloop: less of the shared CPU)")
    parser.add_argument("--only", choices=["receiver", "baseline"], help="load one receiver only (tuning)")
    parser.add_argument("--with-ingestion", action="store_true",
                        help="keep delivery_sensor + index_page runs busy on the receiver's database meanwhile")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",") if x]

    work = Path(tempfile.mkdtemp(prefix="webhook-bench-"))
    pg = None
    server_url = os.environ.get("DATABASE_URL")
    if not server_url:
        pg = embedded.temporary_server(work / "pgdata")
        server_url = pg.get_uri("postgres")
        if args.pg_set:
            with psycopg.connect(server_url, autocommit=True) as conn:
                for setting in args.pg_set:
                    name, _, value = setting.partition("=")
                    conn.execute(psycopg.sql.SQL("ALTER SYSTEM SET {} = {}").format(
                        psycopg.sql.Identifier(name), psycopg.sql.Literal(value)))
                conn.execute("SELECT pg_reload_conf()")
                time.sleep(0.5)
                pending = [r[0] for r in conn.execute("SELECT name FROM pg_settings WHERE pending_restart")]
            if pending:
                parser.error(f"--pg-set: {', '.join(pending)} would need a server restart; only settings "
                             "a reload applies are supported")
    bodies = make_bodies()
    sizes = [len(b) for b in bodies]
    print(f"webhook bench: {os.cpu_count()} cores, workers={args.workers}, pool={args.pool_size}, "
          f"{args.duration:.0f} s per phase, bodies {min(sizes)//1000}-{max(sizes)//1000} KB gzip'd "
          f"(pages 5-100 KB), 10% duplicate rids, ingestion={'on' if args.with_ingestion else 'off'}, "
          f"generator loop {args.loop}, pg settings {', '.join(args.pg_set) or 'default'}")

    targets = {}
    if args.only != "baseline":
        targets["receiver"] = ("webhook_sensor.main:app", None)
    if args.only != "receiver":
        targets["baseline"] = ("webhook_baseline:app", str(ROOT / "bench"))
    servers, traffic, urls, results = {}, {}, {}, {name: [] for name in targets}
    ingest = None
    try:
        for i, (name, (app, app_dir)) in enumerate(targets.items()):
            urls[name] = fresh_database(server_url, f"bench_{name}_{uuid.uuid4().hex[:8]}")
            servers[name] = Server(name, app, urls[name], args.workers, args.pool_size, work / f"{name}.log", app_dir)
            traffic[name] = Traffic(servers[name].port, bodies, seed=i)
        if args.with_ingestion:
            # Settling between phases takes a while too: a generous deadline, stopped at the end anyway.
            total = 3 * (len(levels) * args.duration + args.open_duration) * len(targets) + 300
            ingest = subprocess.Popen(
                [sys.executable, str(ROOT / "bench" / "webhook_ingest_bg.py"), str(total)],
                env={**os.environ, "DATABASE_URL": urls.get("receiver") or urls["baseline"],
                     "EMBEDDING_PROVIDER": "hash", "RAG_HOME": str(work / "rag")},
                stdout=open(work / "ingest.log", "wb"), stderr=subprocess.STDOUT, cwd=ROOT)
            time.sleep(5)  # let it load the definitions and start ticking

        if args.loop == "uvloop":
            import uvloop

            run = uvloop.run
        else:
            run = asyncio.run
        phases = [("closed", c) for c in levels] + [("open", args.rate)]
        for kind, level in phases:
            for name in targets:
                settle(server_url)
                cpu0, gen0 = servers[name].cpu_seconds(), time.process_time()
                if kind == "closed":
                    r = run(closed_loop(servers[name].port, traffic[name], level, args.duration,
                                                f"{name} c={level}"))
                else:
                    r = run(open_loop(servers[name].port, traffic[name], level, args.open_duration,
                                              args.max_in_flight, f"{name} open {level:.0f}/s"))
                cpu, gen = servers[name].cpu_seconds() - cpu0, time.process_time() - gen0
                results[name].append((kind, level, r))
                print(f"{r.line()}  server cpu {cpu / r.elapsed:.2f} cores "
                      f"({cpu / max(1, len(r.latencies)) * 1000:.2f} ms per delivery), "
                      f"generator {gen / r.elapsed:.2f} cores", flush=True)

        print()
        if "receiver" in results and "baseline" in results:
            for (kind, level, mine), (_, _, base) in zip(results["receiver"], results["baseline"]):
                if kind == "closed":
                    ratio = mine.throughput / base.throughput if base.throughput else float("nan")
                    print(f"ratio receiver/baseline c={level}: {ratio:.2f} "
                          f"({mine.throughput:.0f} vs {base.throughput:.0f}/s)")
        for name in targets:
            acked, bad = verify(urls[name], traffic[name].acked)
            print(f"{name}: {acked} acknowledged rids, {bad} missing or not exactly once")
            errors = sum(r.errors for _, _, r in results[name])
            if bad or errors:
                print(f"{name}: FAILED ({errors} errors, {bad} bad rids)")
        if "receiver" in results:
            mine = {(k, lvl): r for k, lvl, r in results["receiver"]}
            checks = []
            if ("closed", 32) in mine:
                checks.append(("≥ 1000/s at c=32", mine[("closed", 32)].throughput >= 1000))
            if ("closed", 128) in mine:
                checks.append(("p99 ≤ 250 ms at c=128", mine[("closed", 128)].p99() <= 250))
            if ("open", args.rate) in mine and args.rate == 1000:
                checks.append(("open 1000/s p99 ≤ 25 ms", mine[("open", args.rate)].p99() <= 25))
            print("acceptance: " + ", ".join(f"{label}: {'yes' if ok else 'NO'}" for label, ok in checks))
    finally:
        if ingest is not None:
            ingest.terminate()
            try:
                ingest.wait(timeout=30)
            except subprocess.TimeoutExpired:
                ingest.kill()
            progress = [line for line in (work / "ingest.log").read_text().splitlines() if line.startswith("ingestion:")]
            print(progress[-1] if progress else "ingestion: no sensor tick completed")
        for server in servers.values():
            server.stop()
        if pg is not None:
            db.close_pools()
            pg.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
