"""`rag_pipeline/defs/sites`, the folder of site folders, loaded as one component that reads each
site's file on its own: a bad file fails its site alone, never the code location.

Left to Dagster's loader, every `defs.yaml` under `defs/` is parsed while the whole tree's
declarations are built (`ComponentTree.find_root_decl`), before any component is loaded: one YAML
typo or unknown field there stops the location and every site's sensors with it, and no public
hook catches the failure per folder. `sites/defs.yaml` declares this component instead, so the
loader stops at `sites/` (a folder with a component file is a leaf) and this reads each
`sites/<name>/defs.yaml` (and SITES_DIR's files) through components/site_files.py: the sites that
load are built, each broken one gets a stand-in that says why (components/broken_sites.py).
"""

from pathlib import Path

import dagster as dg

from rag_pipeline.components.broken_sites import standin_definitions
from rag_pipeline.components.site_files import Declarations, declarations
from rag_pipeline.core.site_spec import SiteError


class SiteFolderComponent(dg.Component):
    """The declared sites: each folder under this one holds a site's defs.yaml (`dg scaffold defs
    SiteComponent sites/<name>`), with SITES_DIR's files beside them; a bad one is reported, not fatal."""

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        return sites_definitions(declarations(Path(context.path)))


def sites_definitions(found: Declarations) -> dg.Definitions:
    """Each loaded site's definitions, and a stand-in for each broken one."""
    built = [site.definitions() for site in found.sites]
    return dg.Definitions.merge(*built, standin_definitions(found.problems, set(found.names())))


# Set by `dg check defs` and `dagster definitions validate` (Dagster's documented switch for code
# that behaves differently when only validated): there a bad site file fails the check.
VALIDATING = "DAGSTER_IS_DEFS_VALIDATION_CLI"


def refuse_when_validating() -> None:
    """In validation mode, every bad site file in one error, a line each: a deploy pipeline's
    `dg check defs` stops it; a running location loads without the site instead."""
    import os

    if os.environ.get(VALIDATING) != "1":
        return
    problems = declarations().problems
    if problems:
        raise SiteError(f"{len(problems)} site file(s) do not load:\n" + "\n".join(p.one_line() for p in problems))
