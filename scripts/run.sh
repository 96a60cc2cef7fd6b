#!/usr/bin/env bash
# `make run`: embedded database, webhook receiver, and `dagster dev` on workspace.yaml.
# Job control (-m) so that `dagster dev` gets our SIGTERM on exit.
set -euo pipefail
set -m
cd "$(dirname "$0")/.."

BIN=.venv/bin
export RAG_HOME="${RAG_HOME:-$PWD/.rag}"
WEBHOOK_PORT="${WEBHOOK_PORT:-8800}"
DAGSTER_PORT="${DAGSTER_PORT:-3000}"
mkdir -p "$RAG_HOME"

# A webhook token is required; make one for this checkout unless the user set theirs.
if [ -z "${WEBHOOK_TOKEN:-}" ]; then
  [ -s "$RAG_HOME/webhook_token" ] || "$BIN/python" -c 'import secrets; print(secrets.token_urlsafe(24))' > "$RAG_HOME/webhook_token"
  WEBHOOK_TOKEN="$(cat "$RAG_HOME/webhook_token")"
fi
export WEBHOOK_TOKEN

"$BIN/rag-pipeline" db migrate
export DAGSTER_POSTGRES_URL="$("$BIN/rag-pipeline" db url --database dagster)"
export DAGSTER_HOME="$RAG_HOME/dagster_home"
mkdir -p "$DAGSTER_HOME"
cp dagster.yaml "$DAGSTER_HOME/dagster.yaml"

pids=()
cleanup() {
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT INT TERM

"$BIN/rag-pipeline" webhook --host 127.0.0.1 --port "$WEBHOOK_PORT" &
pids+=($!)
"$BIN/dagster" dev -w workspace.yaml -h 127.0.0.1 -p "$DAGSTER_PORT" &
pids+=($!)

wait_for() {  # url, seconds
  for _ in $(seq 1 "$2"); do
    if "$BIN/python" -c "import httpx,sys; sys.exit(0 if httpx.get('$1', timeout=2).status_code < 500 else 1)" 2>/dev/null; then
      return 0
    fi
    sleep 1
  done
  echo "timed out waiting for $1" >&2
  return 1
}
wait_for "http://127.0.0.1:$WEBHOOK_PORT/healthz" 60
wait_for "http://127.0.0.1:$DAGSTER_PORT/server_info" 180

# A few sample pages, delivered exactly as the crawler would, so the UI has something to show.
for f in samples/*.md; do
  name="$(basename "$f" .md)"
  "$BIN/rag-pipeline" deliver "https://samples.rag-pipeline.local/$name" "$f" \
    --webhook "http://127.0.0.1:$WEBHOOK_PORT/webhook" >/dev/null
done

provider="${EMBEDDING_PROVIDER:-}"
[ -n "$provider" ] || { [ -n "${OPENAI_API_KEY:-}" ] && provider=openai || provider=local; }
cat <<MSG

  rag-pipeline is running (embeddings: $provider)
    Dagster UI : http://127.0.0.1:$DAGSTER_PORT   (delivery_sensor ticks every 15 s)
    Webhook    : http://127.0.0.1:$WEBHOOK_PORT/webhook?token=…  (token: WEBHOOK_TOKEN, or $RAG_HOME/webhook_token)
    Search     : .venv/bin/rag-pipeline search "how do I rotate the webhook token?"
    Status     : .venv/bin/rag-pipeline status
  Ctrl-C stops the receiver and Dagster; the database keeps running (rag-pipeline db stop).

MSG
wait
