"""A site's answer quality, where a data engineer looks: its `answer_quality` asset asks the site's
labelled questions (questions.jsonl beside its defs.yaml) as `search` asks with its defaults, and
plots recall@10 and MRR over its materializations; its check goes red when recall falls more than
QUALITY_CHECK_MARGIN below the best of the recent evaluations on the same space. Its sensor
evaluates it once a batch that changed the site's pages has settled, and at least every
QUALITY_EVERY_S.

No `from __future__ import annotations` here: Dagster reads the asset's annotations at run time.
"""

import time
from datetime import UTC, datetime
from pathlib import Path

import dagster as dg

from rag_pipeline.core.answer_quality import Evaluation, QuestionsError, regressed
from rag_pipeline.core.one_line import shorten
from rag_pipeline.core.site_spec import SiteSpec
from rag_pipeline.defs.resources import EmbedderResource, PostgresResource, SettingsResource
from rag_pipeline.defs.unended_runs import unended_run
from rag_pipeline.query.evaluation import K, answers, evaluate
from rag_pipeline.store import evaluations as store
from rag_pipeline.store import spaces

QUALITY_CHECK = "answer_quality_holds"
# The evaluations a check compares with: the site's newest on the same space.
RECENT = 30
# A site whose pages changed less than this ago is still being written: evaluated once it settles.
SETTLE_S = 30
QUALITY_INTERVAL_S = 60
# Failing questions listed in the materialization (all of them are in answer_evaluations).
SHOWN_FAILURES = 25


def quality_key(site: str) -> dg.AssetKey:
    return dg.AssetKey([site, "answer_quality"])


def questions_or_failure(path: Path, spec: SiteSpec) -> list:
    """The site's questions, or a dg.Failure saying which line is wrong (this run fails; the
    site's indexing goes on)."""
    from rag_pipeline.components.site_files import read_questions

    try:
        return read_questions(path, spec)
    except QuestionsError as exc:
        raise dg.Failure(description=str(exc)) from None


def failures_markdown(result: Evaluation) -> str:
    if not result.failures:
        return f"Every question answered within the first {result.k} results."
    rows = [f"| {shorten(f.question, 90)} | {f.kind} | {f.url} |" for f in result.failures[:SHOWN_FAILURES]]
    more = len(result.failures) - SHOWN_FAILURES
    tail = [f"\n…and {more} more (table answer_evaluations)"] if more > 0 else []
    return "\n".join(["| question | kind | answering page |", "| --- | --- | --- |", *rows, *tail])


def quality_metadata(result: Evaluation, space: spaces.Space, seconds: float) -> dict:
    return {
        f"recall_at_{result.k}": dg.MetadataValue.float(round(result.recall, 4)),
        "mrr": dg.MetadataValue.float(round(result.mrr, 4)),
        "questions": result.asked,
        "answered": result.answered,
        "stale_questions": dg.MetadataValue.int(len(result.stale)),
        "recall_by_kind": dg.MetadataValue.json({k: round(v, 3) for k, v in result.by_kind().items()}),
        "failing": dg.MetadataValue.md(failures_markdown(result)),
        "space": f"{space.space_id} ({space.model}, {space.dimensions} dims)",
        "seconds": round(seconds, 2),
    }


def quality_check(result: Evaluation, history: list[float], margin: float) -> dg.AssetCheckResult:
    best = max(history) if history else None
    return dg.AssetCheckResult(
        check_name=QUALITY_CHECK,
        passed=not regressed(result.recall, history, margin),
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            f"recall_at_{result.k}": round(result.recall, 4),
            "recent_best": round(best, 4) if best is not None else "none yet (first evaluation on this space)",
            "margin": margin,
            "evaluations_compared": len(history),
        },
    )


def quality_asset(spec: SiteSpec, questions: Path, group: str, upstream: list[dg.AssetKey]) -> dg.AssetsDefinition:
    key = quality_key(spec.name)

    @dg.asset(
        key=key,
        group_name=group,
        deps=upstream,
        kinds={"postgres"},
        check_specs=[dg.AssetCheckSpec(QUALITY_CHECK, asset=key, description=(
            f"recall@{K} on {questions.name} is within QUALITY_CHECK_MARGIN of the best of the site's "
            f"{RECENT} newest evaluations on the same space."))],
        description=(
            f"How well search answers {spec.name}'s labelled questions ({questions.name}): each asked as "
            f"`search` asks with its defaults, recall@{K} and MRR plotted over time, the questions that "
            "fail listed. Evaluated after a batch changed the site's pages, and every QUALITY_EVERY_S."
        ),
    )
    def answer_quality(context: dg.AssetExecutionContext, postgres: PostgresResource, settings: SettingsResource,
                       embedder: EmbedderResource) -> dg.MaterializeResult:
        current = settings.get()
        asked = questions_or_failure(questions, spec)
        started = time.monotonic()
        with postgres.connect() as conn:
            space = spaces.active(conn)
            if space is None:
                raise dg.Failure(description="the index is empty: no embedding space yet, nothing to ask")
            history = store.recent_recalls(conn, spec.name, space.space_id, K, limit=RECENT)
            result = evaluate(conn, current, asked, answers(conn, asked), space, embedder.for_questions(space))
            with conn.transaction():
                store.record(conn, spec.name, space.space_id, result)
        seconds = time.monotonic() - started
        context.log.info(f"{spec.name}: {result.summary()} in {seconds:.1f} s")
        for q in result.stale:
            context.log.warning(f"{questions.name}:{q.line}: stale: no passage of {q.url} holds {q.marker!r}")
        return dg.MaterializeResult(metadata=quality_metadata(result, space, seconds),
                                    check_results=[quality_check(result, history, current.quality_check_margin)])

    return answer_quality


def quality_due(last: datetime | None, changed: datetime | None, now: datetime, every_s: float) -> str | None:
    """Why the site is due an evaluation, or None. ``changed``: its newest page change (None: no
    indexed page yet)."""
    if changed is None:
        return None
    if (now - changed).total_seconds() < SETTLE_S:
        return None                     # still being written: once it settles
    if last is None:
        return "first evaluation"
    if changed > last:
        return "its pages changed"
    if (now - last).total_seconds() >= every_s:
        return f"every {every_s:.0f} s"
    return None


def quality_sensor(spec: SiteSpec, job) -> dg.SensorDefinition:
    @dg.sensor(
        name=f"{spec.name}_quality_sensor",
        job=job,
        minimum_interval_seconds=QUALITY_INTERVAL_S,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(f"Evaluates {spec.name}'s answer_quality once a batch that changed its pages has settled, "
                     "and every QUALITY_EVERY_S."),
    )
    def _sensor(context: dg.SensorEvaluationContext, postgres: PostgresResource,
                settings: SettingsResource) -> dg.SensorResult:
        with postgres.connect() as conn:
            last = store.last_evaluated(conn, [spec.name]).get(spec.name)
            changed = store.last_change(conn, spec.name)
        reason = quality_due(last, changed, datetime.now(UTC), settings.get().quality_every_s)
        if reason is None:
            said = "no page indexed yet" if changed is None else "evaluated since its pages last changed"
            return dg.SensorResult(skip_reason=dg.SkipReason(f"{spec.name}: {said}"))
        running = unended_run(context.instance, job.name)
        if running:
            return dg.SensorResult(skip_reason=dg.SkipReason(
                f"{spec.name}: due ({reason}), but run {running} has not ended"))
        return dg.SensorResult(run_requests=[dg.RunRequest(tags={"rag/site": spec.name, "rag/quality_due": reason})])

    return _sensor


def quality_definitions(spec: SiteSpec, questions: Path, group: str, upstream: list[dg.AssetKey]) -> dg.Definitions:
    asset = quality_asset(spec, questions, group, upstream)
    job = dg.define_asset_job(f"{spec.name}_answer_quality", selection=[asset.key],
                              description=f"Ask {spec.name}'s labelled questions now.")
    return dg.Definitions(assets=[asset], jobs=[job], sensors=[quality_sensor(spec, job)])
