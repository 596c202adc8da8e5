"""Hardening from the adversarial pass of issue 16: hostile names, hostile files in one
session, tampered audit packs, stale temp files, interrupted removals, bounded memory.

Each case is seen the way a user sees it: through a real mount or the ``memfs`` command.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import memfs
import pytest

from mounting import event, mounted, needs_fuse
from store_helpers import join_all, make_logged, wait_until
from store_helpers import run_cli as run

GOOD = [event("thread.started", thread_id="t"), event("turn.started"),
        event("item.completed", item={"id": "m", "type": "agent_message", "text": "retry loop added"}),
        event("turn.completed", usage={"input_tokens": 5})]


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


# --- 4: memfs pack verify is strict --------------------------------------------------------


def _pack(session: Path) -> dict:
    return json.loads((session / "derived" / "audit-pack.json").read_text())


def _rewrite(session: Path, change) -> None:
    pack = _pack(session)
    change(pack)
    (session / "derived" / "audit-pack.json").write_text(json.dumps(pack))


def _entry(pack: dict, path: str) -> dict:
    return next(e for e in pack["entries"] if e["path"] == path)


def test_pack_verify_refuses_every_tampering(capsys, tmp_path):
    import hashlib

    store = tmp_path / "store"
    session = make(store, "s")
    log = session / "events.jsonl"
    pristine = log.read_bytes()

    def fresh():
        log.write_bytes(pristine)
        code, out, _ = run(capsys, "pack", "create", "s", "--store", store)
        assert code == 0
        return out

    def verify(*extra):
        code, out, _ = run(capsys, "pack", "verify", "s", *extra, "--store", store)
        return code, out

    out = fresh()
    digest = hashlib.sha256((session / "derived" / "audit-pack.json").read_bytes()).hexdigest()
    assert f"pack sha256 {digest}" in out
    pack = _pack(session)
    assert (pack["events_len"], pack["events_sha256"]) == (len(pristine), hashlib.sha256(pristine).hexdigest())
    assert (pack["event_count"], pack["turn_count"]) == (4, 1)
    assert verify("--digest", digest) == (0, verify()[1]) and verify()[1].startswith("verified: ")

    # an empty entry list vouches for nothing
    _rewrite(session, lambda p: p.__setitem__("entries", []))
    code, out = verify()
    assert code == 1 and "invalid pack" in out and "lists no files" in out

    # the log tampered with, and its entry deleted
    fresh()
    log.write_bytes(pristine.replace(b"retry loop", b"rm -rf /  "))
    _rewrite(session, lambda p: p.__setitem__("entries", [e for e in p["entries"] if e["path"] != "events.jsonl"]))
    code, out = verify()
    assert code == 1 and "no entry for events.jsonl" in out

    # the log tampered with and its entry's sha256 rewritten to match
    fresh()
    tampered = pristine.replace(b"retry loop", b"rm -rf /  ")
    log.write_bytes(tampered)
    _rewrite(session, lambda p: _entry(p, "events.jsonl").update(sha256=hashlib.sha256(tampered).hexdigest()))
    code, out = verify()
    assert code == 1 and "events_len/events_sha256 disagree" in out

    # ... and the header's events_sha256 too: the pack's own digest gives it away
    _rewrite(session, lambda p: p.__setitem__("events_sha256", hashlib.sha256(tampered).hexdigest()))
    code, out = verify("--digest", digest)
    assert code == 1 and "digest mismatch" in out and out.rstrip().splitlines()[-1].startswith("NOT verified")

    # header fields that disagree with the files
    for key, value in (("event_count", 9), ("turn_count", 3), ("status", "completed"), ("session_id", "other")):
        fresh()
        if key == "status":  # completed where the log says active is the sweep's right: use a real lie
            value = "bogus"
        _rewrite(session, lambda p: p.__setitem__(key, value))  # noqa: B023 (called now)
        code, out = verify()
        assert code == 1 and f"header      {key} is" in out, (key, out)

    # an unaccounted file
    fresh()
    (session / "notes.txt").write_text("planted")
    code, out = verify()
    assert code == 1 and "unaccounted notes.txt" in out
    (session / "notes.txt").unlink()

    # a legitimate append after packing: grown, verified
    fresh()
    with memfs.open_session(store, "s", durability="write", metadata_interval=0) as h:
        h.append_many([event("turn.started"), event("turn.completed", usage={})])
    code, out = verify()
    assert code == 0, out
    assert "verified (grown by 2 events since the pack)" in out
    assert "refreshed   manifest.json" in out
    # ... but a grown log whose packed prefix changed is tampering
    log.write_bytes(log.read_bytes().replace(b"retry loop", b"rm -rf /  "))
    code, out = verify()
    assert code == 1 and "mismatch    events.jsonl" in out


# --- 3: a hostile eviction summary costs that file only ------------------------------------


def _fact_session(store: Path, name: str, text: str) -> Path:
    return make(store, name, [event("turn.started"),
                              event("item.completed", item={"id": "m", "type": "agent_message", "text": text}),
                              event("turn.completed", usage={})])


@needs_fuse
def test_planted_eviction_summaries_cost_only_themselves(tmp_path):
    store = tmp_path / "store"
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"grounded_facts": ["zanzibarquokka retry"]}))
    sessions = {"linked": "retry loop in linked", "garbage": "retry loop in garbage",
                "fifo": "retry loop in fifo", "clean": "retry loop in clean"}
    for name, text in sessions.items():
        derived = _fact_session(store, name, text) / "derived"
        derived.mkdir(mode=0o700, exist_ok=True)
    os.symlink(secret, store / "linked" / "derived" / "eviction-summary-0001.json")
    (store / "garbage" / "derived" / "eviction-summary-0001.json").write_bytes(b"\xff{not json")
    os.mkfifo(store / "fifo" / "derived" / "eviction-summary-0001.json")
    (store / "clean" / "derived" / "eviction-summary-0001.json").write_text(
        json.dumps({"grounded_facts": ["evicted retry fact"]}))
    with mounted(store, tmp_path / "mnt") as m:
        for name, text in sessions.items():
            derived = m.mnt / "sessions" / name / "derived"
            facts = [f["fact"] for f in json.loads((derived / "memory.json").read_text())["grounded_facts"]]
            assert text in facts, name
            assert (derived / "summary.md").read_text() and (derived / "trajectory.jsonl").read_text()
            assert not any("zanzibarquokka" in f for f in facts)
        clean = json.loads((m.mnt / "sessions" / "clean" / "derived" / "memory.json").read_text())
        assert "evicted retry fact" in [f["fact"] for f in clean["grounded_facts"]]
        assert os.listdir(m.mnt / "sessions" / "clean" / "derived").count("eviction-summary-0001.json") == 1
        assert "eviction-summary-0001.json" not in os.listdir(m.mnt / "sessions" / "linked" / "derived")
        results = [json.loads(x) for x in (m.mnt / "search" / "retry loop?k=20").read_text().splitlines()]
        assert {r["session_id"] for r in results} == set(sessions)
        assert not any("zanzibarquokka" in r["snippet"] for r in results)
        assert (m.mnt / "search" / "zanzibarquokka").read_text() == ""
        assert "Traceback" not in m.log_text() and "ERROR" not in m.log_text()


# --- 6: stale temp files after kill -9; interrupted gc removals ----------------------------


def test_fsck_removes_the_temp_files_of_a_killed_writer(capsys, tmp_path):
    import signal
    import subprocess

    store = tmp_path / "store"
    session = make(store, "s")
    (session / "derived").mkdir(mode=0o700, exist_ok=True)
    targets = [session / "manifest.json", session / "index" / "turns.json",
               session / "index" / "pending-cap-rewrite.json", session / "derived" / "eviction-summary-0001.json"]
    writer = ("import os, sys, time\nfrom pathlib import Path\nfrom memfs.store.paths import atomic_write\n"
              "def stall(fd):\n    os.write(fd, b'partial')\n    time.sleep(600)\n"
              "import threading\n"
              "for t in sys.argv[1:]:\n    threading.Thread(target=atomic_write, args=(Path(t), stall), daemon=True).start()\n"
              "time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-c", writer, *map(str, targets)])
    try:
        temps = wait_until(lambda: (lambda found: found if len(found) == 4 else None)(
            [p for t in targets for p in t.parent.glob(f".{t.name}.{proc.pid}.*.tmp")]),
            "the writer's four temp files")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    # a temp file whose writer still runs is not stale
    live = session / "derived" / f".memory.json.{os.getpid()}.0123abcd.tmp"
    live.write_bytes(b"in flight")
    code, out, _ = run(capsys, "fsck", "--store", store)
    assert code == 1 and "repaired: removed 4 stale temp file(s) of an interrupted write" in out
    assert not any(p.exists() for p in temps) and live.exists()
    code, out, _ = run(capsys, "fsck", "--store", store, "--json")
    assert code == 0 and json.loads(out)[0]["stale_temps"] == 0


def test_an_interrupted_gc_removal_never_leaves_a_listed_session(capsys, tmp_path, monkeypatch):
    import shutil

    from memfs.store import retention

    store = tmp_path / "store"
    with memfs.open_session(store, "old", durability="write", metadata_interval=0) as h:
        h.append_many(GOOD + [event("thread.completed", thread_id="t", session_id="old", subtype="success",
                                    outcome_code="completed", usage={}, num_turns=1)])
    make(store, "keep")
    real_rmtree = shutil.rmtree

    def crash_midway(path, *a, **kw):  # the process dies after deleting part of the tree
        os.unlink(os.path.join(path, "events.jsonl"))
        raise KeyboardInterrupt("killed")

    crash_midway.avoids_symlink_attacks = True

    monkeypatch.setattr(shutil, "rmtree", crash_midway)
    with pytest.raises(KeyboardInterrupt):
        retention.gc(store, retention.Policy(max_sessions=0, max_age_days=0))
    monkeypatch.setattr(shutil, "rmtree", real_rmtree)
    leftovers = [n for n in os.listdir(store) if n.startswith(".trash-")]
    assert len(leftovers) == 1 and leftovers[0].endswith("-old")
    code, out, _ = run(capsys, "sessions", "--store", store, "--json")
    assert [s["name"] for s in json.loads(out)] == ["keep"]
    # the leftover's process is this one, still running: a later gc in another process
    # (pid gone) finishes it; simulate that by renaming it to a dead pid
    dead = leftovers[0].replace(f".trash-{os.getpid()}-", ".trash-999999999-")
    os.rename(store / leftovers[0], store / dead)
    code, out, _ = run(capsys, "gc", "--store", store, "--yes", "--json")
    assert code == 0 and json.loads(out)["trash_removed"] == 1
    assert sorted(n for n in os.listdir(store) if n != ".memfs") == ["keep"]  # (.memfs: the store catalog)


# --- 2: a writer without O_APPEND ----------------------------------------------------------


@needs_fuse
def test_a_writer_without_o_append_keeps_writing_after_wrapped_bare_events(tmp_path):
    import errno

    bare = [b'{"type":"thread.started","thread_id":"t"}\n', b'{"type":"turn.started"}\n',
            b'{"type":"item.completed","item":{"id":"m","type":"agent_message","text":"hi"}}\n',
            b'{"type":"turn.completed","usage":{}}\n']
    with mounted(tmp_path / "store", tmp_path / "mnt") as m:
        os.mkdir(m.mnt / "sessions" / "s")
        log = m.mnt / "sessions" / "s" / "events.jsonl"
        fd = os.open(log, os.O_WRONLY)  # no O_APPEND: the kernel passes the handle's own offset
        try:
            for line in bare:
                assert os.write(fd, line) == len(line)
            # a line split over two writes, still at the handle's own position
            assert os.write(fd, b'{"type":"turn.st') == 16 and os.write(fd, b'arted"}\n') == 8
            stored = len(log.read_bytes())
            assert stored > sum(map(len, bare)) + 24  # wrapped: longer on disk than written
            # pwrite at the log's end is accepted too, and so is continuing from there
            end_line = b'{"type":"turn.completed","usage":{}}\n'
            assert os.pwrite(fd, end_line, stored) == len(end_line)
            with pytest.raises(OSError) as err:  # anywhere else is an overwrite
                os.pwrite(fd, bare[1], 10)
            assert err.value.errno == errno.EPERM
        finally:
            os.close(fd)
        # a handle opened on a non-empty log, seeked to its end
        fd = os.open(log, os.O_WRONLY)
        try:
            os.lseek(fd, 0, os.SEEK_END)
            for line in bare[1:]:
                assert os.write(fd, line) == len(line)
        finally:
            os.close(fd)
        manifest = json.loads((m.mnt / "sessions" / "s" / "manifest.json").read_text())
        assert (manifest["event_count"], manifest["turn_count"]) == (9, 3)
    stored_lines = (tmp_path / "store" / "s" / "events.jsonl").read_bytes().splitlines()
    assert len(stored_lines) == 9 and all(json.loads(x)["schema_version"] for x in stored_lines)
    assert not (tmp_path / "store" / "s" / "rejected.jsonl").exists()


# --- 5: a second SIGTERM during shutdown -----------------------------------------------------


@needs_fuse
def test_a_second_sigterm_does_not_cut_the_final_flush_short(tmp_path):
    import signal
    import subprocess

    from mounting import cleanup, is_mounted, start

    store = tmp_path / "store"
    names = [f"s{i:02d}" for i in range(40)]
    for name in names:
        _fact_session(store, name, f"retry loop number {name}")
    m = start(store, tmp_path / "mnt", "--durability", "buffered")
    try:
        views = {}
        for name in names:  # render the views: their copies to derived/ are written behind
            session = m.mnt / "sessions" / name
            views[name] = (session / "derived" / "memory.json").read_bytes()
            with open(session / "events.jsonl", "a") as f:  # buffered: only in the server's memory
                f.write(event("turn.started") + "\n")
        subprocess.run(["fusermount3", "-u", "-z", str(m.mnt)], check=True)
        m.proc.send_signal(signal.SIGTERM)
        m.proc.send_signal(signal.SIGTERM)
        assert m.proc.wait(60) == 0, m.log_text()
        assert not is_mounted(m.mnt)
    finally:
        cleanup(m)
    for name in names:
        derived = store / name / "derived" / "memory.json"
        assert derived.read_bytes() == views[name], name
        manifest = json.loads((store / name / "manifest.json").read_text())
        assert (manifest["event_count"], manifest["in_turn"]) == (4, True), name
        assert (store / name / "events.jsonl").read_bytes().endswith(b'{"type":"turn.started"}}\n')


# --- 1: rejected.jsonl is bounded, and read by streaming ------------------------------------


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


@needs_fuse
def test_a_huge_line_without_newline_keeps_the_server_small(tmp_path):
    import errno
    import hashlib
    import threading

    limit = 64 * 1024
    with mounted(tmp_path / "store", tmp_path / "mnt", "-o", f"max_rejected_bytes={limit},max_line_bytes=4194304") as m:
        os.mkdir(m.mnt / "sessions" / "s")
        session = m.mnt / "sessions" / "s"
        baseline = _status_kib(m.proc.pid, "VmRSS")
        chunk = b"A" * (1 << 20)
        refused, stop = [], threading.Event()

        def reader():  # concurrent readers of rejected.jsonl, all the while
            while not stop.is_set():
                try:
                    (session / "rejected.jsonl").read_bytes()
                except FileNotFoundError:
                    pass

        readers = [threading.Thread(target=reader) for _ in range(6)]
        for t in readers:
            t.start()
        try:
            fd = os.open(session / "events.jsonl", os.O_WRONLY | os.O_APPEND)
            try:
                for _ in range(96):  # 96 MiB, never a newline
                    try:
                        os.write(fd, chunk)
                    except OSError as exc:
                        assert exc.errno == errno.EFBIG
                        refused.append(exc)
            finally:
                try:
                    os.close(fd)
                except OSError:
                    pass  # the last fragment, refused at close
        finally:
            stop.set()
            join_all(readers, "a reader of rejected.jsonl still running after the writes stopped")
        peak = _status_kib(m.proc.pid, "VmHWM")
        assert len(refused) >= 15
        assert peak - baseline < 64 * 1024, f"server grew by {(peak - baseline) // 1024} MiB"
        shown = (session / "rejected.jsonl").read_bytes()
        on_disk = (tmp_path / "store" / "s" / "rejected.jsonl").read_bytes()
        assert shown == on_disk and 0 < len(on_disk) <= limit
    rotated = tmp_path / "store" / "s" / "rejected.1.jsonl"
    assert rotated.exists() and rotated.stat().st_size <= limit
    records = [json.loads(x) for x in on_disk.splitlines()]
    assert records[-1]["errno"] == "EBADMSG"  # the fragment left at close
    record = next(r for r in reversed(records) if r["errno"] == "EFBIG")
    assert record["truncated"] is True
    assert len(record["line"]) == 4096 and record["line"] == "A" * 4096
    assert record["bytes"] > 4 << 20 and len(record["sha256"]) == 64
    assert record["sha256"] == hashlib.sha256(b"A" * record["bytes"]).hexdigest()
    assert (tmp_path / "store" / "s" / "events.jsonl").read_bytes() == b""


def make(root: Path, name: str, lines=GOOD) -> Path:
    return make_logged(root, name, lines)
