"""Full rescans of large logs in a helper process (memfs/store/rescanner.py): the same state
as a rescan in-process, whatever the log holds; any failure of the helper falls back to
rescanning in-process; after close() nothing runs there."""

from __future__ import annotations

import logging

import pytest
from memfs.store import rescanner
from memfs.store.rescanner import RescanHelper

from store_helpers import DONE, START, bare, forget_metadata, msg, open_s, state_of, turn


@pytest.fixture
def helper(monkeypatch):
    """A helper for logs of any size; the tests install it for this process's opens."""
    h = RescanHelper()
    monkeypatch.setattr(rescanner, "MIN_BYTES", 0)
    try:
        yield h
    finally:
        rescanner.use(None)
        h.close()


def stale_session(root):
    """A session whose metadata is gone: opening it rescans its log — turns closed, failed and
    open, a line outside turns, a bare event, a line the rescan skips and an unterminated tail."""
    with open_s(root) as h:
        h.append(msg("outside"))
        for line in [*turn("t1"), *turn("t2", 3), START, msg("t3 message 0")]:
            h.append(line)
        h.append(bare("turn.failed", message="gave up"))
        h.append(START)
        h.append(msg("t4 message 0"))
    with open(root / "s" / "events.jsonl", "ab") as f:
        f.write(b"not json at all\n")
        f.write(msg("t4 message 1") + b"\n")
        f.write(b'{"schema_version":"0.18.0","event":{"type":"item.com')  # being written
    forget_metadata(root / "s")


def opened(root, **kw):
    with open_s(root, read_only=True, **kw) as h:
        report = h.open_report
        return state_of(h), (report.fast_path, report.scanned_lines, report.skipped_lines, report.scanned_bytes)


def test_a_helper_rescan_finds_what_a_rescan_here_finds(tmp_path, helper):
    stale_session(tmp_path)
    here = opened(tmp_path)
    rescanner.use(helper)
    there = opened(tmp_path)
    assert helper.rescans == 1 and helper.broken is None
    assert there == here
    assert here[1][0] is False and here[1][2] == 1  # a rescan, which skipped the bad line
    with open_s(tmp_path) as h:  # a writer's open: it repairs the tail and persists the rescan
        h.append(DONE)
        assert h.manifest["turn_count"] == 4 and not h.manifest["in_turn"]
    assert helper.rescans == 2


def test_a_failing_helper_falls_back_to_rescanning_here(tmp_path, helper, monkeypatch, caplog):
    stale_session(tmp_path)
    here = opened(tmp_path)
    rescanner.use(helper)
    monkeypatch.setattr(rescanner, "FD_PATH", str(tmp_path / "gone" / "{pid}-{fd}"))  # the worker cannot open it
    with caplog.at_level(logging.WARNING, logger="memfs.store"):
        assert opened(tmp_path) == here
    assert helper.rescans == 0 and "FileNotFoundError" in helper.broken
    assert "rescans of large logs run in-process" in caplog.text
    monkeypatch.setattr(rescanner, "FD_PATH", "/proc/{pid}/fd/{fd}")
    assert opened(tmp_path) == here and helper.rescans == 0  # once broken, not asked again


def test_small_logs_and_a_closed_helper_rescan_here(tmp_path, helper, monkeypatch):
    stale_session(tmp_path)
    rescanner.use(helper)
    monkeypatch.setattr(rescanner, "MIN_BYTES", 1 << 20)
    here = opened(tmp_path)
    assert helper.rescans == 0
    monkeypatch.setattr(rescanner, "MIN_BYTES", 0)
    helper.close()
    assert opened(tmp_path) == here and helper.rescans == 0 and helper.broken is None
