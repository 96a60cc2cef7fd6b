"""The vector cache is written a set at a time: one statement for a batch's vectors, a text met
twice in it cached once, and a text already cached kept as it was."""

from __future__ import annotations

import numpy as np

from rag_pipeline.store import chunks, spaces


def test_a_batch_of_vectors_is_cached_once_each_and_the_first_vector_of_a_text_wins(conn):
    space = spaces.ensure_active(conn, "test-model", 4)
    chunks.cache_vectors(conn, space, [(b"kept", [1.0, 0.0, 0.0, 0.0], 3)])
    chunks.cache_vectors(conn, space, [
        (b"kept", [0.0, 1.0, 0.0, 0.0], 3),       # cached before: not overwritten
        (b"twice", [0.0, 0.0, 1.0, 0.0], 5),
        (b"twice", [0.0, 0.0, 1.0, 0.0], 5),      # twice in one batch: one row
        (b"new", np.array([0.5, 0.5, 0.0, 0.0]), 7),
    ])
    chunks.cache_vectors(conn, space, [])
    rows = {bytes(h): (v.to_list(), t) for h, v, t in conn.execute(
        "SELECT embed_hash, embedding, token_count FROM vectors WHERE space_id = %s", (space.space_id,))}
    assert rows == {b"kept": ([1.0, 0.0, 0.0, 0.0], 3), b"twice": ([0.0, 0.0, 1.0, 0.0], 5),
                    b"new": ([0.5, 0.5, 0.0, 0.0], 7)}
