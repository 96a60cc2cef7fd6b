"""Offline checks of deploy/: no cluster, no Docker daemon, no network. Run by deploy/check.sh.

Each check needs some packages and says SKIP (with what it lacks) when they are missing:
  compose    deploy/compose.yaml, interpolated as compose does, against the Compose Specification's
             JSON schema (--compose-schema, schema/compose-spec.json of compose-spec/compose-spec)
             plus depends_on / healthcheck cross-checks                     [PyYAML, jsonschema]
  k8s        every object of deploy/k8s/*.yaml (and --rendered, `helm template` output) against
             the Kubernetes API models of the `kubernetes` client: unknown fields, types, required
             fields; Services, HPAs and PDBs select what exists           [PyYAML, kubernetes]
  chart      deploy/helm/values.yaml merged into the chart's values.yaml, against the chart's
             values.schema.json (--chart, an unpacked `helm pull dagster/dagster --version 1.13.27`)
                                                                           [PyYAML, jsonschema]
  instance   deploy/dagster.yaml, and the dagster.yaml the Helm values give the chart (rendered by
             `helm template` with --rendered, else derived from the values the way the chart's 1.13
             templates do), validated by Dagster's instance schema and each configured class's
             (K8sRunLauncher, QueuedRunCoordinator, Postgres storages); the two must mean the same
                                                     [dagster, dagster-k8s, dagster-postgres]
Exit status 1 when a check fails; skipped checks do not fail.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import sys
import tempfile
from pathlib import Path

DEPLOY = Path(__file__).resolve().parent
ENTRYPOINT_ROLES = {"migrate", "receiver", "webhook", "query-api", "serve", "code-server", "webserver", "daemon",
                    "healthcheck", "help", "dagster"}
results: list[tuple[str, str, str]] = []


class Skip(Exception):
    pass


def check(name):
    def wrap(fn):
        def run(*args):
            try:
                errors = fn(*args)
            except Skip as exc:
                results.append((name, "SKIP", str(exc)))
                return
            except ImportError as exc:
                results.append((name, "SKIP", f"needs {exc.name}"))
                return
            if errors:
                results.append((name, "FAIL", "\n    ".join(errors)))
            else:
                results.append((name, "OK", fn.__doc__.strip().splitlines()[0]))
        return run
    return wrap


def load_all(path: Path) -> list[dict]:
    import yaml

    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


# ---------------------------------------------------------------------------------------- compose
INTERPOLATION = re.compile(r"\$(?:\$|\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\})")


def interpolate(text: str, env: dict[str, str]) -> str:
    def one(match: re.Match) -> str:
        name, op, arg = match.groups()
        if name is None:
            return "$"
        value = env.get(name)
        unset = value is None or (op and op.startswith(":") and value == "")
        if op and op.endswith("?") and unset:
            raise ValueError(f"${{{name}}} is required: {arg}")
        if op and op.endswith("-") and unset:
            return arg
        return value or ""
    return INTERPOLATION.sub(one, text)


@check("compose")
def check_compose(schema_path: str | None) -> list[str]:
    """deploy/compose.yaml: valid against the Compose Specification schema; dependencies consistent"""
    import json

    import jsonschema
    import yaml

    if not schema_path:
        raise Skip("no --compose-schema (schema/compose-spec.json of compose-spec/compose-spec)")
    env = {"POSTGRES_PASSWORD": "check", "WEBHOOK_TOKEN": "check", "QUERY_API_TOKEN": "check"}
    raw = (DEPLOY / "compose.yaml").read_text()
    errors = []
    try:
        interpolate(raw, {})
        errors.append("a required variable (${VAR:?…}) was not enforced")
    except ValueError:
        pass
    project = yaml.safe_load(interpolate(raw, env))
    validator = jsonschema.Draft7Validator(json.loads(Path(schema_path).read_text()))
    errors += [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(project)]
    services = project.get("services", {})
    image = services["migrate"].get("image")
    for name, service in services.items():
        for target, condition in (service.get("depends_on") or {}).items():
            if target not in services:
                errors.append(f"{name} depends on missing service {target}")
                continue
            condition = condition.get("condition") if isinstance(condition, dict) else None
            rag_image = services[target].get("image") == image   # the image has a HEALTHCHECK
            if condition == "service_healthy" and not (services[target].get("healthcheck") or rag_image):
                errors.append(f"{name} waits for {target} to be healthy, and {target} has no healthcheck")
            if condition == "service_completed_successfully" and services[target].get("restart") not in ("no", None):
                errors.append(f"{name} waits for {target} to complete, but {target} restarts")
        command = service.get("command")
        if service.get("image") == image and (not command or command[0] not in ENTRYPOINT_ROLES):
            errors.append(f"{name}: command {command} is not a role of deploy/entrypoint.sh")
    return errors


# -------------------------------------------------------------------------------------------- k8s
K8S_KINDS = {
    ("v1", "ConfigMap"): "V1ConfigMap", ("v1", "Secret"): "V1Secret", ("v1", "Service"): "V1Service",
    ("v1", "ServiceAccount"): "V1ServiceAccount", ("apps/v1", "Deployment"): "V1Deployment",
    ("batch/v1", "Job"): "V1Job", ("autoscaling/v2", "HorizontalPodAutoscaler"): "V2HorizontalPodAutoscaler",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget", ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding", ("v1", "Pod"): "V1Pod",
}


SCALARS = {"str": str, "datetime": str, "date": str, "int": int, "bool": bool, "float": (int, float)}


def walk(value, type_name: str, path: str, errors: list[str]) -> None:
    """Every field of `value` must exist in the Kubernetes model `type_name`, with its type."""
    import kubernetes.client as k8s

    if value is None:
        return
    if type_name.startswith("list["):
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list")
            return
        for i, item in enumerate(value):
            walk(item, type_name[5:-1], f"{path}[{i}]", errors)
    elif type_name.startswith(("dict(", "dict[")):
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a mapping")
            return
        inner = type_name[type_name.index(",") + 1:-1].strip()
        for key, item in value.items():
            walk(item, inner, f"{path}.{key}", errors)
    elif type_name in SCALARS:
        if not isinstance(value, SCALARS[type_name]) or (isinstance(value, bool) and type_name != "bool"):
            errors.append(f"{path}: expected {type_name}, got {value!r}")
    elif type_name == "object":
        pass   # int-or-string and free-form fields
    else:
        model = getattr(k8s, type_name)
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a {type_name} mapping")
            return
        fields = {json_key: attr for attr, json_key in model.attribute_map.items()}
        for key, item in value.items():
            if key not in fields:
                errors.append(f"{path}.{key}: no such field in {type_name}")
            else:
                walk(item, model.openapi_types[fields[key]], f"{path}.{key}", errors)


def check_object(doc: dict, where: str) -> list[str]:
    import kubernetes.client as k8s

    kind = K8S_KINDS.get((doc.get("apiVersion"), doc.get("kind")))
    if kind is None:
        return [f"{where}: {doc.get('apiVersion')} {doc.get('kind')} is not a kind this check knows"]
    errors: list[str] = []
    walk(doc, kind, f"{where}:{doc['kind']}/{doc.get('metadata', {}).get('name')}", errors)
    try:   # the client's constructors refuse a missing required field
        k8s.ApiClient()._ApiClient__deserialize(copy.deepcopy(doc), kind)
    except (ValueError, TypeError) as exc:
        errors.append(f"{where}:{doc['kind']}/{doc.get('metadata', {}).get('name')}: {exc}")
    return errors


@check("k8s")
def check_k8s(rendered: str | None) -> list[str]:
    """deploy/k8s/*.yaml, the Kubernetes objects in the Helm values (and rendered chart output): fields, types, required fields"""
    import kubernetes  # noqa: F401  (skip early without it)

    docs = [(path.name, doc) for path in sorted((DEPLOY / "k8s").glob("*.yaml")) for doc in load_all(path)]
    errors = [e for where, doc in docs for e in check_object(doc, where)]
    by_kind: dict[str, dict[str, dict]] = {}
    for _, doc in docs:
        by_kind.setdefault(doc["kind"], {})[doc["metadata"]["name"]] = doc
    configmaps = set(by_kind.get("ConfigMap", {}))
    for name, deployment in list(by_kind.get("Deployment", {}).items()) + list(by_kind.get("Job", {}).items()):
        spec = deployment["spec"]["template"]
        labels = spec["metadata"].get("labels", {})
        if deployment["kind"] == "Deployment" and deployment["spec"]["selector"]["matchLabels"].items() - labels.items():
            errors.append(f"Deployment/{name}: selector does not match its pod labels")
        for container in spec["spec"]["containers"]:
            args = container.get("args") or []
            if not args or args[0] not in ENTRYPOINT_ROLES:
                errors.append(f"{name}: args {args} is not a role of deploy/entrypoint.sh")
            for source in container.get("envFrom", []):
                ref = source.get("configMapRef", {})
                if ref and ref.get("name") not in configmaps and not ref.get("optional"):
                    errors.append(f"{name}: ConfigMap {ref.get('name')} is not in deploy/k8s/")
    pods = {name: d["spec"]["template"]["metadata"]["labels"] for name, d in by_kind.get("Deployment", {}).items()}
    selectors = [(f"Service/{n}", d["spec"]["selector"]) for n, d in by_kind.get("Service", {}).items()]
    selectors += [(f"PodDisruptionBudget/{n}", d["spec"]["selector"]["matchLabels"])
                  for n, d in by_kind.get("PodDisruptionBudget", {}).items()]
    errors += [f"{what}: selects no Deployment's pods" for what, selector in selectors
               if not any(selector.items() <= labels.items() for labels in pods.values())]
    for name, hpa in by_kind.get("HorizontalPodAutoscaler", {}).items():
        target = hpa["spec"]["scaleTargetRef"]["name"]
        if target not in by_kind.get("Deployment", {}):
            errors.append(f"HorizontalPodAutoscaler/{name}: no Deployment {target}")
            continue
        if hpa["spec"]["minReplicas"] > by_kind["Deployment"][target]["spec"]["replicas"]:
            errors.append(f"HorizontalPodAutoscaler/{name}: minReplicas above the Deployment's replicas")
    # The Kubernetes objects inside the Helm values (the chart copies them into its pods as they are).
    import yaml

    values = yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())
    holders = [("dagsterWebserver", values["dagsterWebserver"]), ("dagsterDaemon", values["dagsterDaemon"]),
               ("runLauncher.config.k8sRunLauncher", values["runLauncher"]["config"]["k8sRunLauncher"])]
    holders += [(f"dagster-user-deployments.deployments[{d['name']}]", d)
                for d in values["dagster-user-deployments"]["deployments"]]
    for where, holder in holders:
        for key, model in (("podSecurityContext", "V1PodSecurityContext"), ("securityContext", "V1SecurityContext"),
                           ("resources", "V1ResourceRequirements")):
            walk(holder.get(key), model, f"helm values {where}.{key}", errors)
    if rendered:
        for doc in load_all(Path(rendered)):
            errors += check_object(doc, "helm template")
    return errors


# ------------------------------------------------------------------------------------------ chart
def helm_merge(base, override):
    """Helm's coalescing of a values file into the chart's defaults: maps merge, the rest replaces,
    null deletes."""
    if isinstance(base, dict) and isinstance(override, dict):
        merged = dict(base)
        for key, value in override.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = helm_merge(base.get(key), value)
        return merged
    return copy.deepcopy(override)


@check("chart")
def check_chart(chart: str | None) -> list[str]:
    """deploy/helm/values.yaml merged into the chart's defaults: valid against the chart's values.schema.json"""
    import json

    import jsonschema
    import yaml

    if not chart:
        raise Skip("no --chart (helm pull dagster/dagster --version 1.13.27 --untar)")
    chart_dir = Path(chart)
    version = yaml.safe_load((chart_dir / "Chart.yaml").read_text()).get("version")
    schema = json.loads((chart_dir / "values.schema.json").read_text())
    values = helm_merge(yaml.safe_load((chart_dir / "values.yaml").read_text()),
                        yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text()))

    def local(node):
        # The chart's Kubernetes $refs point at kubernetesjsonschema.dev, out of reach offline: each
        # keeps its sibling keywords ("type": "object"), and the k8s check covers those objects.
        if isinstance(node, dict):
            return {k: local(v) for k, v in node.items() if not (k == "$ref" and str(v).startswith("http"))}
        return [local(v) for v in node] if isinstance(node, list) else node

    validator = jsonschema.Draft7Validator(local(schema))
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(values)]
    if version != "1.13.27":
        errors.append(f"the chart at {chart} is version {version}, not 1.13.27")
    return errors


# --------------------------------------------------------------------------------------- instance
def snake(name: str) -> str:
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()


def instance_from_values(values: dict) -> dict:
    """The parts of dagster.yaml the chart (1.13) renders from these values: storage, run
    coordinator, concurrency, run launcher, sensors, retention, telemetry, additionalInstanceConfig
    (templates/configmap-instance.yaml and helpers/instance/*.tpl)."""
    pg = values["postgresql"]
    storage = {"postgres_db": {"username": pg["postgresqlUsername"], "password": {"env": "DAGSTER_PG_PASSWORD"},
                               "hostname": pg["postgresqlHost"], "db_name": pg["postgresqlDatabase"],
                               "port": pg["service"]["port"], "params": pg.get("postgresqlParams") or {}}}
    daemon = values["dagsterDaemon"]
    queued = daemon["runCoordinator"]["config"]["queuedRunCoordinator"]
    concurrency = values.get("concurrency", {})
    coordinator_config = {}
    if not concurrency.get("enabled") or queued.get("maxConcurrentRuns") is not None:
        coordinator_config["max_concurrent_runs"] = queued.get("maxConcurrentRuns", -1)
    for key in ("tagConcurrencyLimits", "dequeueIntervalSeconds", "dequeueUseThreads", "dequeueNumWorkers"):
        if queued.get(key):
            coordinator_config[snake(key)] = queued[key]
    launcher = values["runLauncher"]["config"]["k8sRunLauncher"]
    launcher_config = {"load_incluster_config": True, "job_namespace": "rag", "image_pull_policy": "IfNotPresent",
                       "service_account_name": "dagster", "dagster_home": "/opt/dagster/dagster_home",
                       "instance_config_map": "dagster-instance",
                       "postgres_password_secret": values["global"]["postgresqlSecretName"]}
    for key in ("envConfigMaps", "envSecrets"):
        if launcher.get(key):
            launcher_config[snake(key)] = [item["name"] for item in launcher[key]]
    for key in ("envVars", "volumeMounts", "volumes", "labels", "resources", "securityContext", "schedulerName"):
        if launcher.get(key):
            launcher_config[snake(key)] = launcher[key]
    if launcher.get("failPodOnRunFailure"):
        launcher_config["fail_pod_on_run_failure"] = True
    instance = {
        "run_storage": {"module": "dagster_postgres.run_storage", "class": "PostgresRunStorage", "config": storage},
        "event_log_storage": {"module": "dagster_postgres.event_log", "class": "PostgresEventLogStorage",
                              "config": storage},
        "schedule_storage": {"module": "dagster_postgres.schedule_storage", "class": "PostgresScheduleStorage",
                             "config": storage},
        "run_coordinator": {"module": "dagster.core.run_coordinator", "class": "QueuedRunCoordinator",
                            **({"config": coordinator_config} if coordinator_config else {})},
        "run_launcher": {"module": "dagster_k8s", "class": "K8sRunLauncher", "config": launcher_config},
        "telemetry": {"enabled": values["telemetry"]["enabled"]},
    }
    if concurrency.get("enabled"):
        pools, runs = concurrency.get("pools", {}), concurrency.get("runs", {})
        instance["concurrency"] = {
            "pools": {snake(k): v for k, v in pools.items() if v is not None},
            "runs": {**({"max_concurrent_runs": runs["maxConcurrentRuns"]} if "maxConcurrentRuns" in runs else {}),
                     "tag_concurrency_limits": runs.get("tagConcurrencyLimits", [])},
        }
    if daemon["sensors"].get("useThreads"):
        instance["sensors"] = {"use_threads": True, "num_workers": daemon["sensors"]["numWorkers"]}
    retention = values.get("retention", {})
    if retention.get("enabled"):
        instance["retention"] = {kind: {"purge_after_days": retention[kind]["purgeAfterDays"]}
                                 for kind in ("sensor", "schedule") if retention.get(kind)}
    if daemon.get("runMonitoring", {}).get("enabled"):
        raise ValueError("dagsterDaemon.runMonitoring is enabled: it would render a second run_monitoring")
    for key, value in (values.get("additionalInstanceConfig") or {}).items():
        if key in instance:
            raise ValueError(f"additionalInstanceConfig.{key} duplicates a key the chart renders")
        instance[key] = value
    return instance


def validate_instance(config: dict, label: str) -> list[str]:
    """Dagster's schema for dagster.yaml, then each configurable class's own config schema (Dagster's
    own validators, from private modules: re-check this function on a Dagster upgrade)."""
    import yaml
    from dagster._config import process_config
    from dagster._core.instance.config import dagster_instance_config
    from dagster._serdes.config_class import class_from_code_pointer

    errors = []
    with tempfile.TemporaryDirectory() as home:
        Path(home, "dagster.yaml").write_text(yaml.safe_dump(config))
        try:
            dagster_instance_config(home)
        except Exception as exc:   # DagsterInvalidConfigError and friends: report, do not crash
            return [f"{label}: {exc}"]
    for key in ("run_storage", "event_log_storage", "schedule_storage", "run_coordinator", "run_launcher"):
        if key not in config:
            continue
        cls = class_from_code_pointer(config[key]["module"].replace("dagster.core", "dagster._core"), config[key]["class"])
        result = process_config(cls.config_type(), config[key].get("config") or {})
        if not result.success:
            errors += [f"{label}: {key}: {e.message}" for e in result.errors]
    return errors


@check("instance")
def check_instance(rendered: str | None) -> list[str]:
    """deploy/dagster.yaml and the Helm values' instance: accepted by Dagster and dagster-k8s, same run queue, pools, monitoring"""
    import dagster  # noqa: F401
    import dagster_k8s  # noqa: F401
    import dagster_postgres  # noqa: F401
    import yaml

    os.environ.setdefault("DAGSTER_POSTGRES_URL", "postgresql://check@localhost/dagster")
    os.environ.setdefault("DAGSTER_PG_PASSWORD", "check")
    single = yaml.safe_load((DEPLOY / "dagster.yaml").read_text())
    errors = validate_instance(single, "deploy/dagster.yaml")
    try:
        chart = instance_from_values(yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text()))
    except ValueError as exc:
        return errors + [f"helm values: {exc}"]
    errors += validate_instance(chart, "helm values")
    if rendered:   # the chart's own rendering replaces the approximation above
        found = [doc for doc in load_all(Path(rendered))
                 if doc.get("kind") == "ConfigMap" and doc["metadata"]["name"].endswith("-instance")]
        if not found:
            return errors + [f"{rendered}: no instance ConfigMap"]
        chart = yaml.safe_load(found[0]["data"]["dagster.yaml"])
        errors += validate_instance(chart, "helm template")
    same = {
        "concurrency": (single["concurrency"], chart.get("concurrency")),
        "run_coordinator dequeue_interval_seconds": (single["run_coordinator"]["config"].get("dequeue_interval_seconds"),
                                                     chart["run_coordinator"].get("config", {}).get("dequeue_interval_seconds")),
        "sensors": (single.get("sensors"), chart.get("sensors")),
        "run_monitoring": (single.get("run_monitoring"),
                           {k: v for k, v in chart.get("run_monitoring", {}).items() if k != "max_resume_run_attempts"}),
        "telemetry": (single.get("telemetry"), chart.get("telemetry")),
    }
    errors += [f"helm values differ from deploy/dagster.yaml in {what}: {a!r} vs {b!r}"
               for what, (a, b) in same.items() if a != b]
    return errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compose-schema", help="compose-spec.json of the Compose Specification")
    parser.add_argument("--chart", help="an unpacked dagster chart, version 1.13.27")
    parser.add_argument("--rendered", help="`helm template` output to check against the Kubernetes API models")
    args = parser.parse_args()
    for path in sorted(DEPLOY.rglob("*.yaml")):   # every file parses, whatever else is installed
        try:
            load_all(path)
        except ImportError:
            break
        except Exception as exc:
            results.append(("yaml", "FAIL", f"{path}: {exc}"))
    check_compose(args.compose_schema)
    check_k8s(args.rendered)
    check_chart(args.chart)
    check_instance(args.rendered)
    for name, status, detail in results:
        print(f"{status:4} {name}: {detail}")
    return 1 if any(status == "FAIL" for _, status, _ in results) else 0


if __name__ == "__main__":
    sys.exit(main())
