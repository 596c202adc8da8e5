"""Hostile input through the mount (issue 7): a hypothesis-driven append fuzzer.

Each example is a sequence of lines — valid events (envelopes and bare events, any JSON
spelling, ``\\r\\n`` endings, lines exactly at the limit) mixed with invalid ones (garbage
bytes, invalid UTF-8, nesting deeper than the parser allows, numbers that overflow, NUL
bytes, lone surrogate escapes, lines over ``--max-line-bytes``, malformed lifecycle events,
non-objects, blank lines) — concatenated and written to a fresh session's ``events.jsonl``
through one ``O_APPEND`` descriptor, in writes of random sizes. The writer behaves like
``cat`` with one refinement a careful writer makes: a short write is retried from where it
stopped, and on an error it skips the line it was in (the one refused) and carries on.

The oracle for each line is the event contract itself (``parse_line`` and the line limit):
what this suite checks is what the mount does with the stream — splitting, partial lines,
short writes, the refusal of exactly the bad line. Invariants: ``events.jsonl`` is exactly the
valid lines in order (as stored: bare events wrapped), the writer saw exactly one error per
refused line with its errno, every refused line is in ``rejected.jsonl`` (an over-long one
as the prefix read before it crossed the limit), and the mount stays up.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import itertools
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memfs.errors import ValidationError
from memfs.events import parse_line

from mounting import is_mounted, mounted, needs_fuse
from test_reliability_helpers import assert_consistent

pytestmark = needs_fuse

MAX_LINE = 4096  # --max-line-bytes: keeps "huge" lines cheap
NESTING = 1100  # orjson refuses nesting deeper than 1024

# --- lines -----------------------------------------------------------------------------------

json_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | \
    st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4) |
                           st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)


@st.composite
def events(draw) -> dict:
    kind = draw(st.sampled_from(["message", "turn.started", "turn.completed", "turn.failed", "error",
                                 "unknown", "thread.started"]))
    if kind == "message":
        return {"type": "item.completed",
                "item": {"id": draw(st.text(max_size=8)), "type": "agent_message", "text": draw(st.text())}}
    if kind == "turn.completed":
        return {"type": kind, "usage": {"input_tokens": draw(st.integers(0, 10**6))}}
    if kind in ("turn.failed", "error"):
        return {"type": kind, "message": draw(st.text())}
    if kind == "thread.started":
        return {"type": kind, "thread_id": draw(st.text(max_size=12))}
    if kind == "unknown":
        return {"type": "x." + draw(st.text(max_size=8)), "data": draw(json_values)}
    return {"type": kind}


@st.composite
def valid_lines(draw) -> bytes:
    event = draw(events())
    obj = draw(st.sampled_from([event, {"schema_version": "0.18.0", "event": event}]))
    text = json.dumps(obj, ensure_ascii=draw(st.booleans()),
                      separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])))
    line = text.encode("utf-8", "surrogatepass")
    return line + (b"\r" if draw(st.booleans()) else b"")


def sized(size: int) -> bytes:
    """An error event's line exactly ``size`` bytes long."""
    head, tail = b'{"type":"error","message":"', b'"}'
    return head + b"m" * (size - len(head) - len(tail)) + tail


invalid_lines = st.one_of(
    st.binary(max_size=64).map(lambda b: b.replace(b"\n", b"")),  # garbage
    valid_lines().map(lambda b: b[: len(b) // 2]),  # cut short
    st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"]).map(  # invalid UTF-8
        lambda bad: b'{"type":"error","message":"' + bad + b'"}'),
    st.just(b'{"type":"x.deep","a":' + b"[" * NESTING + b"]" * NESTING + b"}"),
    st.sampled_from([b"1e999", b"-1e400", b"1" + b"0" * 400 + b".0e99999"]).map(
        lambda n: b'{"type":"x.num","n":' + n + b"}"),  # overflowing numbers
    st.sampled_from([b'{"type":"error","message":"a\x00b"}', b'{"type":"x"}\x00', b"\x00"]),  # NUL bytes
    st.sampled_from([b"\\ud800", b"\\udfff", b"\\ud800\\u0041"]).map(  # lone surrogates
        lambda s: b'{"type":"error","message":"' + s + b'"}'),
    st.integers(MAX_LINE + 1, MAX_LINE + 3000).map(sized),  # over the limit
    st.sampled_from([b'{"type":"turn.completed"}', b'{"type":"turn.failed"}',  # bad lifecycle events
                     b'{"type":"thread.completed","thread_id":"t"}', b'{"type":"turn.completed","usage":3}']),
    st.sampled_from([b"", b"   ", b"\r", b"[]", b"null", b'"text"', b"{}", b'{"type":7}',  # not events
                     b'{"schema_version":1,"event":{"type":"x"}}', b'{"schema_version":"1","event":[]}',
                     b'{"type":"turn.started"}{"type":"turn.started"}']),
)
edge_lines = st.sampled_from([sized(MAX_LINE), sized(MAX_LINE) + b"\r", b'{"type":"x.big","n":' + b"9" * 300 + b"}",
                              b'{"type":"x.deep","a":' + b"[" * 500 + b"]" * 500 + b"}"])
lines = st.lists(st.one_of(valid_lines(), invalid_lines, edge_lines), min_size=1, max_size=25)
write_sizes = st.lists(st.one_of(st.integers(1, 16), st.integers(17, 8192)), min_size=1, max_size=40)


def expected(line: bytes) -> tuple[bytes | None, str | None]:
    """(stored bytes, None) for a line the contract accepts, (None, errno name) otherwise."""
    if len(line) > MAX_LINE:
        return None, "EFBIG"
    try:
        return parse_line(line)[0], None
    except ValidationError as exc:
        return None, exc.errno_name


# --- the writer --------------------------------------------------------------------------------

def careful_writer(path, data: bytes, sizes: list[int]) -> list[int]:
    """Write ``data`` like ``cat`` through one O_APPEND fd; return the errnos seen, in order."""
    errors = []
    chunks = itertools.cycle(sizes)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        pos = 0
        while pos < len(data):
            chunk = data[pos : pos + next(chunks)]
            try:
                n = os.write(fd, chunk)
                assert 0 < n <= len(chunk)
                pos += n  # a short write: the rest is retried
            except OSError as exc:
                errors.append(exc.errno)
                nl = data.find(b"\n", pos)  # the refused line is the one the writer is in
                pos = len(data) if nl < 0 else nl + 1
    finally:
        try:
            os.close(fd)  # a final unterminated line is validated here
        except OSError as exc:
            errors.append(exc.errno)
    return errors


def rejected_bytes(record: dict) -> bytes:
    return base64.b64decode(record["line_b64"]) if "line_b64" in record else record["line"].encode()


# --- the test ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fuzz_mount(tmp_path_factory):
    base = tmp_path_factory.mktemp("fuzz")
    with mounted(base / "store", base / "mnt", "--max-line-bytes", str(MAX_LINE)) as m:
        yield m
    for session in (base / "store").iterdir():
        if not session.name.startswith("."):  # (the store catalog's folder is no session)
            assert_consistent(session)


def test_hostile_input_through_the_mount(fuzz_mount):
    m = fuzz_mount
    counter = itertools.count()

    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(lines=lines, sizes=write_sizes, terminated=st.booleans())
    def run(lines, sizes, terminated):
        session = m.mnt / "sessions" / f"f{next(counter)}"
        os.mkdir(session)
        data = b"\n".join(lines) + (b"\n" if terminated else b"")
        errors = careful_writer(session / "events.jsonl", data, sizes)

        if not terminated and lines[-1] == b"":
            lines = lines[:-1]  # the stream ends with the previous line's \n: no last line
        outcomes = [expected(line) for line in lines]
        stored = [s for s, _ in outcomes if s is not None]
        refused = [(line, e) for line, (_, e) in zip(lines, outcomes) if e is not None]
        assert (session / "events.jsonl").read_bytes() == b"".join(s + b"\n" for s in stored)
        assert errors == [getattr(errno, e) for _, e in refused]
        records = [json.loads(r) for r in (session / "rejected.jsonl").read_bytes().splitlines()]
        assert [r["errno"] for r in records] == [e for _, e in refused]
        for record, (line, e) in zip(records, refused):
            got = rejected_bytes(record)
            if e == "EFBIG":  # read as far as it crossed the limit; the record keeps its first 4 KiB
                assert record["bytes"] > MAX_LINE and record.get("truncated") is True
                assert line.startswith(got) and 4096 - 4 < len(got) <= 4096
                assert record["sha256"] == hashlib.sha256(line[:record["bytes"]]).hexdigest()
            else:
                assert got == line and record["bytes"] == len(line)
                assert record["sha256"] == hashlib.sha256(line).hexdigest()
        assert m.proc.poll() is None and is_mounted(m.mnt)

    run()
