"""`kill -9` of the receiver under load, then a restart: every rid that got a 200 is stored, once."""

from __future__ import annotations

import gzip
import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid


from rag_pipeline_tests.webhook.conftest import TOKEN

BODY = gzip.compress(("# Kill test\n\n" + "A paragraph that goes on for a while. " * 200).encode())
THREADS = 8
LOAD_S_BEFORE_KILL = 1.5
LOAD_S_AFTER_RESTART = 1.0


class Receiver:
    """`python -m uvicorn webhook_sensor.main:app` on a socket bound here (no port race)."""

    def __init__(self, database_url: str):
        self.env = {**os.environ, "DATABASE_URL": database_url, "WEBHOOK_TOKEN": TOKEN, "WEBHOOK_ACCESS_LOG": "0"}
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        fd = self.sock.fileno()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "webhook_sensor.main:app", "--fd", str(fd), "--log-level", "warning"],
            env=self.env, pass_fds=[fd],
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "receiver exited during startup"
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError("receiver did not become healthy")

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.sock.close()


def deliver(port: int, rid: str, conn: http.client.HTTPConnection | None):
    """(status or None when the connection broke, the connection to reuse)."""
    try:
        conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("POST", f"/webhook?token={TOKEN}", body=BODY, headers={
            "rid": rid, "url": f"https://example.com/{rid}", "CB-Status": "200", "Original-Status": "200",
            "Content-Encoding": "gzip"})
        resp = conn.getresponse()
        resp.read()
        return resp.status, conn
    except (OSError, http.client.HTTPException):
        if conn is not None:
            conn.close()
        return None, None


def test_kill9_under_load_loses_no_acknowledged_delivery(database_url, conn):
    receiver = Receiver(database_url)
    acked: list[str] = []
    unanswered: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def load(deadline: float) -> None:
        client = None
        while not stop.is_set() and time.monotonic() < deadline:
            rid = uuid.uuid4().hex
            status, client = deliver(receiver.port, rid, client)
            with lock:
                (acked if status == 200 else unanswered).append(rid)
            if status is None:
                time.sleep(0.01)
        if client:
            client.close()

    try:
        receiver.start()
        # The load runs across the kill and the restart; bounded by its own deadline.
        deadline = time.monotonic() + 30
        threads = [threading.Thread(target=load, args=(deadline,)) for _ in range(THREADS)]
        for t in threads:
            t.start()
        time.sleep(LOAD_S_BEFORE_KILL)
        with lock:
            acked_before_kill = len(acked)
        receiver.kill9()
        time.sleep(0.3)
        with lock:
            failed_while_down = len(unanswered)
        receiver.start()
        time.sleep(LOAD_S_AFTER_RESTART)
        stop.set()
        for t in threads:
            t.join(timeout=20)
        assert not any(t.is_alive() for t in threads)

        assert acked_before_kill > 50, "the receiver was not under load when it was killed"
        assert failed_while_down > 0, "the kill did not interrupt any request"
        assert len(acked) > acked_before_kill, "no delivery acknowledged after the restart"
        counts = dict(conn.execute(
            "SELECT rid, count(*) FROM deliveries WHERE rid = ANY(%s) GROUP BY rid", (acked,)).fetchall())
        missing = [rid for rid in acked if counts.get(rid) != 1]
        assert missing == [], f"{len(missing)} acknowledged deliveries lost or doubled"

        # The crawler retries what got no answer, with the same rid: each is then stored exactly once.
        for rid in unanswered:
            status, c = deliver(receiver.port, rid, None)
            c and c.close()
            assert status == 200
        total = conn.execute("SELECT count(*), count(DISTINCT rid) FROM deliveries").fetchone()
        assert total == (len(acked) + len(unanswered),) * 2
        print(f"kill -9: {acked_before_kill} acked before the kill, {len(acked)} in all, "
              f"{len(unanswered)} unanswered then retried")
    finally:
        stop.set()
        receiver.stop()
