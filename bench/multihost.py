"""Past one machine: the pipeline spread over six hosts, each a network namespace of its own with
a private disk, nothing shared but the network (issue 25, point 4). Needs root (ip netns, veth,
a bridge, tmpfs mounts).

    host      address      runs (each through deploy/entrypoint.sh, the image's roles)
    pg        10.77.0.2    PostgreSQL 18 + pgvector (the embedded package's binaries): the index and Dagster's storage
    recv1     10.77.0.3    receiver
    recv2     10.77.0.4    receiver
    control   10.77.0.5    dagster-daemon, dagster-webserver, the `main` code location (LOCATION_HOLDS=main)
    run1      10.77.0.6    the `north` code location (LOCATION_HOLDS=north): its batch runs execute here
    run2      10.77.0.7    the `south` code location (LOCATION_HOLDS=south): its batch runs execute here

Why code locations per site shard and not Celery: with Dagster's default run launcher a run
executes beside its location's code server, so a location per site (or shard) on a host of its
own spreads the batch runs over hosts with no broker, no extra package and no second scheduler;
each site's partition set is already its own. (The Kubernetes layout, K8sRunLauncher, is in
deploy/helm.) The bench is the crawler, at the network edge (10.77.0.1, the root namespace):
it posts every crawl to the two receivers in turn, each re-sent until acknowledged. The loopback
embedding fake serves there too, as the model API would from outside.

Sites `north` and `south` are declared in SITES_DIR (a copy on each host, as a ConfigMap would
be). An initial load of every page, then a recrawl (30% changed, 5% gone: 404), during which run1
is killed in the middle of a batch (every process of the host, SIGKILL, its disk lost) and booted
again 5 s later. Then it waits for the pipeline to settle and prints where each run ran, pages/min,
and the reliability figures, the index compared page by page with a clean rebuild of each page's
newest crawl. Last line:
`MULTIHOST run_hosts=… pages_per_min=… lost=… duplicate_chunks=… stuck=… mismatches=…`

    .venv/bin/python bench/multihost.py [--pages 400] [--seed 25] [--settle-timeout 900] [--keep]
"""

from __future__ import annotations

import argparse
import gzip
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import psycopg  # noqa: E402

from bench.faults import Crawl, check_index, page_text, settled  # noqa: E402
from bench.pipeline_throughput import BIN, BenchFailure, Service  # noqa: E402
from rag_pipeline.settings import Settings  # noqa: E402
from rag_pipeline.store import embedded  # noqa: E402
from rag_pipeline_tests.fakes.openai_server import FakeOpenAI  # noqa: E402

BRIDGE = "mhbr0"
NET = "10.77.0"
EDGE = f"{NET}.1"
HOSTS = {"pg": 2, "recv1": 3, "recv2": 4, "control": 5, "run1": 6, "run2": 7}
LOCATIONS = {"main": "control", "north": "run1", "south": "run2"}
SITES = ("north", "south")
TOKEN = "bench-multihost-token"
DIMENSIONS = 256
PG_USER = "embedded_postgres"    # PostgreSQL refuses to run as root
GRPC_PORT, RECEIVER_PORT, WEBSERVER_PORT = 4000, 8800, 3000
ENTRYPOINT = ROOT / "deploy" / "entrypoint.sh"
LOCATION_TAG = "dagster/code_location"   # the location a run was launched from, on every run


def page_url(n: int) -> str:
    """Pages alternate between the two sites."""
    return f"https://{SITES[n % 2]}.example.com/docs/{n}"


# -- hosts ---------------------------------------------------------------------------------------


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if check and done.returncode:
        raise BenchFailure(f"{' '.join(cmd)}: {done.stderr.strip() or done.stdout.strip()}")
    return done


class Host:
    """A network namespace on the bench bridge, and a mount namespace whose `disk` is a tmpfs of
    its own: what one host writes no other host sees. Killing it kills every process in it, and
    its disk goes with the last of them."""

    def __init__(self, name: str, octet: int, disk: Path, logdir: Path):
        self.name, self.ip, self.disk, self.logdir = name, f"{NET}.{octet}", disk, logdir
        self.ns = f"mh-{name}"
        self.holder: subprocess.Popen | None = None
        self.services: list[Service] = []
        self.boots = 0

    def create(self) -> None:
        veth = f"mhv-{self.name}"[:15]
        sh("ip", "netns", "add", self.ns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", self.ns)
        sh("ip", "link", "set", veth, "master", BRIDGE, "up")
        for cmd in (("ip", "addr", "add", f"{self.ip}/24", "dev", "eth0"), ("ip", "link", "set", "eth0", "up"),
                    ("ip", "link", "set", "lo", "up"), ("ip", "route", "add", "default", "via", EDGE)):
            sh("ip", "netns", "exec", self.ns, *cmd)

    def boot(self, files: dict[str, Path]) -> None:
        """A fresh disk, and on it the files an image or a ConfigMap would bring."""
        self.boots += 1
        script = (f"mount -t tmpfs -o mode=0755 tmpfs {self.disk} && mkdir -p {self.disk}/home {self.disk}/tmp"
                  f" && chmod 1777 {self.disk}/tmp && exec sleep infinity")
        self.holder = subprocess.Popen(["ip", "netns", "exec", self.ns, "unshare", "--mount", "--propagation",
                                        "private", "--", "sh", "-c", script], start_new_session=True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if f" {self.disk} " in Path(f"/proc/{self.holder.pid}/mountinfo").read_text():
                    break
            except OSError:
                pass
            time.sleep(0.05)
        else:
            raise BenchFailure(f"host {self.name}: its disk was not mounted")
        for target, source in files.items():
            self.run_once(["sh", "-c", f"mkdir -p \"$(dirname {self.disk}/{target})\" && cp -r {source} {self.disk}/{target}"])

    def enter(self) -> list[str]:
        return ["nsenter", "-t", str(self.holder.pid), "--mount", "--net", "--"]

    def run_once(self, cmd: list[str], env: dict | None = None, timeout_s: float = 300) -> str:
        done = subprocess.run([*self.enter(), *cmd], env=env, capture_output=True, text=True, timeout=timeout_s)
        if done.returncode:
            raise BenchFailure(f"{self.name}: {' '.join(cmd)}: {(done.stderr or done.stdout).strip()[-2000:]}")
        return done.stdout

    def start(self, name: str, cmd: list[str], env: dict) -> Service:
        service = Service(f"{self.name}-{name}-{self.boots}", [*self.enter(), *cmd], env, self.logdir, cwd=ROOT)
        self.services.append(service)
        return service

    def pids(self) -> list[int]:
        out = sh("ip", "netns", "pids", self.ns, check=False).stdout
        return [int(p) for p in out.split()]

    def run_workers(self) -> int:
        """Dagster run workers alive on this host now: the code server starts each run as a
        process of its own (multiprocessing's spawn)."""
        count = 0
        for pid in self.pids():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
                if b"spawn_main" in cmdline and b"grpc" in Path(f"/proc/{parent}/cmdline").read_bytes():
                    count += 1
            except OSError:
                pass
        return count

    def kill(self) -> int:
        """Every process of the host at once (a power cut); returns how many."""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for service in self.services:
            service.stop(grace_s=1)
        self.services = []
        if self.holder is not None:
            self.holder.wait(10)
        return len(pids)

    def destroy(self) -> None:
        for service in self.services:   # gently first (PostgreSQL shuts down cleanly), then the rest killed
            service.stop(grace_s=5)
        self.kill()
        sh("ip", "netns", "del", self.ns, check=False)


class Cluster:
    def __init__(self, work: Path, fake: FakeOpenAI):
        self.work, self.fake = work, fake
        self.disk = work / "disk"
        self.disk.mkdir()
        self.logs = work / "logs"
        self.logs.mkdir()
        self.config = work / "config"
        self.hosts = {name: Host(name, octet, self.disk, self.logs) for name, octet in HOSTS.items()}
        self.rag_url = f"postgresql://postgres@{self.hosts['pg'].ip}:5432/rag"
        self.dagster_url = f"postgresql://postgres@{self.hosts['pg'].ip}:5432/dagster"
        self._write_config()

    def _write_config(self) -> None:
        sites = self.config / "sites"
        sites.mkdir(parents=True)
        for site in SITES:
            (sites / f"{site}.yaml").write_text(
                "type: rag_pipeline.components.SiteComponent\nattributes:\n"
                f"  seeds: [\"https://{site}.example.com/docs/0\"]\n  robots_sitemaps: false\n"
                "  discover_every: 1d\n  max_pages: 10000\n")
        workspace = "load_from:\n" + "".join(
            f"  - grpc_server:\n      host: {self.hosts[host].ip}\n      port: {GRPC_PORT}\n"
            f"      location_name: {location}\n" for location, host in LOCATIONS.items())
        (self.config / "workspace.yaml").write_text(workspace)

    def files(self, host: str) -> dict[str, Path]:
        if host == "pg":
            return {}
        return {"sites": self.config / "sites", "dagster_home/dagster.yaml": ROOT / "deploy" / "dagster.yaml",
                "workspace.yaml": self.config / "workspace.yaml"}

    def env(self, host: str, **extra: str) -> dict[str, str]:
        keep = ("LANG", "LC_ALL", "TZ")
        env = {k: v for k, v in os.environ.items() if k in keep}
        disk = str(self.disk)
        env.update({
            "PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": f"{disk}/home",
            "TMPDIR": f"{disk}/tmp", "PYTHONUNBUFFERED": "1",
            "RAG_HOME": f"{disk}/rag", "DAGSTER_HOME": f"{disk}/dagster_home", "SITES_DIR": f"{disk}/sites",
            "DATABASE_URL": self.rag_url, "DAGSTER_POSTGRES_URL": self.dagster_url,
            "DAGSTER_WORKSPACE": f"{disk}/workspace.yaml",
            "EMBEDDING_PROVIDER": "openai", "OPENAI_API_KEY": "sk-bench", "OPENAI_BASE_URL": self.fake.base_url,
            "EMBEDDING_DIMENSIONS": str(DIMENSIONS), "WEBHOOK_TOKEN": TOKEN,
            # The bench plays the crawler: its deliveries answer no push recorded here.
            "WEBHOOK_ACCEPT_UNSOLICITED": "true",
            "DAGSTER_GRPC_PORT": str(GRPC_PORT), "WEBHOOK_PORT": str(RECEIVER_PORT),
            "DAGSTER_WEBSERVER_PORT": str(WEBSERVER_PORT),
        })
        env.update(extra)
        return env

    # -- bring-up --

    def bridge(self) -> None:
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{EDGE}/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")

    def up(self) -> None:
        for name, host in self.hosts.items():
            host.create()
            host.boot(self.files(name))
        self.start_postgres()
        with psycopg.connect(self.rag_url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
            conn.execute("CREATE DATABASE rag")
        control = self.hosts["control"]
        control.run_once(["sh", str(ENTRYPOINT), "migrate"], env=self.env("control"), timeout_s=600)
        for name in ("recv1", "recv2"):
            self.hosts[name].start("receiver", ["sh", str(ENTRYPOINT), "receiver"], self.env(name))
        for location, host in LOCATIONS.items():
            self.start_code_server(location, host)
        control.start("webserver", ["sh", str(ENTRYPOINT), "webserver"], self.env("control"))
        for name in ("recv1", "recv2"):
            self.wait_http(f"http://{self.hosts[name].ip}:{RECEIVER_PORT}/healthz", name)
        self.wait_http(f"http://{control.ip}:{WEBSERVER_PORT}/server_info", "webserver", timeout_s=300)
        # The bench is the crawler: recrawl pushes off before the daemon's first tick (the sites'
        # seed pages would be pushed to a crawler that cannot reach them).
        control.run_once(["dagster", "sensor", "stop", "recrawl_sensor", "--location", "main",
                          "-w", f"{self.disk}/workspace.yaml"], env=self.env("control"), timeout_s=300)
        control.start("daemon", ["sh", str(ENTRYPOINT), "daemon"], self.env("control"))

    def start_postgres(self) -> None:
        pg = self.hosts["pg"]
        bin_dir = embedded.install_dir() / "bin"
        data, sock = f"{self.disk}/pgdata", f"{self.disk}/pgsock"
        pg.run_once(["sh", "-c", f"mkdir -p {data} {sock} && chown {PG_USER} {data} {sock}"])
        pg.run_once(["runuser", "-u", PG_USER, "--", str(bin_dir / "initdb"), "-D", data, "-U", "postgres",
                     "--auth=trust", "-E", "UTF8", "--no-sync"])
        pg.run_once(["runuser", "-u", PG_USER, "--", "sh", "-c",
                     f"echo 'host all all {NET}.0/24 trust' >> {data}/pg_hba.conf"])
        pg.start("postgres", ["runuser", "-u", PG_USER, "--", str(bin_dir / "postgres"), "-D", data,
                              "-c", f"listen_addresses={pg.ip}", "-c", "port=5432", "-c", f"unix_socket_directories={sock}",
                              "-c", "max_connections=300", "-c", "shared_buffers=256MB"],
                 {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(self.rag_url.rsplit("/", 1)[0] + "/postgres", connect_timeout=2):
                    return
            except psycopg.OperationalError:
                time.sleep(0.3)
        raise BenchFailure(f"PostgreSQL on {pg.ip} did not answer:\n{pg.services[-1].tail()}")

    def start_code_server(self, location: str, host: str) -> Service:
        return self.hosts[host].start(f"code-{location}", ["sh", str(ENTRYPOINT), "code-server"], self.env(
            host, LOCATION_HOLDS=location, DAGSTER_LOCATION_NAME=location))

    @staticmethod
    def wait_http(url: str, what: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise BenchFailure(f"{what} did not answer {url} within {timeout_s:g} s")

    def reboot(self, name: str) -> None:
        host = self.hosts[name]
        host.boot(self.files(name))
        for location, on in LOCATIONS.items():
            if on == name:
                self.start_code_server(location, name)

    def down(self) -> None:
        for host in reversed(list(self.hosts.values())):   # PostgreSQL last
            host.destroy()
        sh("ip", "link", "del", BRIDGE, check=False)

    def receivers(self) -> list[str]:
        return [f"http://{self.hosts[n].ip}:{RECEIVER_PORT}/webhook" for n in ("recv1", "recv2")]


# -- the crawler ---------------------------------------------------------------------------------


class Sender:
    """Posts crawls to the receivers in turn, 4 threads, each re-sent until acknowledged."""

    def __init__(self, receivers: list[str], crawls: list[Crawl]):
        self.receivers, self.crawls = receivers, crawls
        self.acknowledged: set[str] = set()
        self.refused: list[str] = []
        self.by_receiver: Counter = Counter()
        self.lock = threading.Lock()
        self.next = 0

    def run(self) -> None:
        threads = [threading.Thread(target=self._work, daemon=True) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _work(self) -> None:
        with httpx.Client(timeout=30) as client:
            while True:
                with self.lock:
                    if self.next >= len(self.crawls):
                        return
                    i, self.next = self.next, self.next + 1
                crawl = self.crawls[i]
                headers = {"rid": crawl.rid, "url": page_url(crawl.page), "Original-Status": str(crawl.status),
                           "CB-Status": str(crawl.crawler_status), "Content-Encoding": "gzip"}
                body = gzip.compress((crawl.text or "").encode())
                deadline = time.monotonic() + 300
                turn = i
                while time.monotonic() < deadline:
                    target = self.receivers[turn % len(self.receivers)]
                    turn += 1   # a receiver that does not answer: the other one, as a load balancer would
                    try:
                        status = client.post(target, params={"token": TOKEN}, headers=headers, content=body).status_code
                    except httpx.TransportError:
                        status = None
                    if status == 200:
                        with self.lock:
                            self.acknowledged.add(crawl.rid)
                            self.by_receiver[target] += 1
                        break
                    if status is not None and status < 500:
                        with self.lock:
                            self.refused.append(f"{crawl.rid}: {status}")
                        break
                    time.sleep(0.3)


def initial_crawls(pages: int, rng: random.Random, texts: dict[int, str], versions: Counter) -> list[Crawl]:
    crawls = []
    for n in range(pages):
        versions[n] += 1
        texts[n] = page_text(rng, n, versions[n])
        crawls.append(Crawl(n, f"load-{n}-{uuid.uuid4().hex[:8]}", 200, 200, texts[n]))
    return crawls


def recrawls(pages: int, rng: random.Random, texts: dict[int, str], versions: Counter) -> list[Crawl]:
    crawls = []
    for n in range(pages):
        roll = rng.random()
        rid = f"recrawl-{n}-{uuid.uuid4().hex[:8]}"
        if roll < 0.05:
            crawls.append(Crawl(n, rid, 404, 200, "# Not found"))
            continue
        if roll < 0.35:
            versions[n] += 1
            texts[n] = page_text(rng, n, versions[n])
        crawls.append(Crawl(n, rid, 200, 200, texts[n]))
    return crawls


# -- watching ------------------------------------------------------------------------------------


class Watcher:
    """Samples each host's run workers, as evidence of where runs execute."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.seen: Counter = Counter()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self.stop.is_set():
            for name, host in self.cluster.hosts.items():
                if host.holder is not None and host.holder.poll() is None:
                    workers = host.run_workers()
                    if workers:
                        self.seen[name] = max(self.seen[name], workers)
            self.stop.wait(0.5)


def wait_settled(cluster: Cluster, timeout_s: float, label: str, started: float) -> float:
    deadline = time.monotonic() + timeout_s
    shown = time.monotonic()
    state = ""
    while time.monotonic() < deadline:
        try:
            with psycopg.connect(cluster.rag_url, autocommit=True) as conn, \
                    psycopg.connect(cluster.dagster_url, autocommit=True) as dconn:
                done, state = settled(conn, dconn)
        except psycopg.Error as exc:
            done, state = False, f"(database: {exc})"
        if done:
            return time.monotonic()
        if time.monotonic() - shown > 20:
            shown = time.monotonic()
            print(f"  {shown - started:7.1f} s  {label}: {state}", flush=True)
        time.sleep(1)
    raise BenchFailure(f"{label}: not settled within {timeout_s:g} s ({state})")


def mid_batch_run(cluster: Cluster, location: str) -> str | None:
    """A batch run of `location` whose op has started on its batch and not ended."""
    with psycopg.connect(cluster.rag_url, autocommit=True) as conn, \
            psycopg.connect(cluster.dagster_url, autocommit=True) as dconn:
        running = [r[0] for r in conn.execute("SELECT run_id FROM batches WHERE run_id IS NOT NULL AND ended_at IS NULL")]
        if not running:
            return None
        found = dconn.execute("SELECT run_id FROM run_tags WHERE run_id = ANY(%s) AND key = %s AND value = %s LIMIT 1",
                              (running, LOCATION_TAG, location)).fetchone()
    return found[0] if found else None


def runs_by_host(dagster_url: str) -> dict[str, Counter]:
    """Runs by the host of the code location each was launched from (its `dagster/code_location` tag)."""
    hosts: dict[str, Counter] = {}
    with psycopg.connect(dagster_url, autocommit=True) as dconn:
        for job, status, location in dconn.execute(
                "SELECT r.pipeline_name, r.status, t.value FROM runs r"
                " LEFT JOIN run_tags t ON t.run_id = r.run_id AND t.key = %s", (LOCATION_TAG,)):
            host = LOCATIONS.get(location or "", "?")
            hosts.setdefault(host, Counter())[f"{job} {status}"] += 1
    return hosts


# -- main ----------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=400)
    parser.add_argument("--seed", type=int, default=25)
    parser.add_argument("--settle-timeout", type=float, default=900.0)
    parser.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if os.geteuid() != 0:
        print("MULTIHOST failed: needs root (network namespaces, a bridge, tmpfs mounts)")
        return 2
    if args.pages < 20:
        parser.error("--pages must be at least 20")
    if sh("ip", "link", "show", BRIDGE, check=False).returncode == 0:
        print(f"MULTIHOST failed: {BRIDGE} exists (another run, or one that did not clean up: ip link del {BRIDGE})")
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench-multihost-"))
    os.chmod(work, 0o755)
    print(f"multihost: {args.pages} pages over sites {', '.join(SITES)}; hosts {', '.join(HOSTS)}; work folder {work}")
    try:
        with ExitStack() as exits:
            fake = FakeOpenAI(dimensions=DIMENSIONS, host=EDGE)
            cluster = Cluster(work, fake)
            exits.callback(cluster.down)
            cluster.bridge()
            fake.start()   # on the bridge's address, the edge, once it exists
            exits.callback(fake.stop)
            return run(args, cluster, fake)
    except BenchFailure as exc:
        print(f"MULTIHOST failed: {exc}")
        return 2
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def run(args, cluster: Cluster, fake: FakeOpenAI) -> int:
    t0 = time.monotonic()
    cluster.up()
    print(f"  {time.monotonic() - t0:7.1f} s  up: PostgreSQL on pg, receivers on recv1 and recv2, daemon and "
          "webserver on control, code locations main (control), north (run1), south (run2)", flush=True)
    wait_for_sites(cluster, t0)
    watcher = Watcher(cluster)
    watcher.thread.start()
    rng = random.Random(args.seed)
    texts: dict[int, str] = {}
    versions: Counter = Counter()

    load = initial_crawls(args.pages, rng, texts, versions)
    started = time.monotonic()
    sender = Sender(cluster.receivers(), load)
    sender.run()
    loaded = wait_settled(cluster, args.settle_timeout, "initial load", t0)
    load_s = loaded - started
    pages_per_min = args.pages / load_s * 60
    print(f"  {loaded - t0:7.1f} s  initial load: {args.pages} pages searchable in {load_s:.1f} s "
          f"({pages_per_min:,.0f} pages/min)", flush=True)

    again = recrawls(args.pages, rng, texts, versions)
    fake.delay(3.0)   # until the kill: a batch long enough to be caught in the middle
    recrawl = Sender(cluster.receivers(), again)
    sending = threading.Thread(target=recrawl.run, daemon=True)
    sending.start()
    killed = None
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and killed is None:
        run_id = mid_batch_run(cluster, "north")
        if run_id is not None:
            processes = cluster.hosts["run1"].kill()
            killed = run_id
            print(f"  {time.monotonic() - t0:7.1f} s  killed host run1 ({processes} processes, its disk) in the "
                  f"middle of batch run {run_id[:8]}", flush=True)
        else:
            time.sleep(0.1)
    fake.delay(0)
    if killed is None:
        raise BenchFailure("no batch run of north was seen in the middle of its batch within 300 s")
    time.sleep(5)
    cluster.reboot("run1")
    print(f"  {time.monotonic() - t0:7.1f} s  run1 booted again (a fresh disk), its code server started", flush=True)
    sending.join()
    wait_settled(cluster, args.settle_timeout, "recrawl", t0)
    print(f"  {time.monotonic() - t0:7.1f} s  recrawl settled", flush=True)
    watcher.stop.set()
    return report(args, cluster, fake, load + again, sender, recrawl, watcher, pages_per_min, killed)


def wait_for_sites(cluster: Cluster, t0: float, timeout_s: float = 300) -> None:
    """Each site's discovery sensor declares its site (its row in `sites`) on its first tick:
    deliveries routed before would land in the catch-all."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with psycopg.connect(cluster.rag_url, autocommit=True) as conn:
            declared = {r[0] for r in conn.execute("SELECT name FROM sites")}
        if declared >= set(SITES):
            print(f"  {time.monotonic() - t0:7.1f} s  sites declared by their locations' sensors: {sorted(declared)}",
                  flush=True)
            return
        for host in cluster.hosts.values():
            for service in host.services:
                if not service.alive():
                    raise BenchFailure(f"{service.name} exited:\n{service.tail()}")
        time.sleep(1)
    raise BenchFailure(f"the sites were not declared within {timeout_s:g} s")


class _Scenario:
    def __init__(self, crawls: list[Crawl]):
        self.crawls = crawls


def report(args, cluster: Cluster, fake: FakeOpenAI, crawls: list[Crawl], load: Sender, recrawl: Sender,
           watcher: Watcher, pages_per_min: float, killed: str) -> int:
    acknowledged = load.acknowledged | recrawl.acknowledged
    settings = Settings(EMBEDDING_PROVIDER="openai", OPENAI_API_KEY="sk-bench", EMBEDDING_DIMENSIONS=str(DIMENSIONS))
    with psycopg.connect(cluster.rag_url, autocommit=True) as conn, \
            psycopg.connect(cluster.dagster_url, autocommit=True) as dconn:
        stored = {r[0] for r in conn.execute("SELECT rid FROM deliveries")}
        lost = {c.rid for c in crawls if c.rid in acknowledged} - stored
        stuck = conn.execute("SELECT count(*) FROM deliveries WHERE processed_at IS NULL"
                             " OR outcome IN ('queued', 'failed')").fetchone()[0]
        zombies = dconn.execute("SELECT count(*) FROM runs WHERE status NOT IN ('SUCCESS', 'FAILURE', 'CANCELED')"
                                ).fetchone()[0]
        killed_status = dconn.execute("SELECT status FROM runs WHERE run_id = %s", (killed,)).fetchone()[0]
        sites_of = dict(conn.execute("SELECT coalesce(site, 'catch-all'), count(*) FROM pages GROUP BY 1"))
        index = check_index(conn, _Scenario(crawls), acknowledged, settings, url_of=page_url)
    figures = index["figures"]
    hosts = runs_by_host(cluster.dagster_url)
    batch_hosts = sorted(h for h, runs in hosts.items() if any(k.startswith("index_batch SUCCESS") for k in runs))
    run_hosts = [h for h in batch_hosts if h != "control"]
    print(f"deliveries: {len(crawls)} crawls, {len(acknowledged)} acknowledged, refused {len(load.refused + recrawl.refused)}; "
          f"by receiver {dict(load.by_receiver + recrawl.by_receiver)}")
    print(f"pages by site: {sites_of}")
    print("runs by host (the host of the code location each was launched from):")
    for host, runs in sorted(hosts.items()):
        print(f"  {host:8} {dict(sorted(runs.items()))}")
    print(f"run workers seen alive, at most at once, by host: {dict(watcher.seen)}")
    print(f"the batch run killed with run1: {killed[:8]}, now {killed_status}")
    print(f"embedding requests {fake.requests:,}")
    print(f"index: {figures['mismatches']} page(s) differ from a clean rebuild of their newest crawl, "
          f"{figures['duplicate_chunks']} duplicate chunk(s), {figures['resurrected']} resurrected tombstone(s)")
    for line in index["examples"][:5]:
        print(f"  {line}")
    ok = (len(run_hosts) >= 2 and not lost and not stuck and not zombies and not figures["mismatches"]
          and not figures["duplicate_chunks"] and not load.refused and not recrawl.refused
          and set(watcher.seen) >= {"run1", "run2"})
    print(f"MULTIHOST run_hosts={','.join(run_hosts)} pages_per_min={pages_per_min:.0f} lost={len(lost)} "
          f"duplicate_chunks={figures['duplicate_chunks']} stuck={stuck} mismatches={figures['mismatches']} "
          f"zombies={zombies} pages={args.pages}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
