"""Run a command with SIGINT and SIGTERM at their defaults.

A job started in the background of a non-interactive shell (a supervisor, CI, `make run &`)
inherits SIGINT ignored, and `dg dev` (`dagster dev`) maps SIGTERM to its SIGINT handling, so it would
ignore both and outlive `make run`. exec keeps the pid, so the caller's kill still reaches it.
"""

import os
import signal
import sys

for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, signal.SIG_DFL)
os.execvp(sys.argv[1], sys.argv[1:])
