"""The offline model must load with no network, refuse tampered files, and give sensible vectors."""

from __future__ import annotations

import shutil
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rag_pipeline.embedders.base import Embedder, EmbeddingError
from rag_pipeline.embedders.local_embedder import (
    MODEL_SHA256,
    TOKENIZER_SHA256,
    LocalEmbedder,
    default_model_path,
    default_tokenizer_path,
)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No hub access and no outbound connection except loopback: loading must not need them."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    real_connect = socket.socket.connect

    def loopback_only(self: socket.socket, address: object) -> None:
        host = address[0] if isinstance(address, tuple) else address
        if self.family in (socket.AF_INET, socket.AF_INET6) and host not in ("127.0.0.1", "::1", "localhost"):
            raise AssertionError(f"network access attempted: {address!r}")
        real_connect(self, address)  # type: ignore[arg-type]

    monkeypatch.setattr(socket.socket, "connect", loopback_only)
    yield


@pytest.fixture(scope="module")
def embedder() -> LocalEmbedder:
    return LocalEmbedder()


def _cos(a: list[float], b: list[float]) -> float:
    return float(np.dot(a, b))


def test_loads_offline_and_embeds(offline: None) -> None:
    fresh = LocalEmbedder()
    assert isinstance(fresh, Embedder)
    assert (fresh.model, fresh.dimensions) == ("all-MiniLM-L6-v2-onnx-int8", 384)
    result = fresh.embed(["Offline embeddings need no network.", "A second sentence."])
    assert len(result.vectors) == 2
    for v in result.vectors:
        assert len(v) == 384
        assert abs(np.linalg.norm(v) - 1.0) < 1e-5
    assert result.requests == 1 and result.retries == 0 and result.truncated == 0
    assert result.tokens == sum(len(fresh._tokenizer.encode(t).ids) for t in ["Offline embeddings need no network.",
                                                                             "A second sentence."])


def test_related_sentences_are_closer_than_unrelated(embedder: LocalEmbedder) -> None:
    a, b, c, d = embedder.embed([
        "How do I reset my password?",
        "I forgot my password and need to change it.",
        "The recipe calls for two cups of flour and an egg.",
        "Bake the dough in a hot oven for twenty minutes.",
    ]).vectors
    assert _cos(a, b) > _cos(a, c) + 0.3
    assert _cos(a, b) > _cos(a, d) + 0.3
    assert _cos(c, d) > _cos(a, d)


def test_batching_keeps_input_order_and_matches_one_by_one(embedder: LocalEmbedder) -> None:
    # Mixed lengths across several length-sorted batches of 3.
    texts = [("word " * n).strip() + f" item {n}" for n in (40, 1, 300, 7, 120, 3, 60, 2)]
    small_batches = LocalEmbedder(batch_size=3)
    together = np.array(small_batches.embed(texts).vectors)
    alone = np.array([embedder.embed([t]).vectors[0] for t in texts])
    assert np.allclose(together, alone, atol=1e-5)
    assert small_batches.embed(texts).requests == 3


def test_truncation_to_the_model_window_is_counted(embedder: LocalEmbedder) -> None:
    result = embedder.embed(["short text", "token " * 1000])
    assert result.truncated == 1
    assert result.tokens == len(embedder._tokenizer.encode("short text").ids) + 256


def test_empty_list_does_no_work() -> None:
    lazy = LocalEmbedder()
    assert lazy.embed([]).vectors == []
    assert lazy._session is None  # nothing was loaded for nothing


def test_concurrent_first_use_loads_once() -> None:
    fresh = LocalEmbedder()
    results: list[list[float]] = []
    sessions: set[int] = set()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            results.append(fresh.embed(["thread safety"]).vectors[0])
            sessions.add(id(fresh._session))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(sessions) == 1
    assert all(np.allclose(r, results[0]) for r in results)


def test_tampered_model_file_is_refused(tmp_path: Path) -> None:
    tampered = tmp_path / "model.onnx"
    shutil.copyfile(default_model_path(), tampered)
    with tampered.open("r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(EmbeddingError) as info:
        LocalEmbedder(model_path=tampered).embed(["x"])
    message = str(info.value)
    assert str(tampered) in message and MODEL_SHA256 in message


def test_tampered_tokenizer_is_refused(tmp_path: Path) -> None:
    tampered = tmp_path / "tokenizer.json"
    tampered.write_bytes(default_tokenizer_path().read_bytes() + b"\n")
    with pytest.raises(EmbeddingError) as info:
        LocalEmbedder(tokenizer_path=tampered).load()
    message = str(info.value)
    assert str(tampered) in message and TOKENIZER_SHA256 in message


def test_missing_model_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EmbeddingError, match="not found"):
        LocalEmbedder(model_path=tmp_path / "absent.onnx").load()
