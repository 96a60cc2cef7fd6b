"""The UI's asset-page queries for one large site, on one partition set and split into shards
(issue: the partition ceiling, PARTITION_CEILING in rag_pipeline/core/site_spec.py).

One run measures both layouts of a site `big` of N pages (default 300,000), each in its own fresh
Dagster instance (its own DAGSTER_HOME with deploy/dagster.yaml, its own database on one
PostgreSQL server: DAGSTER_POSTGRES_URL's, else an embedded one in a temporary folder):

  unsharded  one partition set `big__pages` of N keys; assets big/discovery → big/pages →
             big/chunks → big/embeddings
  sharded    S sets `big__pages_00`… of ~N/S keys each, a page's set chosen by `shard_of(url, S)`
             (a stable hash of the URL); assets big/shard_00/pages … as the site component builds

The code location is bench/ui_partitions_location.py: the project's own `page_assets`,
`partitions_def` and `discovery_asset`. Filling: the keys added with
`instance.add_dynamic_partitions` in batches, one runless materialization per key for each of
`pages`, `chunks`, `embeddings` written in batches by the project's `write_runless` (its
`store_event_batch` path), 3-5 numeric metadata entries each, then VACUUM ANALYZE (what
autovacuum would have done by the time someone opens the UI).

Then `dagster-webserver` on a workspace of that location, and the GraphQL documents the UI's asset
page sends (copied from dagster-webserver 1.13.27's bundle, ui-core/src/...):

  lineage  AssetGraphLiveQuery (asset-data/AssetBaseDataProvider.tsx) for the nodes of the asset
           page's lineage graph: discovery and the asset's pages/chunks/embeddings (for the
           unsharded layout, the whole group). The UI asks for up to 10 keys a request, so one
           request covers each of these graphs.
  group    sharded only: AssetGraphLiveQuery for the whole group (discovery and every shard's
           three assets): as the UI, up to 10 keys a request, 2 requests at a time (S=3: one)
  stale    AssetStaleStatusDataQuery (asset-data/AssetStaleStatusDataProvider.tsx) for the same
           keys as lineage: the other half of the graph's live data
  health   PartitionHealthQuery (assets/usePartitionHealthData.tsx) for one `pages` asset (sharded:
           shard 00's), what the asset page's partition bar and Partitions tab read

Each query is measured on a freshly started webserver whose assets' partition status caches were
wiped (`instance.wipe_asset_cached_status`): "cold" is its first request, as after a large fill
(Dagster then builds the cache from the event log and stores it); "warm" the median of the next
3 (the cache stored, brought up to date). Sizes are the response bodies' bytes.

    .venv/bin/python bench/ui_partitions.py [--pages 300000] [--shards 3] [--warm 3]

The last line: `UI_PARTITIONS pages=… shards=… unsharded_lineage_s=… unsharded_health_s=…
unsharded_health_mb=… sharded_lineage_s=… sharded_health_s=… sharded_health_mb=…` (warm medians;
sharded: one shard's asset page).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

CHECKOUT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(CHECKOUT))

import httpx  # noqa: E402
import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402
from psycopg.conninfo import conninfo_to_dict  # noqa: E402

from bench.ui_partitions_location import SITE, shard_ids, spec  # noqa: E402
from rag_pipeline.core.site_spec import shard_of  # noqa: E402
from rag_pipeline.store import db, embedded  # noqa: E402

BIN = Path(sys.executable).parent
LOCATION_MODULE = "bench.ui_partitions_location"
STEPS = ("pages", "chunks", "embeddings")
UI_BATCH = 10   # keys a live-data request of the UI asks for (ui-core/src/live-data-provider/util.ts)

# -- the UI's documents (dagster-webserver 1.13.27, ui-core/src; fragments inlined) -------------

ASSET_GRAPH_LIVE_QUERY = """
query AssetGraphLiveQuery($assetKeys: [AssetKeyInput!]!) {
  assetNodes(assetKeys: $assetKeys, loadMaterializations: true) {
    id
    ...AssetNodeLiveFragment
  }
  assetsLatestInfo(assetKeys: $assetKeys) {
    id
    ...AssetLatestInfoFragment
  }
}

fragment AssetNodeLiveFragment on AssetNode {
  id
  opNames
  repository { id }
  assetKey { path }
  assetMaterializations(limit: 1) { ...AssetNodeLiveMaterialization }
  assetObservations(limit: 1) { ...AssetNodeLiveObservation }
  assetChecksOrError {
    ... on AssetChecks { checks { ...AssetCheckLiveFragment } }
  }
  partitionStats {
    numMaterialized
    numMaterializing
    numPartitions
    numFailed
  }
}

fragment AssetNodeLiveMaterialization on MaterializationEvent { timestamp runId stepKey }

fragment AssetNodeLiveObservation on ObservationEvent { timestamp runId stepKey }

fragment AssetCheckLiveFragment on AssetCheck {
  name
  canExecuteIndividually
  executionForLatestMaterialization {
    id
    runId
    status
    timestamp
    stepKey
    evaluation { severity }
  }
  partitionDefinition { name description }
  partitionStatuses {
    ... on AssetCheckDefaultPartitionStatuses {
      succeededPartitions failedPartitions inProgressPartitions skippedPartitions executionFailedPartitions
    }
    ... on AssetCheckTimePartitionStatuses { ranges { startKey endKey status } }
    ... on AssetCheckMultiPartitionStatuses {
      primaryDimensionName
      ranges {
        primaryDimStartKey
        primaryDimEndKey
        secondaryDim {
          ... on AssetCheckDefaultPartitionStatuses {
            succeededPartitions failedPartitions inProgressPartitions skippedPartitions executionFailedPartitions
          }
          ... on AssetCheckTimePartitionStatuses { ranges { startKey endKey status } }
        }
      }
    }
  }
}

fragment AssetLatestInfoFragment on AssetLatestInfo {
  id
  assetKey { path }
  unstartedRunIds
  inProgressRunIds
  latestRun { id ...AssetLatestInfoRun }
}

fragment AssetLatestInfoRun on Run { status startTime endTime id }
"""

ASSET_STALE_STATUS_QUERY = """
query AssetStaleStatusDataQuery($assetKeys: [AssetKeyInput!]!) {
  assetNodes(assetKeys: $assetKeys) { id ...AssetStaleDataFragment }
}

fragment AssetStaleDataFragment on AssetNode {
  id
  assetKey { path }
  staleStatus
  staleCauses {
    key { path }
    reason
    category
    dependency { path }
  }
}
"""

PARTITION_HEALTH_QUERY = """
query PartitionHealthQuery($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) {
    ... on AssetNode {
      id
      partitionKeysByDimension { name type partitionKeys }
      assetPartitionStatuses {
        ... on TimePartitionStatuses { ranges { status startTime endTime startKey endKey } }
        ... on DefaultPartitionStatuses { materializedPartitions materializingPartitions failedPartitions }
        ... on MultiPartitionStatuses {
          primaryDimensionName
          ranges {
            primaryDimStartKey
            primaryDimEndKey
            primaryDimStartTime
            primaryDimEndTime
            secondaryDim {
              ... on TimePartitionStatuses { ranges { status startTime endTime startKey endKey } }
              ... on DefaultPartitionStatuses { materializedPartitions materializingPartitions failedPartitions }
            }
          }
        }
      }
    }
  }
}
"""

WORKSPACE_QUERY = """
query BenchWorkspace {
  workspaceOrError {
    __typename
    ... on Workspace {
      locationEntries {
        name
        loadStatus
        locationOrLoadError { __typename ... on PythonError { message } }
      }
    }
  }
}
"""


# -- the site ------------------------------------------------------------------------------------


def page_url(i: int) -> str:
    return f"https://docs.example.com/docs/section-{i // 600}/page-{i}"


def metadata(step: str, i: int) -> dict:
    """Numbers of the shape the project's own metadata has (metadata.py), varied by page."""
    chunks = 3 + i % 17
    if step == "pages":
        return {"chars": 2_000 + (i * 37) % 40_000, "delivery_id": i + 1, "deliveries_superseded": i % 2}
    if step == "chunks":
        return {"chunks": chunks, "tokens": chunks * 380, "max_tokens": 512, "overlap_tokens": 64}
    return {"chunks_total": chunks, "chunks_embedded": chunks, "tokens_embedded": chunks * 380,
            "tokens_reused": 0, "requests": 1}


def layout_sets(pages: int, shards: int) -> dict[int | None, list[str]]:
    """The keys of each partition set: all in one (shards=1), else by shard_of(url, shards)."""
    sets: dict[int | None, list[str]] = {shard: [] for shard in shard_ids(shards)}
    for i in range(pages):
        url = page_url(i)
        sets[None if shards == 1 else shard_of(url, shards)].append(url)
    return sets


# -- PostgreSQL and the instance -----------------------------------------------------------------


@contextmanager
def postgres_server() -> Iterator[str]:
    """An admin URL: DAGSTER_POSTGRES_URL's server, else an embedded server removed afterwards."""
    url = os.environ.get("DAGSTER_POSTGRES_URL")
    if url:
        yield url
        return
    pgdata = Path(tempfile.mkdtemp(prefix="bench-pg-"))
    server = embedded.temporary_server(pgdata)
    try:
        yield server.get_uri("postgres")
    finally:
        server.cleanup()


@contextmanager
def layout_database(admin_url: str, name: str) -> Iterator[str]:
    """A fresh database of its own for one layout's Dagster instance, dropped afterwards."""
    target = db.as_url(db.with_database(admin_url, f"{name}_{uuid.uuid4().hex[:6]}"))
    db.ensure_database(target)
    try:
        yield target
    finally:
        with psycopg.connect(db.with_database(admin_url, "postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(conninfo_to_dict(target)["dbname"])))


def database_size(url: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT pg_database_size(current_database())").fetchone()[0]


def fill(instance, sets: dict[int | None, list[str]], batch: int, say) -> dict[str, float]:
    """Every key added to its set, then a materialization of each key for each of the 3 assets."""
    import dagster as dg

    from rag_pipeline.defs.index.events import write_runless

    site = spec(len(sets))
    index = {url: i for urls in sets.values() for i, url in enumerate(urls)}
    times = {}
    t0 = time.monotonic()
    for shard, urls in sets.items():
        name = site.partition_set(shard)
        for start in range(0, len(urls), 10_000):
            instance.add_dynamic_partitions(name, urls[start:start + 10_000])
    times["partitions_s"] = time.monotonic() - t0
    t1 = time.monotonic()
    written = 0
    total = 3 * sum(len(urls) for urls in sets.values())
    next_say = time.monotonic() + 60
    for shard, urls in sets.items():
        prefix = site.asset_prefix(shard)
        keys = {step: dg.AssetKey([*prefix, step]) for step in STEPS}
        for start in range(0, len(urls), batch):
            chunk = urls[start:start + batch]
            events = [dg.AssetMaterialization(asset_key=keys[step], partition=url,
                                              metadata=metadata(step, index[url]))
                      for step in STEPS for url in chunk]
            write_runless(instance, events)
            written += len(events)
            if time.monotonic() >= next_say:
                rate = written / (time.monotonic() - t1)
                say(f"    {written:,} / {total:,} events ({rate:,.0f}/s)")
                next_say = time.monotonic() + 60
    times["events_s"] = time.monotonic() - t1
    times["events"] = written
    return times


def vacuum_analyze(url: str) -> float:
    t0 = time.monotonic()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")
    return time.monotonic() - t0


# -- the webserver -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Webserver:
    """`dagster-webserver` on a workspace of the bench's location, in its own process group."""

    def __init__(self, home: Path, env: dict[str, str], name: str):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = home / f"webserver-{name}.log"
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [str(BIN / "dagster-webserver"), "-w", str(home / "workspace.yaml"), "-h", "127.0.0.1",
             "-p", str(self.port)],
            cwd=CHECKOUT, env=env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        self.client = httpx.Client(timeout=httpx.Timeout(1800.0, connect=5.0))

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_loaded(self, timeout_s: float = 600.0) -> float:
        """Until the location is loaded (what the UI's first screen waits for too)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dagster-webserver exited ({self.proc.returncode}):\n{self.tail()}")
            try:
                data = self.client.post(f"{self.base}/graphql", json={"query": WORKSPACE_QUERY}).json()
            except (httpx.HTTPError, ValueError):
                time.sleep(0.5)
                continue
            entries = data.get("data", {}).get("workspaceOrError", {}).get("locationEntries") or []
            if entries and all(e["loadStatus"] == "LOADED" for e in entries):
                error = [e for e in entries if e["locationOrLoadError"]["__typename"] != "RepositoryLocation"]
                if error:
                    raise RuntimeError(f"the code location did not load: {json.dumps(error)[:2000]}")
                return time.monotonic() - t0
            time.sleep(0.5)
        raise RuntimeError(f"the webserver did not load the location in {timeout_s:.0f} s:\n{self.tail()}")

    def query(self, name: str, document: str, variables: dict) -> tuple[float, int]:
        t0 = time.monotonic()
        response = self.client.post(f"{self.base}/graphql",
                                    json={"operationName": name, "query": document, "variables": variables})
        elapsed = time.monotonic() - t0
        response.raise_for_status()
        body = response.content
        data = json.loads(body)
        if data.get("errors"):
            raise RuntimeError(f"{name}: {json.dumps(data['errors'])[:2000]}")
        check_answer(name, data["data"])
        return elapsed, len(body)

    def query_batches(self, name: str, document: str, batches: list[dict]) -> tuple[float, int]:
        """One query split as the UI's live data threads split it: 2 requests in flight at a time."""
        from concurrent.futures import ThreadPoolExecutor

        t0 = time.monotonic()
        with ThreadPoolExecutor(max_workers=2) as pool:
            answers = list(pool.map(lambda variables: self.query(name, document, variables), batches))
        return time.monotonic() - t0, sum(size for _, size in answers)

    def stop(self) -> None:
        self.client.close()
        try:
            os.killpg(self.proc.pid, 15)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, 9)
            except ProcessLookupError:
                pass
            self.proc.wait()
        self._log.close()


EXPECTED: dict[str, int] = {}   # query name → partitions each partitioned asset of it holds


def check_answer(name: str, data: dict) -> None:
    """The answer is about the keys written: all materialized, none failed (a wrong or empty
    answer would be fast for the wrong reason)."""
    want = EXPECTED.get(name)
    if name.startswith("AssetGraphLiveQuery"):
        for node in data["assetNodes"]:
            stats = node["partitionStats"]
            if stats is not None and want is not None:
                assert stats["numPartitions"] >= want and stats["numMaterialized"] == stats["numPartitions"], stats
    elif name == "PartitionHealthQuery":
        node = data["assetNodeOrError"]
        keys = node["partitionKeysByDimension"][0]["partitionKeys"]
        done = node["assetPartitionStatuses"]["materializedPartitions"]
        assert len(keys) == len(done) and (want is None or len(keys) == want), (len(keys), len(done), want)


# -- one layout ----------------------------------------------------------------------------------


def asset_key_input(key) -> dict:
    return {"path": list(key.path)}


def measure_layout(admin_url: str, pages: int, shards: int, warm: int, batch: int, say) -> dict:
    import dagster as dg

    from rag_pipeline.components.discovery_asset import discovery_key

    label = "unsharded" if shards == 1 else f"sharded S={shards}"
    site = spec(shards)
    sets = layout_sets(pages, shards)
    sizes = {shard: len(urls) for shard, urls in sets.items()}
    say(f"== {label}: {pages:,} pages in {len(sets)} partition set(s) of "
        f"{', '.join(f'{n:,}' for n in sizes.values())} keys")
    result: dict = {"label": label, "sets": sizes}
    name = "ui_unsharded" if shards == 1 else f"ui_sharded{shards}"
    with layout_database(admin_url, name) as url, tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        home = Path(tmp)
        shutil.copy(CHECKOUT / "deploy" / "dagster.yaml", home / "dagster.yaml")
        (home / "workspace.yaml").write_text(
            "load_from:\n"
            f"  - python_module:\n"
            f"      module_name: {LOCATION_MODULE}\n"
            f"      location_name: ui_partitions\n"
            f"      working_directory: {CHECKOUT}\n")
        env = {**os.environ, "DAGSTER_HOME": str(home), "DAGSTER_POSTGRES_URL": url,
               "UI_PARTITIONS_SHARDS": str(shards), "RAG_HOME": str(home / "rag_home"),
               "DAGSTER_CLI_API_GRPC_STARTUP_TIMEOUT": "600"}
        os.environ["DAGSTER_POSTGRES_URL"] = url     # deploy/dagster.yaml reads it
        instance = dg.DagsterInstance.from_config(str(home))
        try:
            t0 = time.monotonic()
            times = fill(instance, sets, batch, say)
            result["fill_s"] = time.monotonic() - t0
            result["vacuum_s"] = vacuum_analyze(url)
            result["db_bytes"] = database_size(url)
            say(f"  filled in {result['fill_s']:.1f} s: partitions {times['partitions_s']:.1f} s, "
                f"{times['events']:,} events {times['events_s']:.1f} s "
                f"({times['events'] / max(times['events_s'], 1e-9):,.0f}/s); VACUUM ANALYZE {result['vacuum_s']:.1f} s; "
                f"database {result['db_bytes'] / 1e6:,.0f} MB")

            first = shard_ids(shards)[0]
            keys_of = {shard: [dg.AssetKey([*site.asset_prefix(shard), step]) for step in STEPS]
                       for shard in shard_ids(shards)}
            discovery = discovery_key(SITE)
            page_graph = [asset_key_input(k) for k in [discovery, *keys_of[first]]]
            all_keys = [discovery, *[k for ks in keys_of.values() for k in ks]]
            health_key = asset_key_input(keys_of[first][0])
            queries = [("lineage", "AssetGraphLiveQuery", ASSET_GRAPH_LIVE_QUERY, [{"assetKeys": page_graph}]),
                       ("stale", "AssetStaleStatusDataQuery", ASSET_STALE_STATUS_QUERY, [{"assetKeys": page_graph}]),
                       ("health", "PartitionHealthQuery", PARTITION_HEALTH_QUERY, [{"assetKey": health_key}])]
            if shards > 1:
                group = [asset_key_input(k) for k in all_keys]
                queries.insert(1, ("group", "AssetGraphLiveQuery", ASSET_GRAPH_LIVE_QUERY,
                                   [{"assetKeys": group[i:i + UI_BATCH]} for i in range(0, len(group), UI_BATCH)]))
            EXPECTED.clear()
            EXPECTED["PartitionHealthQuery"] = sizes[first]
            EXPECTED["AssetGraphLiveQuery"] = min(sizes.values())
            for what, op, document, variables in queries:
                instance.wipe_asset_cached_status(all_keys)
                server = Webserver(home, env, what)
                try:
                    load_s = server.wait_loaded()
                    cold_s, cold_bytes = server.query_batches(op, document, variables)
                    warm_runs = [server.query_batches(op, document, variables) for _ in range(warm)]
                finally:
                    server.stop()
                warm_s = statistics.median(s for s, _ in warm_runs)
                result[what] = {"cold_s": cold_s, "warm_s": warm_s, "bytes": cold_bytes,
                                "warm_all": [round(s, 2) for s, _ in warm_runs], "load_s": load_s}
                say(f"  {what:8s} {op}: cold {cold_s:7.2f} s, warm median {warm_s:7.2f} s "
                    f"({', '.join(f'{s:.2f}' for s, _ in warm_runs)}), {cold_bytes / 1e3:10,.1f} KB "
                    f"(location loaded in {load_s:.1f} s)")
        finally:
            instance.dispose()
            db.close_pools()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=300_000)
    parser.add_argument("--shards", type=int, default=3)
    parser.add_argument("--warm", type=int, default=3, help="warm repetitions of each query")
    parser.add_argument("--batch", type=int, default=2_000, help="pages per event batch (x3 events)")
    args = parser.parse_args()
    if args.shards < 2:
        parser.error("--shards: at least 2")

    start = time.monotonic()

    def say(line: str) -> None:
        print(f"[{time.monotonic() - start:7.1f} s] {line}", flush=True)

    say(f"machine: {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    with postgres_server() as admin_url:
        unsharded = measure_layout(admin_url, args.pages, 1, args.warm, args.batch, say)
        sharded = measure_layout(admin_url, args.pages, args.shards, args.warm, args.batch, say)

    print()
    print(f"{'':34s} {'cold s':>8s} {'warm s':>8s} {'KB':>10s}")
    for r in (unsharded, sharded):
        for what in ("lineage", "group", "stale", "health"):
            if what in r:
                m = r[what]
                print(f"{r['label'] + ' ' + what:34s} {m['cold_s']:8.2f} {m['warm_s']:8.2f} {m['bytes'] / 1e3:10,.1f}")
        print(f"{r['label'] + ' database MB':34s} {r['db_bytes'] / 1e6:28,.0f}  (fill {r['fill_s']:.0f} s)")
    if unsharded["health"]["warm_s"] > 0 and sharded["health"]["warm_s"] > 0:
        print(f"ratio unsharded/sharded, warm: lineage {unsharded['lineage']['warm_s'] / sharded['lineage']['warm_s']:.1f}x, "
              f"health {unsharded['health']['warm_s'] / sharded['health']['warm_s']:.1f}x")
    print(f"UI_PARTITIONS pages={args.pages} shards={args.shards} "
          f"unsharded_lineage_s={unsharded['lineage']['warm_s']:.2f} "
          f"unsharded_health_s={unsharded['health']['warm_s']:.2f} "
          f"unsharded_health_mb={unsharded['health']['bytes'] / 1e6:.1f} "
          f"sharded_lineage_s={sharded['lineage']['warm_s']:.2f} "
          f"sharded_health_s={sharded['health']['warm_s']:.2f} "
          f"sharded_health_mb={sharded['health']['bytes'] / 1e6:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
