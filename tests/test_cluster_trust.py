"""Cluster mode's trust boundary (SPEC §9, issue 42 items 1, 2 and part of 5), for real on a
three-node JetStream cluster: a subject is never followed to a path, an ack is checked and not
assumed, the follower never stalls on one message, appends without quorum fail with
``ETIMEDOUT``, and a line over the server's max payload is refused at ``write()``.

The tests publish with ``nats-py`` as any client of the servers can: what the attacker did."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import memfs
import pytest

from cluster import NatsCluster, require
from mounting import cleanup, event, mounted, start
from test_cluster import (  # noqa: F401 (fixtures)
    cluster_config,
    delete_stream,
    hosts,
    item,
    lines_of,
    nats_cluster,
    same_replicas,
    stream_name,
    wait_for,
    write_line,
)

nats = require("nats")
from nats.js.errors import NotFoundError  # noqa: E402

FIRST = event("thread.started", thread_id="t")


async def _on_js(urls: str, fn):
    nc = await nats.connect(urls.split(","))
    try:
        return await fn(nc.jetstream())
    finally:
        await nc.close()


def publish(urls: str, subject: str, data: bytes, headers: dict | None = None) -> int:
    """Publish one message as any client of the servers may; its stream sequence. Asked again
    (for up to 15 s) while the stream does not answer: a loaded cluster may be electing the
    stream's leader, as any client would find."""

    async def fn(js):
        deadline = time.monotonic() + 15
        while True:
            try:
                return await js.publish(subject, data, headers=headers)
            except (nats.js.errors.NoStreamResponseError, nats.errors.TimeoutError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.1)

    return asyncio.run(_on_js(urls, fn)).seq


def messages(urls: str, stream: str) -> list:
    """Every message of the stream, in order (``seq``, ``subject``, ``data``, ``headers``)."""

    async def fn(js):
        state = (await js.stream_info(stream)).state
        out = []
        for seq in range(state.first_seq, state.last_seq + 1):
            try:
                out.append(await js.get_msg(stream, seq))
            except NotFoundError:
                pass
        return out

    return asyncio.run(_on_js(urls, fn))


def checkpoint(store: Path) -> int:
    try:
        return json.loads((store / ".memfs-cluster.json").read_text())["seq"]
    except FileNotFoundError:
        return 0


def tree(path: Path) -> dict[str, bytes | None]:
    """Every file (its bytes) and folder (None) under ``path``."""
    return {str(p.relative_to(path)): (p.read_bytes() if p.is_file() else None) for p in sorted(path.rglob("*"))}


def rejected(store: Path, session: str) -> list[dict]:
    return [json.loads(line) for line in lines_of(store / session / "rejected.jsonl")]


# --- 1. a subject is never a path ----------------------------------------------------------------


def test_a_subject_is_never_followed_to_a_path(tmp_path, nats_cluster, request):
    """Messages on subjects whose session part is not a name ``mkdir`` would take — an absolute
    path, ``-rf``, a nested path, a NUL, a name over 255 bytes — are skipped and logged with
    their stream sequence: no file outside the store is read, published or written, none inside
    is made, the host keeps following, and its checkpoint moves past them (a restart does not
    deliver them again)."""
    stream, config = cluster_config(tmp_path, request)
    urls = nats_cluster.urls
    outside = tmp_path / "outside"  # a log outside the store, private to this host
    outside.mkdir()
    (outside / "events.jsonl").write_text(FIRST + "\n" + item("SECRET-zanzibarquokka") + "\n")
    before = tree(outside)
    args = ("--cluster", urls, "--config", str(config))
    with ExitStack() as stack:
        stack.callback(delete_stream, urls, stream)
        with mounted(tmp_path / "sa", tmp_path / "A", *args) as a:
            os.mkdir(a.mnt / "sessions" / "ok")
            write_line(a.mnt, "ok", FIRST)
            hostile = [str(outside), "-rf", "ok/index", "x\x00y", "n" * 300]
            # (the first line of the planted log: a message that matches it made the old code
            # take the rest of that log for lines of its own to publish)
            seqs = [publish(urls, "memfs." + name, FIRST.encode()) for name in hostile]
            later = publish(urls, "memfs.ok", item("later").encode())
            wait_for(lambda: item("later") in lines_of(a.store / "ok" / "events.jsonl"),
                     what="A to keep following after the hostile subjects")
            log = a.log_text()
            for seq in seqs:
                assert f"stream message {seq} skipped: invalid session name" in log
        assert tree(outside) == before  # nothing outside the store opened for writing, nothing made there
        assert not any(b"SECRET" in m.data for m in messages(urls, stream))  # nor published
        assert [e for e in os.listdir(tmp_path / "sa") if not e.startswith(".")] == ["ok"]
        assert not (tmp_path / "sa" / "ok" / "index" / "events.jsonl").exists()
        assert lines_of(tmp_path / "sa" / "ok" / "events.jsonl") == [FIRST, item("later")]
        assert checkpoint(tmp_path / "sa") >= later  # the checkpoint moved past them
        with mounted(tmp_path / "sa", tmp_path / "A", *args) as a:
            assert int(os.getxattr(a.mnt, "user.memfs.cluster_resumed_after")) >= later  # not delivered again


# --- 3. the follower never stalls on one message -------------------------------------------------


def test_a_stream_line_this_host_cannot_apply_is_rejected_with_its_sequence_and_passed(tmp_path, nats_cluster,
                                                                                       request):
    """An invalid line in the stream, and a line of a session whose history here differs from
    the stream's, are recorded in that session's ``rejected.jsonl`` with their stream sequence;
    the follower goes on and its checkpoint moves past them."""
    stream, config = cluster_config(tmp_path, request)
    urls = nats_cluster.urls
    with memfs.open_session(tmp_path / "sa", "clash") as h:  # A's, written before cluster mode
        h.append(event("thread.started", thread_id="clash-A"))
    args = ("--cluster", urls, "--config", str(config))
    with ExitStack() as stack:
        stack.callback(delete_stream, urls, stream)
        b = stack.enter_context(mounted(tmp_path / "sb", tmp_path / "B", *args))
        for name in ("clash", "s"):
            os.mkdir(b.mnt / "sessions" / name)
            write_line(b.mnt, name, event("thread.started", thread_id=f"{name}-B"))
        a = stack.enter_context(mounted(tmp_path / "sa", tmp_path / "A", *args))
        wait_for(lambda: "another history" in a.log_text(), what="A to leave its own clash alone")
        bad = publish(urls, "memfs.s", b'{"not an event":')
        write_line(b.mnt, "clash", item("b-later"))  # a line of the stream's other history
        clash_seqs = [m.seq for m in messages(urls, stream) if m.subject == "memfs.clash"]
        write_line(b.mnt, "s", item("after"))  # B's fence passes the refused line too
        wait_for(lambda: item("after") in lines_of(a.store / "s" / "events.jsonl"), what="A to keep following")
        last = max(m.seq for m in messages(urls, stream))
        for m in (a, b):  # every host refuses the invalid line, the same way
            assert [(r["stream_seq"], r["errno"]) for r in rejected(m.store, "s")] == [(bad, "EBADMSG")]
            assert lines_of(m.store / "s" / "events.jsonl") == [event("thread.started", thread_id="s-B"),
                                                               item("after")]
        wait_for(lambda: [r.get("stream_seq") for r in rejected(a.store, "clash")] == clash_seqs,
                 what="A to record the other history's lines of its clash")
        assert "clash-B" in rejected(a.store, "clash")[0]["line"] and "b-later" in rejected(a.store, "clash")[1]["line"]
        assert lines_of(a.store / "clash" / "events.jsonl") == [event("thread.started", thread_id="clash-A")]
        wait_for(lambda: checkpoint(a.store) >= last, what="A's checkpoint to move past them")


# --- 2. an ack is checked, not assumed -----------------------------------------------------------


def host_id_of(urls: str, stream: str, subject: str) -> str:
    """The host id in the ``Nats-Msg-Id`` of the last message of ``subject``: what any reader of
    the stream sees."""
    last = [m for m in messages(urls, stream) if m.subject == subject][-1]
    return last.headers["Nats-Msg-Id"].rsplit(":", 3)[0]


def test_a_duplicate_ack_is_not_taken_for_the_write(hosts, nats_cluster, request):
    """Another message already stored under the ``Nats-Msg-Id`` a host will give its next line
    (on another subject) makes JetStream answer the host's publish with a duplicate ack naming
    that message: the line is not in the stream. The host must not count it as written: its
    line reaches the stream, and the other host, on the event loop's path (one ``write()``) and
    on the worker's (a line in two ``write()`` calls)."""
    from memfs.cluster.publish import msg_id

    a, b = hosts
    stream = stream_name(request)  # (the hosts fixture's)
    urls = nats_cluster.urls
    os.mkdir(a.mnt / "sessions" / "s")
    write_line(a.mnt, "s", FIRST)
    same_replicas(a, b, "s", 1)
    host = host_id_of(urls, stream, "memfs.s")
    for n, how in enumerate(("one write", "two writes")):
        fence = max(m.seq for m in messages(urls, stream) if m.subject == "memfs.s")
        line = item(f"two-{n}")
        # stored first, on another subject, under the id the host's publish of ``line`` carries
        publish(urls, f"memfs.decoy{n}", FIRST.encode(), headers={"Nats-Msg-Id": msg_id(host, "s", fence, line.encode())})
        fd = os.open(a.mnt / "sessions" / "s" / "events.jsonl", os.O_WRONLY | os.O_APPEND)
        try:
            if how == "one write":
                assert os.write(fd, (line + "\n").encode()) == len(line) + 1
            else:
                os.write(fd, line[:20].encode())
                os.write(fd, (line[20:] + "\n").encode())
        finally:
            os.close(fd)
        assert [m.data.decode() for m in messages(urls, stream) if m.subject == "memfs.s"][-1] == line
        same_replicas(a, b, "s", 2 + n)
    for n in range(2):  # the decoys are sessions of their own, on both hosts
        wait_for(lambda: all(lines_of(m.store / f"decoy{n}" / "events.jsonl") == [FIRST] for m in (a, b)),  # noqa: B023
                 what="both hosts to have the decoys")


@pytest.mark.skipif(os.geteuid() != 0, reason="unshare --pid needs root")
def test_daemons_in_their_own_pid_namespaces_get_different_host_ids(tmp_path, nats_cluster, request):
    """Two daemons on one machine, each in a PID namespace of its own (as in containers): both
    are pid 1, yet the host ids in their ``Nats-Msg-Id`` differ."""
    stream, config = cluster_config(tmp_path, request)
    urls = nats_cluster.urls
    ids = []
    try:
        for h in ("A", "B"):
            m = start(tmp_path / f"s{h}", tmp_path / h, "--cluster", urls, "--config", str(config),
                      wrap=("unshare", "--pid", "--fork", "--kill-child"))
            try:
                os.mkdir(m.mnt / "sessions" / h.lower())
                write_line(m.mnt, h.lower(), FIRST)
                ids.append(host_id_of(urls, stream, f"memfs.{h.lower()}"))
                assert "memfs[1] " in m.log_text()  # (the server is pid 1 in its namespace)
            finally:
                stop_namespaced(m)
    finally:
        delete_stream(urls, stream)
    assert ids[0] != ids[1]


def stop_namespaced(m) -> None:
    """Stop a mount started under ``unshare --pid --fork``: SIGTERM to the server, not to unshare."""
    try:
        for child in Path(f"/proc/{m.proc.pid}/task/{m.proc.pid}/children").read_text().split():
            os.kill(int(child), signal.SIGTERM)
        m.proc.wait(15)  # (unshare ends with it)
    except (OSError, subprocess.TimeoutExpired):
        pass
    finally:
        cleanup(m)


# --- 5. without quorum: ETIMEDOUT; oversize lines: EFBIG -----------------------------------------


def test_an_unpublished_session_without_quorum_fails_with_etimedout_and_a_reason(tmp_path, request):
    """A session appended with ``memfs append`` while the mount runs has local lines the stream
    lacks; with no server reachable, an append to it through the mount fails like any other:
    ``ETIMEDOUT``, its reason in the session's ``user.memfs.last_error`` and the server's log."""
    cluster = NatsCluster.started(tmp_path / "nats")  # its own: this test stops every server
    stream, config = cluster_config(tmp_path, request, timeout=2)
    try:
        with mounted(tmp_path / "sa", tmp_path / "A", "--cluster", cluster.urls, "--config", str(config)) as a:
            subprocess.run([sys.executable, "-m", "memfs", "append", "--store", str(tmp_path / "sa"), "late"],
                           input=FIRST + "\n", text=True, check=True, capture_output=True, timeout=60)
            for server in cluster.servers:
                server.kill()
            t0 = time.monotonic()
            with pytest.raises(OSError) as refused:
                write_line(a.mnt, "late", item("no-quorum"))
            assert refused.value.errno == errno.ETIMEDOUT
            assert time.monotonic() - t0 >= 2.0
            reason = os.getxattr(a.mnt / "sessions" / "late", "user.memfs.last_error").decode()
            assert "within 2 s" in reason and "no quorum" in reason
            assert reason in a.log_text()
            assert lines_of(tmp_path / "sa" / "late" / "events.jsonl") == [FIRST]
    finally:
        cluster.stop()


def test_a_line_over_the_max_payload_is_refused_at_write_and_the_next_line_works(hosts, nats_cluster, request):
    """The servers take messages of at most 1 MiB (``max_payload``, headers included): a longer
    line is refused by ``write()`` at once with ``EFBIG`` and recorded, nothing of it published,
    and the next line on the same descriptor goes through — whether the line came in one
    ``write()`` (which the kernel splits into 1 MiB FUSE writes), or in pieces. A line a little
    under the limit goes through."""
    a, b = hosts
    os.mkdir(a.mnt / "sessions" / "big")
    write_line(a.mnt, "big", FIRST)

    def line(size: int, tag: str) -> bytes:
        head = b'{"type":"error","message":"' + tag.encode()
        return head + b"x" * (size - len(head) - 2) + b'"}'

    fd = os.open(a.mnt / "sessions" / "big" / "events.jsonl", os.O_WRONLY | os.O_APPEND)
    try:
        for n, (size, pieces) in enumerate(((3 << 19, 1), ((1 << 20) - 100, 1), (3 << 19, 2))):
            over = line(size, f"over-{n}") + b"\n"
            t0 = time.monotonic()
            with pytest.raises(OSError) as refused:
                if pieces == 2:
                    assert os.write(fd, over[:600_000]) == 600_000  # a fragment, kept for its newline
                os.write(fd, over[600_000:] if pieces == 2 else over)
            assert refused.value.errno == errno.EFBIG
            assert time.monotonic() - t0 < 4  # at once, not after the publish timed out (5 s)
            assert os.write(fd, (item(f"next-{n}") + "\n").encode()) == len(item(f"next-{n}")) + 1
        near = event("error", message="near" + "x" * ((1 << 20) - (16 << 10))).encode()  # (as stored)
        assert os.write(fd, near + b"\n") == len(near) + 1
    finally:
        os.close(fd)
    logs = [m.store / "big" / "events.jsonl" for m in (a, b)]
    wait_for(lambda: len({p.read_bytes() for p in logs}) == 1 and lines_of(logs[0]) == [
        FIRST, item("next-0"), item("next-1"), item("next-2"), near.decode()], what="both replicas to hold the lines")
    assert [r["errno"] for r in rejected(a.store, "big")] == ["EFBIG"] * 3
    assert "max_payload" in os.getxattr(a.mnt / "sessions" / "big", "user.memfs.last_error").decode()
