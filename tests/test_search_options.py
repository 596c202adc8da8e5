"""The search options of SPEC §5.1: stemming and stopwords, the output corpus, the filters,
one result per session — through the library, ``memfs search`` and a real mount."""

from __future__ import annotations

import errno
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import Stemmer
from memfs import open_session
from memfs.errors import BadQuery
from memfs.facts import OUTPUT_HEAD, OUTPUT_TAIL
from memfs.search import SearchOptions, parse_options, search_store, store_searcher
from memfs.store.root import Store

from mounting import HAVE_FUSE, event, mounted, sh

FIXTURES = Path(__file__).parent / "fixtures" / "agents"
K1, B = 1.2, 0.75
ENGLISH = Stemmer.Stemmer("english")


def turn(handle, *items, failed: bool = False, at: str | None = None) -> None:
    """One turn of ``items`` (item dicts, or texts as agent messages)."""
    handle.append(event("turn.started", **({"context": {"timestamp": at}} if at else {})))
    for i, item in enumerate(items):
        if isinstance(item, str):
            item = {"id": f"m{i}", "type": "agent_message", "text": item}
        handle.append(event("item.completed", item=item))
    if failed:
        handle.append(event("turn.failed", message="the turn failed"))
    else:
        handle.append(event("turn.completed", usage={"input_tokens": 1}))


def command(output: str, cmd: str = "make build", code: int = 0) -> dict:
    return {"id": "c1", "type": "command_execution", "command": cmd, "status": "completed" if code == 0 else "failed",
            "aggregated_output": output, "exit_code": code}


# --- an independent computation of the formula -----------------------------------------------

def words(text: str) -> list[str]:
    out, cur = [], []
    for c in text:
        if c.isalnum():
            cur.append(c.lower())
        elif cur:
            out.append("".join(cur))
            cur = []
    if cur:
        out.append("".join(cur))
    return out


def expected_scores(docs: dict[str, str], query: str, stem: bool, created_at: float | None,
                    now: float | None = None) -> dict[str, float]:
    """``{chunk_id: score}`` of SPEC §5's formula over ``docs`` (the whole corpus) at ``now``."""
    def analyse(text):
        tokens = words(text)
        return [ENGLISH.stemWord(t) for t in tokens] if stem else tokens

    tokens = {cid: analyse(text) for cid, text in docs.items()}
    n = len(docs)
    avgdl = sum(len(t) for t in tokens.values()) / n
    q = analyse(query)
    now = time.time() if now is None else now
    factor = 1.0 if created_at is None else 1 + 0.15 * 0.5 ** (max(now - created_at, 0) / 86400 / 30)
    out = {}
    for cid, toks in tokens.items():
        score = 0.0
        for t in q:
            tf = toks.count(t)
            if tf:
                df = sum(1 for other in tokens.values() if t in other)
                idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
                score += idf * tf * (K1 + 1) / (tf + K1 * (1 - B + B * len(toks) / max(avgdl, 1)))
        if score > 0:
            out[cid] = score * factor
    return out


def timed(search, *args, **kwargs) -> tuple[list[dict], float, float]:
    """A search's results and the clock just before and just after it."""
    before = time.time()
    results = search(*args, **kwargs)
    return results, before, time.time()


def assert_formula(root, results, docs, query, stem, before, after):
    """Each result's score is the formula's at some instant of the search: between its value
    at ``after`` and at ``before`` (the recency factor only decreases with time), to 1e-9."""
    assert {r["chunk_id"] for r in results} == set(expected_scores(docs, query, stem, None))
    for r in results:
        when = created(root, r["chunk_id"].split(":")[0])
        low = expected_scores(docs, query, stem, when, after)[r["chunk_id"]]
        high = expected_scores(docs, query, stem, when, before)[r["chunk_id"]]
        assert low - 1e-9 <= r["score"] <= high + 1e-9, (r, low, high)


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "sessions"
    with open_session(root, "ci") as h:
        turn(h, "The tests failing on CI were fixed.", "Connection to the database timed out.",
             command("Traceback: segfault in libwidget while linking"), at="2025-01-10T09:00:00Z")
        turn(h, "The retry loop broke again.", "Retry loop retried forever.", failed=True,
             at="2025-03-05T12:00:00Z")
    with open_session(root, "web") as h:
        turn(h, "Rewrote the retry loop with a backoff.", "Connected the web socket.",
             at="2025-03-06T08:00:00Z")
    return root


def created(root, name):
    from memfs.search import created_at_of

    with open_session(root, name, read_only=True) as h:
        return created_at_of(h)


# --- parse_options ----------------------------------------------------------------------------

def test_parse_options_validates_every_value_in_one_place():
    o = parse_options({"k": "3", "min_score": "0.5", "stem": "english", "stopwords": "english", "in": "all",
                       "agent": "codex", "project": "app", "status": "failed", "since": "2025-01-01",
                       "until": "2025-01-31", "session": "s", "distinct": "session", "format": "text"})
    assert (o.k, o.min_score, o.stem, o.stopwords, o.corpus, o.agent, o.project, o.status, o.session,
            o.distinct, o.format) == (3, 0.5, "english", "english", "all", "codex", "app", "failed", "s",
                                      "session", "text")
    assert o.since == 1735689600.0 and o.until == 1738367999.999  # a bare date as until: its whole day
    assert abs(parse_options({"since": "7d"}).since - (time.time() - 7 * 86400)) < 5
    assert abs(parse_options({"until": "12h"}).until - (time.time() - 12 * 3600)) < 5
    assert parse_options({"since": "2025-01-01T10:00:00+02:00"}).since == 1735718400.0
    assert parse_options({}) == SearchOptions()
    assert parse_options({"k": "2"}, SearchOptions(stem="english")).stem == "english"  # over the defaults
    for params, reason in [({"color": "red"}, "unknown search option 'color'"),
                           ({"k": ["1", "2"]}, "'k' given 2 times"), ({"k": "0"}, "k must be a whole number"),
                           ({"min_score": "nan"}, "min_score must be a number"),
                           ({"stem": "french"}, "stem must be none or english"),
                           ({"in": "logs"}, "in must be facts or output or all"),
                           ({"status": "done"}, "status must be failed or completed or open"),
                           ({"distinct": "yes"}, "distinct must be none or session"),
                           ({"since": "yesterday"}, "since: 'yesterday' is neither a date"),
                           ({"agent": ""}, "agent needs a value"),
                           ({"since": "2025-02-01", "until": "2025-01-01"}, "since is after until")]:
        with pytest.raises(BadQuery, match=re.escape(reason)):
            parse_options(params)


def test_the_stopword_list_is_bm25s_s_when_bm25s_is_there():
    from memfs.search.analysis import STOPWORDS_EN

    try:
        from bm25s.stopwords import STOPWORDS_EN as theirs
    except ImportError:  # the bench extra is not installed: the copy stands alone
        theirs = tuple(STOPWORDS_EN)
    assert STOPWORDS_EN == frozenset(theirs) and len(STOPWORDS_EN) == 33


# --- analysis -------------------------------------------------------------------------------------

def test_stemming_finds_inflections_the_default_does_not(root):
    assert search_store(root, "test fail") == []
    results = search_store(root, "test fail", options=SearchOptions(stem="english"))
    assert [r["snippet"] for r in results] == ["The tests failing on CI were fixed.", "the turn failed"]
    connects = search_store(root, "connect", options=parse_options({"stem": "english"}))
    assert {r["snippet"] for r in connects} == {"Connection to the database timed out.", "Connected the web socket."}


def test_stemmed_scores_equal_the_formula_over_stemmed_tokens(root):
    facts = {}
    for name in ("ci", "web"):
        with open_session(root, name, read_only=True) as h:
            from memfs.views import memory_facts

            for i, f in enumerate(memory_facts(h)[0]):
                facts[f"{name}:{i}"] = f["fact"]
    query = "retrying loops connecting"
    results, before, after = timed(search_store, root, query, k=50, options=SearchOptions(stem="english"))
    assert len(results) == 5
    assert_formula(root, results, facts, query, True, before, after)
    # with stopwords too: "the" is no longer a token of documents or queries
    assert search_store(root, "the web", options=SearchOptions(stopwords="english"))[0]["snippet"] == \
        "Connected the web socket."
    with pytest.raises(Exception, match="no search terms"):
        search_store(root, "the", options=SearchOptions(stopwords="english"))


# --- the output corpus ------------------------------------------------------------------------------

def test_text_only_in_an_output_is_found_with_in_output_and_all(root):
    assert search_store(root, "libwidget") == []
    (r,) = search_store(root, "libwidget", options=SearchOptions(corpus="output"))
    assert r["source"] == "output" and r["chunk_id"] == "ci:out:0" and r["turn"] == 1
    assert r["path"] == "sessions/ci/events.jsonl" and "segfault in libwidget" in r["snippet"]
    with open_session(root, "ci", read_only=True) as h:
        line = next(line for _offset, line in h.iter_lines(r["offset"]))
    assert json.loads(line)["event"]["item"]["aggregated_output"] == r["snippet"]
    both = search_store(root, "libwidget make", k=20, options=SearchOptions(corpus="all"))
    assert {x["source"] for x in both} == {"output", "session"}  # "ran make test (exit 0)" is a fact
    # in=output: only outputs (the failed turn's reason is one too)
    outs = search_store(root, "failed libwidget", k=20, options=SearchOptions(corpus="output"))
    assert {x["chunk_id"] for x in outs} == {"ci:out:0", "ci:out:1"} and {x["source"] for x in outs} == {"output"}


def test_all_is_one_corpus_scored_by_the_formula(root):
    docs = {}
    from memfs.views import memory_facts

    for name in ("ci", "web"):
        with open_session(root, name, read_only=True) as h:
            for i, f in enumerate(memory_facts(h)[0]):
                docs[f"{name}:{i}"] = f["fact"]
    docs["ci:out:0"] = "Traceback: segfault in libwidget while linking"
    docs["ci:out:1"] = "the turn failed"
    results, before, after = timed(search_store, root, "retry turn libwidget", k=50,
                                   options=SearchOptions(corpus="all"))
    assert_formula(root, results, docs, "retry turn libwidget", False, before, after)


def test_a_long_output_keeps_its_first_and_last_2_kib(tmp_path):
    root = tmp_path / "sessions"
    middle = " filler" * 2000
    with open_session(root, "big") as h:
        turn(h, command("headword starts" + middle + " middleword" + middle + " tailword ends"))
    for word, found in (("headword", True), ("tailword", True), ("middleword", False)):
        results = search_store(root, word, options=SearchOptions(corpus="output"))
        assert bool(results) is found, word
    (r,) = search_store(root, "headword", options=SearchOptions(corpus="output"))
    assert len(r["snippet"].encode()) <= OUTPUT_HEAD + OUTPUT_TAIL + len("\n…\n".encode())


# --- filters ----------------------------------------------------------------------------------------------

def test_status_filter_and_the_restricted_corpus_statistics(root):
    failed, before, after = timed(search_store, root, "retry loop", k=20, options=SearchOptions(status="failed"))
    assert {r["chunk_id"] for r in failed} == {"ci:3", "ci:4"}  # the failed turn's facts
    # N, avgdl, df: of the failed turn's documents only
    with open_session(root, "ci", read_only=True) as h:
        from memfs.views import memory_facts

        docs = {f"ci:{i}": f["fact"] for i, f in enumerate(memory_facts(h)[0]) if f["turn"] == 2}
    assert_formula(root, failed, docs, "retry loop", False, before, after)
    completed = search_store(root, "retry loop", k=20, options=SearchOptions(status="completed"))
    assert {r["chunk_id"] for r in completed} == {"web:0"}
    assert search_store(root, "retry loop", options=SearchOptions(status="open")) == []


def test_since_and_until_filter_by_the_turn_s_time(root):
    def ids(**kw):
        return {r["chunk_id"] for r in search_store(root, "retry loop connection", k=20,
                                                        options=parse_options(kw))}

    assert ids() == {"ci:1", "ci:3", "ci:4", "web:0"}
    assert ids(since="2025-03-01") == {"ci:3", "ci:4", "web:0"}
    assert ids(until="2025-01-10") == {"ci:1"}  # a bare date: that whole day
    assert ids(since="2025-03-06", until="2025-03-06") == {"web:0"}
    assert ids(since="1d") == set()  # every turn is older


def test_distinct_session_keeps_each_session_s_best(root):
    every = search_store(root, "retry loop", k=20)
    assert [r["chunk_id"].split(":")[0] for r in every].count("ci") == 2
    best = search_store(root, "retry loop", k=20, options=SearchOptions(distinct="session"))
    # a session's score: its best document's, plus half its second's, plus a quarter of its third's
    session_score = {}
    for name in {"ci", "web"}:
        mine = sorted((x["score"] for x in every if x["chunk_id"].split(":")[0] == name), reverse=True)
        session_score[name] = sum(w * x for w, x in zip((1.0, 0.5, 0.25), mine))
    assert [r["chunk_id"].split(":")[0] for r in best] == sorted(session_score, key=lambda n: -session_score[n])
    for r in best:  # its best document (the scores a few microseconds of recency apart)
        name = r["chunk_id"].split(":")[0]
        same = next(x for x in every if x["chunk_id"].split(":")[0] == name)
        assert r["chunk_id"] == same["chunk_id"] and abs(r["score"] - session_score[name]) < 1e-6


def test_a_turn_filter_with_in_output_keeps_outputs_only(root):
    got = search_store(root, "retry loop segfault traceback", k=50,
                       options=parse_options({"in": "output", "status": "completed"}))
    assert [(r["chunk_id"], r["source"], r["turn"]) for r in got] == [("ci:out:0", "output", 1)]


def test_a_turn_s_prompt_is_a_document_of_in_all_only(tmp_path):
    root = tmp_path / "sessions"
    with open_session(root, "asked") as h:
        h.append(event("turn.started", context={"prompt": "Why does the quokka importer hang?"}))
        h.append(event("item.completed", item={"id": "m0", "type": "agent_message", "text": "Looked into it."}))
        h.append(event("turn.completed", usage={"input_tokens": 1}))
    found = search_store(root, "quokka", options=parse_options({"in": "all"}))
    assert [(r["chunk_id"], r["source"], r["turn"], r["snippet"]) for r in found] == [
        ("asked:prompt:0", "prompt", 1, "Why does the quokka importer hang?")]
    assert found[0]["path"] == "sessions/asked/events.jsonl"
    assert search_store(root, "quokka") == []  # the default corpus is SPEC §5's facts
    assert search_store(root, "quokka", options=parse_options({"in": "output"})) == []


def memfs_cli(*args, check=True) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memfs", *map(str, args)], capture_output=True, text=True,
                          check=check, timeout=120)


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """The captured Codex, Claude Code and Gemini CLI sessions, brought in with ``memfs import``."""
    store = tmp_path_factory.mktemp("imported") / "sessions"
    memfs_cli("import", "--store", store, FIXTURES / "codex/ok_failing_command/home/.codex/sessions",
              FIXTURES / "claude/ok_failing_command/home/.claude/projects",
              FIXTURES / "gemini/ok_failing_command/home/.gemini/tmp")
    return store


def cli_ids(store, *args) -> list[str]:
    out = memfs_cli("search", "--json", "--store", store, *args).stdout
    return [r["chunk_id"] for r in json.loads(out)]


def about(store, chunk_id):
    return json.loads((store / chunk_id.split(":")[0] / "index" / "about.json").read_text())


def test_agent_and_project_filters_on_imported_sessions(imported):
    every = cli_ids(imported, "changelog", "-k", "50")
    agents = {about(imported, c)["agent"] for c in every}
    assert {"codex", "claude"} <= agents
    for agent in ("codex", "claude"):
        got = cli_ids(imported, "changelog", "-k", "50", "--agent", agent)
        assert got and {about(imported, c)["agent"] for c in got} == {agent}
    cwd = about(imported, next(c for c in every if about(imported, c)["agent"] == "codex"))["cwd"]
    got = cli_ids(imported, "changelog", "-k", "50", "--project", cwd)
    assert got and {about(imported, c)["cwd"] for c in got} == {cwd}
    assert cli_ids(imported, "changelog", "--agent", "vtcode") == []
    # outputs of the imported commands, one result per session
    outs = cli_ids(imported, "no such file", "--in", "output", "--distinct", "session", "-k", "50")
    assert len(outs) == len({c.split(":")[0] for c in outs}) >= 2 and all(":out:" in c for c in outs)


def test_the_captured_prompts_are_found_with_in_all(imported):
    out = memfs_cli("search", "--json", "--store", imported, "show", "-k", "50", "--in", "all").stdout
    prompts = [r for r in json.loads(out) if r["source"] == "prompt"]
    assert len({r["session_id"] for r in prompts}) == 3  # each CLI's session: its prompt
    assert {r["snippet"] for r in prompts} == {"Show me the changelog"}


def test_bad_cli_flags_exit_2_with_the_reason(imported):
    for args, reason in [(["--stem", "latin"], "stem must be none or english, not 'latin'"),
                         (["--in", "logs"], "in must be facts or output or all"),
                         (["--since", "soon"], "since: 'soon' is neither a date"),
                         (["-k", "0"], "k must be a whole number of at least 1")]:
        done = memfs_cli("search", "x", "--store", imported, *args, check=False)
        assert done.returncode == 2 and reason in done.stderr, (args, done.stderr)


def test_config_search_defaults_and_flags_over_them(root, tmp_path):
    config = tmp_path / "memfs.toml"
    config.write_text('[search]\nstem = "english"\nin = "all"\n')
    got = memfs_cli("search", "--json", "--config", config, "--store", root, "test fail libwidget").stdout
    assert {"ci:0", "ci:out:0"} <= {r["chunk_id"] for r in json.loads(got)}
    got = memfs_cli("search", "--json", "--config", config, "--store", root, "--in", "facts", "--stem", "none",
                    "tests failing").stdout
    assert [r["chunk_id"] for r in json.loads(got)] == ["ci:0"]
    config.write_text('[search]\nstem = "porter"\n')
    done = memfs_cli("search", "--config", config, "--store", root, "x", check=False)
    assert done.returncode == 1 and "[search]: stem must be none or english, not 'porter'" in done.stderr


# --- incremental ---------------------------------------------------------------------------------------

def test_an_option_index_follows_appends_without_a_rebuild(root):
    store = Store(root)
    try:
        search = store_searcher(store)
        stemmed = {"stem": "english", "in": "all"}
        assert search("rebooted", options=stemmed) == []
        before = search.stats()["english/none/facts+output"]
        turn(store.open("web"), command("kernel rebooting after panic", cmd="sudo reboot"))
        results = search("rebooted", options=stemmed)
        assert {r["source"] for r in results} == {"output", "session"}  # "ran sudo reboot" and the output
        after = search.stats()["english/none/facts+output"]
        # the new turn's documents were added to the index made by the first query: nothing re-indexed
        assert after["docs"] > before["docs"] and after["dead_docs"] == before["dead_docs"] == 0
        assert set(search.stats()) == {"none/none/facts", "english/none/facts+output"}  # only those asked for
    finally:
        store.close()


# --- through a mount ------------------------------------------------------------------------------------

needs_fuse = pytest.mark.skipif(not HAVE_FUSE, reason="needs /dev/fuse and fusermount3")


@needs_fuse
def test_options_as_search_file_parameters(tmp_path):
    with mounted(tmp_path / "store", tmp_path / "mnt") as m:
        session = m.mnt / "sessions" / "s1"
        os.mkdir(session)
        lines = [event("turn.started"),
                 event("item.completed", item={"id": "m1", "type": "agent_message", "text": "The tests failing on CI."}),
                 event("item.completed", item=command("undefined reference to libquux")),
                 event("turn.failed", message="the build broke")]
        with open(session / "events.jsonl", "a") as f:
            f.write("".join(line + "\n" for line in lines))

        def cat(name, where=m.mnt / "search"):
            return [json.loads(line) for line in (where / name).read_text().splitlines()]

        assert cat("test fail") == []
        assert [r["chunk_id"] for r in cat("test fail?stem=english")] == ["s1:0"]
        (r,) = cat("libquux?in=output")
        assert r["source"] == "output" and r["chunk_id"] == "s1:out:0" and r["turn"] == 1
        assert cat("libquux") == []
        assert [r["chunk_id"] for r in cat("libquux?in=all&status=failed&distinct=session", session / "search")] \
            == ["s1:out:0"]
        assert cat("libquux?in=output&status=completed") == []
        assert cat("libquux?in=output&agent=codex") == []
        out = sh("cat 'search/failing?stem=english&format=text&k=1'", cwd=m.mnt).stdout
        assert out.startswith(tuple("0123456789")) and "\ts1:0\t" in out
        for name, reason in [("x?stem=latin", "stem must be none or english, not 'latin'"),
                             ("x?in=logs", "in must be facts or output or all"),
                             ("x?since=soon", "since: 'soon' is neither a date"),
                             ("x?distinct=1", "distinct must be none or session"),
                             ("x?stem=english&stem=none", "parameter 'stem' given twice")]:
            with pytest.raises(OSError) as err:
                (m.mnt / "search" / name).read_text()
            assert err.value.errno == errno.EINVAL, name
            assert reason in m.log_text(), name
        with pytest.raises(OSError) as err:  # the session's own search/ cannot search another one
            (session / "search" / "libquux?session=s2").read_text()
        assert err.value.errno == errno.EINVAL and "session='s2' in the search of session 's1'" in m.log_text()
        assert [r["chunk_id"] for r in cat("libquux?in=output&session=s1")] == ["s1:out:0"]
        # incremental: an append is seen by the next search with the same options
        assert [r["chunk_id"] for r in cat("libquux?in=output&stem=english")] == ["s1:out:0"]
        with open(session / "events.jsonl", "a") as f:
            f.write(event("turn.started") + "\n")
            f.write(event("item.completed", item=command("warning: zorblax deprecated", cmd="make lint")) + "\n")
        (r,) = cat("zorblax?in=output&stem=english")
        assert r["chunk_id"] == "s1:out:2" and r["turn"] == 2


def test_the_index_with_an_analyzer_scores_the_formula_exactly():
    from memfs.search import SearchIndex
    from memfs.search.analysis import analyzer

    texts = ["The tests are failing again", "A failed connection to the test server", "Connecting is slow",
             "nothing relevant here at all"]
    index = SearchIndex(analyzer("english", "english"))
    index.set_session("s", "s", 1_700_000_000, [{"fact": t, "turn": i + 1, "offset": i} for i, t in enumerate(texts)])
    now = 1_700_000_000 + 12 * 86400
    results = index.search("the failing test connections", now=now, max_results=10)

    def analysed(text):
        return [ENGLISH.stemWord(t) for t in words(text) if t not in {"the", "are", "a", "to", "is", "at"}]

    docs = {f"s:{i}": " ".join(analysed(t)) for i, t in enumerate(texts)}  # stopwords gone, stems joined
    want = expected_scores(docs, " ".join(analysed("the failing test connections")), False, 1_700_000_000, now)
    assert {r["chunk_id"]: r["score"] for r in results}.keys() == want.keys()
    for r in results:
        assert abs(r["score"] - want[r["chunk_id"]]) < 1e-9
    # the turns filter: the corpus is turns 2 and 3 only (N = 2)
    results = index.search("the failing test connections", now=now, turns={"s": [2, 3]})
    sub = {k: v for k, v in docs.items() if k in ("s:1", "s:2")}
    want = expected_scores(sub, " ".join(analysed("the failing test connections")), False, 1_700_000_000, now)
    assert {r["chunk_id"]: round(r["score"], 9) for r in results} == {k: round(v, 9) for k, v in want.items()}
