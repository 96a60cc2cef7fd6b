# Sourced by scripts/run.sh (and by the test of this set-up): the state that `make run`'s
# processes share. Expects BIN (the venv's bin/) and the checkout as the working directory;
# exports RAG_HOME, WEBHOOK_TOKEN, QUERY_API_TOKEN, DAGSTER_POSTGRES_URL and DAGSTER_HOME.
# With DATABASE_URL set, that server holds both the index and Dagster's storage (`dagster` database).

export RAG_HOME="${RAG_HOME:-$PWD/.rag}"
mkdir -p "$RAG_HOME"

# A webhook token is required; make one for this checkout unless the user set theirs. The CLI and
# the receiver read this file too when WEBHOOK_TOKEN is unset.
if [ -z "${WEBHOOK_TOKEN:-}" ]; then
  [ -s "$RAG_HOME/webhook_token" ] || (umask 077 && "$BIN/python" -c 'import secrets; print(secrets.token_urlsafe(24))' > "$RAG_HOME/webhook_token")
  WEBHOOK_TOKEN="$(cat "$RAG_HOME/webhook_token")"
fi
export WEBHOOK_TOKEN
# The query API's token likewise (applications send it as `Authorization: Bearer …`).
if [ -z "${QUERY_API_TOKEN:-}" ]; then
  [ -s "$RAG_HOME/query_api_token" ] || (umask 077 && "$BIN/python" -c 'import secrets; print(secrets.token_urlsafe(24))' > "$RAG_HOME/query_api_token")
  QUERY_API_TOKEN="$(cat "$RAG_HOME/query_api_token")"
fi
export QUERY_API_TOKEN

"$BIN/rag-pipeline" db migrate
DAGSTER_POSTGRES_URL="$("$BIN/rag-pipeline" db url --database dagster)"
export DAGSTER_POSTGRES_URL
export DAGSTER_HOME="$RAG_HOME/dagster_home"
mkdir -p "$DAGSTER_HOME"
cp deploy/dagster.yaml "$DAGSTER_HOME/dagster.yaml"

# shellcheck source=scripts/run_env.sh
source scripts/run_env.sh   # write_run_env, which scripts/run.sh calls with what it set
