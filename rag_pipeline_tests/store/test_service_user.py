"""As root, PostgreSQL runs as a service user that the first start on a machine adds. Test workers,
or the receiver beside the daemon, start together: on a new CI machine the package's own unlocked
check-then-`useradd` failed two of three test workers."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from rag_pipeline.store import embedded

pytestmark = pytest.mark.skipif(os.name == "nt" or os.geteuid() != 0,
                                reason="only root adds a service user (PostgreSQL refuses to run as root)")

STARTERS = 8
ADD = """
import sys
from rag_pipeline.store import embedded
print("ready", flush=True)
sys.stdin.read(1)          # every starter imported and waiting: released together
embedded.ensure_system_user(sys.argv[1])
"""


def passwd_entries(name: str) -> int:
    return sum(line.startswith(f"{name}:") for line in Path("/etc/passwd").read_text().splitlines())


@pytest.mark.parametrize("round_", range(3))     # a race: each round alone caught it about half the time
def test_processes_starting_together_add_the_service_user_once(round_):
    name = f"rag_t{uuid.uuid4().hex[:10]}"
    starters = [subprocess.Popen([sys.executable, "-c", ADD, name], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for _ in range(STARTERS)]
    try:
        assert [p.stdout.readline() for p in starters] == ["ready\n"] * STARTERS
        for p in starters:
            p.stdin.write("x")
            p.stdin.flush()
        failures = [p.communicate(timeout=60)[1] for p in starters]
        assert [p.returncode for p in starters] == [0] * STARTERS, failures
        assert passwd_entries(name) == 1
        assert pwd.getpwnam(name).pw_uid != 0
        embedded.ensure_system_user(name)          # asked again: nothing to do, no error
        assert passwd_entries(name) == 1
    finally:
        for p in starters:
            p.kill()
        subprocess.run(["userdel", name], capture_output=True)


def test_a_service_user_that_cannot_be_added_is_one_clear_error():
    with pytest.raises(embedded.EmbeddedError, match="could not add the service user"):
        embedded.ensure_system_user("bad name")     # useradd refuses a name with a space


def test_a_system_without_useradd_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(embedded.EmbeddedError, match="could not add the service user .*useradd"):
        embedded.ensure_system_user(f"rag_t{uuid.uuid4().hex[:10]}")
