"""A model's window in its own tokens (issue 45): no chunk is embedded past it, and the cut it
adds is made by content, so chunks stay lossless and edit-stable."""

from __future__ import annotations

import pytest

from rag_pipeline.core.chunking import ChunkBudget, Window, chunk_markdown, chunker_signature
from rag_pipeline.core.tokens import count_tokens
from bench.corpus import PageGenerator, render

# A stand-in for a wordpiece tokenizer that reads more tokens than cl100k on code and numbers:
# a token a run of up to 3 letters, each other character one token, plus [CLS] and [SEP].


def _pieces(text: str) -> int:
    n, run = 2, 0
    for ch in text:
        if ch.isalpha():
            run += 1
            if run == 1 or run > 3:
                n, run = n + 1, 1 if run > 3 else run
        else:
            run = 0
            n += 0 if ch.isspace() else 1
    return n


NARROW = Window("test192", 192, _pieces)


def _page(seed: int, tokens: int = 6_000) -> tuple[PageGenerator, list[str]]:
    generator = PageGenerator(seed)
    return generator, generator.page(tokens)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_every_chunk_fits_the_window_and_the_page_is_whole(seed: int) -> None:
    text = render(_page(seed)[1])
    plain = chunk_markdown(text, 160, 32)
    assert any(NARROW.count(c.embed_text) > NARROW.limit for c in plain)   # the window matters here
    fitted = chunk_markdown(text, 160, 32, NARROW)
    assert "".join(c.content for c in fitted) == text
    assert [c.index for c in fitted] == list(range(len(fitted)))
    assert max(NARROW.count(c.embed_text) for c in fitted) <= NARROW.limit
    # Only the chunks that did not fit are cut again: the others are the plain ones.
    assert len(fitted) > len(plain)
    fits = {c.embed_text for c in plain if NARROW.count(c.embed_text) <= NARROW.limit}
    assert len(fits & {c.embed_text for c in fitted}) >= 0.8 * len(fits)


def test_a_window_wide_enough_changes_nothing() -> None:
    text = render(_page(3)[1])
    wide = Window("wide", 10_000, _pieces)
    assert chunk_markdown(text, 160, 32, wide) == chunk_markdown(text, 160, 32)


def test_one_unit_the_window_cannot_read_is_cut_at_its_sentences() -> None:
    sentence = "Call f(x1, y2, z3) with 0x1F, 0x2E and 0x3D set. "
    text = "# Title\n\n" + sentence * 12 + "\n"
    fitted = chunk_markdown(text, 160, 32, NARROW)
    assert "".join(c.content for c in fitted) == text
    assert len(fitted) >= 2
    assert max(NARROW.count(c.embed_text) for c in fitted) <= NARROW.limit
    assert all(c.content.rstrip().endswith(".") for c in fitted)   # whole sentences


def test_text_the_window_can_never_read_is_cut_to_single_tokens_and_kept() -> None:
    # Pathological: no cut can make it fit. Cut as far as tokens go, then kept (the model reads
    # its start), never looped on.
    tiny = Window("tiny", 1, lambda text: len(text) + 2)
    text = "word word word.\n"
    fitted = chunk_markdown(text, 160, 32, tiny)
    assert "".join(c.content for c in fitted) == text
    assert len(fitted) >= 4 and all(count_tokens(c.content) == 1 for c in fitted)


def test_an_edit_still_moves_at_most_the_chunks_near_it() -> None:
    generator, blocks = _page(4, 10_000)
    before = {c.embed_text for c in chunk_markdown(render(blocks), 160, 32, NARROW)}
    paragraphs = [i for i, b in enumerate(blocks) if not b.startswith(("#", "```", "-", "|", ">")) and ". " in b]
    index = paragraphs[len(paragraphs) // 2]
    sentences = blocks[index].split(". ")
    sentences[len(sentences) // 2] = generator.sentence().rstrip(".!?")
    edited = list(blocks)
    edited[index] = ". ".join(sentences)
    after = {c.embed_text for c in chunk_markdown(render(edited), 160, 32, NARROW)}
    assert 1 <= len(after - before) <= 3


def test_the_window_is_part_of_the_signature() -> None:
    assert chunker_signature(160, 32) == chunker_signature(*ChunkBudget(160, 32))
    assert chunker_signature(*ChunkBudget(160, 32, NARROW)) == chunker_signature(160, 32) + "/test192"


def test_the_local_models_window_counts_its_wordpieces_whole() -> None:
    from rag_pipeline.embedders import local_embedder

    window = local_embedder.window()
    assert (window.name, window.limit) == ("wp256", local_embedder.MAX_LENGTH)
    assert window.count("hello world") == 4            # [CLS] hello world [SEP]
    long = "word " * 1000
    assert window.count(long) == 1002                  # not cut at the window: counted whole
    text = render(_page(5)[1])
    assert max(window.count(c.embed_text) for c in chunk_markdown(text, 160, 32, window)) <= 256
