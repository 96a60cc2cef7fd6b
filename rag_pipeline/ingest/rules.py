"""The boilerplate rules in force: the shipped defaults plus the operator's own file.

`BOILERPLATE_RULES` names a YAML file in the format of rag_pipeline/config/boilerplate.yaml;
its rules are added to the defaults (a rule with a default's name replaces it).
"""

from __future__ import annotations

import threading
from pathlib import Path

from rag_pipeline.core.text import BoilerplateRule, default_boilerplate_rules, parse_boilerplate_rules
from rag_pipeline.settings import get_settings

_cache: dict[tuple[str, float], list[BoilerplateRule]] = {}
_lock = threading.Lock()


class RulesFileError(ValueError):
    pass


def configured_boilerplate_rules() -> list[BoilerplateRule]:
    """The rules of this process's BOILERPLATE_RULES (the CLI's; Dagster passes its settings' own)."""
    return boilerplate_rules(get_settings().boilerplate_rules)


def boilerplate_rules(path: Path | None) -> list[BoilerplateRule]:
    """Defaults + the file at `path` (None: the defaults alone), re-read when the file changes (so
    the sensor picks edits up)."""
    if path is None:
        return default_boilerplate_rules()
    try:
        mtime = path.stat().st_mtime
    except OSError as exc:
        raise RulesFileError(f"BOILERPLATE_RULES file {path} cannot be read: {exc}") from exc
    key = (str(path), mtime)
    with _lock:
        if key not in _cache:
            try:
                own = parse_boilerplate_rules(path.read_text(encoding="utf-8"))
            except ValueError as exc:
                raise RulesFileError(f"{path}: {exc}") from exc
            names = {r.name for r in own}
            _cache.clear()
            _cache[key] = [r for r in default_boilerplate_rules() if r.name not in names] + own
        return list(_cache[key])
