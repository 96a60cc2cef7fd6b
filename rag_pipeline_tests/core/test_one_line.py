"""A reason shortened for a table cell is cut at a word, never inside one."""

from rag_pipeline.core.one_line import shorten

REFUSED = ("http://127.0.0.1:8900/robots.txt: refused http://127.0.0.1:8900/robots.txt: 127.0.0.1 resolves "
           "to 127.0.0.1 is a loopback address; set CRAWLER_ALLOW_NETWORKS to crawl it")


def test_a_reason_that_fits_is_whole_on_one_line():
    assert shorten("a\nb  c", 240) == "a b c"
    assert shorten(REFUSED, 240) == REFUSED


def test_a_long_reason_is_cut_at_a_word_with_an_ellipsis():
    cut = shorten(REFUSED, 120)
    assert len(cut) <= 120 and cut.endswith("…")
    assert cut.removesuffix("…") == REFUSED[:len(cut) - 1].rstrip(" ,;:")
    assert REFUSED[len(cut.removesuffix("…"))] in " ;,:"   # the next character is not a letter of the word


def test_one_word_longer_than_the_width_is_cut_where_it_must():
    assert shorten("x" * 50, 10) == "x" * 9 + "…"
