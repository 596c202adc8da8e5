"""Cluster mode (SPEC §9, issue 17 items 3 and 4), for real on a three-node JetStream cluster:
``memfs mounts`` shows each mount's cluster mode and lag, and the cap evicts at the same point
of the sequence on every replica."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

import pytest

from cluster import NatsCluster, require
from mounting import event, mounted
from test_cluster import delete_stream, lines_of, nats_cluster, on_both, session_on_both, stream_name, wait_for  # noqa: F401 (fixture)

require("nats")


def memfs_cli(*argv, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memfs", *map(str, argv)], capture_output=True, text=True,
                          env=env, timeout=60)


def xdg(tmp_path: Path) -> dict:
    (tmp_path / "run").mkdir(mode=0o700)
    return {**os.environ, "XDG_RUNTIME_DIR": str(tmp_path / "run"), "XDG_STATE_HOME": str(tmp_path / "state")}


def test_memfs_mounts_shows_cluster_mode_and_lag(tmp_path, request):
    cluster = NatsCluster.started(tmp_path / "nats")  # its own: this test stops every server
    env = xdg(tmp_path)
    stream = stream_name(request)
    config = tmp_path / "c.toml"
    config.write_text(f'[cluster]\nstream = "{stream}"\ntimeout = 2\n')
    try:
        with ExitStack() as stack:
            a = stack.enter_context(mounted(tmp_path / "sa", tmp_path / "A", "--cluster", cluster.urls,
                                            "--config", str(config), env=env))
            plain = stack.enter_context(mounted(tmp_path / "sp", tmp_path / "P", env=env))
            os.mkdir(a.mnt / "sessions" / "s")
            with open(a.mnt / "sessions" / "s" / "events.jsonl", "a") as f:
                f.write(event("thread.started", thread_id="t") + "\n")
            listed = {m["mountpoint"]: m for m in json.loads(memfs_cli("mounts", "--json", env=env).stdout)}
            assert listed[str(a.mnt)]["cluster"] == stream
            assert 0.0 <= listed[str(a.mnt)]["cluster_lag"] < 5  # following, nothing pending for long
            assert listed[str(plain.mnt)]["cluster"] is None and listed[str(plain.mnt)]["cluster_lag"] is None
            rows = [r.split() for r in memfs_cli("mounts", env=env).stdout.splitlines()]
            assert rows[0] == ["MOUNTPOINT", "STORE", "PID", "CLUSTER", "LAG", "LOG"]
            row = next(r for r in rows if r[0] == str(a.mnt))
            assert row[3] == stream and row[4].endswith("s")
            assert os.getxattr(a.mnt, "user.memfs.cluster").decode() == f"stream {stream} on {cluster.urls}"
            # no server reachable: the replica goes stale, and memfs mounts says by how much
            for server in cluster.servers:
                server.kill()

            def lag():
                m = {m["mountpoint"]: m for m in json.loads(memfs_cli("mounts", "--json", env=env).stdout)}
                return m[str(a.mnt)]["cluster_lag"]

            wait_for(lambda: (lag() or 0) > 1.0, timeout=30, what="the lag to grow while no server answers")
            # reads keep serving the local replica
            assert lines_of(a.mnt / "sessions" / "s" / "events.jsonl") == [event("thread.started", thread_id="t")]
    finally:
        cluster.stop()


@pytest.fixture
def capped_hosts(tmp_path, nats_cluster, request):
    stream = stream_name(request)
    config = tmp_path / "cluster.toml"
    config.write_text(f'[cluster]\nstream = "{stream}"\ntimeout = 5\n')
    args = ("--cluster", nats_cluster.urls, "--config", str(config), "--max-events", "50")
    with ExitStack() as stack:
        stack.callback(delete_stream, nats_cluster.urls, stream)
        a = stack.enter_context(mounted(tmp_path / "storeA", tmp_path / "A", *args))
        b = stack.enter_context(mounted(tmp_path / "storeB", tmp_path / "B", *args))
        yield a, b


def test_the_cap_evicts_at_the_same_point_on_every_replica(capped_hosts):
    a, b = capped_hosts
    session_on_both(a, b, "cap")
    per_host = 40

    def writer(m, tag):
        fd = os.open(m.mnt / "sessions" / "cap" / "events.jsonl", os.O_WRONLY | os.O_APPEND)
        try:
            for i in range(per_host):  # one closed turn per write(): an atomic batch of three lines
                turn = (event("turn.started"),
                        event("item.completed", item={"id": f"{tag}{i}", "type": "agent_message",
                                                      "text": f"host {tag} fact {i}"}),
                        event("turn.completed", usage={"input_tokens": 1, "output_tokens": 1}))
                data = "".join(line + "\n" for line in turn).encode()
                assert os.write(fd, data) == len(data)
        finally:
            os.close(fd)

    on_both(writer, a, b)
    a_log, b_log = a.store / "cap" / "events.jsonl", b.store / "cap" / "events.jsonl"

    def seq(m):
        return int(os.getxattr(m.mnt / "sessions" / "cap", "user.memfs.cluster_seq"))

    wait_for(lambda: seq(a) == seq(b) and seq(a) > 0, what="both hosts to apply the same last message")
    manifests = [json.loads((m.mnt / "sessions" / "cap" / "manifest.json").read_text()) for m in (a, b)]
    assert manifests[0]["event_count"] <= 50  # capped
    assert a_log.read_bytes() == b_log.read_bytes()  # evicted at the same point: the same bytes
    keys = ("event_count", "turn_count", "retained_turn_base", "in_turn")
    assert [manifests[0][k] for k in keys] == [manifests[1][k] for k in keys]
    assert manifests[0]["retained_turn_base"] > 0 and manifests[0]["turn_count"] == 2 * per_host

    def summaries(m):  # in the order they were written (their names start with the time)
        paths = sorted((m.store / "cap" / "derived").glob("eviction-summary-*.json"))
        return [{k: v for k, v in json.loads(p.read_text()).items() if k != "created_at"} for p in paths]

    assert summaries(a) and summaries(a) == summaries(b)
    # every host's turns are whole (the batches did not interleave) and nothing is lost: what
    # was evicted plus what is left is every line appended
    total = 1 + 2 * per_host * 3
    assert sum(s["evicted_event_count"] for s in summaries(a)) + len(lines_of(a_log)) == total


def test_sessions_written_before_cluster_mode_are_published_and_a_clash_is_left_alone(tmp_path, nats_cluster,
                                                                                     request):
    """A local session from before cluster mode is published at mount (fenced from sequence 0)
    and replicated to B; a session of the same name in both stores with different histories
    stays as it is on the host that mounts second, which refuses writes to it (EEXIST)."""
    import errno

    import memfs

    stream = stream_name(request)
    config = tmp_path / "c.toml"
    config.write_text(f'[cluster]\nstream = "{stream}"\ntimeout = 5\n')
    old = [event("thread.started", thread_id="old"), event("turn.started"),
           event("item.completed", item={"id": "m1", "type": "agent_message", "text": "written before the cluster"}),
           event("turn.completed", usage={"input_tokens": 1, "output_tokens": 1})]
    for store, tag in ((tmp_path / "sa", "A"), (tmp_path / "sb", "B")):
        with memfs.open_session(store, "clash") as h:
            h.append(event("thread.started", thread_id=f"clash-{tag}"))
    with memfs.open_session(tmp_path / "sa", "old") as h:
        h.append_many(old)
    args = ("--cluster", nats_cluster.urls, "--config", str(config))
    with ExitStack() as stack:
        stack.callback(delete_stream, nats_cluster.urls, stream)
        a = stack.enter_context(mounted(tmp_path / "sa", tmp_path / "A", *args))
        wait_for(lambda: os.path.exists(tmp_path / "sa" / "old" / "index" / "cluster.json")
                 and os.path.exists(tmp_path / "sa" / "clash" / "index" / "cluster.json"), what="A to publish")
        b = stack.enter_context(mounted(tmp_path / "sb", tmp_path / "B", *args))
        wait_for(lambda: lines_of(b.mnt / "sessions" / "old" / "events.jsonl") == old, what="B to replicate old")
        assert (b.store / "old" / "events.jsonl").read_bytes() == (a.store / "old" / "events.jsonl").read_bytes()
        with open(b.mnt / "sessions" / "old" / "events.jsonl", "a") as f:  # B continues it, A gets it
            f.write(event("turn.started") + "\n")
        wait_for(lambda: len(lines_of(a.mnt / "sessions" / "old" / "events.jsonl")) == 5, what="A to apply B's line")
        # the clash: B keeps its own session, does not take A's lines, and refuses writes to it
        fd = os.open(b.mnt / "sessions" / "clash" / "events.jsonl", os.O_WRONLY | os.O_APPEND)
        try:
            with pytest.raises(OSError) as err:
                os.write(fd, (event("turn.started") + "\n").encode())
            assert err.value.errno == errno.EEXIST
        finally:
            os.close(fd)
        assert "differs from the stream" in os.getxattr(b.mnt / "sessions" / "clash", "user.memfs.last_error").decode()
        assert lines_of(b.mnt / "sessions" / "clash" / "events.jsonl") == [event("thread.started", thread_id="clash-B")]
        assert lines_of(a.mnt / "sessions" / "clash" / "events.jsonl") == [event("thread.started", thread_id="clash-A")]


def test_a_restarted_host_resumes_after_its_checkpoint(tmp_path, nats_cluster, request):
    """A host keeps a checkpoint of the stream it applied (``.memfs-cluster.json`` in its
    store): remounted, its follower starts after it and delivers only what came since."""
    stream = stream_name(request)
    config = tmp_path / "c.toml"
    config.write_text(f'[cluster]\nstream = "{stream}"\ntimeout = 5\n')
    args = ("--cluster", nats_cluster.urls, "--config", str(config))

    def attr(m, name):
        return int(os.getxattr(m.mnt, f"user.memfs.{name}"))

    with ExitStack() as stack:
        stack.callback(delete_stream, nats_cluster.urls, stream)
        b = stack.enter_context(mounted(tmp_path / "sb", tmp_path / "B", *args))
        os.mkdir(b.mnt / "sessions" / "s")
        first = [event("thread.started", thread_id="t")] + [event("turn.started") if i % 2 == 0 else
                                                             event("turn.completed", usage={}) for i in range(20)]
        with open(b.mnt / "sessions" / "s" / "events.jsonl", "a") as f:
            f.write("".join(line + "\n" for line in first))
        with mounted(tmp_path / "sa", tmp_path / "A", *args) as a:
            assert attr(a, "cluster_resumed_after") == 0
            wait_for(lambda: lines_of(a.mnt / "sessions" / "s" / "events.jsonl") == first, what="A to replicate")
            wait_for(lambda: attr(a, "cluster_delivered") >= 1, what="A's follower")
        checkpoint = json.loads((tmp_path / "sa" / ".memfs-cluster.json").read_text())
        assert checkpoint["stream"] == stream and checkpoint["seq"] >= 1
        more = [event("turn.started"), event("turn.completed", usage={})]
        with open(b.mnt / "sessions" / "s" / "events.jsonl", "a") as f:  # while A is down
            f.write("".join(line + "\n" for line in more))
        with mounted(tmp_path / "sa", tmp_path / "A", *args) as a:
            assert attr(a, "cluster_resumed_after") == checkpoint["seq"]
            wait_for(lambda: lines_of(a.mnt / "sessions" / "s" / "events.jsonl") == first + more,
                     what="A to catch up")
            assert attr(a, "cluster_delivered") == len(more)  # only what came since: no replay
        assert (tmp_path / "sa" / "s" / "events.jsonl").read_bytes() == (b.store / "s" / "events.jsonl").read_bytes()
        assert "s" in memfs_cli("sessions", "--store", tmp_path / "sa", env=os.environ).stdout  # not a session
