"""What is wrong with a site file, said in one line an operator can act on: `file:line: field: reason`.

A site file is YAML an operator edits by hand; a typo in one must fail that site alone and point at
its line. This holds the pure parts: the problem itself, where each field of a YAML text sits
(line numbers from the parser's own marks), and the names a broken site's stand-in takes in
Dagster. Reading files, templates and Dagster are the callers' (components/site_files.py).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

import yaml

__all__ = ["SiteProblem", "field_lines", "line_of", "yaml_problem", "standin_names", "field_label"]


@dataclass(frozen=True)
class SiteProblem:
    """A site file that cannot be used: the site's name as far as the file tells it (else its
    folder's or file's), where, which field, and why."""

    name: str
    file: str
    line: int | None
    field: str            # e.g. `sitemaps`, `attributes.sitemap`; "" for the file as a whole
    reason: str

    def one_line(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}: {self.field}: {self.reason}" if self.field else f"{where}: {self.reason}"

    def as_dict(self) -> dict:
        return {**asdict(self), "problem": self.one_line()}


def field_label(path: tuple) -> str:
    """`("sitemaps", 1)` → `sitemaps[1]`; `("cadence", "rules", 0, "every")` → `cadence.rules[0].every`."""
    label = ""
    for part in path:
        label += f"[{part}]" if isinstance(part, int) else (f".{part}" if label else str(part))
    return label


def field_lines(text: str) -> dict[tuple, int]:
    """The 1-based line of every key and list item of a YAML document, by its path from the root
    (`("attributes", "sitemaps", 0)`); empty when the text does not parse (yaml_problem says why).
    A mapping key's line is its key's; a list item's is the item's."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    lines: dict[tuple, int] = {}

    def walk(node, path: tuple) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                child = (*path, key.value if isinstance(key, yaml.ScalarNode) else str(key.start_mark.line))
                lines[child] = key.start_mark.line + 1
                walk(value, child)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                lines[(*path, index)] = item.start_mark.line + 1
                walk(item, (*path, index))

    if root is not None:
        lines[()] = root.start_mark.line + 1
        walk(root, ())
    return lines


def line_of(lines: dict[tuple, int], path: tuple) -> int | None:
    """The line of `path`, or of its nearest ancestor the file has (an unset field: its mapping)."""
    for end in range(len(path), -1, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None


def yaml_problem(exc: yaml.YAMLError) -> tuple[int | None, str]:
    """(line, reason) of a YAML syntax error, in one line: `mapping values are not allowed here`."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context = getattr(exc, "context", None)
    reason = f"YAML: {problem}" + (f" ({context})" if context else "")
    return (mark.line + 1 if mark is not None else None), reason


_NOT_NAME = re.compile(r"[^a-z0-9_]+")


def standin_names(problems: list[SiteProblem], taken: set[str]) -> list[str]:
    """A name per broken site for its stand-in in Dagster (asset key prefix, group `site_<name>`):
    its own name where it can be one, lower-cased with `_` for the rest, never one a loaded site
    or another stand-in has (a site declared twice keeps the good one's keys)."""
    names: list[str] = []
    used = set(taken)
    for problem in problems:
        base = _NOT_NAME.sub("_", problem.name.lower()).strip("_") or "site"
        if not base[0].isalpha():
            base = f"site_{base}"
        name, n = base, 1
        while name in used:
            n += 1
            name = f"{base}_bad_file" if n == 2 else f"{base}_bad_file_{n - 1}"
        used.add(name)
        names.append(name)
    return names
