"""A site's template learned in its discovery run, pinned in its YAML, shown by `site show` and
`site template` (issue 43, second increment): a loopback site of template-wrapped pages, a real
database and a real Dagster materialization of the site's discovery asset."""

from __future__ import annotations

import json

import dagster as dg
import pytest
from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.components.discovery_asset import discovery_asset
from rag_pipeline.components.site_component import SiteComponent
from rag_pipeline.components.site_files import declarations
from rag_pipeline.crawl.loopback_site import LoopbackSite
from rag_pipeline.defs.resources import PostgresResource, SettingsResource
from rag_pipeline.settings import get_settings
from rag_pipeline.store import site_templates
from rag_pipeline_tests.core.wrapped_site import SITE, wrapped_site
from rag_pipeline_tests.crawl.test_discovery import urlset
from rag_pipeline_tests.store.test_site_templates import stored_pages

PINS = """  template_pins:
    - as: content
      glob: "Build * · *"
    - as: template
      text: "[Skip to main content](#main)"
"""


@pytest.fixture
def site(database_url, conn, tmp_path, monkeypatch):
    """The wrapped documentation site on loopback (its sitemap lists every page), its pages stored
    as crawled, and its site file in SITES_DIR with two pins."""
    with LoopbackSite() as loopback:
        pages = {url.replace(SITE, loopback.base_url): text.replace(SITE, loopback.base_url)
                 for url, text in wrapped_site().items()}
        loopback.set_raw("/robots.txt", b"User-agent: *\nAllow: /\n", content_type="text/plain")
        loopback.set_raw("/sitemap.xml", urlset(loopback.base_url, [u.removeprefix(loopback.base_url) for u in pages]))
        stored_pages(conn, pages)
        folder = tmp_path / "sites"
        folder.mkdir()
        (folder / "docs.yaml").write_text(f"attributes:\n  sitemaps: [{loopback.url('/sitemap.xml')}]\n"
                                          f"  robots_sitemaps: false\n  template_every: 2d\n{PINS}")
        monkeypatch.setenv("SITES_DIR", str(folder))
        monkeypatch.setenv("DATABASE_URL", database_url)
        monkeypatch.delenv("SAMPLE_SITE_URL", raising=False)
        get_settings.cache_clear()
        yield loopback, folder


def _docs() -> SiteComponent:
    found = declarations()
    assert not found.problems, [p.one_line() for p in found.problems]
    (component,) = [c for c in found.sites if c.spec().name == "docs"]
    return component


def _materialize(database_url: str, instance) -> dg.AssetMaterialization:
    asset = discovery_asset(_docs().spec(), None, "site_docs")
    result = dg.materialize([asset], instance=instance, resources={
        "postgres": PostgresResource(database_url=database_url), "settings": SettingsResource()})
    assert result.success
    (materialization,) = result.asset_materializations_for_node(asset.op.name)
    return materialization


def test_the_discovery_run_learns_the_template_with_the_yaml_pins_and_shows_it(site, database_url, conn):
    spec = _docs().spec()
    assert [(p.role, p.how) for p in spec.template_pins] == [("content", "glob"), ("template", "text")]
    with dg.DagsterInstance.ephemeral() as instance:
        first = _materialize(database_url, instance).metadata
        assert first["complete"].value is True
        assert first["template"].value.startswith("docs: template learned (never learned) from 88 pages")
        assert first["template_pages"].value == 88
        kinds = first["template_blocks_by_kind"].value
        assert kinds["link_list"] >= 2 and sum(kinds.values()) == first["template_blocks"].value
        table = first["template_top_blocks"].value
        assert table.startswith("| kind | why | pages seen | scope | example page | text |")
        assert "| line | pin | 88 | site |" in table and "Skip to main content" in table
        learned = site_templates.load(conn, "docs").template
        assert learned.pins == spec.template_pins
        # The content pin keeps the build line out of what is learned; without it, it is learned.
        texts = [b.text for b in learned.blocks]
        assert not any(t.startswith("Build ") for t in texts), texts
        # The next reading within template_every and the same pages: the template is kept.
        second = _materialize(database_url, instance).metadata
        assert second["template"].value.startswith("docs: template not learned again: learned ")
        assert second["template_learned_at"].value == first["template_learned_at"].value

        # A learning that fails in a run: the reading succeeds, the failure is said, the old template stays.
        conn.execute("UPDATE site_templates SET learned_at = learned_at - interval '3 days'")
        conn.execute("CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS"
                     " $$ BEGIN RAISE EXCEPTION 'disk full'; END $$")
        conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON site_template_blocks"
                     " FOR EACH ROW EXECUTE FUNCTION refuse()")
        failed = _materialize(database_url, instance).metadata
        assert failed["complete"].value is True
        assert failed["template"].value.startswith("docs: template learning failed (learned more than 2 days")
        assert "disk full" in failed["template_error"].value
        assert failed["template_blocks"].value == first["template_blocks"].value
        assert site_templates.load(conn, "docs").template == learned

    shown = CliRunner().invoke(cli, ["site", "show", "docs"])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    (header,) = [line for line in lines if line.startswith("  template: learned ")]
    assert f"from 88 pages: {len(learned.blocks)} blocks (" in header
    assert any("last learning FAILED" in line and "disk full" in line for line in lines)
    listed = [line for line in lines if line.startswith("    ") and " pages  " in line]
    assert len(listed) == len(learned.blocks) == 9 and "more: rag-pipeline site template" not in shown.output
    assert listed[0] == (f"        88 pages  line by pin (site), e.g. {learned.blocks[0].example_url}: "
                         "[Skip to main content](#main)")
    as_json = json.loads(CliRunner().invoke(cli, ["site", "show", "docs", "--json"]).output)
    assert as_json["template"]["pages"] == 88 and len(as_json["template"]["blocks"]) == len(learned.blocks)
    assert as_json["template"]["blocks"][0]["example_url"].startswith("https://127.0.0.1:")


def test_site_template_prints_every_block_and_learn_learns_now_with_changed_pins(site, conn):
    loopback, folder = site
    never = CliRunner().invoke(cli, ["site", "template", "docs"])
    assert never.exit_code == 0 and never.output.startswith("docs: template: never learned"), never.output
    learned = CliRunner().invoke(cli, ["site", "template", "docs", "--learn"])
    assert learned.exit_code == 0, learned.output
    assert learned.output.startswith("docs: template learned (asked for) from 88 pages")
    blocks = site_templates.load(conn, "docs").template.blocks
    assert len([line for line in learned.output.splitlines() if " pages  " in line]) == len(blocks)
    # The operator drops the content pin and learns again: the build line is learned now.
    text = (folder / "docs.yaml").read_text()
    (folder / "docs.yaml").write_text(text.replace('    - as: content\n      glob: "Build * · *"\n', ""))
    again = json.loads(CliRunner().invoke(cli, ["site", "template", "docs", "--learn", "--json"]).output)
    assert again["learning"]["outcome"] == "learned"
    assert again["pins"] == [{"as": "template", "text": "[Skip to main content](#main)"}]
    assert any(b["text"].startswith("Build ") for b in again["blocks"])
    unknown = CliRunner().invoke(cli, ["site", "template", "nope"])
    assert unknown.exit_code == 1 and unknown.output.startswith("Error: no site 'nope' is declared")


@pytest.mark.parametrize("pins, said", [
    ('    - as: contnet\n      text: "x"\n', "template_pins[0]: 'as' must be content or template, got 'contnet'"),
    ('    - as: content\n      text: "x"\n    - as: template\n      regex: "(unclosed"\n',
     "template_pins[1]: a template pin's regex '(unclosed' is invalid"),
    ('    - as: template\n      text: "x"\n      glob: "y*"\n', "template_pins[0]: give exactly one of text, glob or regex"),
])
def test_a_bad_pin_is_file_line_field_reason(tmp_path, monkeypatch, pins, said):
    folder = tmp_path / "sites"
    folder.mkdir()
    path = folder / "docs.yaml"
    path.write_text("attributes:\n  seeds: [https://docs.example.com/]\n  template_pins:\n" + pins)
    monkeypatch.setenv("SITES_DIR", str(folder))
    get_settings.cache_clear()
    checked = CliRunner().invoke(cli, ["site", "check"])
    assert checked.exit_code == 1
    assert checked.output.startswith(f"{path}:"), checked.output
    assert said in checked.output and "Traceback" not in checked.output
    index = int(said.split("[")[1].split("]")[0])
    assert checked.output.startswith(f"{path}:{4 + 2 * index}: "), checked.output


def test_a_bad_template_every_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "sites"
    folder.mkdir()
    (folder / "docs.yaml").write_text("attributes:\n  seeds: [https://docs.example.com/]\n  template_every: 30s\n")
    monkeypatch.setenv("SITES_DIR", str(folder))
    get_settings.cache_clear()
    checked = CliRunner().invoke(cli, ["site", "check"])
    assert checked.exit_code == 1
    assert checked.output == f"{folder / 'docs.yaml'}:3: template_every: must be at least 1m\n"


def test_site_show_lists_the_ten_most_seen_blocks_and_counts_the_rest():
    from datetime import UTC, datetime

    from rag_pipeline.cli.template_views import template_lines

    now = datetime(2026, 12, 1, tzinfo=UTC)
    blocks = [{"kind": "line", "why": "text", "pages_seen": 100 - i, "scope": "site", "example_url": f"https://x/{i}",
               "canonical_url": None, "text": f"block {i}"} for i in range(14)]
    facts = {"learned_at": now, "now": now, "pages": 100, "blocks_by_kind": {"line": 14}, "blocks": blocks,
             "error": None, "failed_at": None}
    lines = template_lines(facts)
    assert lines[0] == "template: learned 2026-12-01 00:00:00 UTC (now) from 100 pages: 14 blocks (14 line)"
    assert lines[1:11] == [f"  {100 - i:>6} pages  line by text (site), e.g. https://x/{i}: block {i}" for i in range(10)]
    assert lines[11:] == ["  … and 4 more: rag-pipeline site template <site>"]
