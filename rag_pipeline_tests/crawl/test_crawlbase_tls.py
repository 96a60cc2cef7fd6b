"""The Crawlbase client verifies TLS (the SDK it replaced did not), keeps the token out of its
messages and logs, and sends the query the SDK sent. Against a loopback HTTPS server whose
self-signed certificate is made here."""

from __future__ import annotations

import datetime
import ipaddress
import json
import logging
import ssl
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import rag_pipeline.crawl.crawlbase as crawlbase
from rag_pipeline.crawl.base import PushError
from rag_pipeline.crawl.crawlbase import CrawlbaseCrawler

TOKEN = "tls-secret-token-0123"
CRAWLER = "docs_crawler"


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1, signed by its own key: trusted by nobody unless told."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                       critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_file, key_file


class PushAPI:
    """A Crawlbase-like push API over HTTPS: records the path of every request that got through
    the handshake and answers what `answer` says (a rid by default)."""

    def __init__(self, cert_file: Path, key_file: Path):
        self.paths: list[str] = []
        self.answer: Callable[[int], tuple[int, dict, dict]] = lambda n: (200, {}, {"rid": f"rid{n}"})
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802
                api.paths.append(self.path)
                status, headers, payload = api.answer(len(api.paths))
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        # The handshake runs at accept; one that fails is dropped before any handler sees it.
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> PushAPI:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def cert(tmp_path) -> tuple[Path, Path]:
    return self_signed(tmp_path)


@pytest.fixture
def api(cert) -> Iterator[PushAPI]:
    with PushAPI(*cert) as server:
        yield server


def trusting(cert_file: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cert_file))


def test_push_to_an_untrusted_certificate_fails_before_any_request(api, caplog):
    caplog.set_level(logging.DEBUG)
    crawler = CrawlbaseCrawler(token=TOKEN, crawler_name=CRAWLER, api_url=api.url, max_retries=2, backoff_s=0.01)
    try:
        with pytest.raises(PushError) as failure:
            crawler.push("https://example.com/a", push_id=1)
        health = crawler.health()
    finally:
        crawler.close()
    message = str(failure.value)
    assert "CERTIFICATE_VERIFY_FAILED" in message and TOKEN not in message
    assert failure.value.attempts == 3 and failure.value.status is None
    assert health.status == "unknown" and "CERTIFICATE_VERIFY_FAILED" in health.error
    assert TOKEN not in health.error
    assert api.paths == []          # no request, so no token, ever reached the server
    assert TOKEN not in caplog.text


def test_push_succeeds_when_the_certificate_is_trusted_and_logs_no_token(api, cert, caplog):
    caplog.set_level(logging.INFO, logger="httpx")
    crawler = CrawlbaseCrawler(token=TOKEN, crawler_name=CRAWLER, api_url=api.url, ssl_context=trusting(cert[0]))
    try:
        pushed = crawler.push("https://example.com/a b?q=1", push_id=7)
    finally:
        crawler.close()
    assert pushed.rid == "rid1" and pushed.attempts == 1
    # The query on the wire is the one built, unchanged by httpx.
    assert api.paths == ["/" + crawler.push_url("https://example.com/a b?q=1", 7).split("/", 3)[3]]
    assert f"token={TOKEN}&" in api.paths[0]
    assert "HTTP Request: GET https://127.0.0.1" in caplog.text and "token=***" in caplog.text
    assert TOKEN not in caplog.text


def test_an_answer_echoing_the_token_is_redacted_and_retry_after_is_honoured(api, cert, monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(crawlbase.time, "sleep", slept.append)
    answers = {1: (429, {"Retry-After": "7"}, {}), 2: (503, {}, {}),
               3: (200, {}, {"error": f"no rid for token={TOKEN} ({TOKEN})"})}
    api.answer = lambda n: answers[n]
    crawler = CrawlbaseCrawler(token=TOKEN, crawler_name=CRAWLER, api_url=api.url, max_retries=2, backoff_s=0.01,
                               ssl_context=trusting(cert[0]))
    try:
        with pytest.raises(PushError) as failure:
            crawler.push("https://example.com/a")
    finally:
        crawler.close()
    assert failure.value.attempts == 3 and "answer without rid" in str(failure.value)
    assert TOKEN not in str(failure.value) and "token=***" in str(failure.value)
    assert slept[0] == 7.0 and 0.0 <= slept[1] <= 0.02


def test_a_context_that_does_not_verify_is_refused():
    lax = ssl.create_default_context()
    lax.check_hostname = False
    lax.verify_mode = ssl.CERT_NONE
    with pytest.raises(ValueError, match="verifies TLS"):
        CrawlbaseCrawler(token=TOKEN, crawler_name=CRAWLER, ssl_context=lax)


def test_the_push_url_is_the_one_the_sdk_built():
    """crawlbase 1.1.0: `CRAWLBASE_API_URL + '?token=' + token + '&' + urlencode(options)`, the
    options in the order given and `url` added last by `CrawlingAPI.get`; urlencode quotes with
    quote_plus (space → +, `~` kept, UTF-8 percent-encoded)."""
    crawler = CrawlbaseCrawler(token="tok-123", crawler_name=CRAWLER, page_wait_ms=2000, ajax_wait=True)
    bare = CrawlbaseCrawler(token="tok-123", crawler_name=CRAWLER, api_url="http://127.0.0.1:9")
    try:
        assert crawler.push_url("https://example.com/a b?q=1&r=ü|x~", 7) == (
            "https://api.crawlbase.com/?token=tok-123&crawler=docs_crawler&callback=true&format=md"
            "&callback_headers=pushed-url%3Ahttps%3A%2F%2Fexample.com%2Fa+b%3Fq%3D1%26r%3D%C3%BC%257Cx~"
            "%7Cpush-id%3A7&page_wait=2000&ajax_wait=true"
            "&url=https%3A%2F%2Fexample.com%2Fa+b%3Fq%3D1%26r%3D%C3%BC%7Cx~")
        assert bare.push_url("http://example.com/") == (
            "http://127.0.0.1:9/?token=tok-123&crawler=docs_crawler&callback=true&format=md"
            "&callback_headers=pushed-url%3Ahttp%3A%2F%2Fexample.com%2F&url=http%3A%2F%2Fexample.com%2F")
    finally:
        crawler.close()
        bare.close()
