"""A site whose file does not load, shown where an operator of Dagster looks: in the catalog.

The code location loads without it (the other sites run on), and defines in its place a stand-in:
the asset `<name>/discovery` in the site's group `site_<name>`, which keeps the history of the
site's readings, with a description that says why in one line, and the check `site_file_loads`
that fails with that line (file:line: field: reason). A failed check is what the catalog, the
asset's page and the Overview show in red, and what `rag-pipeline status` lists; a description
alone is seen only by whoever opens the asset. `site_files_sensor` records the check's failure as
soon as the location loads (no run needed), once per reason; "Execute" on the check says the same.
"""

import dagster as dg

from rag_pipeline import compat

from rag_pipeline.core.site_problems import SiteProblem, standin_names

SITE_FILE_CHECK = "site_file_loads"
SENSOR = "site_files_sensor"


def standin_definitions(problems: list[SiteProblem], taken: set[str]) -> dg.Definitions:
    """The stand-ins of the broken sites (none: nothing), named clear of the sites that load."""
    if not problems:
        return dg.Definitions()
    assets, checks, evaluations = [], [], []
    for name, problem in zip(standin_names(problems, taken), problems):
        key = dg.AssetKey([name, "discovery"])
        assets.append(dg.AssetSpec(
            key=key, group_name=f"site_{name}", kinds={"yaml"},
            description=(f"**This site's file does not load:** `{problem.one_line()}`\n\n"
                         "The code location loads without it: the other sites run on. Nothing of this site "
                         "is discovered until its file is fixed and the location reloaded (its pages already "
                         "indexed stay searchable). `rag-pipeline site check` names every bad site file."),
            metadata={"site_file": problem.file, "line": problem.line or 0, "field": problem.field,
                      "problem": problem.one_line()}))
        checks.append(_check(key, problem))
        evaluations.append(evaluation(key, problem))
    return dg.Definitions(assets=assets, asset_checks=checks, sensors=[_sensor(evaluations)])


def _fields(key: dg.AssetKey, problem: SiteProblem) -> dict:
    return {"passed": False, "severity": dg.AssetCheckSeverity.ERROR, "description": problem.one_line(),
            "metadata": {"problem": problem.one_line(), "file": problem.file, "line": problem.line or 0,
                         "field": problem.field, "reason": problem.reason}}


def evaluation(key: dg.AssetKey, problem: SiteProblem) -> dg.AssetCheckEvaluation:
    return dg.AssetCheckEvaluation(asset_key=key, check_name=SITE_FILE_CHECK, **_fields(key, problem))


def _check(key: dg.AssetKey, problem: SiteProblem) -> dg.AssetChecksDefinition:
    @dg.asset_check(asset=key, name=SITE_FILE_CHECK,
                    description="The site's file loads (fails with its file:line, field and reason).")
    def site_file_loads() -> dg.AssetCheckResult:
        return dg.AssetCheckResult(**_fields(key, problem))

    return site_file_loads


def _sensor(evaluations: list[dg.AssetCheckEvaluation]) -> dg.SensorDefinition:
    """Records each stand-in's failed check unless its newest evaluation already says the same."""

    @dg.sensor(name=SENSOR, minimum_interval_seconds=30, default_status=dg.DefaultSensorStatus.RUNNING,
               description="Records the failed `site_file_loads` check of each site whose file does not load.")
    def site_files_sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult:
        keys = [dg.AssetCheckKey(e.asset_key, e.check_name) for e in evaluations]
        records = compat.latest_check_records(context.instance, keys)
        new = [e for key, e in zip(keys, evaluations) if not _says(records.get(key), e.description)]
        said = "; ".join(e.description for e in evaluations)
        return dg.SensorResult(asset_events=new, skip_reason=dg.SkipReason(
            f"{len(evaluations)} site file(s) do not load ({'recorded' if new else 'already recorded'}): {said}"))

    return site_files_sensor


def _says(record, description: str) -> bool:
    """Whether a check's newest record is a failed evaluation with this description (a planned
    record, of an "Execute" still running, carries no evaluation: not yet)."""
    evaluated = compat.evaluation_of(record) if record is not None else None
    return evaluated is not None and not evaluated[0].passed and evaluated[0].description == description
