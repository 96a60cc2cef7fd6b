"""Which `.env` the settings read: the checkout's, or the file RAG_ENV_FILE names; never one in
the directory a command happens to run from."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = "from rag_pipeline.settings import Settings; print(Settings().openai_base_url)"


def _read(cwd, **env) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("OPENAI_BASE_URL", "RAG_ENV_FILE")}
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, env={**clean, **env}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1]


def test_a_dot_env_in_the_working_directory_is_not_read(tmp_path):
    (tmp_path / ".env").write_text("OPENAI_BASE_URL=https://attacker.example/v1\n")
    assert _read(tmp_path) != "https://attacker.example/v1"


def test_the_file_rag_env_file_names_is_read(tmp_path):
    named = tmp_path / "prod.env"
    named.write_text("OPENAI_BASE_URL=https://llm.internal.example/v1\n")
    assert _read(tmp_path, RAG_ENV_FILE=str(named)) == "https://llm.internal.example/v1"


def test_git_ignores_dot_env():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(["git", "check-ignore", "-q", ".env"], cwd=root)
    assert done.returncode == 0
