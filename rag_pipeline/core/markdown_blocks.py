"""Markdown (and RST) as blocks: ATX and underlined headings, fenced code (never cut inside) and
paragraphs. A block owns the blank lines after it, so the blocks cover the text without a gap:
the chunker cuts only between them."""

from __future__ import annotations

import re
from dataclasses import dataclass

_ATX = re.compile(r" {0,3}(#{1,6})(?:[ \t]+(.*?))?[ \t]*")
_ATX_CLOSING = re.compile(r"(?:^|[ \t]+)#+[ \t]*$")
_FENCE_OPEN = re.compile(r" {0,3}(`{3,}|~{3,})(.*)")
_FENCE_CLOSE = re.compile(r" {0,3}(`{3,}|~{3,})[ \t]*")
# Markdown setext uses = and -; RST also underlines with these characters.
_UNDERLINE = re.compile(r" {0,3}([=\-~^*+#\"'`])\1{2,}[ \t]*")
_NOT_A_TITLE = re.compile(r" {0,3}(?:[-+*]|\d{1,9}[.)])(?:[ \t]|$)| {0,3}[>|]| {4}")


@dataclass
class Block:
    start: int
    end: int = -1
    is_code: bool = False
    is_blank: bool = False
    heading_style: tuple[str, bool] | None = None  # Underline style: (character, has overline).
    level: int | None = None  # Heading level, None for body blocks.
    title: str = ""


def _line_spans(text: str) -> list[tuple[int, int]]:
    # Only "\n" ends a line: str.splitlines would also split on \x0b, \x1c, \u2028, ...
    spans = []
    pos = 0
    length = len(text)
    while pos < length:
        newline = text.find("\n", pos)
        end = length if newline < 0 else newline + 1
        spans.append((pos, end))
        pos = end
    return spans


def _is_blank(line: str) -> bool:
    return not line.strip(" \t\r\f\v")


def _is_fence_open(line: str) -> re.Match[str] | None:
    match = _FENCE_OPEN.fullmatch(line)
    if match and match.group(1)[0] == "`" and "`" in match.group(2):
        return None  # CommonMark: a backtick fence's info string has no backtick.
    return match


def _is_title(line: str) -> bool:
    return not (
        _is_blank(line)
        or _ATX.fullmatch(line)
        or _is_fence_open(line)
        or _UNDERLINE.fullmatch(line)
        or _NOT_A_TITLE.match(line)
    )


def _atx_title(match: re.Match[str]) -> str:
    return _ATX_CLOSING.sub("", match.group(2) or "").strip()


def parse_blocks(text: str) -> list[Block]:
    spans = _line_spans(text)
    lines = [text[a:b].rstrip("\n").rstrip("\r") for a, b in spans]
    count = len(lines)
    blocks: list[Block] = []
    at_block_start = True  # After a blank line, a heading or a fence, a line starts a block.
    i = 0
    while i < count:
        line = lines[i]
        if _is_blank(line):
            if not blocks:
                blocks.append(Block(start=0, is_blank=True))
            at_block_start = True
            i += 1
            continue
        start = spans[i][0]

        over = _UNDERLINE.fullmatch(line) if at_block_start and i + 2 < count else None
        if over and over.group(1) not in "`~":
            # RST title with overline. Not with ` or ~: that is a one-line fenced code block.
            under = _UNDERLINE.fullmatch(lines[i + 2])
            title = lines[i + 1].strip()
            if under and under.group(1) == over.group(1) and title and _is_title(title):
                blocks.append(Block(start=start, heading_style=(over.group(1), True), title=title))
                i += 3
                at_block_start = True
                continue

        atx = _ATX.fullmatch(line)
        if atx:
            blocks.append(Block(start=start, level=len(atx.group(1)), title=_atx_title(atx)))
            i += 1
            at_block_start = True
            continue

        fence = _is_fence_open(line)
        if fence:
            marker = fence.group(1)
            j = i + 1
            while j < count:
                close = _FENCE_CLOSE.fullmatch(lines[j])
                if close and close.group(1)[0] == marker[0] and len(close.group(1)) >= len(marker):
                    break
                j += 1
            blocks.append(Block(start=start, is_code=True))
            i = j + 1  # An unclosed fence runs to the end of the text, as in CommonMark.
            at_block_start = True
            continue

        if at_block_start and i + 1 < count and _is_title(line):
            under = _UNDERLINE.fullmatch(lines[i + 1])
            if under:
                char = under.group(1)
                length = len(lines[i + 1].strip())
                # RST wants the underline at least as long as the title; requiring that for
                # characters other than = and - keeps "***" rules apart, and at least four
                # ~ or ` keeps the usual three-character code fence after "Run:" a fence.
                if char in "=-" or (length >= len(line.strip()) and (char not in "~`" or length >= 4)):
                    blocks.append(Block(start=start, heading_style=(char, False), title=line.strip()))
                    i += 2
                    at_block_start = True
                    continue

        if at_block_start:
            blocks.append(Block(start=start))
        at_block_start = False
        i += 1

    if len(blocks) > 1 and blocks[0].is_blank:
        # Leading blank lines belong to the first real block, so no chunk is only whitespace.
        blocks[1].start = 0
        del blocks[0]
    for block, following in zip(blocks, blocks[1:]):
        block.end = following.start
    if blocks:
        blocks[-1].end = len(text)
    _assign_underline_levels(blocks)
    return blocks


def _assign_underline_levels(blocks: list[Block]) -> None:
    styles = [b.heading_style for b in blocks if b.heading_style is not None]
    if all(style in {("=", False), ("-", False)} for style in styles):
        levels = {("=", False): 1, ("-", False): 2}  # Markdown setext.
    else:
        # RST: a style's level is the order in which it first appears in the document.
        levels = {}
        for style in styles:
            levels.setdefault(style, min(len(levels) + 1, 6))
    for block in blocks:
        if block.heading_style is not None:
            block.level = levels[block.heading_style]


# --------------------------------------------------------------------------- units
