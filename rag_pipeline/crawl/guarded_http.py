"""Every fetch of a URL someone else chose (a page, a redirect, robots.txt, a sitemap) goes through
here: each hop's address checked and the connection pinned to it, redirects followed by hand, one
content encoding inflated within a budget, and one deadline for the whole fetch.

The check happens where the socket is opened (a network backend of httpcore's): the name is
resolved once, every address it resolves to must pass `core.addresses.refusal`, and the socket
connects to the address that passed, so a DNS answer that changes after the check (rebinding)
never reaches a refused address. TLS still verifies the certificate against the host name.

The deadline bounds every socket operation too, not only the body's chunks: httpx's timeouts are
per read, so a server that drips its response head (or a TLS handshake) a byte at a time, each
within the read timeout, would hold a worker for as long as it liked. The streams this backend
opens clip each connect, handshake, read and write to what is left of the current fetch's
deadline (`_Deadline`, per thread: httpx's sync client does its I/O in the caller's thread), and
refuse to start one once it has passed. Only the name's resolution (getaddrinfo) is not bounded
by it: the system resolver's own timeouts apply.
"""

from __future__ import annotations

import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import httpcore
import httpx

from rag_pipeline.core.addresses import Network, refusal

__all__ = ["FetchError", "Refused", "Disallowed", "Fetch", "guarded_client", "fetch"]

# Inflated output is produced in steps of this size, so a bomb never holds more than this at once.
_INFLATE_STEP = 64 * 1024
_ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class FetchError(Exception):
    """A fetch that gave no usable answer; the message is the reason recorded for it."""


class Refused(FetchError):
    """A hop to an address the guard does not allow: never connected to. `url`: that hop, when
    `fetch` knows it (robots.txt tells its own origin's refusal from a redirect's by it)."""

    def __init__(self, message: str, url: str | None = None):
        super().__init__(message)
        self.url = url


class Disallowed(Refused):
    """A hop the caller's `check` refused (robots.txt): never requested. A `Refused`, so that
    nothing of it is delivered either. `url`: that hop (a redirect's target, maybe)."""


class _Deadline(threading.local):
    """The monotonic time the current thread's fetch must end by (None: no fetch under way)."""

    at: float | None = None

    @contextmanager
    def until(self, at: float) -> Iterator[None]:
        """Within: every socket operation of this thread ends by ``at``. Nested fetches (robots.txt
        read while a page's hop is checked) have their own, and the outer one's comes back after."""
        outer, self.at = self.at, at
        try:
            yield
        finally:
            self.at = outer

    def clip(self, timeout: float | None, expired: type[Exception]) -> float | None:
        """``timeout`` cut to what is left of the deadline; ``expired`` raised once none is left."""
        if self.at is None:
            return timeout
        left = self.at - time.monotonic()
        if left <= 0:
            raise expired("the fetch's deadline passed")
        return left if timeout is None else min(timeout, left)


_deadline = _Deadline()


class _DeadlineStream(httpcore.NetworkStream):
    """A socket stream whose every operation ends by the current fetch's deadline (`_Deadline`)."""

    def __init__(self, inner: httpcore.NetworkStream):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _deadline.clip(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _deadline.clip(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> httpcore.NetworkStream:
        # The handshake is one operation under one timeout (CPython's ssl bounds it as a whole).
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname,
                                                     _deadline.clip(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str):
        return self._inner.get_extra_info(info)


class _GuardedBackend(httpcore.SyncBackend):
    def __init__(self, allowed: tuple[Network, ...], resolve=socket.getaddrinfo):
        self.allowed = allowed
        self.resolve = resolve

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        return _DeadlineStream(self._connect(host, port, timeout, local_address, socket_options))

    def _connect(self, host, port, timeout, local_address, socket_options) -> httpcore.NetworkStream:
        try:
            infos = self.resolve(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        addresses = list(dict.fromkeys(info[4][0] for info in infos))
        if not addresses:
            raise httpcore.ConnectError(f"cannot resolve {host}: no address")
        # Every answer must pass: a name that resolves to a public and a private address is
        # one an attacker controls.
        for address in addresses:
            reason = refusal(address, self.allowed)
            if reason:
                raise Refused(f"{host} resolves to {reason}")
        last: Exception | None = None
        for address in addresses:
            try:
                return super().connect_tcp(address, port, _deadline.clip(timeout, httpcore.ConnectTimeout),
                                           local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        raise last  # type: ignore[misc]


class _GuardedTransport(httpx.HTTPTransport):
    """httpx's transport with the guarded backend under its pool.

    httpx offers no public way to hand its pool a network backend, so the pool it built is
    replaced by an equal one that has it (`_pool` is httpx's private attribute: an upgrade that
    renames it fails here, at construction, and in test_guarded_http, never silently).
    """

    def __init__(self, allowed: tuple[Network, ...], *, resolve=socket.getaddrinfo,
                 limits: httpx.Limits = httpx.Limits(max_connections=100, max_keepalive_connections=20)):
        super().__init__(trust_env=False, limits=limits)
        if not isinstance(getattr(self, "_pool", None), httpcore.ConnectionPool):
            raise RuntimeError("httpx.HTTPTransport no longer keeps its pool in _pool: "
                               "rag_pipeline.crawl.guarded_http needs a new way to guard connections")
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=_GuardedBackend(allowed, resolve),
        )


def guarded_client(*, allowed: tuple[Network, ...] = (), user_agent: str, timeout_s: float = 30.0,
                   resolve=socket.getaddrinfo, headers: dict[str, str] | None = None) -> httpx.Client:
    """A client whose every connection passes the guard. It never follows redirects (`fetch`
    does, hop by hop) and ignores proxy variables, which would route around the guard."""
    return httpx.Client(
        transport=_GuardedTransport(allowed, resolve=resolve), follow_redirects=False, trust_env=False,
        timeout=timeout_s,
        headers={"User-Agent": user_agent, "Accept-Encoding": "gzip, deflate", **(headers or {})},
    )


@dataclass
class Fetch:
    """An answer being read: its status and headers now, its body through `chunks`."""

    url: str                       # the final URL, after redirects
    status: int
    headers: httpx.Headers
    hops: list[str] = field(default_factory=list)   # the URLs redirected through, in order
    _response: httpx.Response | None = None
    _deadline: float = 0.0

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")

    @property
    def charset(self) -> str | None:
        return self._response.charset_encoding if self._response is not None else None

    def chunks(self, max_bytes: int) -> Iterator[bytes]:
        """The body, inflated from at most one content encoding, at most `max_bytes` of it."""
        encodings = [e.strip().lower() for e in self.headers.get("content-encoding", "").split(",")
                     if e.strip() and e.strip().lower() != "identity"]
        if len(encodings) > 1:
            raise FetchError(f"refused: {len(encodings)} content encodings ({', '.join(encodings)}); "
                             "at most one is accepted")
        if encodings and encodings[0] not in _ENCODINGS:
            raise FetchError(f"refused: unsupported content encoding {encodings[0]!r}")
        inflate = zlib.decompressobj(_ENCODINGS[encodings[0]]) if encodings else None
        total = 0
        assert self._response is not None
        for raw in self._response.iter_raw():
            self._check_deadline()
            pending = raw
            while pending:
                if inflate is None:
                    out, pending = pending, b""
                else:
                    try:
                        out = inflate.decompress(pending, _INFLATE_STEP)
                    except zlib.error as exc:
                        raise FetchError(f"body is not valid {encodings[0]}: {exc}") from None
                    pending = inflate.unconsumed_tail
                total += len(out)
                if total > max_bytes:
                    raise FetchError(f"larger than {max_bytes} bytes" + (" once inflated" if inflate else ""))
                if out:
                    yield out
                if inflate is not None and inflate.eof:
                    pending = b""

    def read(self, max_bytes: int) -> bytes:
        return b"".join(self.chunks(max_bytes))

    def _check_deadline(self) -> None:
        if time.monotonic() > self._deadline:
            raise FetchError("took longer than the fetch's deadline")


@contextmanager
def fetch(client: httpx.Client, url: str, *, deadline_s: float, max_redirects: int = 10,
          headers: dict[str, str] | None = None,
          check: Callable[[str], str | None] | None = None) -> Iterator[Fetch]:
    """GET `url`, following up to `max_redirects` redirects by hand, all within `deadline_s`.

    Raises `Refused` for a hop the guard refuses, `Disallowed` for one `check` gives a reason
    against (it sees every hop's URL before the request), and `FetchError` for any other fetch
    that gave no answer (network, redirects, deadline); an HTTP error status is an answer.
    """
    deadline = time.monotonic() + deadline_s
    with _deadline.until(deadline):
        with _hops(client, url, deadline, deadline_s, max_redirects, headers, check) as answer:
            yield answer


def _late(exc: Exception, deadline: float, deadline_s: float) -> FetchError:
    """A transport error as the fetch's failure: one past the deadline says so."""
    if time.monotonic() >= deadline:
        return FetchError(f"took longer than the fetch's deadline ({deadline_s:g} s)")
    return FetchError(f"{type(exc).__name__}: {exc}")


@contextmanager
def _hops(client: httpx.Client, url: str, deadline: float, deadline_s: float, max_redirects: int,
          headers: dict[str, str] | None, check: Callable[[str], str | None] | None) -> Iterator[Fetch]:
    hops: list[str] = []
    current = url
    for _ in range(max_redirects + 1):
        if httpx.URL(current).scheme not in ("http", "https"):
            raise Refused(f"refused: {current!r} is not http(s)" + (f" (redirected from {hops[-1]})" if hops else ""))
        reason = check(current) if check is not None else None
        if reason:
            raise Disallowed(reason + (f" (redirected from {hops[-1]})" if hops else ""), url=current)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise FetchError(f"took longer than the fetch's deadline ({deadline_s:g} s)")
        request = client.build_request("GET", current, headers=headers,
                                       timeout=httpx.Timeout(min(remaining, client.timeout.read or remaining)))
        try:
            response = client.send(request, stream=True, follow_redirects=False)
        except Refused as exc:
            where = f" (redirected from {hops[-1]})" if hops else ""
            raise Refused(f"refused {current}{where}: {exc}", url=current) from None
        except httpx.HTTPError as exc:
            raise _late(exc, deadline, deadline_s) from None
        if response.is_redirect and response.next_request is not None:
            following = str(response.next_request.url)
            response.close()
            hops.append(current)
            if following in hops:
                raise FetchError("redirect loop: " + " → ".join([*hops, following]))
            current = following
            continue
        try:
            yield Fetch(str(response.url), response.status_code, response.headers, hops, response, deadline)
        except httpx.HTTPError as exc:
            raise _late(exc, deadline, deadline_s) from None
        finally:
            response.close()
        return
    raise FetchError(f"more than {max_redirects} redirects: " + " → ".join([*hops, current]))
