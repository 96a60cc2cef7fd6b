"""How much `maintenance_work_mem` an HNSW build gets. Pure.

pgvector builds its graph in memory and, once the graph outgrows `maintenance_work_mem`, goes on
inserting into the index on disk, which is several times slower: 742,973 vectors of 256 dims took
~40 minutes with 256MB, where the whole graph needs ~1.3 GB. With a parallel build the whole
amount is also reserved up front in shared memory, so asking for much more than the graph needs
costs RAM for nothing. `auto` asks for what the graph needs, with headroom, up to a cap: a share of the RAM when the
server runs on this machine; when it runs elsewhere, whose RAM this process cannot see, what the
server was sized with (`shared_buffers`, conventionally a quarter of its RAM, or its own
`maintenance_work_mem`), unless SPACE_BUILD_MEMORY_MAX says more.
"""

from __future__ import annotations

import re

__all__ = ["AUTO", "graph_bytes", "build_memory", "memory_cap", "parse_size"]

AUTO = "auto"
# A graph element beyond its vector, at pgvector's default m=16: measured 1,739 bytes a 256-dim
# vector (pgvector's notice: 16MB held 9,648 tuples; bench/README.md), 1,032 of them the vector.
ELEMENT_OVERHEAD_BYTES = 710
HEADROOM = 1.25
FLOOR_BYTES = 64 * 2**20
RAM_SHARE = 0.25     # of the machine's memory, at most: shared_buffers and the load go on meanwhile

_UNITS = {"kB": 2**10, "MB": 2**20, "GB": 2**30}
_SIZE = re.compile(r"^([0-9]+)\s*(kB|MB|GB)$")


def parse_size(text: str) -> int:
    """Bytes of a PostgreSQL memory size (`512MB`, `2GB`, `65536kB`)."""
    match = _SIZE.match(text.strip())
    if not match:
        raise ValueError(f"not a memory size: {text!r} (expected <n>kB, <n>MB or <n>GB)")
    return int(match[1]) * _UNITS[match[2]]


def graph_bytes(vectors: int, dimensions: int, bytes_per_dimension: int) -> int:
    """What pgvector's in-memory graph of this many vectors takes (4 bytes a dimension for
    `vector`, 2 for `halfvec`)."""
    return vectors * (8 + dimensions * bytes_per_dimension + ELEMENT_OVERHEAD_BYTES)


def memory_cap(setting: str, *, local: bool, ram_bytes: int, server_bytes: int) -> int:
    """The most `auto` may ask for: SPACE_BUILD_MEMORY_MAX if set; else a share of this machine's
    RAM when the server is on it (`local`), or else `server_bytes`, the larger of the server's
    `shared_buffers` and `maintenance_work_mem` (asking a remote server for more than it was
    sized with can get its backend killed by the kernel, which restarts every connection)."""
    if setting != AUTO:
        return parse_size(setting)
    return int(ram_bytes * RAM_SHARE) if local else server_bytes


def build_memory(setting: str, vectors: int, dimensions: int, bytes_per_dimension: int,
                 cap_bytes: int) -> tuple[str, bool]:
    """The `maintenance_work_mem` for a build, and whether the graph fits in it. A fixed setting
    is used as it is; `auto` gets what the graph needs with headroom, within [FLOOR, cap]."""
    need = graph_bytes(vectors, dimensions, bytes_per_dimension)
    if setting != AUTO:
        return setting, need <= parse_size(setting)
    cap = max(FLOOR_BYTES, cap_bytes)
    granted = min(cap, max(FLOOR_BYTES, int(need * HEADROOM)))
    return f"{-(-granted // 2**20)}MB", need <= granted
