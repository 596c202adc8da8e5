"""Property tests of the session log: whatever mix of valid and invalid lines is appended (with
flushes and reopens in between), ``events.jsonl`` holds exactly the valid lines in order, the
live state matches an independent model of SPEC §3.1, and reopening — on the fast path or by
a rescan — reproduces the live manifest and index. With a small cap, the log is always a
suffix of the valid lines and the index the model's last turns, shifted."""

from __future__ import annotations

import tempfile
from pathlib import Path

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memfs.errors import ValidationError
from memfs.events import SCHEMA_VERSION

from store_helpers import forget_metadata, log_lines, open_s, state_of

HEAD = b'{"schema_version":"' + SCHEMA_VERSION.encode() + b'","event":'

USAGE = st.fixed_dictionaries({}, optional={"input_tokens": st.integers(0, 10**6),
                                            "output_tokens": st.integers(0, 10**6)})
TEXT = st.text(max_size=40)

# valid events: (type, event without its type)
VALID_EVENTS = st.one_of(
    st.tuples(st.just("turn.started"), st.just({})),
    st.tuples(st.just("turn.completed"), USAGE.map(lambda u: {"usage": u})),
    st.tuples(st.just("turn.failed"), TEXT.map(lambda m: {"message": m})),
    st.tuples(st.just("thread.started"), TEXT.map(lambda t: {"thread_id": t})),
    st.tuples(st.just("thread.completed"), st.just({"thread_id": "t", "session_id": "s", "subtype": "success",
                                                    "outcome_code": "completed", "usage": {}, "num_turns": 0})),
    st.tuples(st.just("item.completed"), TEXT.map(lambda t: {"item": {"id": "i", "type": "agent_message", "text": t}})),
    st.tuples(st.just("error"), TEXT.map(lambda m: {"message": m})),
    st.tuples(st.sampled_from(["goal.created", "custom.thing", "x"]), st.dictionaries(
        st.sampled_from(["a", "b", "c"]), st.integers(-2**63, 2**63 - 1) | TEXT, max_size=2)),
)


@st.composite
def valid_line(draw):
    """(raw bytes to append, stored bytes, event type)."""
    etype, fields = draw(VALID_EVENTS)
    event = orjson.dumps({"type": etype, **fields})
    if draw(st.booleans()):
        version = draw(st.sampled_from(["0.18.0", "0.11.0", "9"])).encode()
        raw = b'{"schema_version":"' + version + b'","event":' + event + b"}"
        stored = raw
    else:
        raw = event
        stored = HEAD + event + b"}"
    raw += draw(st.sampled_from([b"", b"\n", b"\r\n"]))
    return raw, stored, etype


INVALID_LINES = st.one_of(
    st.sampled_from([
        b"", b"   ", b"\n", b"not json", b"[1]", b"42", b'"s"', b'{"a":1}', b"\xff\xfe",
        b'{"type":"x"}\n{"type":"y"}', b'{"type":"caf\xe9"}',
        b'{"schema_version":3,"event":{"type":"x"}}', b'{"schema_version":"0.18.0","event":[]}',
        b'{"type":"turn.completed"}', b'{"type":"turn.failed","message":1}', b'{"type":"thread.started"}',
        b'{"type":"turn.started","context":"c"}', b'{"type":"item.completed","item":{"id":1}}',
        b'{"schema_version":"0.18.0","event":{"type":"turn.completed","usage":{"input_tokens":-1}}}',
    ]),
    st.binary(max_size=20).filter(lambda b: not b.strip().startswith(b"{")),
)

OPS = st.lists(st.one_of(
    valid_line().map(lambda v: ("valid", *v)),
    valid_line().map(lambda v: ("valid", *v)),
    valid_line().map(lambda v: ("valid", *v)),
    INVALID_LINES.map(lambda raw: ("invalid", raw)),
    st.just(("flush",)),
    st.just(("reopen",)),
), max_size=40)


def model(lines: list[tuple[bytes, str]]) -> tuple[dict, list[dict]]:
    """SPEC §3.1 written out plainly: (manifest fields, index entries without ts)."""
    entries: list[dict] = []
    turn_count, in_turn, status, offset = 0, False, "active", 0
    for stored, etype in lines:
        end = offset + len(stored) + 1
        if etype == "turn.started":
            status = "active"
            if in_turn:
                entries[-1]["outcome"] = "abandoned"
                turn_count = entries[-1]["turn_number"]
            entries.append({"turn_number": len(entries) + 1, "start_offset": offset, "end_offset": end,
                            "event_count": 1, "outcome": "open"})
            in_turn = True
        else:
            if in_turn:
                entries[-1]["end_offset"] = end
                entries[-1]["event_count"] += 1
            if etype == "thread.started":
                status = "active"
            elif etype == "thread.completed":
                status = "completed"
            elif etype in ("turn.completed", "turn.failed") and in_turn:
                entries[-1]["outcome"] = "completed" if etype == "turn.completed" else "failed"
                turn_count = entries[-1]["turn_number"]
                in_turn = False
        offset = end
    manifest = {"session_id": "s", "schema_version": 1, "turn_count": turn_count, "event_count": len(lines),
                "status": status, "in_turn": in_turn, "persisted_file_len": offset, "retained_turn_base": 1}
    return manifest, entries


def run_ops(root: Path, ops, durability: str, max_events: int):
    """Apply ``ops``; return the (stored, type) of every accepted line and the live state."""
    accepted = []
    h = open_s(root, durability=durability, max_events=max_events, metadata_interval=0)
    try:
        for op in ops:
            if op[0] == "valid":
                _, raw, stored, etype = op
                h.append(raw)
                accepted.append((stored, etype))
            elif op[0] == "invalid":
                try:
                    h.append(op[1])
                except ValidationError:
                    pass
                else:
                    raise AssertionError(f"accepted an invalid line: {op[1]!r}")
            elif op[0] == "flush":
                h.flush()
            else:
                h.close()
                h = open_s(root, durability=durability, max_events=max_events)
                assert h.open_report.fast_path, h.open_report.reason
        live = state_of(h)
    finally:
        h.close()
    return accepted, live


def reopened(root: Path, max_events: int = 0):
    """Open as the writer (the open that repairs and rebuilds metadata)."""
    with open_s(root, max_events=max_events) as h:
        h.lock()
        return h.open_report, state_of(h)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, durability=st.sampled_from(["buffered", "buffered", "write", "fsync"]))
def test_log_holds_exactly_the_valid_lines_and_reopen_reproduces_the_state(ops, durability):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        accepted, live = run_ops(root, ops, durability, max_events=0)
        assert log_lines(root / "s") == [stored for stored, _ in accepted]
        assert live == model(accepted)
        report, state = reopened(root)
        assert report.fast_path and state == live
        forget_metadata(root / "s")
        report, state = reopened(root)
        assert not report.fast_path and state == live
        report, state = reopened(root)
        assert report.fast_path and state == live


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, max_events=st.integers(1, 8))
def test_with_a_cap_the_log_is_a_suffix_and_the_index_keeps_its_ordinals(ops, max_events):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        accepted, (manifest, index) = run_ops(root, ops, "write", max_events)
        stored = [line for line, _ in accepted]
        lines = log_lines(root / "s")
        assert lines == stored[len(stored) - len(lines):]
        full_manifest, full_index = model(accepted)
        dropped = full_manifest["persisted_file_len"] - manifest["persisted_file_len"]
        assert manifest["event_count"] == len(lines)
        assert manifest["turn_count"] == full_manifest["turn_count"]
        assert (manifest["in_turn"], manifest["status"]) == (full_manifest["in_turn"], full_manifest["status"])
        expected = [dict(e, start_offset=e["start_offset"] - dropped, end_offset=e["end_offset"] - dropped)
                    for e in full_index[len(full_index) - len(index):]] if index else []
        assert index == expected
        assert manifest["retained_turn_base"] == (index[0]["turn_number"] if index else manifest["turn_count"] + 1)
        if len(lines) > max_events:  # over the cap only while nothing closed is left to evict
            assert not index or (len(index) == 1 and index[0]["outcome"] == "open")
        report, state = reopened(root, max_events)
        assert report.fast_path and state == (manifest, index)
        (root / "s" / "index" / "turns.json").unlink()
        report, state = reopened(root, max_events)
        assert not report.fast_path and state == (manifest, index)
