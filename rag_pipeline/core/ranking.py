"""Ranked results shaped for citing: at most N passages of one page, best first."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def best_per_key(ranked: Iterable[T], key: Callable[[T], str], per_key: int, k: int) -> list[T]:
    """The first ``k`` of ``ranked`` (best first) keeping at most ``per_key`` of each key: ten
    results are ten sources unless more passages of a page are asked for."""
    if per_key < 1 or k < 1:
        raise ValueError("per_key and k must be at least 1")
    taken: dict[str, int] = {}
    out: list[T] = []
    for item in ranked:
        name = key(item)
        if taken.get(name, 0) >= per_key:
            continue
        taken[name] = taken.get(name, 0) + 1
        out.append(item)
        if len(out) == k:
            break
    return out
