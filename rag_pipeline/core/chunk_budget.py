"""What a page is cut with: the chunker's budget and the window of the model its chunks are
embedded with. Kept apart from the chunker so that the embedders can name their window without
importing it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["ChunkBudget", "Window"]


@dataclass(frozen=True)
class Window:
    """A model's input window in its own tokens: an embed text longer than `limit` would be read
    from its start only. `count` gives a text's length in those tokens, special ones included.
    `name` goes into the chunker signature, so a window that changes re-cuts the pages."""

    name: str
    limit: int
    count: Callable[[str], int] = field(compare=False)


class ChunkBudget(NamedTuple):
    """What a page is cut with: cl100k tokens of content and overlap, and the window of the model
    the chunks are embedded with (None: the model reads more than any chunk holds)."""

    max_tokens: int
    overlap_tokens: int
    window: Window | None = None


