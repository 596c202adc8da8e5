"""Search through a real mount (SPEC §5, §6 ``search/<query>``), with shell tools."""

from __future__ import annotations

import errno
import json
import os

import pytest

from mounting import event, mounted, needs_fuse, sh

pytestmark = needs_fuse

RESULT_FIELDS = {"chunk_id", "session_id", "score", "snippet", "path", "start_line", "end_line",
                 "source", "created_at", "turn", "offset"}


def append_turn(session, *texts):
    lines = [event("turn.started")]
    lines += [event("item.completed", item={"id": f"m{i}", "type": "agent_message", "text": t})
              for i, t in enumerate(texts)]
    lines.append(event("turn.completed", usage={"input_tokens": 1}))
    with open(session / "events.jsonl", "a") as f:
        f.write("".join(line + "\n" for line in lines))


@pytest.fixture(scope="module")
def m(tmp_path_factory):
    base = tmp_path_factory.mktemp("search-mount")
    with mounted(base / "store", base / "mnt") as mount:
        for name, texts in {"s1": ("Added the retry loop.", "Wrote tests for the retry loop.",
                                   "Retry budget raised to five."),
                            "s2": ("Parsed the config file.", "The loop retry now backs off.")}.items():
            os.mkdir(mount.mnt / "sessions" / name)
            append_turn(mount.mnt / "sessions" / name, *texts)
        yield mount


def jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_cat_root_search(m):
    out = sh('cat "search/retry loop"', cwd=m.mnt).stdout
    results = [json.loads(line) for line in out.splitlines()]
    assert len(results) == 4  # every fact holding "retry" or "loop"
    assert all(set(r) == RESULT_FIELDS for r in results)
    assert {r["chunk_id"].split(":")[0] for r in results} == {"s1", "s2"}
    scores = [r["score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    # provenance: the offset is the byte offset of the event in the session's log
    r = results[0]
    session = r["chunk_id"].split(":")[0]
    with open(m.mnt / "sessions" / session / "events.jsonl", "rb") as f:
        f.seek(r["offset"])
        assert json.loads(f.readline())["event"]["item"]["text"] == r["snippet"]


def test_per_session_search_and_suffixes(m):
    s2 = m.mnt / "sessions" / "s2" / "search"
    assert [r["chunk_id"] for r in jsonl(s2 / "retry loop")] == ["s2:1"]
    assert len(jsonl(m.mnt / "search" / "retry loop?k=2")) == 2
    text = (m.mnt / "search" / "retry loop?k=3&format=text").read_text().splitlines()
    assert len(text) == 3
    score, chunk_id, snippet = text[0].split("\t")
    assert float(score) > 0 and ":" in chunk_id and "retry" in snippet.lower()
    assert jsonl(m.mnt / "search" / "retry?min_score=1000") == []


def test_grep_over_results(m):
    out = sh("grep -h '\"chunk_id\":\"s1:' 'search/retry loop' | wc -l", cwd=m.mnt).stdout
    assert int(out) == 3
    out = sh("grep -c budget 'sessions/s1/search/retry?format=text'", cwd=m.mnt).stdout
    assert int(out) == 1


def test_new_fact_searchable_after_append(m):
    session = m.mnt / "sessions" / "s2"
    assert jsonl(session / "search" / "zeppelin") == []
    append_turn(session, "Zeppelin mode enabled.")
    (r,) = jsonl(session / "search" / "zeppelin")
    assert r["snippet"] == "Zeppelin mode enabled." and r["turn"] == 2


def test_empty_listing_and_tokenless_queries(m):
    assert os.listdir(m.mnt / "search") == []
    assert os.listdir(m.mnt / "sessions" / "s1" / "search") == []
    for name in ("?!", "?k=3"):
        with pytest.raises(OSError) as err:
            (m.mnt / "search" / name).read_bytes()
        assert err.value.errno == errno.ENOENT
