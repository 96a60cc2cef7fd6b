#!/usr/bin/env bash
# `make run`: embedded database, webhook receiver, and `dg dev` on workspace.yaml.
# Job control (-m) so that `dg dev` gets our SIGTERM on exit.
set -euo pipefail
set -m
cd "$(dirname "$0")/.."

BIN=.venv/bin
WEBHOOK_PORT="${WEBHOOK_PORT:-8800}"
DAGSTER_PORT="${DAGSTER_PORT:-3000}"
QUERY_API_PORT="${QUERY_API_PORT:-8810}"
SITE_PORT="${SITE_PORT:-8900}"
# The demo crawls a loopback site: the built-in local crawler, unless CRAWLER says otherwise.
export CRAWLER="${CRAWLER:-local}"
# The network guard refuses non-public addresses; the demo site is on loopback, so that one is let in.
export CRAWLER_ALLOW_NETWORKS="${CRAWLER_ALLOW_NETWORKS:-127.0.0.0/8}"
export WEBHOOK_PORT
# The sample site (rag_pipeline/defs/sites/sample) is declared only where this is set: its sitemap
# is read by its discovery sensor as soon as Dagster loads, and its pages pushed by recrawl_sensor.
export SAMPLE_SITE_URL="${SAMPLE_SITE_URL:-http://127.0.0.1:$SITE_PORT}"
users_query_token="${QUERY_API_TOKEN:-}"
# Quiet by default: each service writes to its own log under $RAG_HOME/logs (the previous start's
# kept as *.log.1), and this terminal shows the banner once every service answers, errors, and one
# line a batch (`rag-pipeline follow`). VERBOSE=1 prints everything here, as before, run events
# at DEBUG included.
VERBOSE="${VERBOSE:-0}"
started_at="$(date +%s)"
echo "starting rag-pipeline… (services log to ${RAG_HOME:-$PWD/.rag}/logs)"
# shellcheck source=scripts/setup.sh
source scripts/setup.sh
# SITES_DIR as an absolute path: the services run from the checkout, a command from anywhere.
if [ -n "${SITES_DIR:-}" ]; then SITES_DIR="$(realpath -m -- "$SITES_DIR")"; export SITES_DIR; fi
# What this script set, for the runbook's commands in other shells (docs/configuration.md), and the
# site settings it was given (SITES_DIR, LOCATION_HOLDS: recorded only when set), so that `status`
# and `site …` in another shell declare the sites the running location declares.
write_run_env CRAWLER CRAWLER_ALLOW_NETWORKS WEBHOOK_PORT SAMPLE_SITE_URL DAGSTER_HOME SITES_DIR LOCATION_HOLDS

LOGS="$RAG_HOME/logs"
mkdir -p "$LOGS"
for log in db webhook query_api site dagster; do
  if [ -s "$LOGS/$log.log" ]; then mv -f "$LOGS/$log.log" "$LOGS/$log.log.1"; fi
done
declare -A started   # log file → the pid of the service writing it
start() {  # log file, command…: in the background, its output to its log (or left here with VERBOSE=1); $! is its pid
  local log="$1"
  shift
  if [ "$VERBOSE" = 1 ]; then "${DEFAULT_SIGNALS[@]}" "$@" & else "${DEFAULT_SIGNALS[@]}" "$@" >>"$LOGS/$log" 2>&1 & fi
  started[$log]=$!
}
# deploy/dagster.yaml keeps a run's console output at INFO (every event still goes to the instance).
[ "$VERBOSE" != 1 ] || sed -i 's/^\(  python_log_level:\) INFO$/\1 DEBUG/' "$DAGSTER_HOME/dagster.yaml"

pids=()
dagster_pid=
follow_pid=
cleanup() {
  # A second signal (make forwards the one it got; Ctrl-C pressed twice) must not cut the cleanup
  # short and orphan what it has not stopped yet.
  trap '' INT TERM
  trap - EXIT
  # These jobs are stopped on purpose: no "Terminated …" notice for each (bash still reaps them).
  disown -a 2>/dev/null || true
  # The terminal's follower first: nothing is printed after the stop but the line that says so.
  if [ -n "$follow_pid" ]; then kill -TERM -- "-$follow_pid" 2>/dev/null || kill -TERM "$follow_pid" 2>/dev/null || true; fi
  # Dagster first, and only `dg dev` itself: it stops its daemon and webserver, then its code
  # server. A signal to its whole group would stop the code server under a sensor tick in flight,
  # and the daemon would log a clean stop as user code unreachable.
  if [ -n "$dagster_pid" ]; then
    kill -TERM "$dagster_pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$dagster_pid" 2>/dev/null || break; sleep 0.5; done
  fi
  for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true; done
  # Whatever still runs after 15 s (a stuck run worker) is killed.
  for _ in $(seq 1 30); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 -- "-$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.5
  done
  for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
stopped() {  # Ctrl-C or TERM: what the user asked for, so a clean stop is a success, not make's "Error 143"
  printf 'stopping… '
  cleanup
  echo "stopped: receiver, query API and Dagster; the database keeps running (rag-pipeline db stop)"
  exit 0
}
trap cleanup EXIT
trap stopped INT TERM

DEFAULT_SIGNALS=("$BIN/python" scripts/reset_signals.py)
if [ -z "${DATABASE_URL:-}" ]; then
  # A killed or crashed embedded server is started again within seconds (WAL replay keeps every
  # committed delivery); meanwhile the receiver answers 503 and the crawler re-sends.
  start db.log "$BIN/rag-pipeline" db watch
  pids+=($!)
fi
start webhook.log "$BIN/rag-pipeline" webhook --host 127.0.0.1 --port "$WEBHOOK_PORT"
pids+=($!)
start query_api.log "$BIN/rag-pipeline" serve --host 127.0.0.1 --port "$QUERY_API_PORT"
pids+=($!)
start site.log "$BIN/python" -m rag_pipeline.crawl.loopback_site --root samples/site --port "$SITE_PORT"
pids+=($!)
# `dg dev` with a workspace runs what `dagster dev` runs, without its "superseded" warning.
start dagster.log "$BIN/dg" dev -w workspace.yaml -h 127.0.0.1 -p "$DAGSTER_PORT"
dagster_pid=$!
pids+=($!)

wait_for() {  # url, seconds, the log of the service that answers it
  local why="timed out waiting for $1"
  for _ in $(seq 1 "$2"); do
    if "$BIN/python" -c "import httpx,sys; sys.exit(0 if httpx.get('$1', timeout=2).status_code < 500 else 1)" 2>/dev/null; then
      return 0
    fi
    # A service that exits at once (its port taken) is said so now, not at the end of the wait.
    if ! kill -0 "${started[$3]}" 2>/dev/null; then why="the service behind $1 exited"; break; fi
    sleep 1
  done
  echo "$why; the end of $LOGS/$3:" >&2
  [ "$VERBOSE" = 1 ] || tail -n 5 "$LOGS/$3" >&2 || true
  return 1
}
wait_for "http://127.0.0.1:$WEBHOOK_PORT/healthz" 60 webhook.log
wait_for "http://127.0.0.1:$QUERY_API_PORT/healthz" 60 query_api.log
wait_for "http://127.0.0.1:$DAGSTER_PORT/server_info" 180 dagster.log

# Nothing to seed: the sample site's discovery sensor reads its robots.txt and sitemap within a
# minute of Dagster's start, and recrawl_sensor pushes the pages it registers to the local crawler,
# which delivers them through the receiver exactly as Crawlbase would.
wait_for "http://127.0.0.1:$SITE_PORT/" 30 site.log
if [ "$VERBOSE" != 1 ]; then
  # One line a batch run that ends, a run that fails, an error a service logs (from the start on).
  "${DEFAULT_SIGNALS[@]}" "$BIN/rag-pipeline" follow --since "$started_at" --logs "$LOGS" &
  follow_pid=$!
fi

provider="${EMBEDDING_PROVIDER:-}"
[ -n "$provider" ] || { [ -n "${OPENAI_API_KEY:-}" ] && provider=openai || provider=local; }
# How a shell other than this one gets the token, without printing it.
token_hint='$QUERY_API_TOKEN'
[ -z "$users_query_token" ] && token_hint="\$($PWD/$BIN/rag-pipeline token query)"
cat <<MSG

  rag-pipeline is running (embeddings: $provider)
    Dagster UI : http://127.0.0.1:$DAGSTER_PORT   (delivery_sensor ticks every 15 s)
    Webhook    : http://127.0.0.1:$WEBHOOK_PORT/webhook  (X-Webhook-Token header, or ?token= for a crawler's callback URL; WEBHOOK_TOKEN, or $RAG_HOME/webhook_token)
    Site       : http://127.0.0.1:$SITE_PORT  (samples/site; its sitemap read every 2 min, pages crawled by the $CRAWLER crawler)
    Discovery  : .venv/bin/rag-pipeline site show sample   (add a page to samples/site/docs/: it is found and indexed)
    Cadence    : .venv/bin/rag-pipeline cadence show http://127.0.0.1:$SITE_PORT/pricing
    Search     : .venv/bin/rag-pipeline search "how do I rotate the webhook token?"
    Query API  : curl -s http://127.0.0.1:$QUERY_API_PORT/search -H "Authorization: Bearer $token_hint" \\
                   -H 'Content-Type: application/json' -d '{"question": "how do I rotate the webhook token?"}'
    Status     : .venv/bin/rag-pipeline status
    Logs       : $LOGS/{dagster,webhook,query_api,site,db}.log   (VERBOSE=1 make run prints them here)
  Below: one line a batch, and errors. Ctrl-C stops the receiver and Dagster; the database keeps running (rag-pipeline db stop).

MSG
wait
