"""What the real-documentation corpora of the benches share: a package's source release fetched
once from the package index (pip) and checked against its SHA-256, and reST turned into the
markdown a crawler delivers (section titles as `#` headings, every other line as written).

Used by django_docs.py (search_modes, template_change) and salt_docs.py (peers --docs salt).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

CACHE = Path.home() / ".cache" / "rag-pipeline-bench"
_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+.:_])\1{2,}\s*$")


def fetch_sdist(project: str, release: str, sdist: str, sha256: str, cache: Path = CACHE) -> Path:
    """The source release `sdist` of `project==release`, from the package index once (pip, only
    this project from source: its build requirements may come as wheels), checked against its
    SHA-256."""
    path = cache / sdist
    if not path.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        print(f"downloading {sdist} from the package index (once, into {cache})", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", project,
                        f"{project}=={release}", "-d", str(cache)], check=True)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != sha256:
        raise SystemExit(f"{path} has SHA-256 {digest}, not {sha256}: delete it and run again")
    return path


def to_markdown(rest: str) -> str:
    """Section titles as `#` headings (reST: a title's level is the order its adornment was first
    used); every other line as it is."""
    lines = rest.splitlines()
    levels: list[tuple[str, bool]] = []
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        over = _UNDERLINE.match(line) and i + 2 < len(lines) and lines[i + 1].strip() \
            and _UNDERLINE.match(lines[i + 2]) and lines[i + 2][0] == line[0]
        if over:
            title, style, i = lines[i + 1].strip(), (line[0], True), i + 3
        elif (line.strip() and i + 1 < len(lines) and _UNDERLINE.match(lines[i + 1])
              and len(lines[i + 1].rstrip()) >= len(line.rstrip()) and not _UNDERLINE.match(line)):
            title, style, i = line.strip(), (lines[i + 1][0], False), i + 2
        else:
            out.append(line)
            i += 1
            continue
        if style not in levels:
            levels.append(style)
        out.append("#" * min(6, levels.index(style) + 1) + " " + title)
    return "\n".join(out) + "\n"
