"""What `make run` and the README's commands print in a newcomer's terminal."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_dg_run_from_the_venv_without_activating_it_prints_no_venv_warning(tmp_path):
    """The README runs `.venv/bin/dg scaffold …` from a shell where no venv is active: dg then
    compares $VIRTUAL_ENV (unset) with the project's .venv and warned in 7 lines. A copy of the
    project's pyproject.toml beside a .venv reproduces that wherever the suite's venv lives."""
    shutil.copy(CHECKOUT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / ".venv").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    done = subprocess.run([str(BIN / "dg"), "list", "envs"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "virtual environment" not in done.stderr, done.stderr
    assert done.stderr.strip() == ""
