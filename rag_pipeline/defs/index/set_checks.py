"""The checks of one partition set (a site's, a site shard's, or the catch-all's), on its own
`pages`, `chunks` and `embeddings`: a site's asset pages show what concerns that site, and the
index-wide checks stay on `index`.

Dagster shows a check as evaluated only while no newer materialization of its asset exists, unless
the evaluation came from the run that materialized it. These assets are materialized by every batch
run (and runlessly by a tombstone), so the checks are evaluated where the materializations are made:
at the end of each run, for the sets it touched, and by index_snapshot_sensor with every snapshot,
for every set (which covers the runless tombstones and quiet hours). The vectors' check reads every
chunk of a set: a run carries its newest full evaluation forward, labelled with its time.
"""

from collections.abc import Iterable
from datetime import UTC, datetime

import dagster as dg
import psycopg

from rag_pipeline import compat
from rag_pipeline.defs.index.partitions import step_key
from rag_pipeline.settings import Settings
from rag_pipeline.store import invariants
from rag_pipeline.store.invariants import Finding, PageSet

PAGES_MATCH_SOURCE = "pages_match_their_source"
NO_TOMBSTONED_CHUNKS = "no_chunk_of_a_tombstoned_page"
VECTORS_IN_ACTIVE_SPACE = "every_chunk_in_the_active_space"

#: (step, check name, what an offender is, severity, description), one check per step.
_CHECKS = (
    ("pages", PAGES_MATCH_SOURCE, "live page(s) whose index lags their newest content", dg.AssetCheckSeverity.WARN,
     "Search shows the newest content of each of these pages (after CHECK_GRACE_MINUTES)."),
    ("chunks", NO_TOMBSTONED_CHUNKS, "chunk(s) of tombstoned pages still searchable", dg.AssetCheckSeverity.ERROR,
     "A 404/410 page of these has no chunk left in search."),
    ("embeddings", VECTORS_IN_ACTIVE_SPACE, "chunk(s) outside the active embedding space", dg.AssetCheckSeverity.ERROR,
     "Every chunk of these pages carries a vector of the active embedding space."),
)
#: Where the rest is said, on every page asset's description.
INDEX_WIDE = ("The index-wide checks (stuck deliveries, failing runs, the delivery queue, the embedding API, the "
              "crawler) are on the `index` asset.")


def specs(site: str | None, shard: int | None) -> list[dg.AssetCheckSpec]:
    return [dg.AssetCheckSpec(name, asset=step_key(step, site, shard), description=description)
            for step, name, _, _, description in _CHECKS]


#: A step's check: its statement over the asked sets (None: every set with offenders).
_QUERIES = {
    "pages": lambda conn, settings, sets: invariants.pages_behind_source_by_set(conn, settings.check_grace_minutes,
                                                                                sets),
    "chunks": lambda conn, settings, sets: invariants.chunks_of_tombstoned_pages_by_set(conn, sets),
    "embeddings": lambda conn, settings, sets: invariants.chunks_outside_active_space_by_set(conn, sets),
}
#: The step whose check reads every chunk of a set (2.9 s at 743,000 chunks): a run carries its
#: newest full evaluation forward instead (see `log_evaluations`).
COSTLY = "embeddings"


def findings(conn, settings: Settings, steps=("pages", "chunks", "embeddings"),
             sets: list[PageSet] | None = None) -> dict[str, dict[PageSet, Finding]]:
    """Each step's check over the asked sets (None: every set, those without offenders left out),
    one statement a step whatever the number of sets."""
    return {step: _QUERIES[step](conn, settings, sets) for step in steps}


def summed(found: dict[PageSet, Finding]) -> Finding:
    """One check over the whole index, from its findings by set."""
    return Finding(sum(f.count for f in found.values()), [e for f in found.values() for e in f.examples][:10])


def defined_sets(check_keys: Iterable[dg.AssetCheckKey]) -> list[PageSet]:
    """The partition sets whose checks a code location defines."""
    return [set_of_prefix(list(key.asset_key.path[:-1])) for key in check_keys if key.name == PAGES_MATCH_SOURCE]


def _ordered(sets: Iterable[PageSet]) -> list[PageSet]:
    return sorted(set(sets), key=lambda s: (s[0] or "", s[1] if s[1] is not None else -1))


def evaluations(conn, settings: Settings, sets: Iterable[PageSet], steps=("pages", "chunks", "embeddings"),
                found: dict[str, dict[PageSet, Finding]] | None = None) -> list[dg.AssetCheckEvaluation]:
    """The checks of each set as evaluations (a run logs them, a sensor reports them); `found`:
    findings already read for every set (`findings(..., sets=None)`), else they are read here."""
    sets = _ordered(sets)
    if not sets:
        return []
    found = found if found is not None else findings(conn, settings, steps, sets)
    return [dg.AssetCheckEvaluation(asset_key=step_key(step, *s), check_name=name,
                                    **result_fields(found[step].get(s, Finding(0, [])), what, severity))
            for s in sets for step, name, what, severity, _ in _CHECKS if step in steps]


def carried_forward(instance: dg.DagsterInstance, sets: list[PageSet]) -> tuple[list[dg.AssetCheckEvaluation],
                                                                                list[PageSet]]:
    """The costly check of each set as its newest full evaluation said, labelled with its time (a
    run's switches add no chunk without its vector, so a run cannot make it worse); the sets never
    evaluated yet, to evaluate now."""
    keys = {s: dg.AssetCheckKey(step_key(COSTLY, *s), VECTORS_IN_ACTIVE_SPACE) for s in sets}
    records = compat.latest_check_records(instance, list(keys.values()))
    carried, fresh = [], []
    for s, key in keys.items():
        evaluated = compat.evaluation_of(records[key]) if key in records else None
        if evaluated is None:
            fresh.append(s)
            continue
        previous, at = evaluated
        since = previous.metadata.get("evaluated_at")
        at = float(since.value) if since is not None else at
        when = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        base = (previous.description or "").split(" (as of ")[0]
        carried.append(dg.AssetCheckEvaluation(
            asset_key=key.asset_key, check_name=key.name, passed=previous.passed, severity=previous.severity,
            description=f"{base} (as of {when}: read with each `index` snapshot, not in every run)",
            metadata={**previous.metadata, "evaluated_at": at}))
    return carried, fresh


def log_evaluations(context: dg.OpExecutionContext, conn, settings: Settings, sets: Iterable[PageSet],
                    steps=("pages", "chunks", "embeddings")) -> None:
    """The checks of the partition sets a run materialized, in that run: the UI ties them to its
    materializations. The costly one is carried forward (`carried_forward`). A check that cannot be
    read costs the run nothing but a warning."""
    sets = _ordered(sets)
    try:
        events = evaluations(conn, settings, sets, [s for s in steps if s != COSTLY])
        if COSTLY in steps:
            carried, fresh = carried_forward(context.instance, sets)
            events += carried + evaluations(conn, settings, fresh, [COSTLY])
        for evaluation in events:
            context.log_event(evaluation)
    except psycopg.Error as exc:
        context.log.warning(f"the checks of the pages' partition sets were not evaluated: {str(exc).strip()[:300]}")


def set_of_prefix(prefix: list[str]) -> PageSet:
    """(site, shard) of an asset key prefix (partitions.step_key's inverse)."""
    if not prefix:
        return None, None
    return prefix[0], int(prefix[1].removeprefix("shard_")) if len(prefix) > 1 else None


def result_fields(finding: Finding, what: str, severity: dg.AssetCheckSeverity) -> dict:
    """passed, severity, description and metadata of a check that counts offenders."""
    described = f"{finding.count} {what}" + (f", e.g. {', '.join(finding.examples[:5])}" if finding.examples else "")
    return {"passed": finding.count == 0, "severity": severity,
            "description": described if finding.count else f"no {what}",
            "metadata": {"count": finding.count, "examples": dg.MetadataValue.json(finding.examples)}}


def set_checks(site: str | None, shard: int | None) -> dg.AssetChecksDefinition:
    """The set's three checks, for the UI's "Execute" (and a job that selects them)."""
    from rag_pipeline.defs.resources import PostgresResource, SettingsResource

    prefix = "_".join(str(p) for p in step_key("pages", site, shard).path[:-1]) or "catch_all"

    @dg.multi_asset_check(specs=specs(site, shard), name=f"{prefix}_page_checks", can_subset=True,
                          description="This partition set's pages: behind their source, tombstoned chunks, vectors.")
    def _checks(context: dg.AssetCheckExecutionContext, postgres: PostgresResource, settings: SettingsResource):
        with postgres.connect() as conn:
            for evaluation in evaluations(conn, settings.get(), [(site, shard)]):
                if evaluation.asset_check_key in context.selected_asset_check_keys:
                    yield dg.AssetCheckResult(asset_key=evaluation.asset_key, check_name=evaluation.check_name,
                                              passed=evaluation.passed, severity=evaluation.severity,
                                              description=evaluation.description, metadata=evaluation.metadata)

    return _checks
