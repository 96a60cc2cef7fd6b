"""`rag-pipeline site list|show|discover` and the sites in `status`, on the sample site that
`make run` declares (rag_pipeline/defs/sites/sample, on when SAMPLE_SITE_URL is set)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from rag_pipeline.cli import main as cli
from rag_pipeline.crawl.loopback_site import LoopbackSite
from rag_pipeline.settings import get_settings

SAMPLE_SITE = Path(__file__).resolve().parents[2] / "samples" / "site"


def _env(monkeypatch, database_url, site_url: str | None) -> None:
    monkeypatch.setenv("DATABASE_URL", database_url)
    if site_url:
        monkeypatch.setenv("SAMPLE_SITE_URL", site_url)
    else:
        monkeypatch.delenv("SAMPLE_SITE_URL", raising=False)
    get_settings.cache_clear()


def test_site_discover_reads_the_sample_site_and_show_tells_what_it_found(database_url, conn, monkeypatch):
    with LoopbackSite(SAMPLE_SITE) as site:
        _env(monkeypatch, database_url, site.base_url)
        result = CliRunner().invoke(cli, ["site", "discover", "sample"])
        assert result.exit_code == 0, result.output
        # The generated sitemap lists six pages, robots.txt disallows /drafts/; the old guide is the seed.
        assert result.output.startswith("sample: complete: 6 listed, 5 new, 0 no longer listed, 0 lastmod moved")
        assert "not recorded in Dagster: no instance at" in result.output
        shown = CliRunner().invoke(cli, ["site", "show", "sample"])
    assert shown.exit_code == 0, shown.output
    assert ("sample: 1 sitemap(s) and robots.txt's Sitemap: lines, 1 seed(s), up to 1,000 pages, read every 2m"
            in shown.output)
    assert "pages: 6 (0 live, 5 listed, 0 unlisted, 0 tombstoned, 6 due, 6 never crawled)" in shown.output
    assert "disallowed 1" in shown.output
    listed = json.loads(CliRunner().invoke(cli, ["site", "list", "--json"]).output)
    assert [(s["site"], s["listed"], s["due"]) for s in listed] == [("sample", 5, 6)]
    urls = [r[0] for r in conn.execute("SELECT crawl_url FROM pages WHERE site = 'sample' ORDER BY 1")]
    assert site.url("/drafts/launch-plan") not in urls and site.url("/pricing") in urls
    status = json.loads(CliRunner().invoke(cli, ["status", "--json"]).output)
    assert [(s["site"], s["last_reading"]["complete"]) for s in status["sites"]] == [("sample", True)]

    # Another shell, without `make run`'s SAMPLE_SITE_URL: the site the running location declared
    # is still listed and shown, from what its reading recorded; a reading needs the declaration.
    _env(monkeypatch, database_url, None)
    listed = CliRunner().invoke(cli, ["site", "list"])
    assert listed.exit_code == 0 and listed.output.startswith("sample: 0 live, 5 listed"), listed.output
    shown = CliRunner().invoke(cli, ["site", "show", "sample"])
    assert shown.exit_code == 0 and "not in this shell" in shown.output and "pages: 6" in shown.output
    assert "read every 2m" in shown.output and "0:02:00" not in shown.output
    refused = CliRunner().invoke(cli, ["site", "discover", "sample"])
    assert refused.exit_code == 1 and "SAMPLE_SITE_URL" in refused.output


def test_an_unreadable_sitemap_exits_1_and_says_why(database_url, monkeypatch):
    with LoopbackSite() as site:     # answers 404 to everything, robots.txt included (allowed)
        _env(monkeypatch, database_url, site.base_url)
        result = CliRunner().invoke(cli, ["site", "discover", "sample"])
    assert result.exit_code == 1
    assert f"problem: {site.url('/sitemap.xml')}: answered 404" in result.output
    status = CliRunner().invoke(cli, ["status"])
    assert "INCOMPLETE" in status.output and site.url("/sitemap.xml") + ": answered 404" in status.output


def test_an_unknown_site_is_one_line_and_exit_1(database_url, monkeypatch):
    _env(monkeypatch, database_url, None)      # the sample site is off: no site declared
    result = CliRunner().invoke(cli, ["site", "show", "docs"])
    assert result.exit_code == 1
    assert result.output.strip() == ("Error: no site 'docs' is declared; declared sites: sample (switched off "
                                     "here: enabled is false; the sample site is on under `make run`)")
    listed = CliRunner().invoke(cli, ["site", "list"])
    assert listed.exit_code == 0 and listed.output.startswith("no sites declared")


def _sites_dir(tmp_path, monkeypatch, files: dict[str, str]) -> Path:
    folder = tmp_path / "sites"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    monkeypatch.setenv("SITES_DIR", str(folder))
    get_settings.cache_clear()
    return folder


TYPO = "attributes:\n  seeds: [https://typo.example.com/]\n  sitemap: [https://typo.example.com/s.xml]\n"


def test_a_bad_site_file_is_named_by_check_list_show_and_status_and_the_others_work(database_url, monkeypatch,
                                                                                     tmp_path):
    _env(monkeypatch, database_url, None)
    folder = _sites_dir(tmp_path, monkeypatch, {"docs.yaml": "attributes:\n  seeds: [https://docs.example.com/]\n",
                                                "typo.yaml": TYPO})
    said = f"{folder / 'typo.yaml'}:3: sitemap: Extra inputs are not permitted: not a site field (did you mean sitemaps?)"
    checked = CliRunner().invoke(cli, ["site", "check"])
    assert checked.exit_code == 1 and checked.output == said + "\n"
    listed = CliRunner().invoke(cli, ["site", "list"])
    assert listed.exit_code == 0 and f"typo: DOES NOT LOAD: {said}" in listed.output.splitlines()
    assert "docs: declared, not read yet" in listed.output
    shown = CliRunner().invoke(cli, ["site", "show", "typo"])
    assert shown.exit_code == 1 and shown.output.startswith(f"typo: DOES NOT LOAD: {said}\n"), shown.output
    as_json = json.loads(CliRunner().invoke(cli, ["site", "show", "typo", "--json"]).output)
    assert as_json["does_not_load"]["line"] == 3 and as_json["does_not_load"]["field"] == "sitemap"
    healthy = CliRunner().invoke(cli, ["site", "show", "docs"])
    assert healthy.exit_code == 0 and "Traceback" not in healthy.output
    assert healthy.output.startswith("docs: no sitemap declared and robots.txt's Sitemap: lines, 1 seed(s)")
    assert f"(another site file does not load: {said})" in healthy.output
    status = CliRunner().invoke(cli, ["status"])
    assert status.exit_code == 0 and f"site typo DOES NOT LOAD: {said}" in status.output, status.output
    report = json.loads(CliRunner().invoke(cli, ["status", "--json"]).output)
    assert [p["problem"] for p in report["site_files_not_loading"]] == [said]

    (folder / "typo.yaml").write_text(TYPO.replace("sitemap:", "sitemaps:"))
    fixed = CliRunner().invoke(cli, ["site", "check"])
    assert fixed.exit_code == 0 and fixed.output == "2 site(s) OK, 1 switched off (checked), 8 labelled question(s) read\n"


OFF_AND_BAD = ("attributes:\n  enabled: false\n  sitemaps: [\"htp://not a url\"]\n  discover_every: 5s\n")


def test_site_check_judges_a_switched_off_site_and_does_not_count_it_ok(database_url, monkeypatch, tmp_path):
    """A switched-off site's file is on where it is deployed: `site check` must fail on it here."""
    _env(monkeypatch, database_url, None)
    folder = _sites_dir(tmp_path, monkeypatch, {"docs.yaml": "attributes:\n  seeds: [https://docs.example.com/]\n",
                                                "off.yaml": OFF_AND_BAD})
    checked = CliRunner().invoke(cli, ["site", "check"])
    assert checked.exit_code == 1, checked.output
    assert checked.output == (f"{folder / 'off.yaml'}:3: sitemaps[0]: only http and https URLs can be indexed, "
                              "got 'htp://not a url'\n")
    (folder / "off.yaml").write_text(OFF_AND_BAD.replace("htp://not a url", "https://off.example.com/s.xml"))
    checked = CliRunner().invoke(cli, ["site", "check"])
    assert checked.exit_code == 1 and checked.output == f"{folder / 'off.yaml'}:4: discover_every: must be at least 1m\n"
    (folder / "off.yaml").write_text(OFF_AND_BAD.replace("htp://not a url", "https://off.example.com/s.xml")
                                     .replace("5s", "1h"))
    # docs, and two switched off (the sample site without SAMPLE_SITE_URL, and off): checked, not "OK".
    checked = CliRunner().invoke(cli, ["site", "check"])
    assert checked.exit_code == 0 and checked.output == "1 site(s) OK, 2 switched off (checked), 8 labelled question(s) read\n", checked.output


def test_show_and_discover_of_an_unknown_site_list_the_same_sites(database_url, monkeypatch, tmp_path):
    _env(monkeypatch, database_url, None)
    _sites_dir(tmp_path, monkeypatch, {"docs.yaml": "attributes:\n  seeds: [https://docs.example.com/]\n",
                                       "typo.yaml": TYPO})
    shown = CliRunner().invoke(cli, ["site", "show", "nosuch"])
    discovered = CliRunner().invoke(cli, ["site", "discover", "nosuch"])
    assert shown.exit_code == discovered.exit_code == 1
    assert shown.output == discovered.output == (
        "Error: no site 'nosuch' is declared; declared sites: docs, sample (switched off here: enabled is false; "
        "the sample site is on under `make run`), typo (its file does not load: `rag-pipeline site check`)\n")


def test_a_site_whose_file_was_removed_reads_no_longer_declared_in_status(database_url, conn, monkeypatch):
    from rag_pipeline.core.site_spec import SiteSpec
    from rag_pipeline.store import sites as sites_store

    _env(monkeypatch, database_url, None)
    with conn.transaction():
        # Synced by a running location once, an hour ago; none has since (its file was removed).
        sites_store.sync_declared(conn, [SiteSpec(name="gone", seeds=("https://gone.example.com/",))],
                                  by_location=True)
        conn.execute("UPDATE sites SET synced_at = now() - interval '1 hour'")
    status = CliRunner().invoke(cli, ["status"])
    assert status.exit_code == 0
    said = " ".join(status.output.split())
    assert ("no longer declared: no site file of this shell names it, and no running code location has synced "
            "it since 20") in said and "(1h 0m ago): its pages stay" in said and "INCOMPLETE" not in said
    [row] = json.loads(CliRunner().invoke(cli, ["status", "--json"]).output)["sites"]
    assert row["declared"] is False and row["declared_by_running_location"] is False


def test_a_site_the_running_location_declares_is_not_no_longer_declared_in_another_shell(database_url, conn,
                                                                                          monkeypatch):
    """make run with SITES_DIR (or an env var) this shell lacks: the site is the running location's."""
    from rag_pipeline.core.site_spec import SiteSpec
    from rag_pipeline.store import sites as sites_store

    _env(monkeypatch, database_url, None)
    with conn.transaction():
        sites_store.sync_declared(conn, [SiteSpec(name="elsewhere", seeds=("https://elsewhere.example.com/",))],
                                  by_location=True)        # as its discovery sensor does, every tick
    status = CliRunner().invoke(cli, ["status"])
    said = " ".join(status.output.split())
    assert status.exit_code == 0 and "no longer declared" not in said, said
    assert ("declared by the running code location (synced 20") in said
    assert "not in this shell (its site file or an env var it reads is not here): never read" in said
    [row] = json.loads(CliRunner().invoke(cli, ["status", "--json"]).output)["sites"]
    assert row["declared"] is False and row["declared_by_running_location"] is True
    # A shell's sync (`site discover`) is not the running location's: it notes nothing.
    with conn.transaction():
        sites_store.sync_declared(conn, [SiteSpec(name="shell", seeds=("https://shell.example.com/",))])
    rows = {r["site"]: r for r in json.loads(CliRunner().invoke(cli, ["status", "--json"]).output)["sites"]}
    assert rows["shell"]["synced_at"] is None and rows["shell"]["declared_by_running_location"] is False


def test_the_pages_line_adds_up_when_a_redirect_alias_is_among_them():
    from rag_pipeline.cli.site_views import pages_line

    row = {"pages": 6, "live": 5, "listed": 5, "unlisted": 0, "tombstoned": 0, "due": 0, "never_crawled": 0,
           "aliases": 1}
    assert pages_line(row) == ("6 (5 live, 5 listed, 0 unlisted, 0 tombstoned, 0 due, 0 never crawled; 1 of the 6 "
                               "is a redirect alias (its URL redirects to a page counted here))")


def test_a_reading_from_the_cli_records_its_check_with_it(database_url, monkeypatch, tmp_path):
    """`site discover` records the reading on `<site>/discovery` and discovery_read_cleanly with
    it: the UI shows the check as evaluated for that reading, not greyed out by it."""
    import dagster as dg

    from rag_pipeline import compat
    from rag_pipeline.components.discovery_asset import DISCOVERY_CHECK, discovery_key

    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")   # a local (sqlite) instance
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.setenv("DAGSTER_POSTGRES_URL", "unused-by-this-instance")
    with LoopbackSite(SAMPLE_SITE) as site:
        _env(monkeypatch, database_url, site.base_url)
        result = CliRunner().invoke(cli, ["site", "discover", "sample"])
    assert result.exit_code == 0 and f"recorded on sample/discovery in {tmp_path}" in result.output, result.output
    key = dg.AssetCheckKey(discovery_key("sample"), DISCOVERY_CHECK)
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        [record] = instance.fetch_materializations(discovery_key("sample"), limit=1).records
        assert compat.shown_as_evaluated(instance, [key]) == {key: True}
        # Both say where they came from: a shell's reading must not pass for the sensor's.
        assert record.asset_materialization.metadata["read_by"].value == "rag-pipeline site discover"
        check = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
        evaluation = check.event.dagster_event.event_specific_data
    assert evaluation.passed and evaluation.metadata["read_by"].value == "rag-pipeline site discover"
    assert evaluation.description.startswith("read by `rag-pipeline site discover` from a shell: complete: 6 listed")


def test_a_failed_reading_from_the_cli_says_in_dagster_that_a_shell_made_it(database_url, monkeypatch, tmp_path):
    import dagster as dg

    from rag_pipeline.components.discovery_asset import DISCOVERY_CHECK, discovery_key

    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    monkeypatch.setenv("DAGSTER_POSTGRES_URL", "unused-by-this-instance")
    with LoopbackSite() as site:     # answers 404 to everything
        _env(monkeypatch, database_url, site.base_url)
        result = CliRunner().invoke(cli, ["site", "discover", "sample"])
    assert result.exit_code == 1 and "recorded on sample/discovery" in result.output, result.output
    key = dg.AssetCheckKey(discovery_key("sample"), DISCOVERY_CHECK)
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        check = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
        evaluation = check.event.dagster_event.event_specific_data
    assert not evaluation.passed and evaluation.metadata["read_by"].value == "rag-pipeline site discover"
    assert evaluation.description == (f"read by `rag-pipeline site discover` from a shell: "
                                      f"{site.url('/sitemap.xml')}: answered 404")


def test_site_check_reads_each_sites_labelled_questions_and_names_a_bad_line(database_url, monkeypatch, tmp_path):
    _env(monkeypatch, database_url, None)
    folder = _sites_dir(tmp_path, monkeypatch, {
        "docs.yaml": "attributes:\n  seeds: [https://docs.example.com/]\n",
        "docs.questions.jsonl": '{"question": "Rotate the token?", "url": "/ops", "marker": "WEBHOOK_TOKEN"}\n'
                                '{"question": "Cost?", "url": "/pricing", "markr": "nine"}\n'})
    checked = CliRunner().invoke(cli, ["site", "check"])
    assert checked.exit_code == 1
    assert checked.output == (f"{folder / 'docs.questions.jsonl'}:2: unknown key 'markr' (a question has question, "
                              "url, marker, kind)\n")
    (folder / "docs.questions.jsonl").write_text('{"question": "Rotate the token?", "url": "/ops"}\n')
    checked = CliRunner().invoke(cli, ["site", "check"])
    assert checked.exit_code == 0 and checked.output == (
        "1 site(s) OK, 1 switched off (checked), 9 labelled question(s) read\n"), checked.output
