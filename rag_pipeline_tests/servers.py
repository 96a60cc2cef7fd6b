"""Serve an ASGI app on a loopback ephemeral port in a background thread, for real-HTTP tests."""

from __future__ import annotations

import socket
import threading
from contextlib import contextmanager
from typing import Iterator

import httpx
import uvicorn

# One TLS context for every short-lived client of the tests: each new one loads the CA bundle,
# ~36 ms of CPU, where a POST to a loopback server costs ~1 ms (thousands a run).
TLS = httpx.create_ssl_context()


class LoopbackServer:
    """uvicorn on a socket bound to 127.0.0.1:0 before start, so there is no port race."""

    def __init__(self, app, *, lifespan: str = "on", name: str = "loopback", host: str = "127.0.0.1"):
        self.app = app
        self.host = host   # another address only where loopback is not shared (bench/multihost.py)
        self.lifespan = lifespan
        self.name = name
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 20.0) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self._socket, self.port = sock, sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan=self.lifespan,
                                timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name=f"{self.name}-{self.port}", daemon=True)
        self._thread.start()
        waited = threading.Event()
        for _ in range(int(timeout_s / 0.01)):
            if self._server.started:
                return
            if not self._thread.is_alive():
                break
            waited.wait(0.01)
        self.stop()
        raise RuntimeError(f"{self.name} server did not start")

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
            if self._thread.is_alive():
                raise RuntimeError(f"{self.name} server did not stop within 10 s")
        if self._socket is not None:
            self._socket.close()
        self._server = self._thread = self._socket = None


@contextmanager
def serve(app, *, health_path: str | None = None) -> Iterator[str]:
    """Yield the base URL (http://127.0.0.1:PORT) while `app` is served; stop on exit."""
    server = LoopbackServer(app)
    server.start()
    try:
        if health_path:
            httpx.get(server.base_url + health_path, timeout=5, verify=TLS).raise_for_status()
        yield server.base_url
    finally:
        server.stop()
