"""A request's database work, cancelled in PostgreSQL when its client hangs up.

A question whose client has gone would otherwise hold its pooled connection until the scan ends
(or QUERY_STATEMENT_TIMEOUT_S): a few clients that give up on slow questions could then starve
everyone else of connections."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import anyio
import psycopg
from fastapi import Request
from fastapi.concurrency import run_in_threadpool

log = logging.getLogger("query_api")

# How often a request whose query runs looks whether its client is still there, and how often the
# cancel is sent again while the work goes on (one that lands between two statements is ignored).
HANG_UP_POLL_S = 0.1
CANCEL_AGAIN_S = 0.5

T = TypeVar("T")


class ClientGoneAway(Exception):
    """The client hung up while its request was served: its work was cancelled."""


class CancelOnHangUp:
    """One request's blocking database work, run in a worker thread while the event loop watches
    the client: when it hangs up, the query running on the request's pooled connection is
    cancelled in PostgreSQL (`cancel_safe`), so the connection goes back to the pool at once
    instead of after the scan (or QUERY_STATEMENT_TIMEOUT_S). The connection is cancelled only
    while the work holds it (`holding`): never once it is back in the pool and someone else's."""

    def __init__(self, request: Request):
        self.request = request
        self.gone = False
        self._lock = threading.Lock()
        self._conn: psycopg.Connection | None = None

    @contextmanager
    def holding(self, conn: psycopg.Connection) -> Iterator[psycopg.Connection]:
        """In the worker thread, around the work on ``conn``: what a hang-up cancels."""
        with self._lock:
            if self.gone:
                raise ClientGoneAway()
            self._conn = conn
        try:
            yield conn
        finally:
            with self._lock:
                self._conn = None

    async def run(self, work: Callable[[], T]) -> T:
        """``work()`` in a worker thread, cancelled if the client hangs up; its result or its error."""
        failed: BaseException | None = None
        async with anyio.create_task_group() as watchers:    # raised out of here, an error comes wrapped
            watchers.start_soon(self._watch)
            try:
                result = await run_in_threadpool(work)
            except Exception as exc:  # noqa: BLE001 - raised below, as it is
                failed = exc
            watchers.cancel_scope.cancel()
        if self.gone:
            raise ClientGoneAway() from failed
        if failed is not None:
            raise failed
        return result

    async def _watch(self) -> None:
        while not await self.request.is_disconnected():
            await anyio.sleep(HANG_UP_POLL_S)
        self.gone = True
        while True:         # until the work ends (run cancels this task): a statement may start after a cancel
            await anyio.to_thread.run_sync(self._cancel)
            await anyio.sleep(CANCEL_AGAIN_S)

    def _cancel(self) -> None:
        with self._lock:
            if self._conn is None:
                return
            try:
                self._conn.cancel_safe(timeout=5.0)
            except Exception as exc:  # noqa: BLE001 - the statement timeout still ends the query
                log.warning("could not cancel the query of a client that hung up: %s", exc)
