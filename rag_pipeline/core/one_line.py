"""A reason shown in a table cell or a log line: one line, and cut only at a word.

A reason cut mid-word reads as another word ("is a loopbac"), and its end is often what to do."""

from __future__ import annotations


def shorten(text: str, width: int) -> str:
    """``text`` on one line, at most ``width`` characters: cut at the last space that fits, with `…`
    (mid-word only when one word is longer than the width)."""
    flat = " ".join(text.split())
    if len(flat) <= width:
        return flat
    cut = flat[:width - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > 0 else cut).rstrip(" ,;:") + "…"
