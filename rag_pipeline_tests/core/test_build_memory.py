"""The HNSW build's maintenance_work_mem: what the graph needs, up to a cap: a share of RAM with the
server on this machine, what the server was sized with when it is elsewhere."""

from __future__ import annotations

import pytest

from rag_pipeline.core.build_memory import build_memory, graph_bytes, memory_cap, parse_size

GIB = 2**30


def test_the_graph_size_matches_pgvectors_own_count():
    # pgvector's notice on 256-dim vectors: 16MB held 9,648 tuples (1,739 bytes each).
    assert 9_000 < 16 * 2**20 // graph_bytes(1, 256, 4) < 10_000
    assert graph_bytes(1000, 3072, 2) < graph_bytes(1000, 3072, 4)


def test_auto_asks_for_what_the_graph_needs_with_headroom():
    memory, fits = build_memory("auto", 742_973, 256, 4, 24 * GIB)
    need = graph_bytes(742_973, 256, 4)
    assert fits and need < parse_size(memory) <= 1.3 * need
    assert build_memory("auto", 10, 256, 4, 24 * GIB) == ("64MB", True)    # a floor: tiny builds


def test_auto_stops_at_its_cap_and_says_the_graph_does_not_fit():
    memory, fits = build_memory("auto", 5_000_000, 1536, 4, 4 * GIB)
    assert parse_size(memory) == 4 * GIB and not fits
    assert build_memory("auto", 742_973, 256, 4, 0) == ("64MB", False)    # the floor, whatever the cap


def test_the_cap_is_a_quarter_of_this_machines_ram_only_when_the_server_is_on_it():
    assert memory_cap("auto", local=True, ram_bytes=16 * GIB, server_bytes=128 * 2**20) == 4 * GIB
    # A server elsewhere: its RAM is not this machine's; what it was sized with bounds the ask.
    assert memory_cap("auto", local=False, ram_bytes=16 * GIB, server_bytes=2 * GIB) == 2 * GIB
    assert memory_cap("3GB", local=False, ram_bytes=16 * GIB, server_bytes=128 * 2**20) == 3 * GIB
    assert memory_cap("512MB", local=True, ram_bytes=16 * GIB, server_bytes=0) == 512 * 2**20


def test_a_fixed_size_is_kept_and_judged():
    assert build_memory("256MB", 742_973, 256, 4, 24 * GIB) == ("256MB", False)
    assert build_memory("2GB", 742_973, 256, 4, 24 * GIB) == ("2GB", True)


@pytest.mark.parametrize("text", ["2 TB", "lots", "", "1.5GB"])
def test_a_size_that_is_not_one_is_refused(text):
    with pytest.raises(ValueError, match="not a memory size"):
        parse_size(text)
