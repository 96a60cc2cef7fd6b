#!/bin/sh
# The image's entrypoint: the first argument names the role this container plays.
#   migrate       rag-pipeline db migrate, Dagster's database created, `dagster instance migrate`; exits
#   receiver      the webhook receiver (rag-pipeline webhook)            :8800  GET /healthz
#   query-api     the query API (rag-pipeline serve)                     :8810  GET /healthz
#   code-server   the Dagster code location over gRPC (dagster api grpc) :4000  grpc-health-check
#                 (named DAGSTER_LOCATION_NAME, default rag_pipeline; LOCATION_HOLDS picks its sites)
#   webserver     the Dagster UI (dagster-webserver)                     :3000  GET /server_info
#   daemon        sensors, schedules, run queue, run monitoring (dagster-daemon run)
#   healthcheck   probe the role this container was started as (Docker HEALTHCHECK)
#   anything else is run as a command: `rag-pipeline status`, `dagster …`, `sh`.
# Every server binds 0.0.0.0: in a container, other containers reach it through its address.
set -eu

ROLE_FILE="${TMPDIR:-/tmp}/rag-role"
WEBHOOK_PORT="${WEBHOOK_PORT:-8800}"
QUERY_API_PORT="${QUERY_API_PORT:-8810}"
DAGSTER_GRPC_PORT="${DAGSTER_GRPC_PORT:-4000}"
DAGSTER_WEBSERVER_PORT="${DAGSTER_WEBSERVER_PORT:-3000}"

record_role() {
    # For `healthcheck`, which Docker runs as a separate process of the same container.
    printf '%s\n' "$1" >"$ROLE_FILE" 2>/dev/null || true
}

workspace() {
    # The webserver and the daemon load the code location from the code server: the same location
    # name (rag_pipeline) as `make run`, so sensor cursors and on/off states carry over.
    if [ -n "${DAGSTER_WORKSPACE:-}" ]; then
        printf '%s' "$DAGSTER_WORKSPACE"
        return
    fi
    file="${TMPDIR:-/tmp}/workspace.yaml"
    cat >"$file" <<EOF
load_from:
  - grpc_server:
      host: ${DAGSTER_GRPC_HOST:-localhost}
      port: ${DAGSTER_GRPC_PORT}
      location_name: rag_pipeline
EOF
    printf '%s' "$file"
}

http_ok() {
    # Exit 0 when GET $1 answers 200; python is the one HTTP client the slim image is sure to have.
    python - "$1" <<'EOF'
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=4) as answer:
        sys.exit(0 if answer.status == 200 else 1)
except Exception as exc:
    print(f"unhealthy: {sys.argv[1]}: {exc}", file=sys.stderr)
    sys.exit(1)
EOF
}

role="${1:-help}"
[ "$#" -gt 0 ] && shift

case "$role" in
    migrate)
        # The index's schema first (every other role refuses to start on an outdated one), then
        # Dagster's database (CREATEDB needed once) and its schema, which dagster-postgres would
        # otherwise create or upgrade lazily from whichever process connects first.
        rag-pipeline db migrate
        if [ "${RAG_MIGRATE_DAGSTER:-1}" = "1" ]; then
            rag-pipeline db url --database dagster >/dev/null
            dagster instance migrate
        fi
        ;;
    receiver|webhook)
        record_role receiver
        exec rag-pipeline webhook --host 0.0.0.0 --port "$WEBHOOK_PORT" "$@"
        ;;
    query-api|serve)
        record_role query-api
        exec rag-pipeline serve --host 0.0.0.0 --port "$QUERY_API_PORT" --workers "${QUERY_API_WORKERS:-1}" "$@"
        ;;
    code-server)
        record_role code-server
        exec dagster api grpc --module-name rag_pipeline.definitions --location-name "${DAGSTER_LOCATION_NAME:-rag_pipeline}" \
            --host 0.0.0.0 --port "$DAGSTER_GRPC_PORT" "$@"
        ;;
    webserver)
        record_role webserver
        ws="$(workspace)"
        exec dagster-webserver --host 0.0.0.0 --port "$DAGSTER_WEBSERVER_PORT" --workspace "$ws" "$@"
        ;;
    daemon)
        record_role daemon
        ws="$(workspace)"
        exec dagster-daemon run --workspace "$ws" "$@"
        ;;
    healthcheck)
        current="$(cat "$ROLE_FILE" 2>/dev/null || true)"
        case "$current" in
            receiver) http_ok "http://127.0.0.1:${WEBHOOK_PORT}/healthz" ;;
            query-api) http_ok "http://127.0.0.1:${QUERY_API_PORT}/healthz" ;;
            webserver) http_ok "http://127.0.0.1:${DAGSTER_WEBSERVER_PORT}/server_info" ;;
            code-server) exec dagster api grpc-health-check --port "$DAGSTER_GRPC_PORT" ;;
            # Fails when the daemon's threads stopped beating in the instance's storage.
            daemon) exec dagster-daemon liveness-check ;;
            *) exit 0 ;;
        esac
        ;;
    help|--help|-h)
        sed -n '2,12p' "$0"
        ;;
    *)
        exec "$role" "$@"
        ;;
esac
