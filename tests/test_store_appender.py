"""LineAppender without a mount (SPEC §6 write semantics): the one-line write (the handle's
single append) and the general path beside it."""

from __future__ import annotations

import inspect
import logging

import pytest
from memfs.errors import ValidationError
from memfs.store.appender import LineAppender

from store_helpers import START, log_lines, msg, open_s, turn


def appender(h, pid=42) -> LineAppender:
    return LineAppender(h.writes, max_line_bytes=1 << 20, pid=pid)


def test_one_line_writes_and_the_general_path_agree(tmp_path):
    with open_s(tmp_path) as h:
        a = appender(h)
        assert a.write(msg("one") + b"\n") == len(msg("one")) + 1  # the one-line path
        two_lines = msg("two") + b"\n" + msg("three") + b"\n"
        assert a.write(two_lines) == len(two_lines)
        head, tail = msg("four")[:10], msg("four")[10:] + b"\n"
        assert a.write(head) == 10 and a.partial == head  # a fragment is held...
        assert a.write(tail) == len(tail) and not a.partial  # ...and completed
        assert a.write(bytearray(msg("five") + b"\n")) == len(msg("five")) + 1  # not bytes: general path
        assert a.write(b"") == 0
    assert log_lines(tmp_path / "s") == [msg(t) for t in ("one", "two", "three", "four", "five")]


def test_a_refused_one_line_write_raises_and_is_recorded_with_the_writer_pid(tmp_path):
    with open_s(tmp_path) as h:
        a = appender(h, pid=4242)
        with pytest.raises(ValidationError):
            a.write(b'{"type": 7}\n')
        assert not a.partial
        assert a.write(msg("after") + b"\n") > 0
    assert log_lines(tmp_path / "s") == [msg("after")]
    rejected = (tmp_path / "s" / "rejected.jsonl").read_text()
    assert '"pid":4242' in rejected.replace(" ", "")


def test_a_failure_after_the_line_was_accepted_does_not_fail_the_write(tmp_path, caplog):
    def hook(session_dir, session_id, events):
        raise RuntimeError("disk says no")

    lines = [*turn("t1"), *turn("t2")]
    with open_s(tmp_path, max_events=7, summary_hook=hook, durability="buffered") as h:
        h.append_many(lines[:-1])
        a = appender(h)
        with caplog.at_level(logging.WARNING, logger="memfs.store"):
            assert a.write(lines[-1] + b"\n") == len(lines[-1]) + 1  # the cap failed after it
        assert "s: line appended, then: event cap not applied: summary hook failed: disk says no" in caplog.text
        assert h.manifest["event_count"] == 8
    assert log_lines(tmp_path / "s") == lines


def test_write_is_the_appenders_own(tmp_path):
    with open_s(tmp_path) as h:
        assert "Append the complete lines" in LineAppender.write.__doc__  # a documented method
        assert list(inspect.signature(LineAppender.write).parameters) == ["self", "data"]
        a = appender(h)
        a.write(START + b"\n")
    assert log_lines(tmp_path / "s") == [START]
