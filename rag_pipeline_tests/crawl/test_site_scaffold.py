"""`dg scaffold defs SiteComponent`: refuses a site that would not load (one line, exit 1, nothing
written), and writes no example sitemap beside a seed."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import dagster as dg
import pytest

from rag_pipeline.components.site_component import SiteComponent, SiteScaffolder, SiteScaffoldParams
from rag_pipeline.components.site_files import declarations, read_site

CHECKOUT = Path(__file__).resolve().parents[2]
SITES = CHECKOUT / "rag_pipeline" / "defs" / "sites"


@pytest.mark.parametrize("folder, args, said", [
    ("zz{tag}", ["--sitemap", "not a url"], "sitemaps[0]: only http and https URLs can be indexed, got 'not a url'"),
    ("zz{tag}", ["--sitemap", "htp://docs.example.com/sitemap.xml"], "sitemaps[0]: only http and https URLs"),
    ("zz{tag}", ["--seed", "https://"], "seeds[0]: URL has no host: 'https://'"),
    ("Bad-Name{tag}", ["--sitemap", "https://docs.example.com/sitemap.xml"], "name: site name 'Bad-Name"),
    ("zz{tag}", [], "give --sitemap URL or --seed URL"),
])
def test_dg_scaffold_refuses_a_site_that_would_not_load_in_one_line(folder, args, said):
    name = folder.format(tag=uuid.uuid4().hex[:6])
    proc = subprocess.run([str(Path(sys.executable).with_name("dg")), "scaffold", "defs", "SiteComponent",
                           f"sites/{name}", *args], cwd=CHECKOUT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    refusal = [line for line in proc.stderr.splitlines() if line.startswith("dg scaffold: not written: ")]
    assert len(refusal) == 1 and said in refusal[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (SITES / name).exists()


def scaffold(target: Path, **params) -> None:
    SiteScaffolder().scaffold(dg.ScaffoldRequest(type_name="rag_pipeline.components.SiteComponent",
                                                 target_path=target, scaffold_format="yaml", project_root=None,
                                                 params=SiteScaffoldParams(**params)))


def test_a_seed_alone_writes_no_example_sitemap(tmp_path):
    target = tmp_path / "sites" / "docs"
    scaffold(target, seed="https://docs.mine.example/start")
    text = (target / "defs.yaml").read_text()
    site = read_site(target / "defs.yaml", "docs")
    assert isinstance(site, SiteComponent), site
    assert site.spec().sitemaps == () and site.spec().seeds == ("https://docs.mine.example/start",)
    assert site.spec().scope == ("https://docs.mine.example", "https://docs.mine.example/*")
    assert "sitemaps: []" in text


def test_a_sitemap_is_written_as_given_and_loads(tmp_path):
    target = tmp_path / "sites" / "docs"
    scaffold(target, sitemap="https://docs.mine.example/sitemap.xml")
    found = declarations(tmp_path / "sites", sites_dir=None)
    assert not found.problems and found.names() == ["docs"]
    assert found.sites[0].spec().sitemaps == ("https://docs.mine.example/sitemap.xml",)


def test_a_site_outside_sites_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        scaffold(tmp_path / "docs", sitemap="https://docs.mine.example/sitemap.xml")
    assert exited.value.code == 1
    assert "a site goes in sites/<name>" in capsys.readouterr().err
    assert not (tmp_path / "docs" / "defs.yaml").exists()
