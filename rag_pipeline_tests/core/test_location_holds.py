import pytest

from rag_pipeline.core.location_holds import HoldsError, parse_holds
from rag_pipeline.core.site_spec import SiteError, SiteSpec
from rag_pipeline.settings import SettingsError, load_settings


def test_all_is_the_default_and_holds_every_page():
    for text in ("all", "", " all "):
        holds = parse_holds(text)
        assert holds.everything and holds.holds_main()
        assert holds.holds_page(None, None) and holds.holds_page("docs", 3) and holds.holds_site("docs")


def test_a_list_holds_main_whole_sites_and_single_shards():
    holds = parse_holds("main, docs ,blog:1")
    assert not holds.everything and holds.holds_main()
    assert holds.holds_page(None, None)                     # the catch-all is main's
    assert holds.holds_page("docs", None) and holds.holds_page("docs", 7)
    assert holds.holds_page("blog", 1) and not holds.holds_page("blog", 0)
    assert not holds.holds_site("blog")                     # discovery goes with shard 0
    assert not holds.holds_page("shop", None)
    assert holds.describe() == "main,docs,blog:1"
    site_only = parse_holds("blog:0")
    assert site_only.holds_site("blog") and not site_only.holds_main() and not site_only.holds_page(None, None)
    assert site_only.holds_page("blog", None)               # a one-shard site's pages are its shard 0


@pytest.mark.parametrize(("text", "message"), [
    ("all,docs", "'all' cannot be combined"),
    ("Docs", "is not 'main', a site name or site:shard"),
    ("docs:x", "is not 'main', a site name or site:shard"),
    ("docs,docs:1", "both whole and by shard"),
])
def test_a_bad_list_is_refused_with_the_entry(text, message):
    with pytest.raises(HoldsError, match=message):
        parse_holds(text)


def test_the_held_sites_must_be_declared_with_those_shards():
    holds = parse_holds("main,docs,blog:2")
    with pytest.raises(HoldsError, match=r"blog:2, but blog has 2 shard\(s\) \(0 to 1\)"):
        holds.check_against({"docs": 1, "blog": 2})
    with pytest.raises(HoldsError, match="the site 'docs', which is not declared \\(declared: blog\\)"):
        holds.check_against({"blog": 3})
    holds.check_against({"docs": 1, "blog": 3})


def test_a_bad_location_holds_is_one_line_naming_the_variable(monkeypatch):
    monkeypatch.setenv("LOCATION_HOLDS", "main,Bad Name")
    with pytest.raises(SettingsError, match="LOCATION_HOLDS") as caught:
        load_settings()
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("name", ["main", "all"])
def test_the_words_of_location_holds_are_not_site_names(name):
    with pytest.raises(SiteError, match="is reserved"):
        SiteSpec(name=name, sitemaps=("https://a.example.com/sitemap.xml",))


def test_location_holds_is_read_at_load_even_beside_another_bad_setting(monkeypatch):
    from rag_pipeline.settings import location_settings

    monkeypatch.setenv("SENSOR_BATCH_SIZE", "0")     # fails the ticks, not the load
    monkeypatch.setenv("LOCATION_HOLDS", "main,docs")
    assert location_settings().holds().describe() == "main,docs"
    monkeypatch.setenv("LOCATION_HOLDS", "main,Docs")   # fails the load: it decides what is defined
    with pytest.raises(SettingsError, match="LOCATION_HOLDS"):
        location_settings().holds()
