"""A tiny loopback web site: pages held in memory or served from a folder (`samples/site/`).

Tests and the simulator change it on the fly (edit a page, answer 404/410, redirect); `make run`
serves `samples/site/` with it: `python -m rag_pipeline.crawl.loopback_site --root samples/site --port 8900`.
A `_redirects` file in the folder holds `FROM TO [STATUS]` lines. `/sitemap.xml`, unless the folder
has one, lists every page file with its modification time as `<lastmod>`, as a static site
generator would: a page added to the folder is in the sitemap at once. `{SITE}` in a .xml or .txt
file is the address the site is served at.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit
from xml.sax.saxutils import escape

_CONTENT_TYPES = {".md": "text/markdown", ".xml": "application/xml", ".txt": "text/plain", ".html": "text/html"}


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        # A client that closes a kept-alive connection (a pool closing, a fetch cut at its cap) is
        # no error of the site's: no traceback for it.
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)


@dataclass(frozen=True)
class Page:
    status: int = 200
    body: bytes = b""
    content_type: str = "text/html; charset=utf-8"
    location: str | None = None
    delay_s: float = 0.0          # a slow page, to see politeness limits at work
    headers: tuple[tuple[str, str], ...] = ()   # more headers, as sent (Content-Encoding, …)
    drip_s: float = 0.0           # a pause before each 1 KiB of the body: a site that never ends


class LoopbackSite:
    def __init__(self, root: Path | None = None, *, host: str = "127.0.0.1", port: int = 0):
        self.root = Path(root) if root else None
        self.pages: dict[str, Page] = {}
        self.hits: Counter = Counter()
        self.in_flight = 0
        self.max_in_flight = 0       # the most requests served at once
        self._lock = threading.Lock()
        site = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802 (http.server naming)
                path = urlsplit(self.path).path or "/"
                page = site.lookup(path)
                with site._lock:
                    site.hits[path] += 1
                    site.in_flight += 1
                    site.max_in_flight = max(site.max_in_flight, site.in_flight)
                try:
                    if page.delay_s:
                        time.sleep(page.delay_s)
                finally:
                    with site._lock:
                        site.in_flight -= 1
                self.send_response(page.status)
                if page.location:
                    self.send_header("Location", page.location)
                self.send_header("Content-Type", page.content_type)
                for name, value in page.headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(page.body)))
                self.end_headers()
                try:
                    if not page.drip_s:
                        self.wfile.write(page.body)
                        return
                    for start in range(0, len(page.body), 1024):
                        time.sleep(page.drip_s)
                        self.wfile.write(page.body[start:start + 1024])
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass   # the client stopped reading (a cap, a deadline): its choice

            def log_message(self, *args):
                pass

        self._server = _Server((host, port), Handler)
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def url(self, path: str) -> str:
        return self.base_url + path

    # What tests change on the fly.
    def set_page(self, path: str, text: str, *, status: int = 200,
                 content_type: str = "text/html; charset=utf-8", delay_s: float = 0.0) -> None:
        with self._lock:
            self.pages[path] = Page(status, text.encode("utf-8"), content_type, delay_s=delay_s)

    def set_raw(self, path: str, body: bytes, *, status: int = 200, content_type: str = "application/xml",
                headers: dict[str, str] | None = None, drip_s: float = 0.0) -> None:
        """Bytes served as they are (a gzip'd sitemap, a body under some Content-Encoding)."""
        with self._lock:
            self.pages[path] = Page(status, body, content_type, headers=tuple((headers or {}).items()),
                                    drip_s=drip_s)

    def redirect(self, path: str, to: str, *, status: int = 301) -> None:
        with self._lock:
            self.pages[path] = Page(status, b"", "text/plain", location=to)

    def remove(self, path: str, *, status: int = 404) -> None:
        with self._lock:
            self.pages[path] = Page(status, b"not found", "text/plain")

    def lookup(self, path: str) -> Page:
        with self._lock:
            page = self.pages.get(path)
        if page is not None:
            return page
        if self.root is not None:
            return self._from_folder(path)
        return Page(404, b"not found", "text/plain")

    def _from_folder(self, path: str) -> Page:
        root = self.root.resolve()
        redirects = root / "_redirects"
        if redirects.exists():
            for line in redirects.read_text().splitlines():
                fields = line.split("#", 1)[0].split()
                if len(fields) >= 2 and fields[0] == path:
                    return Page(int(fields[2]) if len(fields) > 2 else 301, b"", "text/plain", fields[1])
        rel = path.strip("/") or "index"
        for candidate in (rel, f"{rel}.html", f"{rel}/index.html", f"{rel}.md"):
            file = (root / candidate).resolve()
            if file.is_file() and root in file.parents:
                kind = _CONTENT_TYPES.get(file.suffix, "text/html")
                body = file.read_bytes()
                if file.suffix in (".xml", ".txt"):   # {SITE}: wherever this site is served
                    body = body.replace(b"{SITE}", self.base_url.encode())
                return Page(200, body, f"{kind}; charset=utf-8")
        if rel == "sitemap.xml":
            return Page(200, self._sitemap(root), "application/xml; charset=utf-8")
        return Page(404, b"not found", "text/plain")

    def _sitemap(self, root: Path) -> bytes:
        """What a static site generator would publish: every page file, its mtime as <lastmod>."""
        entries = []
        for file in sorted(root.rglob("*")):
            if file.suffix not in (".html", ".md") or file.name.startswith("_"):
                continue
            rel = file.relative_to(root).with_suffix("").as_posix()
            path = "/" if rel == "index" else "/" + rel.removesuffix("/index")
            lastmod = datetime.fromtimestamp(file.stat().st_mtime, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            entries.append(f"  <url><loc>{escape(self.base_url + path)}</loc><lastmod>{lastmod}</lastmod></url>")
        return ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                "<urlset xmlns=\"http://www.sitemaps.org/schemas/sitemap/0.9\">\n"
                + "\n".join(entries) + "\n</urlset>\n").encode()

    def start(self) -> "LoopbackSite":
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="loopback-site", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> "LoopbackSite":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve a folder as a loopback web site.")
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--port", type=int, default=8900)
    args = parser.parse_args()
    site = LoopbackSite(args.root, port=args.port)
    print(f"serving {args.root} at {site.base_url}", flush=True)
    try:
        site._server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
