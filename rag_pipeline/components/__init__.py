"""Dagster component types of this project (`dg list components`): one YAML instance each under
rag_pipeline/defs/."""

from rag_pipeline.components.site_component import SiteComponent
from rag_pipeline.components.site_folder import SiteFolderComponent

__all__ = ["SiteComponent", "SiteFolderComponent"]
