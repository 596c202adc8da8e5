#!/usr/bin/env python3
"""bench_search — memfs BM25 search (SPEC §5) side by side with rank_bm25 and bm25s.

One run, one synthetic corpus, one query set for every engine:

* small: one session of ``--small`` facts (default 10,000) — the per-session query goal
  (p50 < 5 ms);
* large: ``--sessions`` sessions (default 1,000) holding ``--large`` facts in all (default
  1,000,000) — the root query goal (p50 < 50 ms), per-session queries inside that store, the
  update goal (one appended fact < 1 ms) and the memory of the index.

Engines: ``memfs`` (memfs.search.SearchIndex, the formula of §5 with recency);
``rank_bm25`` (BM25Okapi, k1 1.2, b 0.75: its own idf with an epsilon floor, no recency);
``bm25s`` (method "lucene", k1 1.2, b 0.75: the same idf as §5, float32, no recency). All get
memfs's tokens. For quality, each engine's top ``--rerank`` hits are re-scored with the §5
formula (recency included) and re-ranked; the table shows how many of memfs's top 6 they
share, raw and after that re-ranking. Alternatives considered for the engine itself (a pure
Python dict-of-dicts scorer, SQLite FTS5 candidate retrieval) are timed too
(``--no-alternatives`` skips them).

Usage: .venv/bin/python scripts/bench_search.py [--small N] [--large N] [--sessions N]
       [--queries N] [--skip-large] [--no-alternatives] [--seed N]
Speed goals are measured here and never asserted in tests.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sqlite3
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from memfs.search import SearchIndex, tokenize  # noqa: E402
from memfs.search.bm25 import idf, recency_factor, term_score  # noqa: E402

K = 6
NOW = 1_800_000_000.0
DAY = 86400.0
COMMON = ("the a to of in and is for on with it that this was test tests file error fix added "
          "run ran exit build failed passed loop retry cache config update src py json request "
          "timeout value function class module import return call path line output").split()
SYLLABLES = "ka ri to na mo shi lu pe ver da con gra tin bel sor qua xen fi ro dul am ex pre".split()


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def make_vocab(rng: np.random.Generator, size: int) -> list[str]:
    words = list(COMMON)
    seen = set(words)
    while len(words) < size:
        n = int(rng.integers(2, 5))
        w = "".join(SYLLABLES[i] for i in rng.integers(0, len(SYLLABLES), n))
        if rng.random() < 0.15:
            w += str(int(rng.integers(0, 1000)))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def make_facts(rng: np.random.Generator, vocab: list[str], n: int) -> list[str]:
    """Fact-like texts: prose over a Zipf vocabulary, file changes, commands."""
    ranks = np.arange(len(vocab), dtype=np.float64)
    p = 1.0 / (ranks + 2.7) ** 1.07
    p /= p.sum()
    lengths = np.clip(rng.lognormal(2.3, 0.6, n).astype(int), 2, 60)
    words = rng.choice(len(vocab), size=int(lengths.sum()), p=p)
    kinds = rng.random(n)
    out, at = [], 0
    for i in range(n):
        ws = [vocab[j] for j in words[at: at + lengths[i]]]
        at += lengths[i]
        if kinds[i] < 0.15:
            out.append(f"file update: src/{ws[0]}/{ws[-1]}.py")
        elif kinds[i] < 0.30:
            out.append(f"ran pytest -q tests/test_{ws[0]}.py -k {ws[-1]} (exit {i % 3})")
        else:
            out.append(" ".join(ws).capitalize() + ".")
    return out


def make_queries(rng: np.random.Generator, vocab: list[str], n: int) -> list[str]:
    """Half mid-frequency words, half drawn like the corpus (common words included), some
    with a repeated word."""
    queries = []
    for i in range(n):
        m = int(rng.integers(1, 4))
        if i % 2:
            ws = [vocab[int(j)] for j in rng.integers(40, 5000, m)]
        else:
            ws = [vocab[int(j)] for j in np.minimum(rng.zipf(1.3, m) - 1 + rng.integers(0, 40, m), len(vocab) - 1)]
        if i % 5 == 0:
            ws.append(ws[0])
        queries.append(" ".join(ws))
    return queries


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def timed(fn, *args, **kwargs):
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, (time.perf_counter() - t) * 1e3


class Corpus:
    """Token lists and per-document session data, for the other engines and the re-ranking."""

    def __init__(self, sessions: dict[str, tuple[float | None, list[str]]]):
        self.names, self.created, self.local, self.tokens = [], [], [], []
        for name, (created, texts) in sessions.items():
            for i, text in enumerate(texts):
                self.names.append(name)
                self.created.append(created)
                self.local.append(i)
                self.tokens.append(tokenize(text))
        self.n = len(self.tokens)
        self.avgdl = sum(map(len, self.tokens)) / self.n
        self.df: dict[str, int] = {}
        for toks in self.tokens:
            for t in set(toks):
                self.df[t] = self.df.get(t, 0) + 1

    def chunk_id(self, i: int) -> str:
        return f"{self.names[i]}:{self.local[i]}"

    def our_score(self, i: int, q: list[str]) -> float:
        toks = self.tokens[i]
        s = 0.0
        for t in q:
            tf = toks.count(t)
            if tf:
                s += term_score(idf(self.n, self.df[t]), float(tf), float(len(toks)), self.avgdl)
        return s * recency_factor(self.created[i], NOW) if s > 0 else 0.0

    def rerank(self, ids, q: list[str]) -> list[str]:
        scored = [(-self.our_score(int(i), q), self.chunk_id(int(i))) for i in ids]
        return [c for s, c in sorted(scored) if s < 0][:K]


def overlap(theirs: list[str], ours: list[str]) -> float | None:
    """Share of memfs's top K that the other list's top K holds (None: memfs found nothing)."""
    if not ours:
        return None
    return len(set(theirs[:K]) & set(ours[:K])) / len(ours[:K])


def mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.mean(values) if values else None


def row(table, engine, build_s, lat, raw=None, reranked=None, mem=None):
    table.append((engine, build_s, pct(lat, 0.5), pct(lat, 0.95),
                  None if raw is None else mean(raw), None if reranked is None else mean(reranked), mem))


def print_table(title: str, table: list) -> None:
    print(f"\n{title}")
    head = f"{'engine':<34}{'build s':>9}{'p50 ms':>10}{'p95 ms':>10}{'top6 raw':>10}{'top6 rr':>9}{'memory':>12}"
    print(head)
    print("-" * len(head))
    for engine, build_s, p50, p95, raw, rr, mem in table:
        f = lambda v, fmt: ("n/a" if v is None else format(v, fmt))  # noqa: E731
        memtxt = "n/a" if mem is None else f"{mem / 2**20:.0f} MiB"
        print(f"{engine:<34}{f(build_s, '.1f'):>9}{f(p50, '.2f'):>10}{f(p95, '.2f'):>10}"
              f"{f(raw, '.2f'):>10}{f(rr, '.2f'):>9}{memtxt:>12}")


def bench_memfs(sessions, queries, scope):
    index = SearchIndex()
    gc.collect()
    before = rss_bytes()
    t = time.perf_counter()
    for name, (created, texts) in sessions.items():
        index.set_session(name, f"id-{name}", created,
                          [{"fact": x, "turn": None, "offset": None} for x in texts])
    build_s = time.perf_counter() - t
    gc.collect()
    mem = rss_bytes() - before
    tops, lat = [], []
    for q in queries:
        res, ms = timed(index.search, q, sessions=scope, max_results=K, now=NOW)
        lat.append(ms)
        tops.append([r["chunk_id"] for r in res])
    return index, build_s, lat, tops, mem


def bench_bm25s(corpus: Corpus, queries, tops):
    import bm25s

    gc.collect()
    before = rss_bytes()
    t = time.perf_counter()
    model = bm25s.BM25(k1=1.2, b=0.75, method="lucene")
    model.index(corpus.tokens, show_progress=False)
    build_s = time.perf_counter() - t
    mem = rss_bytes() - before
    vocab = model.vocab_dict
    lat, raw, rr = [], [], []
    for q, ours in zip(queries, tops):
        qt = [x for x in tokenize(q) if x in vocab]
        if not qt:
            continue
        t = time.perf_counter()
        docs, _scores = model.retrieve([qt], k=min(RERANK, corpus.n), show_progress=False, n_threads=1)
        lat.append((time.perf_counter() - t) * 1e3)
        ids = docs[0]
        raw.append(overlap([corpus.chunk_id(int(i)) for i in ids[:K]], ours))
        rr.append(overlap(corpus.rerank(ids, tokenize(q)), ours))
    del model
    return build_s, lat, raw, rr, mem


def bench_rank_bm25(corpus: Corpus, queries, tops, limit=None):
    from rank_bm25 import BM25Okapi

    gc.collect()
    before = rss_bytes()
    t = time.perf_counter()
    model = BM25Okapi(corpus.tokens, k1=1.2, b=0.75)
    build_s = time.perf_counter() - t
    mem = rss_bytes() - before
    lat, raw, rr = [], [], []
    for q, ours in list(zip(queries, tops))[:limit]:
        t = time.perf_counter()
        scores = model.get_scores(tokenize(q))
        ids = np.argsort(-scores, kind="stable")[:RERANK]
        lat.append((time.perf_counter() - t) * 1e3)
        ids = [i for i in ids if scores[i] != 0]
        raw.append(overlap([corpus.chunk_id(int(i)) for i in ids[:K]], ours))
        rr.append(overlap(corpus.rerank(ids, tokenize(q)), ours))
    del model
    return build_s, lat, raw, rr, mem


def bench_pure_python(corpus: Corpus, queries, limit=None):
    """Alternative engine: token → {doc: tf}, scored by a Python loop (same formula)."""
    t = time.perf_counter()
    postings: dict[str, dict[int, int]] = {}
    for i, toks in enumerate(corpus.tokens):
        counts: dict[str, int] = {}
        for x in toks:
            counts[x] = counts.get(x, 0) + 1
        for x, tf in counts.items():
            postings.setdefault(x, {})[i] = tf
    dl = [len(x) for x in corpus.tokens]
    factors = [recency_factor(c, NOW) for c in corpus.created]
    build_s = time.perf_counter() - t
    lat = []
    for q in queries[:limit]:
        t = time.perf_counter()
        acc: dict[int, float] = {}
        for x in tokenize(q):
            p = postings.get(x)
            if not p:
                continue
            w = idf(corpus.n, len(p))
            norm = 1.2 * 0.25
            scale = 1.2 * 0.75 / max(corpus.avgdl, 1.0)
            for d, tf in p.items():
                acc[d] = acc.get(d, 0.0) + w * tf * 2.2 / (tf + norm + scale * dl[d])
        ranked = sorted(((s * factors[d], d) for d, s in acc.items()), reverse=True)[:K]
        lat.append((time.perf_counter() - t) * 1e3)
        del ranked
    del postings
    return build_s, lat


def bench_fts5(corpus: Corpus, queries, limit=None):
    """Alternative engine: SQLite FTS5 as the candidate source. Timed: fetching the candidate
    rowids only — a lower bound, since each candidate would still need the §5 score."""
    db = sqlite3.connect(":memory:")
    t = time.perf_counter()
    db.execute("CREATE VIRTUAL TABLE f USING fts5(body, tokenize='unicode61 remove_diacritics 0')")
    db.executemany("INSERT INTO f(rowid, body) VALUES (?, ?)",
                   ((i, " ".join(toks)) for i, toks in enumerate(corpus.tokens)))
    db.commit()
    build_s = time.perf_counter() - t
    lat = []
    for q in queries[:limit]:
        terms = " OR ".join('"' + x + '"' for x in dict.fromkeys(tokenize(q)))
        t = time.perf_counter()
        rows = db.execute("SELECT rowid FROM f WHERE f MATCH ?", (terms,)).fetchall()
        lat.append((time.perf_counter() - t) * 1e3)
        del rows
    db.close()
    return build_s, lat


RESULTS: dict[str, dict] = {}  # what --json writes, by table title


def compare(title, sessions, queries, args, scope=None, heavy_limit=None):
    table = []
    index, build_s, lat, tops, mem = bench_memfs(sessions, queries, scope)
    row(table, "memfs (numpy postings, §5+recency)", build_s, lat, mem=mem)
    corpus = Corpus(sessions)
    b = bench_bm25s(corpus, queries, tops)
    row(table, "bm25s lucene (no recency)", b[0], b[1], raw=b[2], reranked=b[3], mem=b[4])
    r = bench_rank_bm25(corpus, queries, tops, limit=heavy_limit)
    row(table, "rank_bm25 Okapi (no recency)", r[0], r[1], raw=r[2], reranked=r[3], mem=r[4])
    if args.alternatives:
        p = bench_pure_python(corpus, queries, limit=heavy_limit)
        row(table, "alt: pure-Python dict postings", p[0], p[1])
        f = bench_fts5(corpus, queries, limit=heavy_limit)
        row(table, "alt: FTS5 candidates only", f[0], f[1])
    print_table(title, table)
    RESULTS[title] = {"memfs_p50_ms": pct(lat, .5), "memfs_p99_ms": pct(lat, .99),
                      "bm25s_p50_ms": pct(b[1], .5), "rank_bm25_p50_ms": pct(r[1], .5), "memfs_build_s": build_s}
    n_heavy = len(queries) if heavy_limit is None else min(heavy_limit, len(queries))
    print(f"  {len(queries)} queries; rank_bm25 and the alternatives on the first {n_heavy}. "
          f"top6 raw / rr: mean share of memfs's top {K} found in the engine's own top {K} / in "
          f"its top {RERANK} re-ranked by the §5 formula (queries memfs finds nothing for skipped). memory: RSS growth while building.")
    del corpus
    gc.collect()
    return index


def bench_updates(index: SearchIndex, name: str, rng, vocab, n=2000):
    """One appended fact → searchable: extend_session, and sync_session as the mount calls it."""
    texts = make_facts(rng, vocab, 2 * n)
    ext = []
    for text in texts[:n]:
        _, ms = timed(index.extend_session, name, [{"fact": text, "turn": None, "offset": None}])
        ext.append(ms)
    count = index.session_fact_count(name)
    facts = [{"fact": f"placeholder {i}", "turn": None, "offset": None} for i in range(count)]
    index.set_session(name, f"id-{name}", NOW, facts, generation=0)
    sync = []
    for text in texts[n:]:
        facts.append({"fact": text, "turn": None, "offset": None})
        _, ms = timed(index.sync_session, name, f"id-{name}", NOW, facts, generation=0)
        sync.append(ms)
    hits = index.search(texts[-1], sessions=[name], max_results=1000, now=NOW)
    assert f"{name}:{len(facts) - 1}" in {r["chunk_id"] for r in hits}, "appended fact not found"
    return ext, sync


RERANK = 60


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", type=int, default=10_000)
    ap.add_argument("--large", type=int, default=1_000_000)
    ap.add_argument("--sessions", type=int, default=1_000)
    ap.add_argument("--queries", type=int, default=60)
    ap.add_argument("--heavy-queries", type=int, default=12,
                    help="queries for rank_bm25 and the alternatives at the large scale")
    ap.add_argument("--rerank", type=int, default=RERANK)
    ap.add_argument("--vocab", type=int, default=60_000)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--skip-large", action="store_true")
    ap.add_argument("--no-alternatives", dest="alternatives", action="store_false")
    ap.add_argument("--json", help="also write results and goals here (for scripts/bench.py)")
    args = ap.parse_args()
    try:
        run(args)
    finally:
        if args.json:
            write_json(args)


def write_json(args) -> None:
    goals = {}
    for title, r in RESULTS.items():
        if title.startswith("per-session"):
            goals[f"search: per-session p50 < 5 ms at {args.small:,} facts"] = {
                "measured": f"{r['memfs_p50_ms']:.2f} ms", "met": r["memfs_p50_ms"] < 5}
        elif title.startswith("root"):
            goals[f"search: root p50 < 50 ms at {args.large:,} facts"] = {
                "measured": f"{r['memfs_p50_ms']:.2f} ms", "met": r["memfs_p50_ms"] < 50}
    if "update_p50_ms" in UPDATES:
        goals["search: index update after one fact < 1 ms"] = {
            "measured": f"{UPDATES['update_p50_ms']:.3f} ms", "met": UPDATES["update_p50_ms"] < 1}
    Path(args.json).write_text(json.dumps({"results": RESULTS | {"updates": UPDATES}, "goals": goals}, indent=2))


UPDATES: dict[str, float] = {}


def run(args) -> None:
    global RERANK
    RERANK = args.rerank
    rng = np.random.default_rng(args.seed)
    vocab = make_vocab(rng, args.vocab)
    queries = make_queries(rng, vocab, args.queries)
    print(f"bench_search: python {sys.version.split()[0]}, numpy {np.__version__}, "
          f"{os.cpu_count()} cpus; {len(queries)} queries, e.g. {queries[:4]}")

    small = {"solo": (NOW - 3 * DAY, make_facts(rng, vocab, args.small))}
    index = compare(f"per-session query, one session of {args.small:,} facts (goal p50 < 5 ms)",
                    small, queries, args, scope=["solo"])
    ext, sync = bench_updates(index, "solo", rng, vocab)
    UPDATES["update_p50_ms"] = pct(sync, .5)
    print(f"  update, one appended fact (goal < 1 ms): extend_session p50 {pct(ext, .5):.3f} ms, "
          f"p99 {pct(ext, .99):.3f} ms; sync_session p50 {pct(sync, .5):.3f} ms, p99 {pct(sync, .99):.3f} ms")
    del index, small
    if args.skip_large:
        return

    per = args.large // args.sessions
    facts = make_facts(rng, vocab, per * args.sessions)
    ages = rng.uniform(-2, 200, args.sessions)
    large = {f"s{i:04d}": (NOW - ages[i] * DAY, facts[i * per:(i + 1) * per]) for i in range(args.sessions)}
    del facts
    index = compare(f"root query, {per * args.sessions:,} facts in {args.sessions:,} sessions (goal p50 < 50 ms)",
                    large, queries, args, heavy_limit=args.heavy_queries)
    lat = [timed(index.search, q, sessions=[f"s{(7 * i) % args.sessions:04d}"], now=NOW)[1]
           for i, q in enumerate(queries)]
    print(f"  per-session query inside that store: p50 {pct(lat, .5):.2f} ms, p95 {pct(lat, .95):.2f} ms")
    ext, sync = bench_updates(index, "s0001", rng, vocab, n=1000)
    print(f"  update, one appended fact: extend_session p50 {pct(ext, .5):.3f} ms, p99 {pct(ext, .99):.3f} ms; "
          f"sync_session p50 {pct(sync, .5):.3f} ms, p99 {pct(sync, .99):.3f} ms")
    st = index.stats()
    print(f"  index at {st['docs']:,} facts: {st['postings']:,} postings, {st['vocabulary']:,} tokens; "
          f"structures {st['index_bytes'] / 2**20:.0f} MiB (getsizeof), stored fact texts "
          f"{st['fact_bytes'] / 2**20:.0f} MiB; RSS growth while building: see the memfs row")


if __name__ == "__main__":
    main()
