"""The checks of one partition set (a site's, a site shard's, or the catch-all's), on its own
`pages`, `chunks` and `embeddings`: a site's asset pages show what concerns that site, and the
index-wide checks stay on `index`.

Dagster shows a check as evaluated only while no newer materialization of its asset exists, unless
the evaluation came from the run that materialized it. These assets are materialized by every batch
run (and runlessly by a tombstone), so the checks are evaluated where the materializations are made:
at the end of each run, for the sets it touched, and by index_snapshot_sensor with every snapshot,
for every set (which covers the runless tombstones and quiet hours).
"""

from collections.abc import Iterable

import dagster as dg
import psycopg

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


def findings(conn, settings: Settings, sets: list[PageSet]) -> dict[PageSet, tuple[Finding, Finding, Finding]]:
    """The three invariants of each set, in three statements whatever the number of sets."""
    behind = invariants.pages_behind_source_by_set(conn, settings.check_grace_minutes, sets)
    tombstoned = invariants.chunks_of_tombstoned_pages_by_set(conn, sets)
    outside = invariants.chunks_outside_active_space_by_set(conn, sets)
    return {s: (behind[s], tombstoned[s], outside[s]) for s in sets}


def defined_sets(check_keys: Iterable[dg.AssetCheckKey]) -> list[PageSet]:
    """The partition sets whose checks a code location defines."""
    return [set_of_prefix(list(key.asset_key.path[:-1])) for key in check_keys if key.name == PAGES_MATCH_SOURCE]


def evaluations(conn, settings: Settings, sets: Iterable[PageSet]) -> list[dg.AssetCheckEvaluation]:
    """The checks of each set as evaluations (a run logs them, a sensor reports them)."""
    sets = sorted(set(sets), key=lambda s: (s[0] or "", s[1] if s[1] is not None else -1))
    if not sets:
        return []
    found = findings(conn, settings, sets)
    return [dg.AssetCheckEvaluation(asset_key=step_key(step, *s), check_name=name, **result_fields(finding, what, severity))
            for s in sets for (step, name, what, severity, _), finding in zip(_CHECKS, found[s])]


def log_evaluations(context: dg.OpExecutionContext, conn, settings: Settings, sets: Iterable[PageSet]) -> None:
    """The checks of the partition sets a run materialized, in that run: the UI ties them to its
    materializations. A check that cannot be read costs the run nothing but a warning."""
    try:
        for evaluation in evaluations(conn, settings, sets):
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
