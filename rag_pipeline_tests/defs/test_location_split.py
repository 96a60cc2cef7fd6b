"""Sites spread over code locations (LOCATION_HOLDS), declared in SITES_DIR: each location serves
its own sites' assets and batches, one of them `main`'s, and together they are the whole project."""

from __future__ import annotations

import dagster as dg
import pytest

from rag_pipeline.components.site_component import declared_sites
from rag_pipeline.components.site_files import declarations
from rag_pipeline.core.site_spec import SiteSpec
from rag_pipeline.core.location_holds import HoldsError
from rag_pipeline.store import sites as sites_store
from rag_pipeline_tests.fakes.openai_server import FakeOpenAI
from rag_pipeline_tests.harness import Pipeline, configure, load_defs
from rag_pipeline_tests.ingest.pagework import put

SITES = {
    "alpha.yaml": "attributes:\n  sitemaps: [https://alpha.example.com/sitemap.xml]\n  shards: 2\n",
    "beta.yaml": "type: rag_pipeline.components.SiteComponent\nattributes:\n"
                 "  seeds: [https://beta.example.com/]\n  discover_every: 1h\n",
}


@pytest.fixture
def sites_dir(tmp_path, monkeypatch):
    folder = tmp_path / "sites"
    folder.mkdir()
    for name, text in SITES.items():
        (folder / name).write_text(text)
    configure(monkeypatch, SITES_DIR=str(folder), SAMPLE_SITE_URL=None)
    return folder


def held(monkeypatch, holds: str) -> dict[str, set[str]]:
    configure(monkeypatch, LOCATION_HOLDS=holds)
    defs = load_defs()
    # What the location defines itself (its graph also shows, as external, what its assets depend on).
    assets = {key.to_user_string() for a in defs.assets or []
              for key in (a.keys if isinstance(a, dg.AssetsDefinition) else {a.key})}
    return {"assets": assets, "jobs": {j.name for j in defs.resolve_all_job_defs() if not j.name.startswith("__")},
            "sensors": {s.name for s in defs.sensors or []}, "schedules": {s.name for s in defs.schedules or []},
            "checks": {k.to_user_string() for c in defs.asset_checks or [] for k in c.check_keys}}


def test_sites_dir_declares_sites_beside_the_package(sites_dir):
    names = {spec.name: spec for spec, _ in declared_sites()}
    assert set(names) == {"alpha", "beta"}
    assert names["alpha"].shards == 2 and names["beta"].seeds == ("https://beta.example.com/",)
    keys = {k.to_user_string() for k in load_defs().resolve_asset_graph().get_all_asset_keys()}
    assert {"alpha/discovery", "alpha/shard_00/pages", "alpha/shard_01/embeddings", "beta/embeddings"} <= keys


def test_sites_dir_is_read_beside_another_bad_setting(sites_dir, monkeypatch):
    monkeypatch.setenv("SENSOR_BATCH_SIZE", "0")   # fails the ticks, not what the location defines
    assert {spec.name for spec, _ in declared_sites()} == {"alpha", "beta"}


def test_a_site_declared_twice_loads_once_and_the_second_file_is_named(sites_dir):
    (sites_dir / "beta2.yml").write_text("attributes:\n  name: beta\n  seeds: [https://beta.example.org/]\n")
    assert {spec.name: spec.seeds for spec, _ in declared_sites()}["beta"] == ("https://beta.example.com/",)
    problems = declarations().problems
    assert [p.one_line() for p in problems] == [
        f"{sites_dir / 'beta2.yml'}:2: name: site beta is declared twice: also in {sites_dir / 'beta.yaml'} "
        "(that one is loaded)"]
    keys = {k.to_user_string() for k in load_defs().resolve_asset_graph().get_all_asset_keys()}
    assert {"beta/discovery", "beta_bad_file/discovery"} <= keys


def test_a_bad_sites_dir_file_names_the_file_line_and_field_and_the_others_load(sites_dir):
    (sites_dir / "gamma.yaml").write_text("attributes:\n  seeds: [https://gamma.example.com/]\n  max_pages: lots\n")
    assert {spec.name for spec, _ in declared_sites()} == {"alpha", "beta"}
    [problem] = declarations().problems
    assert problem.one_line() == (f"{sites_dir / 'gamma.yaml'}:3: max_pages: Input should be a valid integer, "
                                  "unable to parse string as an integer")
    (sites_dir / "gamma.yaml").write_text("type: some.OtherComponent\nattributes: {}\n")
    assert "only sites belong here" in declarations().problems[0].one_line()


def test_the_locations_together_are_the_whole_project_each_part_once(sites_dir, monkeypatch):
    whole = held(monkeypatch, "all")
    parts = [held(monkeypatch, h) for h in ("main", "alpha:0,beta", "alpha:1")]
    for kind in ("assets", "checks", "schedules"):
        assert set().union(*(p[kind] for p in parts)) == whole[kind], kind
        assert sum(len(p[kind]) for p in parts) == len(whole[kind]), f"{kind} held twice"
    main, alpha0_beta, alpha1 = parts
    assert {"index", "pages", "chunks", "embeddings"} <= main["assets"]
    assert not any(a.startswith(("alpha/", "beta/")) for a in main["assets"])
    assert alpha0_beta["assets"] == {"alpha/discovery", "beta/discovery", "beta/pages", "beta/chunks",
                                     "beta/embeddings", *(f"alpha/shard_00/{s}" for s in ("pages", "chunks", "embeddings"))}
    assert alpha1["assets"] == {f"alpha/shard_01/{s}" for s in ("pages", "chunks", "embeddings")}
    # Index-wide duties are main's alone; every location routes and runs its own batches.
    assert {"recrawl_sensor", "index_snapshot_sensor"} <= main["sensors"]
    for part in (alpha0_beta, alpha1):
        assert "recrawl_sensor" not in part["sensors"] and "index_snapshot_sensor" not in part["sensors"]
        assert not part["schedules"]
        # A location holds the checks of the partition sets it holds, and no index-wide one.
        assert {c.split(":")[0] for c in part["checks"]} == {a for a in part["assets"] if not a.endswith("discovery")}
        assert {"delivery_sensor", "delivery_failure_sensor", "index_batch"} <= part["sensors"] | part["jobs"]
    assert "alpha_discovery_sensor" in alpha0_beta["sensors"] and "alpha_discovery_sensor" not in alpha1["sensors"]
    # The HNSW upkeep's job is main's alone (delivery_sensor targets it only there).
    assert "space_index" in main["jobs"] and not {"space_index", "push"} & (alpha0_beta["jobs"] | alpha1["jobs"])


def test_a_location_holding_an_undeclared_site_fails_to_load_saying_so(sites_dir, monkeypatch):
    configure(monkeypatch, LOCATION_HOLDS="main,gamma")
    with pytest.raises(HoldsError, match="'gamma', which is not declared \\(declared: alpha, beta\\)"):
        load_defs()


def test_a_location_holding_a_site_whose_file_does_not_load_still_loads(sites_dir, monkeypatch):
    (sites_dir / "gamma.yaml").write_text("attributes:\n  seeds: [https://gamma.example.com/]\n  sitemap: []\n")
    gamma = held(monkeypatch, "beta,gamma:1")
    assert gamma["assets"] == {"beta/discovery", "beta/pages", "beta/chunks", "beta/embeddings"}
    assert "gamma/discovery" in held(monkeypatch, "main")["assets"]     # the stand-in is main's


def test_each_location_leases_only_its_own_pages(sites_dir, monkeypatch, database_url, conn):
    with FakeOpenAI(dimensions=64) as fake:
        configure(monkeypatch, DATABASE_URL=database_url, EMBEDDING_PROVIDER="openai", OPENAI_API_KEY="sk-test",
                  OPENAI_BASE_URL=fake.base_url, EMBEDDING_DIMENSIONS="64", EMBEDDING_MAX_RETRIES="0")
        sites_store.sync_declared(conn, [spec for spec, _ in declared_sites()])
        # A site declared once and no longer: its pages are main's, as no location may name it.
        sites_store.sync_declared(conn, [SiteSpec(name="gamma", seeds=("https://gamma.example.com/",))])
        urls = {"beta": [f"https://beta.example.com/p{i}" for i in range(3)],
                "main": [f"https://elsewhere.example.com/p{i}" for i in range(2)] + ["https://gamma.example.com/p0"]}
        for url in urls["beta"] + urls["main"]:
            put(conn, url, f"# {url}\n\nThe page at {url} says something of its own.")
        with dg.instance_for_test() as instance:
            configure(monkeypatch, LOCATION_HOLDS="alpha:0,beta")
            beta = Pipeline(instance, load_defs()).tick()
            assert sorted(beta.partitions) == urls["beta"]
            assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in beta.runs)
            # main's pages were routed by that tick too, and wait for main's own location.
            queued = {r[0] for r in conn.execute("SELECT page_url FROM deliveries WHERE outcome = 'queued'")}
            assert queued == set(urls["main"])
            configure(monkeypatch, LOCATION_HOLDS="alpha:1")
            assert Pipeline(instance, load_defs()).tick().partitions == []
            configure(monkeypatch, LOCATION_HOLDS="main")
            assert sorted(Pipeline(instance, load_defs()).tick().partitions) == urls["main"]
        sites_of = dict(conn.execute("SELECT url, coalesce(site, '-') FROM pages WHERE indexed_hash IS NOT NULL"))
        assert sites_of == {**{u: "beta" for u in urls["beta"]}, **{u: "-" for u in urls["main"][:2]},
                            "https://gamma.example.com/p0": "gamma"}
