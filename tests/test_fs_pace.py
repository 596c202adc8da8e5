"""The mount's search-index warm-up gives way to requests (memfs/pace.py): while an idle
session is read without pause, the warm-up of a large stale session waits; a request that
needs that session is answered all the same; once the reads stop, the warm-up finishes and
search finds the session's facts."""

from __future__ import annotations

import json
import os
import threading
import time

import memfs
from memfs.samples import sized_message

from mounting import children, event, mounted, needs_fuse, sh

pytestmark = needs_fuse


def root_xattr(mnt, name: str) -> str | None:
    try:
        return os.getxattr(mnt, f"user.memfs.{name}").decode()
    except OSError:
        return None


def stale_session(store, name: str, mb: int, last_text: str) -> int:
    """A session whose ``mb`` MB log no metadata describes (opening it rescans it); its last
    turn says ``last_text``. Returns its number of events."""
    with memfs.open_session(store, name, durability="write", max_events=0) as h:
        h.append(event("turn.started").encode() + b"\n")
        h.append(event("turn.completed", usage={}).encode() + b"\n")
    chunk = (event("turn.started") + "\n").encode() + sized_message(1) * 30 + \
        (event("turn.completed", usage={}) + "\n").encode()
    turns = mb * 1024 * 1024 // len(chunk)
    last = [event("turn.started"),
            event("item.completed", item={"id": "z", "type": "agent_message", "text": last_text}),
            event("turn.completed", usage={})]
    with open(store / name / "events.jsonl", "ab") as f:  # behind the metadata's back
        for _ in range(turns):
            f.write(chunk)
        f.write("".join(line + "\n" for line in last).encode())
    (store / name / "manifest.json").unlink()
    return 2 + turns * 32 + 3


def test_the_warm_up_gives_way_to_reads_and_finishes_after_them(tmp_path):
    store = tmp_path / "store"
    with memfs.open_session(store, "idle", durability="write") as h:
        h.append(event("turn.started").encode() + b"\n")
        h.append(event("turn.completed", usage={}).encode() + b"\n")
    events = stale_session(store, "big", 24, "the zebra quartz migration finished")
    with mounted(store, tmp_path / "mnt") as m:
        manifest = m.mnt / "sessions" / "idle" / "manifest.json"
        stop = threading.Event()
        reads = [0]

        def reader():  # stat + cat of an idle session, without pause
            while not stop.is_set():
                os.stat(manifest)
                assert json.loads(manifest.read_bytes())["event_count"] == 2
                reads[0] += 1

        thread = threading.Thread(target=reader)
        thread.start()
        try:
            deadline = time.monotonic() + 60
            while int(root_xattr(m.mnt, "background_waits") or 0) == 0:
                assert thread.is_alive() and time.monotonic() < deadline, \
                    f"the warm-up never gave way (pending: {root_xattr(m.mnt, 'warm_pending')})"
                time.sleep(0.01)
            # a request that needs what the warm-up holds (its fold of the big session: the
            # views' state) is answered while the reads go on: the warm-up stops giving way
            # while it is served (without that, such a request waited 40 s here)
            view = json.loads(sh("cat sessions/big/derived/memory.json", cwd=m.mnt, timeout=20).stdout)
            assert "the zebra quartz migration finished" in json.dumps(view)
            big = json.loads(sh("cat sessions/big/manifest.json", cwd=m.mnt, timeout=20).stdout)
            assert big["event_count"] == events
            assert thread.is_alive()
        finally:
            stop.set()
            thread.join(60)
        assert reads[0] > 0
        deadline = time.monotonic() + 60
        while root_xattr(m.mnt, "warm_pending") != "0":
            assert time.monotonic() < deadline, f"the warm-up did not finish: {root_xattr(m.mnt, 'warm_pending')}"
            time.sleep(0.01)
        assert int(root_xattr(m.mnt, "background_waited_ms")) > 0
        hits = [json.loads(line) for line in sh('cat "search/zebra quartz"', cwd=m.mnt).stdout.splitlines()]
        assert [h["chunk_id"].split(":")[0] for h in hits] == ["big"]
        assert hits[0]["snippet"] == "the zebra quartz migration finished"


def test_a_request_rescan_of_a_large_log_runs_in_the_helper_and_leaves_no_process(tmp_path):
    """A session that appears behind the server's back after its warm-up is opened by a request:
    its 20 MB log is rescanned by the mount's helper process (memfs/store/rescanner.py), whose
    result is the session's true count; at unmount the helper goes with the server."""
    store = tmp_path / "store"
    with memfs.open_session(store, "idle", durability="write") as h:
        h.append(event("turn.started").encode() + b"\n")
    with mounted(store, tmp_path / "mnt") as m:
        deadline = time.monotonic() + 60
        while root_xattr(m.mnt, "warm_pending") != "0":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert root_xattr(m.mnt, "helper_rescans") == "0"  # (the idle session is small)
        events = stale_session(store, "late", 20, "the late session's last words")
        big = json.loads(sh("cat sessions/late/manifest.json", cwd=m.mnt).stdout)
        assert (big["event_count"], big["in_turn"]) == (events, False)
        assert root_xattr(m.mnt, "helper_rescans") == "1"
        helpers = children(m.proc.pid)
        assert helpers, "the helper process runs while the mount serves"
        assert json.loads(sh("cat sessions/late/manifest.json", cwd=m.mnt).stdout)["event_count"] == events
        assert root_xattr(m.mnt, "helper_rescans") == "1"  # held open now: no second rescan
    deadline = time.monotonic() + 30
    while any(os.path.exists(f"/proc/{pid}") for pid in helpers):
        assert time.monotonic() < deadline, f"left running after unmount: {helpers}"
        time.sleep(0.01)


def thread_nices(pid: int) -> dict[int, int]:
    """Each thread of ``pid``: its nice value (``/proc/<pid>/task/<tid>/stat``, field 19)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                out[int(tid)] = int(f.read().rsplit(")", 1)[1].split()[16])
        except (OSError, IndexError):  # (a thread that ended meanwhile)
            continue
    return out


def test_the_mount_runs_its_worker_threads_below_its_event_loop(tmp_path):
    # cap rewrites (request hops), their persists (the persister) and the store's pool run
    # on worker threads; each lowers its own priority; the event loop (the main thread) keeps
    # the process's
    with mounted(tmp_path / "store", tmp_path / "mnt", "--max-events", "20") as m:
        s = m.mnt / "sessions" / "w"
        os.mkdir(s)
        for _ in range(30):  # a turn per append: past the cap of 20 every few turns
            with open(s / "events.jsonl", "a") as f:
                f.write(f"{event('turn.started')}\n{event('turn.completed', usage={})}\n")
        assert json.loads((s / "manifest.json").read_bytes())["retained_turn_base"] > 1  # rewrites happened
        base = os.getpriority(os.PRIO_PROCESS, 0)
        lowered = min(19, base + 10)
        assert thread_nices(m.proc.pid)[m.proc.pid] == base
        assert os.sched_getscheduler(m.proc.pid) == os.SCHED_OTHER  # the event loop's policy stays
        # each worker is at the loop's nice + 10 (a worker started by a worker is not lowered
        # twice) and runs as a batch thread (it never preempts on wakeup); the others (the
        # loop, fsync mode's syncer threads) keep the normal policy. A thread starting just
        # now may be between its two changes: sample until none is, within a deadline.
        deadline = time.monotonic() + 10
        while True:
            threads = {}
            for tid, n in thread_nices(m.proc.pid).items():
                try:
                    threads[tid] = (n, os.sched_getscheduler(tid))
                except OSError:  # (a thread that ended meanwhile)
                    continue
            if all(t in ((base, os.SCHED_OTHER), (lowered, os.SCHED_BATCH)) for t in threads.values()):
                break
            assert time.monotonic() < deadline, threads
            time.sleep(0.01)
        assert (lowered, os.SCHED_BATCH) in threads.values(), threads
