"""Vector, lexical and hybrid search on a labelled set (issue 12, point 3): recall@5, recall@10
and MRR over 231 questions about Django 5.2.19's own documentation, whose answering passages are
known (bench/labelled/django_docs.py: error codes, setting and command names, version numbers,
and questions asked in other words than the docs').

The pages (ref, topics, howto, the 5.1 and 5.2 release notes: 255 pages) are delivered as the
crawler delivers them, routed and applied by `apply_batch` with the offline local model (MiniLM,
the default of `make run`), so chunks, vectors and the lexical index are the production ones.
Each question is asked through `retrieve`, as `search` asks it, in each mode, at passage level
(`--per-page` unlimited) and with the default one passage a page. A passage answers a question
when it is of the question's page and its embedded text holds the question's marker. Last line:
`SEARCH_MODES default recall@10=… mrr=… recall@10 hybrid=… vector=… lexical=… mrr hybrid=… (N questions,
M chunks)`: `default` is what `search` returns without options (SEARCH_MODE, SEARCH_PER_PAGE).

    .venv/bin/python bench/search_modes.py [--vector-weight 1] [--lexical-weight 1] [--rrf-k 60]
        [--fusion scores|rrf] [--template] [--docs django|salt]

`--docs salt`: Salt 3008.5's docs (bench/labelled/salt_docs.py, 562 pages) and their labelled
questions, a set no parameter was chosen on; the last line then starts `SEARCH_MODES salt`.

`--template`: each page wrapped in the site template of bench/template_change.py (navigation,
section sidebar, cookie banner, build footer) as a full-page crawl delivers it, the docs declared
as a site so that its batch runs learn the template and cut the pages without it (issue 43: search
with the template is not worse than without it).

The Django source release comes from the package index once (pip download), into
~/.cache/rag-pipeline-bench, checked against its SHA-256.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.database import bench_database  # noqa: E402
from bench.loading import apply_pages  # noqa: E402
from bench.labelled import django_docs, salt_docs  # noqa: E402
from bench.search_quality import pct  # noqa: E402
from rag_pipeline.core.answer_quality import Question, plain  # noqa: E402
from rag_pipeline.core.urls import normalize_url  # noqa: E402
from rag_pipeline.embedders.factory import indexing_chunk_budget  # noqa: E402
from rag_pipeline.embedders.local_embedder import LocalEmbedder  # noqa: E402
from rag_pipeline.query.evaluation import answers  # noqa: E402
from rag_pipeline.query.retrieval import MODES, retrieve  # noqa: E402
from rag_pipeline.settings import Settings  # noqa: E402
from rag_pipeline.core.site_spec import SiteSpec  # noqa: E402
from rag_pipeline.store import db, sites  # noqa: E402

PAGES_PER_BATCH = 50
# The labelled sets: the project's parameters were chosen on Django's; Salt's is the check that
# they hold on docs they were not tuned on (issue 45, point 6).
DOCS = {"django": ("Django", django_docs), "salt": ("Salt", salt_docs)}


def load(url: str, pages: dict[str, str], settings: Settings, embedder: LocalEmbedder) -> int:
    return apply_pages(url, pages.items(), embedder, indexing_chunk_budget(settings, None), per_batch=PAGES_PER_BATCH,
                       report_every=PAGES_PER_BATCH)


def answering(conn, questions: list[django_docs.Question]) -> dict[int, set[str]]:
    """Question number → the keys (page#chunk) of the passages that answer it, by the rules of
    the product's own evaluations (core/answer_quality.py)."""
    labelled = [Question(q.question, normalize_url(q.url), plain(q.marker), q.kind) for q in questions]
    return dict(enumerate(answers(conn, labelled)))


def measure(conn, settings, embedder, questions, truth, mode, per_page):
    ranks, times = [], []
    by_kind = defaultdict(list)
    for n, q in enumerate(questions):
        t0 = time.perf_counter()
        hits = retrieve(conn, settings, q.question, 10, per_page=per_page, mode=mode,
                        embedder_for=lambda _space: embedder)
        times.append((time.perf_counter() - t0) * 1000)
        rank = next((i for i, h in enumerate(hits, 1) if h.key in truth[n]), None)
        ranks.append(rank)
        by_kind[q.kind].append(rank)

    def scores(found):
        return (sum(r is not None and r <= 5 for r in found) / len(found),
                sum(r is not None for r in found) / len(found),
                sum(1 / r for r in found if r is not None) / len(found))

    return scores(ranks), {kind: scores(found) for kind, found in by_kind.items()}, times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vector-weight", type=float, default=None)
    parser.add_argument("--lexical-weight", type=float, default=None)
    parser.add_argument("--rrf-k", type=int, default=None)
    parser.add_argument("--fusion", choices=["scores", "rrf"], default=None, help="SEARCH_FUSION (default: the setting's)")
    parser.add_argument("--template", action="store_true", help="pages wrapped in a site template (issue 43)")
    parser.add_argument("--docs", choices=list(DOCS), default="django",
                        help="the labelled set (django: the one tuned on; salt: never tuned on)")
    args = parser.parse_args()
    title, docs = DOCS[args.docs]
    pages = docs.corpus(docs.fetch())
    if args.template:
        from bench.template_change import template

        wrapper = template(pages, 1)
        pages = {url: wrapper.wrap(url, text) for url, text in pages.items()}
    questions = docs.load_questions()
    print(f"search modes: {title} {docs.RELEASE} docs, {len(pages)} pages, {len(questions)} labelled questions; "
          f"{os.cpu_count()} cores, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    with bench_database("bench_search_modes") as url:
        overrides = {k: v for k, v in (("SEARCH_VECTOR_WEIGHT", args.vector_weight),
                                       ("SEARCH_LEXICAL_WEIGHT", args.lexical_weight),
                                       ("SEARCH_RRF_K", args.rrf_k), ("SEARCH_FUSION", args.fusion)) if v is not None}
        settings = Settings(DATABASE_URL=url, EMBEDDING_PROVIDER="local", **overrides)
        if args.template:
            with db.connection(url) as conn:
                sites.sync_declared(conn, [SiteSpec(name=args.docs, seeds=(docs.BASE_URL,))])
        t0 = time.perf_counter()
        embedder = LocalEmbedder()
        chunks = load(url, pages, settings, embedder)
        print(f"indexed {chunks:,} chunks in {time.perf_counter() - t0:.0f} s (local model, chunks of "
              f"{settings.chunk_budget()[0]} tokens); fusion: vector weight {settings.search_vector_weight}, "
              f"lexical weight {settings.search_lexical_weight}, rrf k {settings.search_rrf_k}", flush=True)
        with db.connection(url) as conn:
            truth = answering(conn, questions)
            unanswerable = [q for n, q in enumerate(questions) if not truth[n]]
            if unanswerable:
                for q in unanswerable[:10]:
                    print(f"  no passage holds the marker {q.marker!r} on {q.url}")
                raise SystemExit(f"FAILED: {len(unanswerable)} questions have no answering passage in the index")
            retrieve(conn, settings, "warm up", 10, mode="vector", embedder_for=lambda _space: embedder)
            results = {}
            for per_page, label in ((None, "passages (no limit a page)"),
                                    ("default", f"the default: at most {settings.search_per_page} passages a page"),
                                    (1, "one passage a page")):
                print(f"\n{label}:")
                print(f"  {'mode':<8} {'recall@5':>8} {'recall@10':>9} {'MRR':>6} {'p50 ms':>7} {'p95 ms':>7}   "
                      "recall@10 by kind")
                for mode in MODES:
                    (r5, r10, mrr), kinds, times = measure(conn, settings, embedder, questions, truth, mode, per_page)
                    results[(mode, per_page)] = (r5, r10, mrr)
                    shown = "  ".join(f"{k} {v[1]:.2f}" for k, v in sorted(kinds.items()))
                    print(f"  {mode:<8} {r5:>8.3f} {r10:>9.3f} {mrr:>6.3f} {pct(times, 50):>7.1f} "
                          f"{pct(times, 95):>7.1f}   {shown}", flush=True)
    best_single = max(results[("vector", None)][1], results[("lexical", None)][1])
    verdict = "≥" if results[("hybrid", None)][1] >= best_single else "<"
    print(f"\nhybrid recall@10 {results[('hybrid', None)][1]:.3f} {verdict} the better single mode's {best_single:.3f}")
    default = results[(settings.search_mode, "default")]
    print(f"default search ({settings.search_mode}, fusion {settings.search_fusion}, at most {settings.search_per_page} "
          f"a page): recall@10 {default[1]:.3f}, MRR {default[2]:.3f}")
    print(f"SEARCH_MODES{'' if args.docs == 'django' else ' ' + args.docs}{' (template)' if args.template else ''} default recall@10={default[1]:.3f} mrr={default[2]:.3f} "
          f"recall@10 hybrid={results[('hybrid', None)][1]:.3f} vector={results[('vector', None)][1]:.3f} "
          f"lexical={results[('lexical', None)][1]:.3f} mrr hybrid={results[('hybrid', None)][2]:.3f} "
          f"vector={results[('vector', None)][2]:.3f} lexical={results[('lexical', None)][2]:.3f} "
          f"({len(questions)} questions, {chunks} chunks)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
