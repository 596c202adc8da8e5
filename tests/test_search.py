"""BM25 search (SPEC §5): tokenizer, formula, recency, ordering, incremental index.

Scores are compared with an independent, deliberately plain implementation written here
(per-character tokenizer, per-document loops), not with the index's own helpers.
"""

from __future__ import annotations

import math
import random
import re
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from memfs.search import MAX_QUERY_TOKENS, MAX_RESULTS, SearchIndex, query_tokens, recency_factor, tokenize
from memfs.search import index as index_module

DAY = 86400.0
NOW = 1_800_000_000.0
RESULT_FIELDS = {"chunk_id", "session_id", "score", "snippet", "path", "start_line", "end_line",
                 "source", "created_at", "turn", "offset"}


# --- the independent reference ------------------------------------------------------------

def ref_tokenize(text: str) -> list[str]:
    tokens, current = [], []
    for ch in text:
        if ch.isalnum():
            current.append(ch.lower())
        elif current:
            tokens.append("".join(current))
            current = []
    if current:
        tokens.append("".join(current))
    return tokens


def ref_search(sessions: dict, query: str, *, only=None, k=6, min_score=0.0, now=NOW) -> list[tuple[str, float]]:
    """sessions: name → (created_at or None, [fact text]). Returns [(chunk_id, score)]."""
    docs = []
    for name, (created, texts) in sessions.items():
        if only is not None and name not in only:
            continue
        for i, text in enumerate(texts):
            docs.append((f"{name}:{i}", ref_tokenize(text), created))
    q = ref_tokenize(query)[:MAX_QUERY_TOKENS]
    n = len(docs)
    if n == 0 or not q:
        return []
    avgdl = sum(len(toks) for _, toks, _ in docs) / n
    k1, b = 1.2, 0.75
    out = []
    for chunk_id, toks, created in docs:
        dl = len(toks)
        score = 0.0
        for t in q:
            tf = toks.count(t)
            if tf == 0:
                continue
            df = sum(1 for _, other, _ in docs if t in other)
            idf_t = math.log(1 + (n - df + 0.5) / (df + 0.5))
            score += idf_t * tf * (k1 + 1) / (tf + k1 * (1 - b + b * dl / max(avgdl, 1)))
        if score <= 0:
            continue
        if created is None:
            factor = 1.0
        else:
            age_days = max(0.0, now - created) / DAY
            factor = 1 + 0.15 * 0.5 ** (age_days / 30)
        score *= factor
        if score < min_score:
            continue
        out.append((chunk_id, score))
    out.sort(key=lambda r: (-r[0 + 1], r[0]))
    return out[:k]


def build(sessions: dict) -> SearchIndex:
    index = SearchIndex()
    for name, (created, texts) in sessions.items():
        index.set_session(name, f"id-{name}", created, facts(texts))
    return index


def facts(texts, start=0):
    return [{"fact": t, "turn": i // 3 + 1, "offset": 100 * i, "type": "agent_message"}
            for i, t in enumerate(texts, start)]


def assert_same(results: list[dict], expected: list[tuple[str, float]]) -> None:
    assert [r["chunk_id"] for r in results] == [c for c, _ in expected]
    for r, (_, score) in zip(results, expected):
        assert abs(r["score"] - score) <= 1e-9


WORDS = ["retry", "loop", "Retry", "LOOP", "net", "src/net.py", "exit", "0", "pytest", "café",
         "naïve", "重试", "循环", "timeout", "the", "a", "error:", "fix", "HTTP", "cache", "x1",
         "Δ", "ΟΔΟΣ", "value=42", "(ok)", "failed", "build", "ran", "tests"]


def random_corpus(rng: random.Random, sessions: int, per_session: int) -> dict:
    corpus = {}
    for s in range(sessions):
        texts = []
        for _ in range(per_session):
            n = rng.randint(0, 14)
            texts.append(" ".join(rng.choice(WORDS) for _ in range(n)) + rng.choice(["", ".", "!", " —"]))
        created = None if s == 0 else NOW - rng.uniform(-5, 120) * DAY
        corpus[f"s{s}"] = (created, texts)
    return corpus


# --- tokenizer ----------------------------------------------------------------------------

def test_tokenizer_splits_on_everything_but_alphanumerics():
    assert tokenize("Added the retry-loop, (src/net.py)!") == ["added", "the", "retry", "loop", "src", "net", "py"]
    assert tokenize("snake_case and   tabs\tand\nnewlines") == ["snake", "case", "and", "tabs", "and", "newlines"]
    assert tokenize("") == [] and tokenize("?!… — ") == []


def test_tokenizer_lowercases_mixed_case_and_keeps_duplicates():
    assert tokenize("HTTPServer retry RETRY Retry") == ["httpserver", "retry", "retry", "retry"]


def test_tokenizer_accents_and_full_unicode_lowercase():
    assert tokenize("Café NAÏVE Ångström") == ["café", "naïve", "ångström"]
    assert tokenize("STRAẞE") == ["straße"]
    assert tokenize("İstanbul") == ["i\u0307stanbul"]  # full lowercase: two characters
    # per-character lowercase: a capital sigma is always σ (no final-sigma context rule)
    assert tokenize("ΟΔΟΣ") == ["οδοσ"]
    # a decomposed accent is a combining mark, not alphanumeric: it ends the token
    assert tokenize("cafe\u0301 ok") == ["cafe", "ok"]


def test_tokenizer_cjk_runs_and_digits():
    assert tokenize("重试循环 added") == ["重试循环", "added"]
    assert tokenize("日本語テキストabc、中文。") == ["日本語テキストabc", "中文"]
    assert tokenize("exit 0; v1.2.3 took 12ms") == ["exit", "0", "v1", "2", "3", "took", "12ms"]
    assert tokenize("١٢٣ x² ½") == ["١٢٣", "x²", "½"]


def test_tokenizer_alphanumeric_class_is_exactly_isalnum():
    pattern = re.compile(r"[^\W_]")
    mismatched = [c for c in range(sys.maxunicode + 1) if chr(c).isalnum() != bool(pattern.match(chr(c)))]
    assert mismatched == []


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_tokenizer_matches_the_character_walk(text):
    assert tokenize(text) == ref_tokenize(text)


def test_query_is_cut_to_the_maximum_number_of_tokens():
    long_query = " ".join(f"w{i}" for i in range(10_000))
    assert query_tokens(long_query) == [f"w{i}" for i in range(MAX_QUERY_TOKENS)]
    index = build({"s": (None, ["w0 w1", f"w{MAX_QUERY_TOKENS + 5}", "w9999"])})
    results = index.search(long_query, max_results=10, now=NOW)
    assert [r["chunk_id"] for r in results] == ["s:0"]
    assert results == index.search(" ".join(f"w{i}" for i in range(MAX_QUERY_TOKENS)), max_results=10, now=NOW)


# --- the formula --------------------------------------------------------------------------

def test_scores_equal_an_independent_implementation():
    rng = random.Random(5)
    corpus = random_corpus(rng, sessions=4, per_session=120)  # 480 facts
    index = build(corpus)
    queries = ["retry loop", "retry retry loop", "RETRY the the loop loop", "café naïve 重试",
               "src net py exit 0", "ΟΔΟΣ δ", "failed build failed tests ran", "value 42 ok",
               "http cache timeout x1 a the", "nothing-matches-this"]
    for q in queries:
        assert_same(index.search(q, max_results=MAX_RESULTS, now=NOW), ref_search(corpus, q, k=MAX_RESULTS))
        for name in corpus:
            assert_same(index.search(q, sessions=[name], max_results=MAX_RESULTS, now=NOW),
                        ref_search(corpus, q, only={name}, k=MAX_RESULTS))
        assert_same(index.search(q, sessions=["s1", "s3"], max_results=MAX_RESULTS, now=NOW),
                    ref_search(corpus, q, only={"s1", "s3"}, k=MAX_RESULTS))


def test_result_fields():
    index = SearchIndex()
    index.set_session("sess-1", "sess/1 raw", NOW - 0.5, [{"fact": "Added the retry loop.", "turn": 1,
                                                         "offset": 87, "type": "agent_message"}])
    (r,) = index.search("retry loop", now=NOW)
    assert set(r) == RESULT_FIELDS
    assert r["chunk_id"] == "sess-1:0" and r["session_id"] == "sess/1 raw"
    assert r["snippet"] == "Added the retry loop." and r["path"] == "sessions/sess-1/derived/memory.json"
    assert (r["start_line"], r["end_line"], r["source"]) == (0, 0, "session")
    assert r["created_at"] == NOW - 0.5
    assert (r["turn"], r["offset"]) == (1, 87)
    assert isinstance(r["score"], float)
    index.set_session("sess-1", "sess/1 raw", NOW, [{"fact": "retry", "turn": None, "offset": None}])
    (r,) = index.search("retry", now=NOW)
    assert r["created_at"] == int(NOW) and isinstance(r["created_at"], int)
    assert (r["turn"], r["offset"]) == (None, None)


def test_empty_and_tokenless_queries_find_nothing():
    index = build({"s": (None, ["retry loop"])})
    assert index.search("", now=NOW) == []
    assert index.search("?!— …", now=NOW) == []
    assert SearchIndex().search("retry", now=NOW) == []


# --- recency ------------------------------------------------------------------------------

def test_recency_factor_values():
    assert recency_factor(None, NOW) == 1.0
    assert recency_factor(NOW, NOW) == pytest.approx(1.15, abs=1e-15)
    assert recency_factor(NOW + 10 * DAY, NOW) == pytest.approx(1.15, abs=1e-15)
    assert recency_factor(NOW - 30 * DAY, NOW) == pytest.approx(1.075, abs=1e-15)
    assert recency_factor(NOW - 60 * DAY, NOW) == pytest.approx(1.0375, abs=1e-15)


@pytest.mark.parametrize("created, factor", [(None, 1.0), (NOW - 30 * DAY, 1.075), (NOW + 5 * DAY, 1.15),
                                             (NOW, 1.15), (NOW - 90 * DAY, 1.01875)])
def test_recency_multiplies_the_bm25_score(created, factor):
    texts = ["retry loop in net", "the loop", "unrelated"]
    base = build({"s": (None, texts)}).search("retry loop", max_results=10, now=NOW)
    dated = build({"s": (created, texts)}).search("retry loop", max_results=10, now=NOW)
    assert [r["chunk_id"] for r in dated] == [r["chunk_id"] for r in base]
    for plain, r in zip(base, dated):
        assert abs(r["score"] - plain["score"] * factor) <= 1e-9


def test_recency_reorders_sessions():
    corpus = {"old": (NOW - 300 * DAY, ["retry loop"]), "new": (NOW - 1 * DAY, ["retry loop"])}
    results = build(corpus).search("retry", now=NOW)
    assert [r["chunk_id"] for r in results] == ["new:0", "old:0"]
    assert_same(results, ref_search(corpus, "retry"))


# --- ordering, cut-offs -------------------------------------------------------------------

def test_ties_are_broken_by_chunk_id_as_a_string():
    index = build({"s": (None, ["retry"] * 12), "b": (None, ["retry"]), "a": (None, ["retry"])})
    results = index.search("retry", sessions=["s"], now=NOW)
    assert [r["chunk_id"] for r in results] == ["s:0", "s:1", "s:10", "s:11", "s:2", "s:3"]
    assert len({r["score"] for r in results}) == 1
    results = index.search("retry", max_results=3, now=NOW)
    assert [r["chunk_id"] for r in results] == ["a:0", "b:0", "s:0"]


def test_min_score_is_applied_after_recency():
    texts = ["retry loop", "loop", "other words here"]
    plain = build({"s": (None, texts)}).search("retry loop", max_results=10, now=NOW)
    top = plain[0]["score"]
    fresh = build({"s": (NOW, texts)})
    # below the threshold without recency, above it with the 1.15 factor
    threshold = top * 1.1
    kept = fresh.search("retry loop", min_score=threshold, max_results=10, now=NOW)
    assert [r["chunk_id"] for r in kept] == ["s:0"]
    assert kept[0]["score"] >= threshold
    assert build({"s": (None, texts)}).search("retry loop", min_score=threshold, now=NOW) == []
    # equal to min_score is kept ("drop results below")
    exact = fresh.search("retry loop", min_score=kept[0]["score"], now=NOW)
    assert [r["chunk_id"] for r in exact] == ["s:0"]


def test_max_results():
    index = build({"s": (None, [f"retry {i}" for i in range(20)])})
    assert len(index.search("retry", now=NOW)) == 6  # default
    assert len(index.search("retry", max_results=3, now=NOW)) == 3
    assert len(index.search("retry", max_results=50, now=NOW)) == 20
    assert index.search("retry", max_results=0, now=NOW) == []
    big = build({"s": (None, [f"retry {i}" for i in range(MAX_RESULTS + 10)])})
    assert len(big.search("retry", max_results=10 * MAX_RESULTS, now=NOW)) == MAX_RESULTS


def test_per_session_and_root_corpus_statistics_differ():
    corpus = {"a": (None, ["retry loop", "retry", "retry again", "unrelated"]),
              "b": (None, ["retry loop", "build failed", "tests ran", "cache miss", "net timeout"])}
    index = build(corpus)
    root = {r["chunk_id"]: r["score"] for r in index.search("retry loop", max_results=20, now=NOW)}
    only_b = {r["chunk_id"]: r["score"] for r in index.search("retry loop", sessions=["b"], max_results=20, now=NOW)}
    assert set(only_b) == {"b:0"}
    assert index.search("retry loop", sessions="b", now=NOW) == index.search("retry loop", sessions=["b"], now=NOW)
    assert abs(only_b["b:0"] - dict(ref_search(corpus, "retry loop", only={"b"}))["b:0"]) <= 1e-9
    assert abs(root["b:0"] - dict(ref_search(corpus, "retry loop", k=20))["b:0"]) <= 1e-9
    # "retry" is rare in b alone but common across both: its idf (and so the score) differs
    assert only_b["b:0"] > root["b:0"] + 0.1
    assert index.search("retry", sessions=["nope"], now=NOW) == []


# --- incremental updates ------------------------------------------------------------------

def test_extend_makes_a_new_fact_searchable_at_once():
    corpus = {"a": (NOW - DAY, ["retry loop", "build failed"]), "b": (None, ["tests ran"])}
    index = build(corpus)
    assert index.search("flaky", now=NOW) == []
    index.extend_session("a", facts(["fixed the flaky test"], start=2))
    corpus["a"][1].append("fixed the flaky test")
    (r,) = index.search("flaky", now=NOW)
    assert (r["chunk_id"], r["turn"], r["offset"]) == ("a:2", 1, 200)
    for q in ("retry loop flaky", "the test", "tests"):
        assert_same(index.search(q, max_results=20, now=NOW), ref_search(corpus, q, k=20))
        assert_same(index.search(q, sessions=["a"], max_results=20, now=NOW), ref_search(corpus, q, only={"a"}, k=20))
    with pytest.raises(KeyError):
        index.extend_session("missing", facts(["x"]))


def test_replace_and_remove_sessions(monkeypatch):
    monkeypatch.setattr(index_module, "_COMPACT_MIN_DEAD", 0)  # compact as soon as dead > live
    rng = random.Random(7)
    corpus = random_corpus(rng, sessions=3, per_session=30)
    index = build(corpus)
    for round_ in range(6):
        name = f"s{round_ % 3}"
        corpus[name] = (NOW - round_ * DAY, random_corpus(rng, 1, 25 + round_)["s0"][1])
        index.set_session(name, f"id-{name}", corpus[name][0], facts(corpus[name][1]))
        for q in ("retry loop", "the failed build", "café 重试"):
            assert_same(index.search(q, max_results=MAX_RESULTS, now=NOW), ref_search(corpus, q, k=MAX_RESULTS))
    index.remove_session("s1")
    del corpus["s1"]
    index.remove_session("s1")  # twice is fine
    assert sorted(index.sessions()) == ["s0", "s2"]
    for q in ("retry loop", "the failed build"):
        assert_same(index.search(q, max_results=MAX_RESULTS, now=NOW), ref_search(corpus, q, k=MAX_RESULTS))
        assert_same(index.search(q, sessions=["s2"], max_results=MAX_RESULTS, now=NOW),
                    ref_search(corpus, q, only={"s2"}, k=MAX_RESULTS))
    stats = index.stats()
    assert stats["docs"] == sum(len(t) for _, t in corpus.values())
    assert stats["dead_docs"] <= stats["docs"]


def test_sync_session_extends_refreshes_or_reindexes():
    index = SearchIndex()
    fs = facts(["retry loop", "build failed"])
    index.sync_session("a", "id-a", None, fs, generation=0)
    fs = fs + facts(["flaky test"], start=2)
    index.sync_session("a", "id-a", None, fs, generation=0)
    assert index.session_fact_count("a") == 3
    assert [r["chunk_id"] for r in index.search("flaky", now=NOW)] == ["a:2"]
    # a cap rewrite: same texts, new offsets → offsets refreshed
    moved = [dict(f, offset=f["offset"] + 7) for f in fs]
    index.sync_session("a", "id-a", NOW, moved, generation=1)
    (r,) = index.search("flaky", now=NOW)
    assert r["offset"] == 207 and r["created_at"] == int(NOW)
    # different texts → reindexed from scratch
    index.sync_session("a", "id-a", None, facts(["something else entirely"]), generation=1)
    assert index.search("flaky", now=NOW) == []
    assert [r["chunk_id"] for r in index.search("else", now=NOW)] == ["a:0"]


def test_fact_without_tokens_counts_in_the_corpus():
    corpus = {"s": (None, ["— …", "retry loop", "loop"])}
    assert_same(build(corpus).search("loop", now=NOW), ref_search(corpus, "loop"))
