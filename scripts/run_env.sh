# Sourced by scripts/setup.sh: write_run_env NAME… writes $RAG_HOME/run.env, what scripts/run.sh set
# for make run's processes, so that a command in another shell reads the deployment's settings
# (below that shell's environment and the .env; rag_pipeline/settings_sources.py). The file stays
# once make run stops: a runbook command still concerns this deployment. Only the variables named,
# and never a secret: the tokens stay in their own files.
write_run_env() {
  local name value tmp="$RAG_HOME/run.env.$$"
  {
    echo "# written by scripts/run.sh (make run) at $(date -u +%Y-%m-%dT%H:%M:%SZ); rag-pipeline reads it below the environment and .env"
    for name in "$@"; do
      [ -n "${!name+set}" ] || continue
      value="${!name//\\/\\\\}"
      value="${value//\'/\\\'}"
      printf "%s='%s'\n" "$name" "$value"
    done
  } > "$tmp"
  mv "$tmp" "$RAG_HOME/run.env"
}
