"""Issue 42 point 3: a bad site file fails that site alone, named by file:line, field and reason;
the code location loads the other sites and stands a failing check in for the bad one."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import dagster as dg
import pytest

from rag_pipeline.components.broken_sites import SITE_FILE_CHECK
from rag_pipeline.components.site_files import declarations
from rag_pipeline.core.site_spec import SiteError
from rag_pipeline_tests.harness import configure

GOOD = "type: rag_pipeline.components.SiteComponent\nattributes:\n  sitemaps: [https://good.example.com/sitemap.xml]\n"

# (file text, line, field, the reason's start): each kind of mistake an operator makes.
BAD = {
    "yaml_syntax": ("type: rag_pipeline.components.SiteComponent\nattributes:\n  sitemaps: [https://a.example.com/\n"
                    "  max_pages: 5\n", 4, "", "YAML: expected ',' or ']'"),
    "unknown_field": ("type: rag_pipeline.components.SiteComponent\nattributes:\n"
                      "  seeds: [https://a.example.com/]\n  sitemap: [https://a.example.com/s.xml]\n", 4, "sitemap",
                      "Extra inputs are not permitted: not a site field (did you mean sitemaps?)"),
    "wrong_type": ("type: rag_pipeline.components.SiteComponent\nattributes:\n  seeds: [https://a.example.com/]\n"
                   "  max_pages: lots\n", 4, "max_pages", "Input should be a valid integer"),
    "not_a_url": ("type: rag_pipeline.components.SiteComponent\nattributes:\n  sitemaps:\n"
                  "    - https://a.example.com/s.xml\n    - not a url\n", 5, "sitemaps[1]",
                  "only http and https URLs can be indexed, got 'not a url'"),
    "htp": ("type: rag_pipeline.components.SiteComponent\nattributes:\n  seeds: ['htp://a.example.com/']\n", 3,
            "seeds[0]", "only http and https URLs can be indexed, got 'htp://a.example.com/'"),
    "no_host": ("type: rag_pipeline.components.SiteComponent\nattributes:\n  seeds: ['https://']\n", 3, "seeds[0]",
                "URL has no host"),
    "bad_name": ("type: rag_pipeline.components.SiteComponent\nattributes:\n  name: Bad-Name\n"
                 "  seeds: [https://a.example.com/]\n", 3, "name", "site name 'Bad-Name': use lower-case"),
    "discover_every": ("type: rag_pipeline.components.SiteComponent\nattributes:\n  seeds: [https://a.example.com/]\n"
                       "  discover_every: 30s\n", 4, "discover_every", "must be at least 1m"),
    "unreadable_every": ("type: rag_pipeline.components.SiteComponent\nattributes:\n"
                         "  seeds: [https://a.example.com/]\n  discover_every: daily\n", 4, "discover_every",
                         "cannot read interval 'daily'"),
    "cadence": ("type: rag_pipeline.components.SiteComponent\nattributes:\n  seeds: [https://a.example.com/]\n"
                "  cadence:\n    default: often\n", 4, "cadence", "cannot read interval 'often'"),
    "not_a_site": ("type: dagster.DefsFolderComponent\nattributes: {}\n", 1, "type", "'dagster.DefsFolderComponent' is not"),
    "no_start": ("type: rag_pipeline.components.SiteComponent\nattributes:\n  max_pages: 10\n", 2, "sitemaps",
                 "declare at least one of sitemaps or seeds"),
    "post_processing": ("type: rag_pipeline.components.SiteComponent\nattributes:\n  seeds: [https://a.example.com/]\n"
                        "post_processing:\n  assets:\n    - attributes: {group_name: other}\n", 4, "post_processing",
                        "not supported in a site file: its assets are built by SiteComponent"),
    "template_vars_module": ("type: rag_pipeline.components.SiteComponent\ntemplate_vars_module: .vars\nattributes:\n"
                             "  seeds: [https://a.example.com/]\n", 2, "template_vars_module",
                             "not supported in a site file: its templates resolve with Dagster's built-ins only"),
    "template": ("type: rag_pipeline.components.SiteComponent\nattributes:\n  seeds: [\"{{ nosuch.thing }}\"]\n", 3,
                 "seeds", "template: "),
}


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project of its own (its defs module on sys.path), laid out as this one: `sites/defs.yaml`
    declares the site folder component, one folder per site."""
    package = tmp_path / "siteproj"
    sites = package / "defs" / "sites"
    sites.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "defs" / "__init__.py").write_text("")
    (sites / "defs.yaml").write_text("type: rag_pipeline.components.SiteFolderComponent\n")
    (sites / "good").mkdir()
    (sites / "good" / "defs.yaml").write_text(GOOD)
    monkeypatch.syspath_prepend(str(tmp_path))
    configure(monkeypatch, SITES_DIR=None, SAMPLE_SITE_URL=None)
    yield sites
    for name in [m for m in sys.modules if m.startswith("siteproj")]:
        del sys.modules[name]


def tree_defs(sites: Path) -> dg.Definitions:
    """The project's definitions, with this project's resources (its sites' assets need them)."""
    from rag_pipeline.definitions import whole_project

    tree = dg.ComponentTree(defs_module=importlib.import_module("siteproj.defs"), project_root=sites.parents[2])
    return dg.Definitions.merge(tree.build_defs(), dg.Definitions(resources=whole_project().resources))


@pytest.mark.parametrize("kind", sorted(BAD))
def test_each_kind_of_bad_file_is_one_line_with_its_line_and_field(project, kind):
    text, line, field, reason = BAD[kind]
    (project / "broken").mkdir()
    (project / "broken" / "defs.yaml").write_text(text)
    found = declarations(project, sites_dir=None)
    assert found.names() == ["good"]
    [problem] = found.problems
    path = project / "broken" / "defs.yaml"
    assert problem.one_line().startswith(f"{path}:{line}: {field + ': ' if field else ''}{reason}"), problem
    assert "\n" not in problem.one_line()


def test_a_bad_folder_name_is_named_as_the_folders(project):
    (project / "Bad-Name").mkdir()
    (project / "Bad-Name" / "defs.yaml").write_text(GOOD.replace("good.example", "other.example"))
    [problem] = declarations(project, sites_dir=None).problems
    assert problem.field == "name" and "the name is the folder's" in problem.reason


def test_the_tree_loads_the_good_sites_and_stands_in_a_failing_check_for_the_bad_one(project):
    (project / "typo").mkdir()
    (project / "typo" / "defs.yaml").write_text(BAD["unknown_field"][0])
    (project / "broken_yaml").mkdir()
    (project / "broken_yaml" / "defs.yaml").write_text(BAD["yaml_syntax"][0])
    defs = tree_defs(project)
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert {"good/discovery", "good/pages", "good/chunks", "good/embeddings"} <= keys
    assert {"typo/discovery", "broken_yaml/discovery"} <= keys and not {"typo/pages", "broken_yaml/pages"} & keys
    standin = graph.get(dg.AssetKey(["typo", "discovery"]))
    said = f"{project / 'typo' / 'defs.yaml'}:4: sitemap: Extra inputs are not permitted"
    assert said in standin.description and standin.group_name == "site_typo"
    assert defs.resolve_sensor_def("good_discovery_sensor")
    # The check fails with the one line, run as the UI's "Execute" runs it.
    with dg.instance_for_test() as instance:
        evaluated = dg.Definitions(asset_checks=[c for c in defs.asset_checks
                                                 if dg.AssetCheckKey(dg.AssetKey(["typo", "discovery"]), SITE_FILE_CHECK)
                                                 in c.check_keys],
                                   assets=[dg.AssetSpec(dg.AssetKey(["typo", "discovery"]))])
        run = evaluated.resolve_implicit_global_asset_job_def().execute_in_process(instance=instance,
                                                                                    raise_on_error=False)
        [evaluation] = [e.asset_check_evaluation_data for e in run.all_events
                        if e.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION]
    assert not evaluation.passed and evaluation.description.startswith(said)


def test_the_sensor_records_each_failed_check_once_per_reason(project):
    (project / "typo").mkdir()
    (project / "typo" / "defs.yaml").write_text(BAD["unknown_field"][0])
    defs = tree_defs(project)
    with dg.instance_for_test() as instance:
        sensor = defs.resolve_sensor_def("site_files_sensor")
        first = sensor(dg.build_sensor_context(instance=instance, definitions=defs))
        [event] = first.asset_events
        assert event.asset_key == dg.AssetKey(["typo", "discovery"]) and not event.passed
        instance.report_runless_asset_event(event)          # as the daemon stores a tick's events
        again = sensor(dg.build_sensor_context(instance=instance, definitions=defs))
        assert again.asset_events == [] and "already recorded" in again.skip_reason.skip_message
        record = instance.event_log_storage.get_latest_asset_check_execution_by_key(
            [dg.AssetCheckKey(event.asset_key, SITE_FILE_CHECK)])
        assert record


def test_validation_mode_fails_on_a_bad_file_naming_it(project, monkeypatch, tmp_path):
    """`dg check defs` and `dagster definitions validate` set DAGSTER_IS_DEFS_VALIDATION_CLI: there
    the location refuses to load with a bad site file; elsewhere it loads without the site."""
    from rag_pipeline.definitions import defs

    folder = tmp_path / "sites_dir"
    folder.mkdir()
    (folder / "typo.yaml").write_text(BAD["discover_every"][0])
    configure(monkeypatch, SITES_DIR=str(folder))
    assert dg.AssetKey(["typo", "discovery"]) in defs().resolve_asset_graph().get_all_asset_keys()
    monkeypatch.setenv("DAGSTER_IS_DEFS_VALIDATION_CLI", "1")
    with pytest.raises(SiteError, match=r"^1 site file\(s\) do not load:\n.*typo.yaml:4: discover_every: must be"):
        defs()


def test_dg_check_defs_fails_on_a_bad_sites_dir_file_and_passes_without_it(tmp_path):
    folder = tmp_path / "sites"
    folder.mkdir()
    (folder / "typo.yaml").write_text("attributes:\n  seeds: [https://a.example.com/]\n  discover_every: 30s\n")
    dg_bin = Path(sys.executable).with_name("dg")
    checkout = Path(__file__).resolve().parents[2]
    env = {"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "HOME": str(tmp_path),
           "DAGSTER_HOME": str(tmp_path), "SITES_DIR": str(folder)}
    failed = subprocess.run([str(dg_bin), "check", "defs", "--use-active-venv"], cwd=checkout, env=env,
                            capture_output=True, text=True, timeout=300)
    assert failed.returncode != 0
    assert f"{folder / 'typo.yaml'}:3: discover_every: must be at least 1m" in failed.stdout + failed.stderr


def test_a_switched_off_site_is_not_a_problem(project):
    (project / "off").mkdir()
    (project / "off" / "defs.yaml").write_text(textwrap.dedent("""\
        type: rag_pipeline.components.SiteComponent
        attributes:
          enabled: "{{ env('NO_SUCH_VARIABLE_HERE', '') != '' }}"
          sitemaps: ["{{ env('NO_SUCH_VARIABLE_HERE', 'http://127.0.0.1:1') }}/sitemap.xml"]
        """))
    found = declarations(project, sites_dir=None)
    assert not found.problems and [c._folder for c in found.disabled] == ["off"]


def test_a_switched_off_site_is_judged_as_fully_as_the_others(project):
    (project / "off").mkdir()
    (project / "off" / "defs.yaml").write_text(textwrap.dedent("""\
        type: rag_pipeline.components.SiteComponent
        attributes:
          enabled: false
          seeds: [https://off.example.com/]
          cadence:
            default: often
        """))
    (project / "templated").mkdir()
    (project / "templated" / "defs.yaml").write_text(textwrap.dedent("""\
        type: rag_pipeline.components.SiteComponent
        attributes:
          enabled: "{{ env('NO_SUCH_VARIABLE_HERE', '') != '' }}"
          sitemaps: ["{{ env('NO_SUCH_VARIABLE_HERE', '') }}/sitemap.xml"]
        """))
    found = declarations(project, sites_dir=None)
    assert found.names() == ["good"] and found.disabled == []
    off, templated = found.problems
    assert off.one_line().startswith(f"{project / 'off' / 'defs.yaml'}:5: cadence: cannot read interval 'often'")
    assert "give env() a default" not in off.reason      # no template there: no hint about one
    assert templated.file.endswith("templated/defs.yaml") and templated.line == 4
    assert templated.field == "sitemaps[0]" and "give env() a default" in templated.reason


def test_the_sample_sites_own_file_passes_without_sample_site_url(monkeypatch):
    from rag_pipeline.components.site_files import PACKAGE_SITES

    configure(monkeypatch, SITES_DIR=None, SAMPLE_SITE_URL=None)
    found = declarations(PACKAGE_SITES, sites_dir=None)
    assert found.problems == [] and [c.spec().name for c in found.disabled] == ["sample"]


def test_validation_mode_fails_on_a_bad_switched_off_file(monkeypatch, tmp_path):
    """`dg check defs` is the deploy gate: a file switched off where it is checked still fails it."""
    from rag_pipeline.definitions import defs

    folder = tmp_path / "sites_dir"
    folder.mkdir()
    (folder / "off.yaml").write_text("attributes:\n  enabled: false\n  sitemaps: ['htp://not a url']\n")
    configure(monkeypatch, SITES_DIR=str(folder), DAGSTER_IS_DEFS_VALIDATION_CLI="1")
    with pytest.raises(SiteError, match=r"off.yaml:3: sitemaps\[0\]: only http and https URLs"):
        defs()


def test_a_site_error_carries_its_field():
    from rag_pipeline.core.site_spec import SiteSpec

    with pytest.raises(SiteError) as caught:
        SiteSpec(name="docs", seeds=("https://a.example.com/", "ftp://b.example.com/"))
    assert caught.value.field == ("seeds", 1)
