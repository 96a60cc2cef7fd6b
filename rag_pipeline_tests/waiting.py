"""Waiting on a condition with a deadline, never for a fixed time."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


#: The longest pause between two looks: a condition is often a query, and a long wait that looked
#: every 20 ms would spend the cores the daemon under test needs.
MAX_POLL_S = 0.2


def wait_until(condition: Callable[[], T], timeout_s: float, what: str, *, poll_s: float = 0.02) -> T:
    """The first truthy value of ``condition()``; AssertionError naming ``what`` at the deadline.
    Looks often at first, then every MAX_POLL_S."""
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        pause.wait(poll_s)
        poll_s = min(MAX_POLL_S, poll_s * 1.5)
