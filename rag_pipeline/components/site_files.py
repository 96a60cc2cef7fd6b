"""Site files, read and judged one at a time: the one place a site declaration is validated.

The code location (components/site_folder.py), the CLI (`site check`, `site list|show`, `status`),
SITES_DIR and the scaffolder (which checks the file it is about to write) all read sites here, so
they agree on what is wrong and say it the same way: `file:line: field: reason`. A file that
fails is a `SiteProblem`, never an exception: one bad site must not take the others down.

Each file goes through what Dagster's loader would do to it, in the same order: YAML, the
component type, Dagster's templates (`{{ env('X') }}`, public `dg.ResolutionContext`), the
component's model (unknown fields, wrong types), then the site's own rules (SiteSpec: its name,
its URLs, its caps, its cadence).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg
import yaml
from pydantic import ValidationError

from rag_pipeline.core.site_problems import SiteProblem, field_label, field_lines, line_of, yaml_problem
from rag_pipeline.core.site_spec import SiteError

SITE_TYPE = "rag_pipeline.components.SiteComponent"
# What a site file may hold: `type`, `attributes`, and `requirements` (the env vars it reads, for `dg`).
_FILE_KEYS = {"type", "attributes", "requirements"}
# Dagster's keys of a component file that a site file cannot honour, and why: a site file is read
# here, not by Dagster's loader, so they would be accepted and silently do nothing.
_UNSUPPORTED = {
    "post_processing": "not supported in a site file: its assets are built by SiteComponent, not by Dagster's "
                       "loader, which applies post_processing (set tags, groups and the rest through the "
                       "site's fields)",
    "template_vars_module": "not supported in a site file: its templates resolve with Dagster's built-ins only "
                            "(`env('X', 'default')`), never with a module's template vars",
}
PACKAGE_SITES = Path(__file__).resolve().parents[1] / "defs" / "sites"


@dataclass
class Declarations:
    """Every site file of the package and SITES_DIR, judged: the enabled sites that load (each
    name once), those switched off (`enabled: false`), and the problems, file by file."""

    sites: list = field(default_factory=list)
    disabled: list = field(default_factory=list)
    problems: list[SiteProblem] = field(default_factory=list)

    def names(self) -> list[str]:
        return sorted(c.spec().name for c in self.sites)


def site_yaml(folder: Path) -> Path | None:
    """The component file of a site folder, as Dagster finds it."""
    return next((folder / n for n in ("defs.yaml", "defs.yml", "component.yaml") if (folder / n).is_file()), None)


def questions_file(source: str) -> Path:
    """Where a site's labelled questions are: `questions.jsonl` beside a site folder's defs.yaml,
    `<name>.questions.jsonl` beside a SITES_DIR file `<name>.yaml`."""
    path = Path(source)
    if path.name in ("defs.yaml", "defs.yml", "component.yaml"):
        return path.parent / "questions.jsonl"
    return path.parent / f"{path.stem}.questions.jsonl"


def read_questions(path: Path, spec) -> list:
    """A site's labelled questions (core/answer_quality.py), or a QuestionsError in one line."""
    from rag_pipeline.core.answer_quality import QuestionsError, parse_questions

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise QuestionsError(f"{path}: cannot read it: {exc}") from None
    return parse_questions(text, str(path), spec.origin())


def question_sets(found: Declarations) -> dict[str, list]:
    """Site name → its questions, for the loaded sites that declare some. A file that cannot be
    used is a QuestionsError: a gate that skipped it would pass a model it never asked."""
    return {site.spec().name: read_questions(path, site.spec())
            for site in found.sites if (path := site.questions_file()) is not None}


def declarations(package: Path = PACKAGE_SITES, sites_dir: str | None = "") -> Declarations:
    """The package's site folders, then SITES_DIR's files (`sites_dir` "": the setting's)."""
    if sites_dir == "":
        sites_dir = _sites_dir_setting()
    found = Declarations()
    loaded = []
    for folder in sorted(p for p in package.iterdir() if p.is_dir()) if package.is_dir() else []:
        path = site_yaml(folder)
        if path is not None:
            loaded.append(read_site(path, folder.name))
    if sites_dir:
        folder = Path(sites_dir)
        if not folder.is_dir():
            found.problems.append(SiteProblem("sites_dir", str(folder), None, "SITES_DIR",
                                              "not a folder (SITES_DIR names a folder of <name>.yaml site files)"))
        else:
            for path in sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")]):
                loaded.append(read_site(path, path.stem, type_required=False))
    seen: dict[str, object] = {}
    for item in loaded:
        if isinstance(item, SiteProblem):
            found.problems.append(item)
        elif not item.enabled:
            found.disabled.append(item)
        else:
            name = item.spec().name
            if name in seen:
                found.problems.append(_twice(item, seen[name]))
            else:
                seen[name] = item
                found.sites.append(item)
    return found


def _twice(component, first) -> SiteProblem:
    name = component.spec().name
    lines = field_lines(Path(component._source).read_text(encoding="utf-8"))
    return SiteProblem(name, component._source, line_of(lines, ("attributes", "name")), "name",
                       f"site {name} is declared twice: also in {first._source} (that one is loaded)")


def read_site(path: Path, default_name: str, *, type_required: bool = True):
    """The site of one file: a SiteComponent, or a SiteProblem saying where and why."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return SiteProblem(default_name, str(path), None, "", f"cannot read it: {exc}")
    return check_text(text, str(path), default_name, type_required=type_required)


def check_text(text: str, file: str, default_name: str, *, type_required: bool = True):
    """A site file's text judged as `read_site` judges a file (the scaffolder's check too)."""
    from rag_pipeline.components.site_component import SiteComponent

    def problem(path: tuple, reason: str, label: str | None = None, name: str = default_name) -> SiteProblem:
        shown = field_label(path[1:] if path[:1] == ("attributes",) else path) if label is None else label
        return SiteProblem(name, file, line_of(lines, path), shown, reason)

    lines = field_lines(text)
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        line, reason = yaml_problem(exc)
        return SiteProblem(default_name, file, line, "", reason)
    document = {} if document is None else document
    if not isinstance(document, dict):
        return problem((), "expected a mapping with `type:` and `attributes:`, as `dg scaffold defs SiteComponent` writes")
    attributes = document.get("attributes") or {}
    if not isinstance(attributes, dict):
        return problem(("attributes",), "expected a mapping of the site's fields", "attributes")
    name = attributes.get("name") if isinstance(attributes.get("name"), str) and attributes.get("name") else default_name
    for key in document:
        if key in _UNSUPPORTED:
            return problem((key,), _UNSUPPORTED[key], str(key), name)
        if key not in _FILE_KEYS:
            return problem((key,), "not a key of a component file (type, attributes)", str(key), name)
    kind = document.get("type")
    if kind is None and type_required:
        return problem((), f"no `type:` (a site's is {SITE_TYPE})", "type", name)
    if kind is not None and (not isinstance(kind, str) or kind.rsplit(".", 1)[-1] != SiteComponent.__name__):
        return problem(("type",), f"{kind!r} is not {SITE_TYPE}: only sites belong here", "type", name)
    resolved = {}
    for key, value in attributes.items():
        try:
            resolved[key] = dg.ResolutionContext.default().resolve_value(value)
        except Exception as exc:  # a template that fails: Dagster's message, its last line
            said = [line for line in str(exc).splitlines() if line.strip()]
            return problem(("attributes", key), f"template: {said[-1] if said else type(exc).__name__}", name=name)
    try:
        component = SiteComponent.model_validate(resolved)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = tuple(error["loc"])
        reason = error["msg"]
        if error["type"] == "extra_forbidden":
            close = difflib.get_close_matches(str(where[-1]), list(SiteComponent.model_fields), n=1)
            reason += f": not a site field{f' (did you mean {close[0]}?)' if close else ''}"
        return problem(("attributes", *where), reason, name=name)
    component._folder, component._source = default_name, file
    # Judged whatever `enabled` says: a file switched off here (the sample site's, in a CI without
    # SAMPLE_SITE_URL) is on where it is deployed, and must not pass the gate only to fail there.
    try:
        spec = component.spec()
        component.cadence_rules(spec.name)
    except SiteError as exc:
        path = ("attributes", *exc.field)
        reason = str(exc).removeprefix(f"site {name}: ")
        if exc.field and reason.startswith(f"{exc.field[0]}:"):
            reason = reason.removeprefix(f"{exc.field[0]}:").strip()
        elif exc.field and reason.startswith(f"{exc.field[0]} "):    # "max_pages must be …"
            reason = reason.removeprefix(f"{exc.field[0]} ")
        if exc.field == ("name",) and "name" not in attributes:
            reason += f" (the name is the {'folder' if type_required else 'file'}'s: rename it, or set `name:`)"
        if not component.enabled and "{{" in str(attributes.get(exc.field[0] if exc.field else "", "")):
            reason += (" (as its template renders here, where the site is switched off: give env() a default "
                       "that makes a valid value, as the sample site's does)")
        return problem(path, reason, name=name)
    return component


def _sites_dir_setting() -> str | None:
    """SITES_DIR as the code location reads it."""
    from rag_pipeline.settings import location_settings

    return location_settings().sites_dir
