"""Hardening from the adversarial pass of issue 16: hostile names, hostile files in one
session, tampered audit packs, stale temp files, interrupted removals, bounded memory.

Each case is seen the way a user sees it: through a real mount or the ``memfs`` command.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import memfs
from memfs import cli
from mounting import event, mounted, needs_fuse

GOOD = [event("thread.started", thread_id="t"), event("turn.started"),
        event("item.completed", item={"id": "m", "type": "agent_message", "text": "retry loop added"}),
        event("turn.completed", usage={"input_tokens": 5})]


def run(capsys, *argv) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def make(root: Path, name: str, lines=GOOD) -> Path:
    with memfs.open_session(root, name, durability="write", metadata_interval=0) as h:
        h.append_many(lines)
    return root / name


# --- 7: a session name beginning with '-' ------------------------------------------------


def test_cli_refuses_to_create_a_session_named_like_an_option(capsys, tmp_path):
    store = tmp_path / "store"
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(GOOD) + "\n")
    code, out, err = run(capsys, "append", "--store", store, "--", "-rf", source)
    assert code == 1 and out == ""
    assert err == "memfs: invalid session name '-rf': it must not begin with '-' (e.g. '_rf')\n"
    assert not (store / "-rf").exists()
    code, out, _ = run(capsys, "append", "--store", store, "--", "a-rf", source)
    assert code == 0 and "appended 4 lines to a-rf" in out
