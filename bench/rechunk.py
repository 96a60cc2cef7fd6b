"""Re-chunk at site scale: a chunker change on a loaded site, through the real daemon, measured from
the moment it is started until every page is searchable on its new chunks and the search indexes
are valid again (issue 44, point 7).

The site is loaded as `bench/pipeline_throughput.py --dagster-only --skip-recrawl` loads it (its
functions: generated pages POSTed to the real receiver, delivery_sensor's `index_batch` runs
through `dagster api grpc` and `dagster-daemon`, the loopback OpenAI fake, the load done when every
page shows its delivered content and both search indexes are valid, then no run left), with the
default chunk budget of the model the fake serves (512/64: `backfill plan --json` prints the
signature before and after each change). Every service is then stopped, and each re-chunk starts
from a copy of that loaded site (`CREATE DATABASE … TEMPLATE … STRATEGY FILE_COPY` of the index
and the Dagster databases), so the sensor and the backfill make exactly the same change to exactly
the same pages, and the overlap change starts where the others did:

  sensor    CHUNK_MAX_TOKENS=384 (the issue's change that moves every boundary; content-defined
            cuts keep the strongest ones, so the plan's rows_written says how many rows it writes),
            rechunk_sensor started as an operator would: the `startSensor` mutation of
            dagster-webserver's GraphQL (the UI's document)
  backfill  the same change, through a backfill of the `rechunk` job over every partition of the
            page set, launched with the UI's `LaunchPartitionBackfill` document as the job page's
            "Materialize all" → "Launch backfill" sends it (selector `rechunk_partition_set`, the
            job's asset selection, every partition key as the dialog lists them; `--backfill-form
            assets` sends the asset page's form instead: no selector). Its progress is read through
            `partitionBackfillOrError` every 5 s (status, numPartitions, the counts by run status of
            a job backfill, the per-asset counts of an asset backfill), and the backfill page's own
            `BackfillDetailsQuery` every 30 s (timed, as a browser left open on it would ask).
            rechunk_sensor is started once the backfill's first run is under way and stopped
            `--overlap-s` later: pages switched twice are counted from the ledger, and partitions
            materialized twice from the event log (with those whose metadata says `skipped`).
  overlap   CHUNK_OVERLAP_TOKENS=32 (64 → 32: no boundary moves, every overlap does), through
            rechunk_sensor

Before each change `rag-pipeline backfill plan --json` is run with the new settings (its figures
are kept: pages, chunks_to_embed, tokens_to_embed and whatever else it prints), then the code
server, the daemon and the webserver are started with them. From the start, a sampler, every
`--sample-every` seconds, set-based SELECTs over pages, chunks and the active space's vectors (the
chunks of every page every `--full-every` seconds, of the pages cut since the last sample or not yet
searchable in the others: a page's state is the one last read):
live pages (deleted_at IS NULL, indexed), those cut with the new signature, those searchable on
it (pages.chunker_version new, every live chunk of the new version with its vector), (i) live
pages with no chunk that has a vector (missing from search), (ii) pages with live chunks of two
chunker versions (mixed); the HNSW and GIN index states and the HNSW index's OID (a drop and a
rebuild between two samples still shows); and (iii) `--searches` real searches through the
project's `query.retrieval.retrieve` (SEARCH_MODE, k=5, one passage a page, as `rag-pipeline
search` asks) for a paragraph of a sampled page: the page must come back, and no page twice.
Questions are embedded by a second fake, so the first one's billing is the re-chunk's alone.

Per change: the time until every live page is searchable on the new signature, the time until both
indexes are valid after that, tokens embedded (embedding_ledger after the start) against the plan's
tokens_to_embed, the runs launched by job and status, pages applied more than once, the Dagster
database's growth (pg_database_size before the services start and after the runs ended) and per
page, event rows and bytes, whether the HNSW index was dropped, and the worst sample of each check.

    .venv/bin/python bench/rechunk.py [--pages 2000] [--timeout 3600] [--keep]
        [--only sensor|backfill|overlap]... [--sample-every 1.0] [--full-every 0] [--searches 3] [--search-every 0]
        [--overlap-s 120]
        [--backfill-form job|assets] [--planned-subsets] [--code-rev REV | --code-dir DIR]

`--planned-subsets`: DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS=true for every service, so a
backfill's range run is created with one planned event an asset instead of one a page and an asset
(bench/README.md: what the daemon spends creating range runs).

Ctrl-C (or SIGTERM) stops every process the bench started and removes its databases.

The last line: `RECHUNK pages=N sensor_searchable_s=… sensor_index_valid_s=… backfill_searchable_s=…
backfill_ratio=… overlap_hnsw_kept=yes|no tokens_vs_plan=… missing_max=… mixed_max=…
dagster_bytes_per_page=…` (backfill_ratio: the backfill's searchable time over the sensor's;
tokens_vs_plan, missing_max, mixed_max, dagster_bytes_per_page: the worst of the changes run; `-`
for a change not run). The acceptance run is `--pages 100000 --timeout 7200 --search-every 10 --full-every 30` (a corpus of that
size is cached by pipeline_throughput.py's make_corpus). With DATABASE_URL set, the databases are
made on that server and dropped.
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
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from psycopg import sql  # noqa: E402
from psycopg.conninfo import conninfo_to_dict  # noqa: E402

from bench import pipeline_throughput as pt  # noqa: E402
from bench.corpus import render  # noqa: E402
from bench.ui_partitions import Webserver  # noqa: E402
from rag_pipeline.store import db  # noqa: E402

LOCATION, REPOSITORY = "rag_pipeline", "__repository__"
EMBEDDINGS_KEY = '["embeddings"]'
BACKFILL_POLL_S = 5.0
BACKFILL_PAGE_POLL_S = 30.0
# Each change: the settings it makes, and how it is started.
CHANGES = {
    "sensor": ({"CHUNK_MAX_TOKENS": "384"}, "rechunk_sensor, every boundary moved (CHUNK_MAX_TOKENS 512 → 384)"),
    "backfill": ({"CHUNK_MAX_TOKENS": "384"}, "UI backfill of `rechunk`, every boundary moved (512 → 384)"),
    "overlap": ({"CHUNK_OVERLAP_TOKENS": "32"}, "rechunk_sensor, overlap only (CHUNK_OVERLAP_TOKENS 64 → 32)"),
}

# -- the UI's documents (dagster-webserver 1.13.27's bundle; fragments cut to the fields read) ----

START_SENSOR = """
mutation StartSensor($sensorSelector: SensorSelector!) {
  startSensor(sensorSelector: $sensorSelector) {
    __typename
    ... on Sensor { id sensorState { id status } }
    ... on SensorNotFoundError { message }
    ... on UnauthorizedError { message }
    ... on PythonError { message }
  }
}
"""

STOP_SENSOR = """
mutation StopRunningSensor($id: String!) {
  stopSensor(id: $id) {
    __typename
    ... on StopSensorMutationResult { instigationState { id status } }
    ... on UnauthorizedError { message }
    ... on PythonError { message }
  }
}
"""

PARTITION_KEYS = """
query BenchPartitionKeys($assetKey: AssetKeyInput!) {
  assetNodeOrError(assetKey: $assetKey) {
    __typename
    ... on AssetNode { partitionKeysByDimension { partitionKeys } }
  }
}
"""

LAUNCH_BACKFILL = """
mutation LaunchPartitionBackfill($backfillParams: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $backfillParams) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on PartitionSetNotFoundError { message }
    ... on PartitionKeysNotFoundError { message }
    ... on UnauthorizedError { message }
    ... on PythonError { message stack }
  }
}
"""

BACKFILL_PROGRESS = """
query BenchBackfillProgress($backfillId: String!) {
  partitionBackfillOrError(backfillId: $backfillId) {
    __typename
    ... on PartitionBackfill {
      id
      status
      numPartitions
      isAssetBackfill
      partitionStatusCounts { runStatus count }
      assetBackfillData {
        assetBackfillStatuses {
          ... on AssetPartitionsStatusCounts {
            assetKey { path }
            numPartitionsTargeted
            numPartitionsInProgress
            numPartitionsMaterialized
            numPartitionsFailed
          }
        }
      }
      error { message }
    }
    ... on PythonError { message }
  }
}
"""

# The backfill page (ui-core BackfillPage: BackfillDetailsQuery, polled every 10 s while requested).
BACKFILL_PAGE = """
query BackfillDetailsQuery($backfillId: String!) {
  partitionBackfillOrError(backfillId: $backfillId) {
    __typename
    ... on PartitionBackfill {
      id
      status
      timestamp
      endTimestamp
      numPartitions
      isAssetBackfill
      assetSelection { path }
      partitionSetName
      error { message }
      assetBackfillData {
        rootTargetedPartitions { partitionKeys ranges { start end } }
        assetBackfillStatuses {
          ... on AssetPartitionsStatusCounts {
            assetKey { path }
            numPartitionsTargeted
            numPartitionsInProgress
            numPartitionsMaterialized
            numPartitionsFailed
          }
        }
      }
      partitionStatuses { results { id partitionName runId runStatus runDuration } }
    }
    ... on PythonError { message }
  }
}
"""

TERMINAL_BACKFILL = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}


class GraphQL:
    """dagster-webserver, as the UI talks to it: one POST a document."""

    def __init__(self, server: Webserver):
        self.server = server

    def __call__(self, document: str, variables: dict) -> tuple[dict, float, int]:
        t0 = time.monotonic()
        response = self.server.client.post(f"{self.server.base}/graphql",
                                           json={"query": document, "variables": variables})
        took = time.monotonic() - t0
        response.raise_for_status()
        data = response.json()
        if data.get("errors"):
            raise pt.BenchFailure(f"GraphQL: {json.dumps(data['errors'])[:1500]}")
        return data["data"], took, len(response.content)


def sensor_selector(name: str) -> dict:
    return {"sensorSelector": {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY, "sensorName": name}}


def start_sensor(gql: GraphQL, name: str) -> str:
    data, _, _ = gql(START_SENSOR, sensor_selector(name))
    answer = data["startSensor"]
    if answer["__typename"] != "Sensor":
        raise pt.BenchFailure(f"startSensor {name}: {answer}")
    return answer["sensorState"]["id"]


def stop_sensor(gql: GraphQL, state_id: str) -> None:
    data, _, _ = gql(STOP_SENSOR, {"id": state_id})
    if data["stopSensor"]["__typename"] != "StopSensorMutationResult":
        raise pt.BenchFailure(f"stopSensor: {data['stopSensor']}")


# -- databases -----------------------------------------------------------------------------------


def clone_database(source_url: str, name: str, timeout_s: float = 120.0) -> str:
    """A copy of a database no one is connected to (its files copied: fast at any size)."""
    admin = db.with_database(source_url, "postgres")
    source = conninfo_to_dict(source_url)["dbname"]
    deadline = time.monotonic() + timeout_s
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        while True:
            try:
                conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY").format(
                    sql.Identifier(name), sql.Identifier(source)))
                break
            except psycopg.errors.ObjectInUse:   # a backend of ours still closing, autovacuum
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)
    return db.with_database(source_url, name)


def drop_database(url: str) -> None:
    name = conninfo_to_dict(url)["dbname"]
    with psycopg.connect(db.with_database(url, "postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def database_size(url: str) -> int:
    return pt._database_size(url)


# -- processes -----------------------------------------------------------------------------------


@dataclass
class Services:
    code_server: pt.Service
    daemon: pt.Service
    webserver: Webserver | None
    started_at: float

    def report(self, url: str, dagster_url: str) -> str:
        return pt.pending_report(url, dagster_url, self.daemon, self.code_server)


def start_services(stack: ExitStack, env: dict[str, str], logdir: Path, code: Path, dagster_url: str,
                   webserver: bool) -> Services:
    """The code server, the daemon on a workspace naming it (and the webserver on the same one),
    each stopped by `stack`; returns once delivery_sensor has ticked on this daemon."""
    started = time.time()
    code_server, workspace = pt.start_code_server(env, logdir, code)
    stack.callback(code_server.stop)
    daemon = pt.Service("daemon", [str(pt.BIN / "dagster-daemon"), "run", "-w", str(workspace)], env, logdir, cwd=code)
    stack.callback(daemon.stop)
    server = None
    if webserver:
        server = Webserver(logdir, env, "rechunk")
        stack.callback(server.stop)
    wait_for_tick_after(dagster_url, daemon, started)
    if server is not None:
        server.wait_loaded()
    return Services(code_server, daemon, server, started)


def wait_for_tick_after(dagster_url: str, daemon: pt.Service, since: float, timeout_s: float = 300.0) -> None:
    """delivery_sensor evaluated by this daemon (the copied instance holds the load's ticks)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not daemon.alive():
            raise pt.BenchFailure(f"dagster-daemon exited ({daemon.proc.returncode}):\n{daemon.tail()}")
        with psycopg.connect(dagster_url, autocommit=True) as dconn:
            if any((t.get("timestamp") or 0) > since for t in pt._tick_bodies(dconn)[-5:]):
                return
        time.sleep(0.5)
    raise pt.BenchFailure(f"delivery_sensor did not tick within {timeout_s:.0f} s:\n{daemon.tail()}")


def backfill_plan(env: dict[str, str], code: Path) -> tuple[dict, float]:
    """`rag-pipeline backfill plan --json` with these settings: its figures, and how long it took."""
    t0 = time.monotonic()
    done = subprocess.run([str(pt.BIN / "rag-pipeline"), "backfill", "plan", "--json"], env=env, cwd=code,
                          capture_output=True, text=True, timeout=7200)
    took = time.monotonic() - t0
    if done.returncode != 0:
        raise pt.BenchFailure(f"backfill plan exited {done.returncode}: {done.stderr[-1500:]}")
    return json.loads(done.stdout[done.stdout.index("{"):]), took


# -- sampling ------------------------------------------------------------------------------------


@dataclass
class Sample:
    t: float
    took: float
    live: int
    cut: int              # pages.chunker_version is the new signature
    searchable: int       # ... and every live chunk of it is of that version, with its vector
    missing: int          # live pages with no chunk that has a vector
    mixed: int            # pages with live chunks of two chunker versions
    hnsw: str
    hnsw_oid: int | None
    gin: str
    full: bool = True     # every page's chunks read (else only the pages cut since, or not yet searchable)
    checked: int = 0      # pages whose chunks this sample read


# The live pages and whether each is cut with the new signature: one pass over `pages` (~1 s of
# the two cores at 100,000 pages: the first sample and the full ones only).
PAGES_SQL = """
SELECT page_id, chunker_version = %(sig)s
FROM pages WHERE deleted_at IS NULL AND indexed_hash IS NOT NULL
"""

# The pages switched since a ledger id (every switch writes a ledger row), as PAGES_SQL reads them.
SWITCHED_SQL = """
SELECT p.page_id, p.chunker_version = %(sig)s, p.deleted_at IS NULL AND p.indexed_hash IS NOT NULL, l.id
FROM embedding_ledger l JOIN pages p ON p.url = l.page_url WHERE l.id > %(after)s
"""

# Each page's live chunks: how many, how many with a vector of the active space, all of the new
# version, two versions. Over every page (the full check) or the pages named (`WHERE ...`).
CHUNKS_SQL = """
SELECT c.page_id, count(*), count(v.chunk_id), bool_and(c.chunker_version = %(sig)s),
       min(c.chunker_version) <> max(c.chunker_version)
FROM chunks c LEFT JOIN {vectors} v ON v.chunk_id = c.chunk_id
{where}
GROUP BY c.page_id
"""



def wait_for(condition, timeout_s: float, what: str) -> None:
    """Poll `condition` every 0.2 s until it holds; a BenchFailure naming `what` past the deadline."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise pt.BenchFailure(f"no {what} within {timeout_s:.0f} s")
        time.sleep(0.2)


@dataclass
class Searched:
    t: float
    took: float
    asked: int
    missed: list[str]
    twice: list[str]


class Watch(threading.Thread):
    """The sampler, on three connections so that a slow read never delays a quick one:
    - every `every_s`, the pages switched since the last sample (the ledger's new rows) and the
      chunks of the pages whose state may have moved since (switched since, or cut and not yet
      searchable), the indexes' states: the state of a page not read is the one last read (a page
      not switched keeps the chunks it had; the full check reads them all). Not a pass over every
      page: at 100,000 pages that took ~2.6 s, and a sample every second held one of the two cores;
    - every `full_every_s`, the chunks of every page (870,000 chunks joined to their vectors at
      100,000 pages: seconds), its own sample: a page whose chunks changed without its signature (a
      defect the sampler is there to catch) shows there;
    - every `search_every_s`, `searches` searches through the project's retrieval for a paragraph of
      sampled pages (with the indexes dropped each is an exact scan: seconds at 100,000 pages)."""

    def __init__(self, url: str, signature: str, every_s: float, questions: list[tuple[str, str]],
                 settings, searches: int, search_every_s: float = 0.0, full_every_s: float = 0.0):
        super().__init__(daemon=True, name="rechunk-watch")
        from rag_pipeline.store import spaces

        self.url, self.signature, self.every_s = url, signature, every_s
        self.questions, self.settings, self.per_sample = questions, settings, searches
        self.samples: list[Sample] = []
        self.searched: list[Searched] = []
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.conn = self._connect()
        self.space = spaces.active(self.conn)
        self.all_chunks = sql.SQL(CHUNKS_SQL).format(vectors=self.space.table(), where=sql.SQL(""))
        self.some_chunks = sql.SQL(CHUNKS_SQL).format(vectors=self.space.table(),
                                                      where=sql.SQL("WHERE c.page_id = ANY(%(ids)s)"))
        # page → (searchable, missing, mixed) as last read; the pages cut as of the last sample.
        self.state: dict = {}
        self.live: dict = {}
        self.cut: set = set()
        self.ledger_id = 0
        self.full_every_s, self.search_every_s = full_every_s, search_every_s
        self._next = 0
        self._embedders: dict = {}
        self._others = [threading.Thread(target=self._every, args=(full_every_s, self.full_sample), daemon=True),
                        threading.Thread(target=self._every, args=(search_every_s, self.search), daemon=True)]

    def _connect(self):
        from pgvector.psycopg import register_vector

        conn = psycopg.connect(self.url, autocommit=True)
        register_vector(conn)   # as the project's pooled connections (store/db.py)
        return conn

    def _live(self, conn) -> tuple[dict, set]:
        live = dict(conn.execute(PAGES_SQL, {"sig": self.signature}).fetchall())
        return live, {page for page, new in live.items() if new}

    def _read_chunks(self, conn, state: dict, cut: set, ids: list, every: bool) -> None:
        if every:
            rows = conn.execute(self.all_chunks, {"sig": self.signature}).fetchall()
        else:
            rows = conn.execute(self.some_chunks, {"sig": self.signature, "ids": ids}).fetchall()
        seen = set()
        for page, n, with_vector, all_new, mixed in rows:
            seen.add(page)
            state[page] = (page in cut and all_new and with_vector == n, with_vector == 0, mixed)
        for page in ids:
            if page not in seen:   # no live chunk at all: missing from search
                state[page] = (False, True, False)

    def _sample(self, conn, t: float, live: dict, cut: set, state: dict, full: bool, checked: int) -> Sample:
        from rag_pipeline.store import spaces, text_search

        states = [state.get(page, (False, True, False)) for page in live]
        oid = conn.execute("SELECT to_regclass(%s)::oid", (self.space.index_name(),)).fetchone()[0]
        return Sample(t, time.time() - t, len(live), len(cut), sum(x[0] for x in states), sum(x[1] for x in states),
                      sum(x[2] for x in states), spaces.index_state(conn, self.space), oid,
                      text_search.index_state(conn), full=full, checked=checked)

    def sample(self) -> Sample:
        """The quick sample (the first one reads every page and its chunks)."""
        t = time.time()
        if not self.state:
            self.ledger_id = self.conn.execute("SELECT coalesce(max(id), 0) FROM embedding_ledger").fetchone()[0]
            self.live, self.cut = self._live(self.conn)
            self._read_chunks(self.conn, self.state, self.cut, list(self.live), every=True)
            checked, full = len(self.live), True
        else:
            moved = {page for page in self.cut if not self.state.get(page, (False,))[0]}   # cut, not yet searchable
            for page, new, live, ledger_id in self.conn.execute(
                    SWITCHED_SQL, {"sig": self.signature, "after": self.ledger_id}).fetchall():
                self.ledger_id = max(self.ledger_id, ledger_id)
                moved.add(page)
                if live:
                    self.live[page] = new
                else:
                    self.live.pop(page, None)
                (self.cut.add if new and live else self.cut.discard)(page)
            if moved:
                self._read_chunks(self.conn, self.state, self.cut, list(moved), every=False)
            checked, full = len(moved), False
        return self._sample(self.conn, t, self.live, self.cut, self.state, full, checked)

    def full_sample(self, conn) -> None:
        t = time.time()
        live, cut = self._live(conn)
        state: dict = {}
        self._read_chunks(conn, state, cut, list(live), every=True)
        self.samples.append(self._sample(conn, t, live, cut, state, True, len(live)))

    def search(self, conn, questions: list[tuple[str, str]] | None = None) -> Searched:
        """`searches` of the questions in turn (or each of `questions`): the page must come back, once."""
        from rag_pipeline.query.retrieval import retrieve

        t = time.time()
        asked = questions or [self.questions[(self._next + i) % len(self.questions)]
                              for i in range(min(self.per_sample, len(self.questions)))]
        if questions is None:
            self._next += len(asked)
        done = Searched(t, 0.0, len(asked), [], [])
        for key, question in asked:
            hits = retrieve(conn, self.settings, question, 5, per_page=1, embedder_for=self._embedder)
            urls = [h.page_url for h in hits]
            if key not in urls:
                done.missed.append(key)
            done.twice.extend(u for u, n in Counter(urls).items() if n > 1)
        done.took = time.time() - t
        if questions is None:
            self.searched.append(done)
        return done

    def _embedder(self, space):
        from rag_pipeline.embedders.factory import make_embedder_for_space

        if space.space_id not in self._embedders:
            self._embedders[space.space_id] = make_embedder_for_space(self.settings, space)
        return self._embedders[space.space_id]

    def _every(self, every_s: float, work) -> None:
        if work is self.search and not (self.questions and self.per_sample):
            return
        try:
            with self._connect() as conn:
                while not self.stopping.is_set():
                    t = time.monotonic()
                    work(conn)
                    self.stopping.wait(max(0.0, every_s - (time.monotonic() - t)))
        except BaseException as exc:  # noqa: BLE001 - reported by the phase
            self.error = exc

    def run(self) -> None:
        for thread in self._others:
            thread.start()
        try:
            while not self.stopping.is_set():
                s = self.sample()
                self.samples.append(s)
                self.stopping.wait(max(0.0, self.every_s - s.took))
        except BaseException as exc:  # noqa: BLE001 - reported by the phase
            self.error = exc

    def stop(self) -> None:
        self.stopping.set()
        self.join(60)
        for thread in self._others:
            if thread.is_alive():
                thread.join(120)
        self.conn.close()

    def done_at(self) -> float | None:
        return min((s.t for s in self.samples if s.live and s.searchable == s.live), default=None)

    def indexes_valid_at(self, after: float) -> float | None:
        return min((s.t for s in self.samples if s.t >= after and s.hnsw == "valid" and s.gin == "valid"),
                   default=None)


def search_questions(pages: list[pt.Page], n: int, seed: int) -> list[tuple[str, str]]:
    """(page key, one of its paragraphs) for `n` pages: a question only that page answers best."""
    rng = random.Random(seed + 11)
    out = []
    for page in rng.sample(pages, min(len(pages), n * 3)):
        paragraphs = [b for b in page.blocks if pt.is_paragraph(b) and len(b) > 120]
        if paragraphs:
            out.append((page.key, rng.choice(paragraphs)[:600]))
        if len(out) == n:
            break
    return out


# -- the backfill --------------------------------------------------------------------------------


@dataclass
class BackfillPoll:
    t: float
    took: float
    status: str
    partitions: int | None
    counts: dict[str, int]     # job backfill: run status → partitions; asset backfill: per-asset figures
    truth: int = 0             # pages searchable on the new signature (the sampler's nearest sample)


class BackfillWatch(threading.Thread):
    """partitionBackfillOrError every 5 s, and the backfill page's own query every 30 s."""

    def __init__(self, gql: GraphQL, backfill_id: str, watch: Watch):
        super().__init__(daemon=True, name="backfill-watch")
        self.gql, self.backfill_id, self.watch = gql, backfill_id, watch
        self.polls: list[BackfillPoll] = []
        self.pages: list[tuple[float, float, int, Counter]] = []   # (t, took s, bytes, partitions by run status)
        self.stopping = threading.Event()
        self.error: BaseException | None = None

    def status(self) -> str:
        return self.polls[-1].status if self.polls else "?"

    def run(self) -> None:
        last_page = 0.0
        try:
            while not self.stopping.is_set():
                self.poll()
                if time.monotonic() - last_page >= BACKFILL_PAGE_POLL_S or self.status() in TERMINAL_BACKFILL:
                    self.page()
                    last_page = time.monotonic()
                if self.status() in TERMINAL_BACKFILL:
                    return
                self.stopping.wait(BACKFILL_POLL_S)
        except BaseException as exc:  # noqa: BLE001 - reported by the phase
            self.error = exc

    def poll(self) -> None:
        data, took, _ = self.gql(BACKFILL_PROGRESS, {"backfillId": self.backfill_id})
        b = data["partitionBackfillOrError"]
        if b["__typename"] != "PartitionBackfill":
            raise pt.BenchFailure(f"partitionBackfillOrError: {b}")
        counts: dict[str, int] = {s["runStatus"]: s["count"] for s in b.get("partitionStatusCounts") or []}
        for a in (b.get("assetBackfillData") or {}).get("assetBackfillStatuses") or []:
            if "assetKey" in a:
                name = "/".join(a["assetKey"]["path"])
                for k in ("Targeted", "InProgress", "Materialized", "Failed"):
                    counts[f"{name} {k.lower()}"] = a[f"numPartitions{k}"]
        truth = self.watch.samples[-1].searchable if self.watch.samples else 0
        self.polls.append(BackfillPoll(time.time(), took, b["status"], b["numPartitions"], counts, truth))

    def page(self) -> None:
        data, took, size = self.gql(BACKFILL_PAGE, {"backfillId": self.backfill_id})
        b = data["partitionBackfillOrError"]
        statuses = Counter(r["runStatus"] or "none" for r in ((b.get("partitionStatuses") or {}).get("results") or []))
        self.pages.append((time.time(), took, size, statuses))


def partition_keys(gql: GraphQL) -> tuple[list[str], float]:
    """Every key of the page set, as the launch dialog lists them."""
    data, took, _ = gql(PARTITION_KEYS, {"assetKey": {"path": ["chunks"]}})
    node = data["assetNodeOrError"]
    return node["partitionKeysByDimension"][0]["partitionKeys"], took


def launch_backfill(gql: GraphQL, keys: list[str], form: str) -> tuple[str, float]:
    params: dict = {"tags": [], "assetSelection": [{"path": ["chunks"]}, {"path": ["embeddings"]}],
                    "partitionNames": keys, "fromFailure": False}
    if form == "job":
        params["selector"] = {"partitionSetName": "rechunk_partition_set",
                              "repositorySelector": {"repositoryLocationName": LOCATION, "repositoryName": REPOSITORY}}
    data, took, _ = gql(LAUNCH_BACKFILL, {"backfillParams": params})
    answer = data["launchPartitionBackfill"]
    if answer["__typename"] != "LaunchBackfillSuccess":
        raise pt.BenchFailure(f"launchPartitionBackfill: {json.dumps(answer)[:1500]}")
    return answer["backfillId"], took


# -- one change ----------------------------------------------------------------------------------


@dataclass
class ChangeResult:
    name: str
    what: str
    signature: str
    plan: dict
    plan_s: float
    plan_after: dict
    t0: float
    samples: list[Sample]
    searched: list[Searched]
    searchable_at: float | None
    index_valid_at: float | None
    hnsw_dropped: bool
    hnsw_states: Counter
    ledger: dict
    applied_by: Counter           # who switched the pages: backfill / rechunk_sensor / other, pages
    twice_ledger: int             # pages with more than one ledger row after the start
    twice_materialized: dict      # asset → (partitions materialized more than once, materializations saying `skipped`)
    runs: dict[tuple[str, str], int]
    rechunk_run_pages: int        # pages of the rag/chunker-tagged runs (rechunk_sensor's batches)
    dagster_before: int
    dagster_after: int
    index_before: int
    index_after: int
    event_rows: int
    event_bytes: int
    fake_tokens: int
    runs_ended: bool
    backfill: dict = field(default_factory=dict)
    observed: Counter = field(default_factory=Counter)   # asset observations after the start, by asset key
    twice_example: str = ""       # the metadata of one twice-materialized `embeddings` partition's last one

    def rel(self, ts: float | None) -> float | None:
        return None if ts is None else ts - self.t0

    @property
    def live(self) -> int:
        return self.samples[-1].live if self.samples else 0

    @property
    def dagster_growth(self) -> int:
        return self.dagster_after - self.dagster_before

    @property
    def tokens_vs_plan(self) -> float | None:
        planned = self.plan.get("tokens_to_embed") or 0
        return self.ledger["tokens_embedded"] / planned if planned else None


def run_change(name: str, env_base: dict[str, str], url: str, dagster_url: str, code: Path, work: Path,
               pages: list[pt.Page], fake, questions_fake, args) -> ChangeResult:
    overrides, what = CHANGES[name]
    logdir = work / name
    logdir.mkdir()
    say(f"== {name}: {what} ==")
    with ExitStack() as stack:
        t = time.monotonic()
        index_url = clone_database(url, f"{conninfo_to_dict(url)['dbname']}_{name}")
        dag_url = clone_database(dagster_url, f"{conninfo_to_dict(dagster_url)['dbname']}_{name}")
        stack.callback(drop_database, dag_url)
        stack.callback(drop_database, index_url)
        stack.callback(db.close_pools)
        say(f"  copied the loaded site's databases in {time.monotonic() - t:.1f} s")
        env = {**env_base, "DATABASE_URL": index_url, "DAGSTER_POSTGRES_URL": dag_url,
               "RAG_HOME": str(logdir / "rag_home"), **overrides}
        plan, plan_s = backfill_plan(env, code)
        say(f"  backfill plan ({plan_s:.1f} s): " + ", ".join(f"{k} {v}" for k, v in plan.items()))
        signature = plan["signature"]
        dagster_before, index_before = database_size(dag_url), database_size(index_url)
        services = start_services(stack, env, logdir, code, dag_url, webserver=True)
        gql = GraphQL(services.webserver)
        before_runs, before_event = pt.dagster_marks(dag_url)
        settings = search_settings(index_url, questions_fake.base_url)
        watch = Watch(index_url, signature, args.sample_every, [], settings, args.searches, args.search_every,
                      args.full_every)
        watch.questions = usable_questions(watch, search_questions(pages, 40, args.seed), say)
        first = watch.sample()
        say(f"  before: {first.live} live pages, {first.cut} cut with {signature}; HNSW {first.hnsw}, GIN {first.gin}; "
            f"sampler {first.took:.2f} s a sample")
        fake_before = fake.total_tokens
        backfill: dict = {}
        bwatch = None
        sensor_id = None
        t0 = time.time()
        watch.samples.append(first)
        watch.start()
        stack.callback(watch.stop)
        if name == "backfill":
            keys, keys_s = partition_keys(gql)
            t0 = time.time()
            backfill_id, launch_s = launch_backfill(gql, keys, args.backfill_form)
            backfill.update(id=backfill_id, keys=len(keys), keys_s=keys_s, launch_s=launch_s, form=args.backfill_form)
            say(f"  backfill {backfill_id} launched over {len(keys):,} partitions ({args.backfill_form} form; keys read "
                f"in {keys_s:.1f} s, launch answered in {launch_s:.1f} s)")
            bwatch = BackfillWatch(gql, backfill_id, watch)
            bwatch.start()
            stack.callback(bwatch.stopping.set)
        else:
            sensor_id = start_sensor(gql, "rechunk_sensor")
            say("  rechunk_sensor started (GraphQL startSensor)")
        deadline = t0 + args.timeout

        def check() -> None:
            if watch.error:
                raise pt.BenchFailure(f"the sampler failed: {watch.error!r}")
            if bwatch is not None and bwatch.error:
                raise pt.BenchFailure(f"the backfill poller failed: {bwatch.error!r}")
            if time.time() > deadline:
                last = watch.samples[-1]
                raise pt.BenchFailure(f"{name}: {last.live - last.searchable} of {last.live} pages not searchable on "
                                      f"{signature} after {args.timeout:.0f} s\n{services.report(index_url, dag_url)}")
            for service in (services.daemon, services.code_server):
                if not service.alive():
                    raise pt.BenchFailure(f"{service.name} exited:\n{service.tail()}")

        sensor_window = None
        while watch.done_at() is None or (bwatch is not None and bwatch.status() not in TERMINAL_BACKFILL):
            check()
            if bwatch is not None:
                sensor_id, sensor_window = overlap_sensor(gql, dag_url, backfill, sensor_id, sensor_window, args)
            if bwatch is not None and watch.done_at() is not None and sensor_id is not None:
                stop_sensor(gql, sensor_id)
                sensor_id = None
                sensor_window = (sensor_window[0], time.time())
            time.sleep(0.5)
        searchable_at = watch.done_at()
        say(f"  every page searchable on {signature} after {searchable_at - t0:.1f} s")
        while watch.indexes_valid_at(searchable_at) is None:
            check()
            time.sleep(0.5)
        index_valid_at = watch.indexes_valid_at(searchable_at)
        say(f"  both indexes valid after {index_valid_at - t0:.1f} s")
        if bwatch is not None:
            bwatch.stopping.set()
            bwatch.join(60)
            if sensor_id is not None:
                stop_sensor(gql, sensor_id)
                sensor_window = (sensor_window[0], time.time()) if sensor_window else None
            backfill.update(polls=bwatch.polls, pages=bwatch.pages,
                            sensor_window=sensor_window and (sensor_window[0] - t0, sensor_window[1] - t0))
        runs_ended = pt.quiesce(dag_url, timeout_s=min(args.timeout, 900))
        # A last look: the sampler's checks hold once every run ended too (a sample taken after).
        ended = time.time()
        wait_for(lambda: any(x.t > ended for x in watch.samples), max(10 * args.sample_every, 30.0),
                 "a sample after the runs ended")
        watch.stop()
        dagster_after, index_after = database_size(dag_url), database_size(index_url)
        stats = pt.dagster_stats(dag_url, before_runs, before_event, t0)
        ledger, applied_by, twice = ledger_figures(index_url, dag_url, t0)
        twice_mat, example, observed = materialized_twice(dag_url, before_event)
        rechunk_pages = tagged_run_pages(dag_url, before_runs)
        plan_after, _ = backfill_plan(env, code)
        if backfill:
            backfill["runs"] = backfill_runs(dag_url, backfill["id"], t0)
            backfill["log"] = backfill_log(services.daemon, backfill["id"], t0)
        states = Counter(s.hnsw for s in watch.samples)
        oids = {s.hnsw_oid for s in watch.samples}
        return ChangeResult(
            name, what, signature, plan, plan_s, plan_after, t0, list(watch.samples), list(watch.searched), searchable_at,
            index_valid_at,
            hnsw_dropped=len(oids) > 1 or any(s != "valid" for s in states), hnsw_states=states, ledger=ledger,
            applied_by=applied_by, twice_ledger=twice, twice_materialized=twice_mat, runs=stats.runs,
            rechunk_run_pages=rechunk_pages, dagster_before=dagster_before, dagster_after=dagster_after,
            index_before=index_before, index_after=index_after, event_rows=stats.event_rows,
            event_bytes=stats.event_bytes, fake_tokens=fake.total_tokens - fake_before, runs_ended=runs_ended,
            backfill=backfill, observed=observed, twice_example=example)


def overlap_sensor(gql: GraphQL, dagster_url: str, backfill: dict, sensor_id: str | None,
                   window: tuple[float, float] | None, args) -> tuple[str | None, tuple[float, float] | None]:
    """rechunk_sensor beside the backfill: started once a run of the backfill is under way,
    stopped `--overlap-s` later."""
    now = time.time()
    if window is None:
        if args.overlap_s <= 0 or not backfill_run_started(dagster_url, backfill["id"]):
            return sensor_id, window
        say(f"  a backfill run is under way: rechunk_sensor started beside it for {args.overlap_s:.0f} s")
        return start_sensor(gql, "rechunk_sensor"), (now, float("nan"))
    if sensor_id is not None and now - window[0] >= args.overlap_s:
        stop_sensor(gql, sensor_id)
        say("  rechunk_sensor stopped (GraphQL stopSensor)")
        return None, (window[0], now)
    return sensor_id, window


def backfill_run_started(dagster_url: str, backfill_id: str) -> bool:
    with psycopg.connect(dagster_url, autocommit=True) as dconn:
        return dconn.execute(
            "SELECT EXISTS (SELECT 1 FROM runs r JOIN run_tags t ON t.run_id = r.run_id"
            " WHERE t.key = 'dagster/backfill' AND t.value = %s AND r.status IN ('STARTED', 'SUCCESS', 'FAILURE'))",
            (backfill_id,)).fetchone()[0]


def backfill_runs(dagster_url: str, backfill_id: str, t0: float) -> list[str]:
    """Each run of the backfill: pages, status, and when it was queued, started, ended (s after t0)."""
    with psycopg.connect(dagster_url, autocommit=True) as dconn:
        ids = {r for (r,) in dconn.execute("SELECT run_id FROM run_tags WHERE key = 'dagster/backfill' AND value = %s",
                                            (backfill_id,))}
        ranges = dict(dconn.execute(
            "SELECT s.run_id, s.value || ' … ' || e.value FROM run_tags s JOIN run_tags e ON e.run_id = s.run_id"
            " AND e.key = 'dagster/asset_partition_range_end' WHERE s.key = 'dagster/asset_partition_range_start'"
            " AND s.run_id = ANY(%s)", (list(ids),)).fetchall())
        timelines = pt.run_timelines(dconn, ids)
    lines = []
    for r in timelines:
        m = r.marks
        end = m.get("RUN_SUCCESS") or m.get("RUN_FAILURE") or m.get("RUN_CANCELED")
        lines.append(f"{r.job} {r.status:8} queued {pt._rel(m.get('RUN_ENQUEUED'), t0)} started "
                     f"{pt._rel(m.get('RUN_START'), t0)} ended {pt._rel(end, t0)} s; "
                     f"{r.events.get('MAT embeddings', 0)} `embeddings` materialized; range {ranges.get(r.run_id, '?')}")
    return lines


def backfill_log(daemon: pt.Service, backfill_id: str, t0: float) -> list[str]:
    """The backfill daemon's lines about it (1 s resolution), seconds after t0."""
    import re
    from datetime import datetime

    stamp = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4})")
    color = re.compile(r"\x1b\[[0-9;]*m")
    out = []
    for path in (daemon.out_path, daemon.err_path):
        for line in path.read_text(errors="replace").splitlines():
            line = color.sub("", line)
            match = stamp.match(line)
            if match and backfill_id in line:
                ts = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S %z").timestamp()
                out.append(f"{ts - t0:6.0f} s  {line.split(' - ', 3)[-1][:150]}")
    return out


def ledger_figures(url: str, dagster_url: str, t0: float) -> tuple[dict, Counter, int]:
    """What the switches after `t0` cost (embedding_ledger), who made them, and the pages switched
    more than once."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows, pages, embedded, reused, chunks = conn.execute(
            "SELECT count(*), count(DISTINCT page_url), coalesce(sum(tokens_embedded), 0),"
            " coalesce(sum(tokens_reused), 0), coalesce(sum(chunks_embedded), 0)"
            " FROM embedding_ledger WHERE recorded_at >= to_timestamp(%s)", (t0,)).fetchone()
        twice = conn.execute(
            "SELECT count(*) FROM (SELECT page_url FROM embedding_ledger WHERE recorded_at >= to_timestamp(%s)"
            " GROUP BY page_url HAVING count(*) > 1) x", (t0,)).fetchone()[0]
        by_run = dict(conn.execute(
            "SELECT coalesce(run_id, ''), count(*) FROM embedding_ledger WHERE recorded_at >= to_timestamp(%s)"
            " GROUP BY 1", (t0,)).fetchall())
    with psycopg.connect(dagster_url, autocommit=True) as dconn:
        jobs = dict(dconn.execute("SELECT run_id, pipeline_name FROM runs WHERE run_id = ANY(%s)",
                                  (list(by_run),)).fetchall())
        backfills = {r for (r,) in dconn.execute(
            "SELECT run_id FROM run_tags WHERE key = 'dagster/backfill' AND run_id = ANY(%s)", (list(by_run),))}
        sensors = {r for (r,) in dconn.execute(
            "SELECT run_id FROM run_tags WHERE key = 'rag/chunker' AND run_id = ANY(%s)", (list(by_run),))}
    who: Counter = Counter()
    for run_id, n in by_run.items():
        if run_id in backfills:
            who[f"backfill ({jobs.get(run_id)})"] += n
        elif run_id in sensors:
            who[f"rechunk_sensor ({jobs.get(run_id)})"] += n
        else:
            who[f"other ({jobs.get(run_id, 'no run')})"] += n
    return ({"rows": rows, "pages": pages, "tokens_embedded": int(embedded), "tokens_reused": int(reused),
             "chunks_embedded": int(chunks)}, who, twice)


def materialized_twice(dagster_url: str, before_event: int) -> tuple[dict[str, tuple[int, int]], str, Counter]:
    """After the start, for `chunks` and `embeddings`: (partitions materialized more than once,
    materializations whose metadata says the run left the page: `skipped`, range_runs.py); the
    metadata of one twice-materialized `embeddings` partition's last materialization; and the
    asset observations by asset."""
    with psycopg.connect(dagster_url, autocommit=True) as dconn:
        twice = {json.loads(key)[-1]: (int(n), int(skipped)) for key, n, skipped in dconn.execute(
            "SELECT asset_key, count(*) FILTER (WHERE n > 1), coalesce(sum(skipped), 0) FROM"
            " (SELECT asset_key, partition, count(*) AS n,"
            "   count(*) FILTER (WHERE event LIKE '%%\"label\": \"skipped\"%%') AS skipped"
            "  FROM event_logs WHERE id > %s AND dagster_event_type = 'ASSET_MATERIALIZATION'"
            "   AND asset_key = ANY(%s) GROUP BY 1, 2) x GROUP BY 1",
            (before_event, ['["chunks"]', EMBEDDINGS_KEY])).fetchall()}
        row = dconn.execute(
            "SELECT event FROM event_logs WHERE id > %s AND dagster_event_type = 'ASSET_MATERIALIZATION'"
            " AND asset_key = %s AND partition = (SELECT partition FROM event_logs WHERE id > %s"
            "  AND dagster_event_type = 'ASSET_MATERIALIZATION' AND asset_key = %s GROUP BY partition"
            "  HAVING count(*) > 1 LIMIT 1) ORDER BY id DESC LIMIT 1",
            (before_event, EMBEDDINGS_KEY, before_event, EMBEDDINGS_KEY)).fetchone()
        observed = Counter(dict(dconn.execute(
            "SELECT coalesce(asset_key, ''), count(*) FROM event_logs WHERE id > %s"
            " AND dagster_event_type = 'ASSET_OBSERVATION' GROUP BY 1", (before_event,)).fetchall()))
    return twice, _metadata_of(row[0]) if row else "", observed


def _metadata_of(event_json: str) -> str:
    """`label: value` of a stored materialization's metadata entries."""
    found = []

    def walk(node) -> None:
        if isinstance(node, dict):
            if "label" in node and "entry_data" in node:
                data = {k: v for k, v in node["entry_data"].items() if k != "__class__"}
                found.append(f"{node['label']}: {next(iter(data.values()), '')}"[:160])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(json.loads(event_json))
    return "; ".join(found)


def tagged_run_pages(dagster_url: str, before_runs: set[str]) -> int:
    """Pages of the runs tagged `rag/chunker` (rechunk_sensor's batches) started after the start."""
    with psycopg.connect(dagster_url, autocommit=True) as dconn:
        rows = dconn.execute(
            "SELECT p.run_id, p.value FROM run_tags p JOIN run_tags c ON c.run_id = p.run_id AND c.key = 'rag/chunker'"
            " WHERE p.key = 'rag/pages'").fetchall()
    return sum(int(v) for run_id, v in rows if run_id not in before_runs)


def search_settings(url: str, questions_url: str):
    """The settings a search reads, its questions embedded by the second fake."""
    from rag_pipeline.settings import load_settings

    return load_settings({"DATABASE_URL": url, "EMBEDDING_PROVIDER": "openai", "OPENAI_API_KEY": "sk-bench",
                          "OPENAI_BASE_URL": questions_url, "EMBEDDING_DIMENSIONS": pt.DIMENSIONS})


def usable_questions(watch: Watch, questions: list[tuple[str, str]], log) -> list[tuple[str, str]]:
    """The questions whose page comes back before the change (a miss later is then the change's)."""
    missed = watch.search(watch.conn, questions).missed
    kept = [q for q in questions if q[0] not in missed]
    if len(kept) < len(questions):
        log(f"  ({len(questions) - len(kept)} of {len(questions)} sampled questions miss their page before the "
            "change: left out)")
    return kept


# -- the load ------------------------------------------------------------------------------------


def load_site(pages: list[pt.Page], env: dict[str, str], url: str, dagster_url: str, work: Path, code: Path,
              args) -> dict:
    """pipeline_throughput.py's Dagster initial load; every service stopped at the end."""
    rules = _rules()
    texts = {p.key: render(p.blocks) for p in pages}
    expected = {k: pt.expected_hash(k, text, rules) for k, text in texts.items()}
    bodies = [(p.url, gzip.compress(texts[p.key].encode())) for p in pages]
    random.Random(args.seed + 3).shuffle(bodies)
    logdir = work / "load"
    logdir.mkdir()
    with ExitStack() as stack:
        receiver, base = pt.start_receiver(env, logdir, "receiver", code)
        stack.callback(receiver.stop)
        code_server, workspace = pt.start_code_server(env, logdir, code)
        stack.callback(code_server.stop)
        daemon = pt.Service("daemon", [str(pt.BIN / "dagster-daemon"), "run", "-w", str(workspace)], env, logdir,
                            cwd=code)
        stack.callback(daemon.stop)
        pt.wait_for_first_tick(dagster_url, daemon)
        dagster_before = database_size(dagster_url)
        before_runs, before_event = pt.dagster_marks(dagster_url)
        phase = pt.run_phase("load", url, base, bodies, expected, args.timeout,
                             lambda: pt.pending_report(url, dagster_url, daemon, code_server))
        index_ready = pt.wait_for_indexes(url, args.timeout)
        pt.quiesce(dagster_url, timeout_s=min(args.timeout, 900))
        stats = pt.dagster_stats(dagster_url, before_runs, before_event, phase.t0)
        plan, _ = backfill_plan({**env, "DATABASE_URL": url}, code)
    db.close_pools()
    return {"phase": phase, "index_ready_s": index_ready - phase.t0, "runs": stats.runs,
            "dagster_growth": database_size(dagster_url) - dagster_before, "plan": plan,
            "index_size": database_size(url)}


def _rules():
    from rag_pipeline.ingest.rules import configured_boilerplate_rules

    return configured_boilerplate_rules()


# -- report --------------------------------------------------------------------------------------


def say(line: str) -> None:
    print(line, flush=True)


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def worst(samples: list[Sample], attr: str) -> tuple[int, float | None]:
    top = max(samples, key=lambda s: getattr(s, attr), default=None)
    return (getattr(top, attr), top.t) if top else (0, None)


def print_change(r: ChangeResult) -> None:
    live = max(r.live, 1)
    print(f"\n== {r.name}: {r.what} ==")
    print(f"  plan ({r.plan_s:.1f} s): " + ", ".join(f"{k} {v}" for k, v in r.plan.items()))
    print(f"  plan after: signature {r.plan_after.get('signature')}, {r.plan_after.get('pages')} page(s) left")
    print(f"  every live page ({r.live:,}) searchable on {r.signature} after {_s(r.rel(r.searchable_at))} s "
          f"({r.live / max(r.rel(r.searchable_at) or 1, 1e-9) * 60:,.0f} pages/min); both indexes valid after "
          f"{_s(r.rel(r.index_valid_at))} s")
    print(f"  HNSW index dropped at some point: {'yes' if r.hnsw_dropped else 'no'} (states sampled: "
          + ", ".join(f"{k} {v}" for k, v in r.hnsw_states.items()) + ")")
    planned = r.plan.get("tokens_to_embed") or 0
    ratio = f"{r.tokens_vs_plan:.3f}" if r.tokens_vs_plan is not None else "-"
    print(f"  tokens embedded (ledger) {r.ledger['tokens_embedded']:,} against the plan's {planned:,} (x{ratio}); "
          f"billed by the fake {r.fake_tokens:,}; reused {r.ledger['tokens_reused']:,}; chunks embedded "
          f"{r.ledger['chunks_embedded']:,} (plan {r.plan.get('chunks_to_embed', '-')})")
    print(f"  switches: {r.ledger['rows']:,} ledger rows for {r.ledger['pages']:,} pages; by whom: "
          + ", ".join(f"{k} {v:,}" for k, v in r.applied_by.most_common()))
    print(f"  pages switched more than once (ledger): {r.twice_ledger}; partitions materialized more than once, and "
          "materializations saying `skipped` (the run left the page to another batch, or found it cut already): "
          + (", ".join(f"{a} {n:,} and {k:,}" for a, (n, k) in sorted(r.twice_materialized.items())) or "none")
          + f"; rag/chunker-tagged runs' pages {r.rechunk_run_pages:,}; asset observations "
          + (", ".join(f"{k} {v:,}" for k, v in r.observed.most_common()) or "none"))
    if r.twice_example:
        print(f"    e.g. the last `embeddings` materialization of a page materialized twice: {r.twice_example}")
    print("  runs: " + (", ".join(f"{job} {status}: {n}" for (job, status), n in sorted(r.runs.items())) or "none")
          + ("" if r.runs_ended else " (some still going when counted)"))
    print(f"  dagster database: {r.dagster_before / 1e6:,.1f} → {r.dagster_after / 1e6:,.1f} MB, "
          f"+{r.dagster_growth / 1e6:,.1f} MB = {r.dagster_growth / live:,.0f} bytes a page; event_logs "
          f"{r.event_rows:,} rows, {r.event_bytes:,} bytes = {r.event_rows / live:.2f} rows, "
          f"{r.event_bytes / live:,.0f} bytes a page")
    print(f"  index database: {r.index_before / 1e6:,.1f} → {r.index_after / 1e6:,.1f} MB")
    n = len(r.samples)
    quick = [s for s in r.samples if not s.full]
    full = [s for s in r.samples if s.full]
    m, mt = worst(r.samples, "missing")
    x, xt = worst(r.samples, "mixed")
    gaps = sorted(b.t - a.t for a, b in zip(quick, quick[1:]))
    searched = r.searched
    search_s = sorted(q.took / max(q.asked, 1) for q in searched)
    missed = sum(len(q.missed) for q in searched)
    twice = sum(len(q.twice) for q in searched)

    def median(values) -> float:
        return pt.percentile(sorted(values), 50) if values else float("nan")

    print(f"  sampler: {len(quick)} quick samples (median {median([s.took for s in quick]):.2f} s, every "
          f"{median(gaps):.2f} s at the median, {max(gaps, default=float('nan')):.2f} s at most; each read the "
          f"chunks of median {median([s.checked for s in quick]):.0f} pages, at most "
          f"{max((s.checked for s in quick), default=0):,}), {len(full)} reading every page's chunks (median "
          f"{median([s.took for s in full]):.2f} s)")
    print(f"    (i) live pages with no searchable chunk: worst {m}" + (f" at {mt - r.t0:.1f} s" if m else ""))
    print(f"    (ii) pages with live chunks of two chunker versions: worst {x}" + (f" at {xt - r.t0:.1f} s" if x else ""))
    print(f"    (iii) searches: {sum(q.asked for q in searched)} (a search took median {median(search_s):.2f} s, max "
          f"{max(search_s, default=float('nan')):.2f} s), page not returned {missed}, a page twice {twice}"
          + (f" (e.g. {next(p for q in searched for p in q.missed)})" if missed else ""))
    step = max(1, n // 12)
    ordered = sorted(r.samples, key=lambda s: s.t)
    print("    t s     cut  searchable  missing  mixed  HNSW     GIN")
    for s in ordered[::step] + ([ordered[-1]] if (n - 1) % step else []):
        print(f"    {s.t - r.t0:6.1f} {s.cut:7d} {s.searchable:11d} {s.missing:8d} {s.mixed:6d}  {s.hnsw:8} {s.gin}")
    if r.backfill:
        print_backfill(r)


def print_backfill(r: ChangeResult) -> None:
    b = r.backfill
    window = b.get("sensor_window")
    print(f"  backfill {b['id']} ({b['form']} form) over {b['keys']:,} partitions; rechunk_sensor beside it "
          + (f"from {window[0]:.1f} s to {window[1]:.1f} s" if window else "never (no backfill run was under way)"))
    polls: list[BackfillPoll] = b.get("polls") or []
    if polls:
        took = sorted(p.took for p in polls)
        print(f"  progress through GraphQL (partitionBackfillOrError, every {BACKFILL_POLL_S:g} s; answered in median "
              f"{pt.percentile(took, 50):.2f} s, max {took[-1]:.2f} s) beside the pages really searchable:")
        step = max(1, len(polls) // 12)
        for p in polls[::step] + ([polls[-1]] if (len(polls) - 1) % step else []):
            counts = ", ".join(f"{k} {v}" for k, v in sorted(p.counts.items())) or "no counts"
            print(f"    {p.t - r.t0:6.1f} s  {p.status:18} partitions {p.partitions}: {counts} | searchable {p.truth}")
    for line in b.get("runs") or []:
        print(f"    run: {line}")
    for line in b.get("log") or []:
        print(f"    daemon: {line}")
    for t, took, size, statuses in b.get("pages") or []:
        print(f"    backfill page (BackfillDetailsQuery) at {t - r.t0:6.1f} s: {took:.2f} s, {size / 1e6:.2f} MB, "
              "partitions by run status " + (", ".join(f"{k} {v}" for k, v in statuses.most_common()) or "none"))


def summary(n: int, results: dict[str, ChangeResult]) -> str:
    sensor, backfill, overlap = (results.get(k) for k in ("sensor", "backfill", "overlap"))
    done = list(results.values())

    def maxed(values) -> str:
        values = [v for v in values if v is not None]
        return "-" if not values else (f"{max(values):.3f}" if isinstance(max(values), float) else str(max(values)))

    ratio = "-"
    if sensor and backfill and sensor.rel(sensor.searchable_at) and backfill.rel(backfill.searchable_at):
        ratio = f"{backfill.rel(backfill.searchable_at) / sensor.rel(sensor.searchable_at):.2f}"
    per_page = [r.dagster_growth / max(r.live, 1) for r in done]
    return (f"RECHUNK pages={n} sensor_searchable_s={_s(sensor and sensor.rel(sensor.searchable_at))} "
            f"sensor_index_valid_s={_s(sensor and sensor.rel(sensor.index_valid_at))} "
            f"backfill_searchable_s={_s(backfill and backfill.rel(backfill.searchable_at))} backfill_ratio={ratio} "
            f"overlap_hnsw_kept={'-' if not overlap else ('no' if overlap.hnsw_dropped else 'yes')} "
            f"tokens_vs_plan={maxed([r.tokens_vs_plan for r in done])} "
            f"missing_max={maxed([worst(r.samples, 'missing')[0] for r in done])} "
            f"mixed_max={maxed([worst(r.samples, 'mixed')[0] for r in done])} "
            f"dagster_bytes_per_page={'-' if not per_page else f'{max(per_page):.0f}'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=2000, help="the site's pages (the acceptance run: 100000)")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds the load, and each change, may take before the bench fails")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs, DAGSTER_HOME)")
    parser.add_argument("--only", action="append", choices=list(CHANGES),
                        help="this change alone (after the load); repeat it for several, in the order given")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--sample-every", type=float, default=1.0, help="seconds between the sampler's samples")
    parser.add_argument("--searches", type=int, default=3, help="searches a sample")
    parser.add_argument("--search-every", type=float, default=0.0,
                        help="seconds between the samples that search (0: every sample; the 100,000-page run: 10)")
    parser.add_argument("--full-every", type=float, default=0.0,
                        help="seconds between the samples that read every page's chunks (0: every sample; the "
                             "others read the pages cut since, or not yet searchable; the 100,000-page run: 30)")
    parser.add_argument("--overlap-s", type=float, default=120.0,
                        help="seconds rechunk_sensor runs beside the backfill (0: never)")
    parser.add_argument("--backfill-form", choices=["job", "assets"], default="job",
                        help="the `rechunk` job page's launch (job) or the asset page's (assets)")
    parser.add_argument("--planned-subsets", action="store_true",
                        help="DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS=true for every service: a range run "
                             "is created with one planned event an asset, not one a page and an asset")
    parser.add_argument("--code-rev", metavar="REV", help="run the services from `git archive REV`")
    parser.add_argument("--code-dir", metavar="DIR", type=Path, help="run the services from this copy")
    args = parser.parse_args()

    main_pid = os.getpid()

    def interrupted(signum, _frame):
        if os.getpid() == main_pid:   # not in the corpus builder's forked workers, which a pool ends so
            raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGHUP, interrupted)

    from rag_pipeline_tests.fakes.openai_server import FakeOpenAI

    t = time.time()
    pages = pt.make_corpus(args.pages, args.seed)
    tokens = sum(p.tokens for p in pages)
    say(f"rechunk: {len(pages):,} pages, {tokens:,} tokens; corpus built in {time.time() - t:.1f} s")
    version = f"the copy in {args.code_dir}" if args.code_dir else pt.code_version(args.code_rev)
    say(f"code: {version}")
    say(f"machine: {os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    work = Path(tempfile.mkdtemp(prefix="bench-rechunk-"))
    status = 1
    results: dict[str, ChangeResult] = {}
    try:
        with ExitStack() as stack:
            fake = stack.enter_context(FakeOpenAI(dimensions=pt.DIMENSIONS))
            questions_fake = stack.enter_context(FakeOpenAI(dimensions=pt.DIMENSIONS))
            code = args.code_dir.resolve() if args.code_dir else pt.checkout_code(args.code_rev, work)
            say(f"dagster.yaml: {pt.instance_settings(pt.instance_yaml(code))}")
            url = stack.enter_context(pt.fresh_database("bench_rechunk", code))
            dagster_url = stack.enter_context(pt.dagster_database(url))
            home = work / "dagster_home"
            home.mkdir()
            shutil.copy(pt.instance_yaml(code), home / "dagster.yaml")
            env = pt.base_env(url, work / "rag_home", fake.base_url, code)
            for name in ("CHUNK_MAX_TOKENS", "CHUNK_OVERLAP_TOKENS"):
                env.pop(name, None)
            env.update({"DAGSTER_HOME": str(home), "DAGSTER_POSTGRES_URL": dagster_url})
            if args.planned_subsets:
                env["DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS"] = "true"
                say("planned events: one an asset a run (DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS=true)")
            load = load_site(pages, env, url, dagster_url, work, code, args)
            phase = load["phase"]
            say(f"load: {phase.watched:,} pages searchable in {phase.searchable_s:.1f} s, indexes valid after "
                f"{load['index_ready_s']:.1f} s; runs "
                + ", ".join(f"{j} {s}: {n}" for (j, s), n in sorted(load["runs"].items()))
                + f"; dagster database +{load['dagster_growth'] / 1e6:,.1f} MB = "
                f"{load['dagster_growth'] / max(phase.watched, 1):,.0f} bytes a page; index database "
                f"{load['index_size'] / 1e6:,.1f} MB")
            say(f"  backfill plan after the load (default budget): signature {load['plan']['signature']}, "
                f"{load['plan']['pages']} page(s) outdated")
            for name in args.only or list(CHANGES):
                results[name] = run_change(name, env, url, dagster_url, code, work, pages, fake, questions_fake, args)
                say(f"  {name} done; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for r in results.values():
            print_change(r)
        now = version if (args.code_rev or args.code_dir) else pt.code_version()
        if now != version:
            print(f"WARNING: the code changed during the bench (was {version}, now {now})")
        print(summary(len(pages), results))
        status = 0
    except pt.BenchFailure as exc:
        print(f"\nFAILED: {exc}", flush=True)
        for r in results.values():
            print_change(r)
    except KeyboardInterrupt as exc:
        print(f"\ninterrupted ({str(exc) or 'Ctrl-C'}): processes stopped, databases removed", flush=True)
        for r in results.values():   # the changes that finished before it: what was measured is kept
            print_change(r)
        status = 130
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
