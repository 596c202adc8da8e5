"""Opening a session (SPEC §3.1, §3.3): the fast path when the metadata can be trusted, a
rescan whenever it cannot, what a rescan skips, torn tails, and the turn state machine's rules
(checked through appends and through rescans alike)."""

from __future__ import annotations

import os
import textwrap

import memfs.store.recovery as store_recovery
import memfs.store.session as store_session
import orjson
import pytest
from memfs.store import lines as store_lines
from memfs.store.recovery import TAIL_WINDOW

from store_helpers import (
    DONE,
    FAILED,
    START,
    THREAD_DONE,
    THREAD_START,
    disk_index,
    disk_json,
    disk_manifest,
    env,
    forget_metadata,
    log_lines,
    msg,
    open_s,
    run_python,
    state_of,
    turn,
    without_times,
    without_ts,
)


def build(tmp_path, lines, **kw):
    with open_s(tmp_path, **kw) as h:
        h.append_many(lines)
        return state_of(h)


def reopen(tmp_path, **kw):
    """Open as the session's writer (what a first append does): the open that repairs."""
    with open_s(tmp_path, **kw) as h:
        h.lock()
        return h.open_report, state_of(h)


def write_log(tmp_path, lines: list[bytes], tail: bytes = b"") -> None:
    sdir = tmp_path / "s"
    sdir.mkdir(exist_ok=True)
    (sdir / "events.jsonl").write_bytes(b"".join(line + b"\n" for line in lines) + tail)


def count_log_reads(monkeypatch, tmp_path) -> list[int]:
    """Bytes read from events.jsonl (by any descriptor) from now on, one entry per read."""
    reads: list[int] = []
    real_pread, real_read, real_preadv = os.pread, os.read, os.preadv

    def is_log(fd):
        try:
            return os.path.samestat(os.fstat(fd), os.stat(tmp_path / "s" / "events.jsonl"))
        except OSError:
            return False

    def pread(fd, n, off):
        data = real_pread(fd, n, off)
        if is_log(fd):
            reads.append(len(data))
        return data

    def read(fd, n):
        data = real_read(fd, n)
        if is_log(fd):
            reads.append(len(data))
        return data

    monkeypatch.setattr(os, "pread", pread)
    monkeypatch.setattr(os, "read", read)
    monkeypatch.setattr(os, "preadv", lambda fd, bufs, off: real_preadv(fd, bufs, off))
    return reads


SESSION = [THREAD_START, *turn("a", 3), msg("outside"), *turn("b", 1, end=FAILED), START, msg("open")]


def test_fast_path_when_metadata_is_consistent_reads_no_log(tmp_path, monkeypatch):
    live = build(tmp_path, [*SESSION[:-2], *(line for t in range(100) for line in turn(f"t{t}", 5)), *SESSION[-2:]])
    size = (tmp_path / "s" / "events.jsonl").stat().st_size
    reads = count_log_reads(monkeypatch, tmp_path)
    with open_s(tmp_path, read_only=True) as ro:  # a reader's open reads no byte of the log
        assert ro.open_report.fast_path and state_of(ro) == live
    assert reads == []
    report, state = reopen(tmp_path)
    assert report.fast_path and report.scanned_bytes == 0 and report.index_source == "turns.json"
    assert state == live
    # a writer's open: the torn-tail probe (the last byte), the last line and the last turn's
    # first line (the takeover check, memfs.store.recovery._tail_agrees), nothing else
    assert 0 < sum(reads) <= 1 + 2 * TAIL_WINDOW < size
    reads.clear()
    forget_metadata(tmp_path / "s")
    report, state = reopen(tmp_path)
    assert not report.fast_path and report.scanned_bytes == size
    assert sum(reads) >= size
    assert state == live


def test_reopen_after_a_process_died_without_writing_metadata_rescans(tmp_path):
    code = textwrap.dedent("""
        import os, sys, memfs
        from store_helpers import START, DONE, msg
        h = memfs.open_session(sys.argv[1], "s", durability="write", metadata_interval=3600)
        for line in [START, msg("a"), DONE, START, msg("b")]:
            h.append(line)
        os._exit(0)  # no close: the metadata on disk is from the open
    """)
    res = run_python(code, str(tmp_path), env={**os.environ, "PYTHONPATH": os.path.dirname(__file__)})
    assert res.returncode == 0, res.stderr
    assert disk_manifest(tmp_path / "s")["event_count"] == 0
    report, (manifest, index) = reopen(tmp_path)
    assert not report.fast_path
    assert report.reason.startswith("log is ")
    assert (manifest["event_count"], manifest["turn_count"], manifest["in_turn"]) == (5, 1, True)
    assert [(e["turn_number"], e["event_count"], e["outcome"]) for e in index] == [(1, 3, "completed"), (2, 2, "open")]
    report, _ = reopen(tmp_path)
    assert report.fast_path  # the rescan wrote metadata back


def test_reopen_without_any_metadata_rescans(tmp_path):
    live = build(tmp_path, SESSION)
    forget_metadata(tmp_path / "s")
    report, state = reopen(tmp_path)
    assert (report.fast_path, report.reason) == (False, "manifest missing or unreadable")
    assert report.scanned_lines == len(SESSION) and report.skipped_lines == 0
    assert state == live
    assert without_ts(disk_index(tmp_path / "s")) == live[1]


@pytest.mark.parametrize(("name", "content", "reason"), [
    ("manifest.json", b"{not json", "manifest missing or unreadable"),
    ("manifest.json", b"[1,2]", "manifest missing or unreadable"),
    ("index/turns.json", b"garbage", "turn index missing or unreadable"),
    ("index/turns.json", b'{"entries":{"turn_number":1}}', "turn index missing or unreadable"),
    ("index/turns.json", b'{"entries":[{"turn_number":1}]}', "turn index missing or unreadable"),
    ("index/turns.json", b'{"entries":[{"turn_number":1,"start_offset":true,"end_offset":5,"event_count":1}]}',
     "turn index missing or unreadable"),
])
def test_corrupt_metadata_forces_a_rescan(tmp_path, name, content, reason):
    live = build(tmp_path, SESSION)
    (tmp_path / "s" / name).write_bytes(content)
    report, state = reopen(tmp_path)
    assert (report.fast_path, report.reason) == (False, reason)
    assert state == live
    assert reopen(tmp_path)[0].fast_path


def test_stale_but_well_formed_index_forces_a_rescan(tmp_path):
    sdir = tmp_path / "s"
    with open_s(tmp_path) as h:
        h.append_many(turn("a"))
        old_closed = (sdir / "index" / "turns.json").read_bytes()  # one closed turn
        h.append_many([START, msg("x")])
        h.flush()
        old_open = (sdir / "index" / "turns.json").read_bytes()  # turn 2 open, 2 events
        h.append_many([msg("y"), msg("z")])
        live = state_of(h)
    for stale in (old_closed, old_open):
        (sdir / "index" / "turns.json").write_bytes(stale)
        report, state = reopen(tmp_path)
        assert (report.fast_path, report.reason) == (False, "turn index inconsistent with manifest")
        assert state == live


@pytest.mark.parametrize("edit", [
    lambda e: e.__setitem__("end_offset", e["end_offset"] + 10_000),   # past the end of the log
    lambda e: e.__setitem__("start_offset", -1),
    lambda e: e.__setitem__("event_count", 0),
    lambda e: e.__setitem__("turn_number", 7),
    lambda e: e.__setitem__("outcome", "open"),                        # open but not the last
])
def test_inconsistent_index_entries_force_a_rescan(tmp_path, edit):
    sdir = tmp_path / "s"
    live = build(tmp_path, [*turn("a"), *turn("b"), START])
    index = disk_json(sdir / "index" / "turns.json")
    edit(index["entries"][0])
    (sdir / "index" / "turns.json").write_bytes(orjson.dumps(index))
    report, state = reopen(tmp_path)
    assert not report.fast_path
    assert state == live


def test_overlapping_offsets_force_a_rescan(tmp_path):
    sdir = tmp_path / "s"
    live = build(tmp_path, [*turn("a"), *turn("b")])
    index = disk_json(sdir / "index" / "turns.json")
    index["entries"][1]["start_offset"] = index["entries"][0]["end_offset"] - 1
    (sdir / "index" / "turns.json").write_bytes(orjson.dumps(index))
    report, state = reopen(tmp_path)
    assert report.reason == "turn index inconsistent with manifest"
    assert state == live


def test_log_longer_than_the_metadata_forces_a_rescan(tmp_path):
    sdir = tmp_path / "s"
    build(tmp_path, [*turn("a"), START])
    with open(sdir / "events.jsonl", "ab") as f:  # another writer appended while it was closed
        f.write(msg("appended directly") + b"\n" + DONE + b"\n")
    report, (manifest, index) = reopen(tmp_path)
    assert not report.fast_path and report.reason.startswith("log is ")
    assert manifest["turn_count"] == 2 and index[1]["event_count"] == 3


@pytest.mark.parametrize("field", ["in_turn", "persisted_file_len", "retained_turn_base", "status", "event_count"])
def test_missing_manifest_fields_force_a_rescan(tmp_path, field):
    sdir = tmp_path / "s"
    live = build(tmp_path, SESSION)
    manifest = disk_manifest(sdir)
    del manifest[field]
    (sdir / "manifest.json").write_bytes(orjson.dumps(manifest))
    report, state = reopen(tmp_path)
    assert (report.fast_path, report.reason) == (False, "manifest incomplete")
    assert state == live


def test_manifest_of_an_older_writer_keeps_its_identity(tmp_path):
    sdir = tmp_path / "s"
    write_log(tmp_path, [*turn("a"), *turn("b")])
    (sdir / "manifest.json").write_bytes(orjson.dumps({
        "session_id": "raw id/with slash", "schema_version": 1, "created_at": "2026-01-01T00:00:00Z",
        "updated_at": "2026-01-02T00:00:00Z", "turn_count": 2, "event_count": 8, "status": "completed"}))
    report, (manifest, index) = reopen(tmp_path)
    assert report.reason == "manifest incomplete"
    assert manifest["session_id"] == "raw id/with slash"
    assert disk_manifest(sdir)["created_at"] == "2026-01-01T00:00:00Z"
    assert (manifest["turn_count"], manifest["retained_turn_base"], manifest["in_turn"]) == (2, 1, False)
    assert manifest["persisted_file_len"] == (sdir / "events.jsonl").stat().st_size


def test_malformed_lifecycle_lines_never_create_or_close_turns_in_a_rescan(tmp_path):
    lines = [
        env("thread.started"),                                   # no thread_id
        env("turn.completed"),                                   # no usage
        env("turn.started", context=5),                          # malformed start
        START,
        msg("inside"),
        env("turn.failed", message=["x"]),                       # malformed close
        env("turn.completed", usage={"output_tokens": -1}),      # malformed close
        env("turn.started", token_breakdown="lots"),             # malformed start: no abandon
        env("thread.completed", thread_id="t"),                  # malformed: status unchanged
        DONE,
    ]
    write_log(tmp_path, lines)
    report, (manifest, index) = reopen(tmp_path)
    assert report.skipped_lines == 7
    assert (manifest["turn_count"], manifest["event_count"], manifest["status"]) == (1, 3, "active")
    start = sum(len(line) + 1 for line in lines[:3])
    assert [(e["turn_number"], e["start_offset"], e["end_offset"], e["event_count"], e["outcome"]) for e in index] == [
        (1, start, sum(len(line) + 1 for line in lines), 3, "completed")]
    with open_s(tmp_path) as h:
        assert [e["type"] for e in h.reconstruct_turn(1)] == ["turn.started", "item.completed", "turn.completed"]


def test_non_json_blank_and_foreign_lines_are_skipped_but_advance_offsets(tmp_path):
    junk = [b"", b"   ", b"not json at all", b"\xff\xfe\xfd", b"[1,2,3]", b'{"type":"turn.started"}',
            b'{"schema_version":2,"event":{"type":"x"}}', b'{"schema_version":"0.18.0","event":{"type":["x"]}}']
    lines = [START, *junk, msg("kept"), *junk, DONE, b'{"schema_version":"0.11.0","event":{"type":"old.kind"}}']
    write_log(tmp_path, lines)
    report, (manifest, index) = reopen(tmp_path)
    assert (report.scanned_lines, report.skipped_lines) == (len(lines), 2 * len(junk))
    assert (manifest["event_count"], manifest["turn_count"]) == (4, 1)
    assert index[0]["event_count"] == 3
    assert index[0]["end_offset"] == sum(len(line) + 1 for line in lines[:-1])
    with open_s(tmp_path) as h:
        assert h.reconstruct_turn(1)[1]["item"]["text"] == "kept"
    assert log_lines(tmp_path / "s") == lines  # a rescan never rewrites the log


def test_torn_tail_moves_to_rejected_and_the_next_append_lands_on_a_clean_line(tmp_path):
    sdir = tmp_path / "s"
    write_log(tmp_path, [START, msg("whole")], tail=b'{"schema_version":"0.18.0","event":{"type":"item.comp')
    with open_s(tmp_path, read_only=True) as ro:  # a read-only open repairs nothing
        assert ro.manifest["event_count"] == 2
    assert (sdir / "events.jsonl").read_bytes().endswith(b"item.comp")
    with open_s(tmp_path) as h:
        assert h.open_report.torn_tail_bytes == 0  # opening is reading: the first change repairs
        h.append(DONE)
        assert h.open_report.torn_tail_bytes == len(b'{"schema_version":"0.18.0","event":{"type":"item.comp')
        assert h.manifest["turn_count"] == 1
    assert log_lines(sdir) == [START, msg("whole"), DONE]
    rejected = [orjson.loads(line) for line in (sdir / "rejected.jsonl").read_bytes().splitlines()]
    assert len(rejected) == 1
    assert rejected[0]["reason"] == "torn-tail"
    assert rejected[0]["line"] == '{"schema_version":"0.18.0","event":{"type":"item.comp'
    assert rejected[0]["bytes"] == len(rejected[0]["line"])


def test_torn_tail_without_any_newline(tmp_path):
    write_log(tmp_path, [], tail=b"x" * 5000)
    with open_s(tmp_path) as h:
        assert h.file_len == 0
        h.append(START)
    assert log_lines(tmp_path / "s") == [START]


# --- the state machine (SPEC §3.1): appends and rescans agree ----------------------------------


def both_ways(tmp_path, lines):
    """The state after appending ``lines``, checked equal to a rescan of the same log."""
    live = build(tmp_path, lines)
    forget_metadata(tmp_path / "s")
    report, rescanned = reopen(tmp_path)
    assert not report.fast_path
    assert rescanned == live
    return live


def test_turn_completed_without_an_open_turn_only_counts(tmp_path):
    manifest, index = both_ways(tmp_path, [DONE, FAILED, msg("loose")])
    assert (manifest["event_count"], manifest["turn_count"], manifest["in_turn"]) == (3, 0, False)
    assert index == []


def test_turn_started_inside_an_open_turn_abandons_it(tmp_path):
    manifest, index = both_ways(tmp_path, [START, msg("a"), START, msg("b"), DONE, START, START])
    assert [(e["turn_number"], e["event_count"], e["outcome"]) for e in index] == [
        (1, 2, "abandoned"), (2, 3, "completed"), (3, 1, "abandoned"), (4, 1, "open")]
    assert (manifest["turn_count"], manifest["in_turn"], manifest["event_count"]) == (3, True, 7)
    assert index[0]["end_offset"] == index[1]["start_offset"]


def test_thread_completed_sets_status_without_closing_the_open_turn(tmp_path):
    with open_s(tmp_path, durability="buffered") as h:
        h.append_many([THREAD_START, START, msg("a")])
        h.append(THREAD_DONE)
        assert (tmp_path / "s" / "events.jsonl").stat().st_size == h.file_len  # a boundary
        m = h.manifest
        assert (m["status"], m["in_turn"], m["turn_count"]) == ("completed", True, 0)
        assert h.turn_index[0]["event_count"] == 3 and h.turn_index[0]["outcome"] == "open"
        h.append(DONE)
        assert h.turn_index[0]["event_count"] == 4 and h.manifest["status"] == "completed"
        h.append(START)
        assert h.manifest["status"] == "active"
    manifest, index = both_ways(tmp_path / "again", [START, THREAD_DONE, msg("after")])
    assert (manifest["status"], manifest["in_turn"], index[0]["event_count"]) == ("completed", True, 3)
    manifest, _ = both_ways(tmp_path / "third", [THREAD_DONE, THREAD_START])
    assert manifest["status"] == "active"


def test_turn_failed_closes_as_failed(tmp_path):
    manifest, index = both_ways(tmp_path, [*turn("a", end=FAILED), *turn("b")])
    assert [e["outcome"] for e in index] == ["failed", "completed"]
    assert manifest["turn_count"] == 2


def test_rescan_streams_with_small_chunks(tmp_path, monkeypatch):
    """Lines that straddle read chunks (and a line longer than a chunk) scan the same."""
    lines = [START, msg("y" * 3000), *[msg(f"m{i}") for i in range(50)], DONE]
    live = build(tmp_path, lines)
    monkeypatch.setattr(store_recovery, "scan_chunks", lambda fd, start, end: store_lines.scan_chunks(fd, start, end, 97))
    forget_metadata(tmp_path / "s")
    report, state = reopen(tmp_path)
    assert state == live and report.scanned_lines == len(lines)


# --- the turns.cache of large indexes -----------------------------------------------------------


def test_turns_cache_is_used_only_while_it_matches_turns_json(tmp_path, monkeypatch):
    monkeypatch.setattr(store_session, "CACHE_MIN_ENTRIES", 3)
    sdir = tmp_path / "s"
    live = build(tmp_path, [*turn("a"), *turn("b"), *turn("c"), START, msg("open")])
    assert (sdir / "index" / "turns.cache").exists()
    report, state = reopen(tmp_path)
    assert (report.fast_path, report.index_source) == (True, "turns.cache")
    assert state == live
    with open_s(tmp_path) as h:  # the reopened index keeps working and persists the same JSON
        h.append(DONE)
        h.flush()
        live = state_of(h)
        assert disk_index(sdir) == h.turn_index
        assert orjson.loads(h.reads.turn_index_json()) == {"entries": h.turn_index}
    # turns.json replaced by another writer: the cache no longer describes it
    index = disk_json(sdir / "index" / "turns.json")
    (sdir / "index" / "turns.json").write_bytes(orjson.dumps(index, option=orjson.OPT_INDENT_2))
    report, state = reopen(tmp_path)
    assert (report.fast_path, report.index_source) == (True, "turns.json")
    assert state == live
    # a damaged cache is ignored
    data = bytearray((sdir / "index" / "turns.cache").read_bytes())
    data[-5] ^= 0xFF
    (sdir / "index" / "turns.cache").write_bytes(bytes(data))
    report, state = reopen(tmp_path)
    assert (report.fast_path, report.index_source) == (True, "turns.json")
    assert state == live
    # the cache goes away once the index is small again
    monkeypatch.setattr(store_session, "CACHE_MIN_ENTRIES", 100)
    with open_s(tmp_path) as h:
        h.lock()
        h.flush()
    assert not (sdir / "index" / "turns.cache").exists()


def test_turns_json_bytes_are_reused_after_an_open(tmp_path):
    sdir = tmp_path / "s"
    build(tmp_path, [*turn("a"), *turn("b"), START])
    with open_s(tmp_path) as h:
        before = h.turn_index
        h.append(DONE)
        h.flush()
        assert disk_index(sdir) == h.turn_index
        assert disk_index(sdir)[:2] == before[:2]


def test_updated_at_and_created_at_survive_reopen(tmp_path):
    sdir = tmp_path / "s"
    build(tmp_path, turn("a"))
    first = disk_manifest(sdir)
    report, (manifest, _) = reopen(tmp_path)
    assert disk_manifest(sdir)["created_at"] == first["created_at"]
    assert without_times(disk_manifest(sdir)) == without_times(first)


def test_index_of_another_writer_without_outcomes_is_trusted_and_kept_current(tmp_path):
    sdir = tmp_path / "s"
    build(tmp_path, [*turn("a"), START, msg("open")])
    index = disk_json(sdir / "index" / "turns.json")
    for entry in index["entries"]:
        del entry["outcome"]
    (sdir / "index" / "turns.json").write_bytes(orjson.dumps(index))
    with open_s(tmp_path) as h:
        assert h.open_report.fast_path
        assert "outcome" not in h.turn_index[0] and h.turn_index[1]["outcome"] == "open"
        h.append(DONE)
        h.flush()
        assert disk_index(sdir)[1]["event_count"] == 3 and disk_index(sdir)[1]["outcome"] == "completed"
        assert disk_index(sdir) == h.turn_index
