"""Cluster mode for real (SPEC §9): a three-node JetStream cluster on 127.0.0.1 (tests/cluster.py,
three ``nats-server`` processes with routes) and two memfs daemons with separate local stores
standing in for hosts A and B. Never a mock; every wait is a condition with a deadline."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import subprocess
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from cluster import NatsCluster, require
from mounting import cleanup, event, mounted, needs_fuse, sh, start
from store_helpers import join_all
from store_helpers import wait_until as wait_for

nats = require("nats")

pytestmark = needs_fuse


@pytest.fixture(scope="module")
def nats_cluster(tmp_path_factory):
    cluster = NatsCluster.started(tmp_path_factory.mktemp("nats"))
    try:
        yield cluster
    finally:
        cluster.stop()


def lines_of(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


def stream_name(request) -> str:
    """A stream per test: tests do not see one another's sessions (each test deletes its own,
    as streams may not share the ``memfs.>`` subjects)."""
    return "T" + "".join(c for c in request.node.name if c.isalnum())[:40]


def stream_leader(urls: str, name: str) -> str:
    async def run():
        nc = await nats.connect(urls.split(","))
        try:
            return (await nc.jetstream().stream_info(name)).cluster.leader
        finally:
            await nc.close()

    return asyncio.run(run())


async def slow_cluster_again(call, seconds: float = 30.0):
    """``await call()``, again while the cluster is slow to answer or has no leader yet (a
    JetStream API error or a timeout), for ``seconds`` at most."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return await call()
        except (nats.js.errors.APIError, nats.errors.TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def delete_stream(urls: str, name: str, **connect) -> None:
    """Delete stream ``name`` if it exists (``connect``: nats.connect's options, credentials)."""

    async def run():
        nc = await nats.connect(urls.split(","), **connect)

        async def delete() -> None:
            try:
                await nc.jetstream(timeout=10).delete_stream(name)
            except nats.js.errors.NotFoundError:
                pass

        try:
            await slow_cluster_again(delete)
        finally:
            await nc.close()

    asyncio.run(run())


@pytest.fixture
def hosts(tmp_path, nats_cluster, request):
    """Mount hosts A and B (each its own local store) in cluster mode on a stream of their own."""
    stream = stream_name(request)
    args = ("--cluster", nats_cluster.urls, "-o", "idle_release=0.2")
    config = tmp_path / "cluster.toml"
    config.write_text(f'[cluster]\nstream = "{stream}"\ntimeout = 5\n')
    with ExitStack() as stack:
        stack.callback(delete_stream, nats_cluster.urls, stream)  # after both mounts are gone
        a = stack.enter_context(mounted(tmp_path / "storeA", tmp_path / "A", *args, "--config", str(config)))
        b = stack.enter_context(mounted(tmp_path / "storeB", tmp_path / "B", *args, "--config", str(config)))
        yield a, b


def on_both(writer, a, b, timeout: float = 120) -> None:
    """Run ``writer(a, "A")`` and ``writer(b, "B")`` at once, in two threads; raise the first
    error either met (an ``OSError`` of a refused write, a failed assertion)."""
    errors: list[BaseException] = []

    def run(m, tag):
        try:
            writer(m, tag)
        except (OSError, AssertionError) as exc:
            errors.append(exc)

    join_all([threading.Thread(target=run, args=(m, tag)) for m, tag in ((a, "A"), (b, "B"))],
             f"writers still running after {timeout} s", timeout)
    if errors:
        raise errors[0]


def session_on_both(a, b, name: str) -> None:
    """Create session ``name`` on host A with its first line and wait until B has it."""
    os.mkdir(a.mnt / "sessions" / name)
    append(a.mnt, name, event("thread.started", thread_id="t"))
    wait_for(lambda: (b.mnt / "sessions" / name / "events.jsonl").exists(), what=f"session {name} on B")


def two_hosts(stack: ExitStack, tmp_path: Path, urls: str, config: Path) -> tuple:
    """Hosts A and B (stores ``sa``/``sb``) mounted in cluster mode, unmounted by ``stack``."""
    return tuple(stack.enter_context(mounted(tmp_path / f"s{h.lower()}", tmp_path / h, "--cluster", urls,
                                             "--config", str(config))) for h in ("A", "B"))


def append(mnt: Path, session: str, *lines: str) -> None:
    path = mnt / "sessions" / session / "events.jsonl"
    with open(path, "a") as f:
        for line in lines:
            f.write(line + "\n")
            f.flush()


def turn(n: int, fact: str) -> list[str]:
    return [event("turn.started"),
            event("item.completed", item={"id": f"m{n}", "type": "agent_message", "text": fact}),
            event("turn.completed", usage={"input_tokens": 10, "output_tokens": 5})]


def test_session_written_on_a_continues_on_b(hosts):
    a, b = hosts
    os.mkdir(a.mnt / "sessions" / "s1")
    append(a.mnt, "s1", event("thread.started", thread_id="t1"), *turn(1, "The retry loop uses exponential backoff."),
           *turn(2, "The cache lives in redis."))
    b_log = b.store / "s1" / "events.jsonl"
    a_log = a.store / "s1" / "events.jsonl"
    wait_for(lambda: len(lines_of(b_log)) == 7, what="B to have A's seven lines")
    # the session created on A appears on B, and B continues it
    assert "s1" in os.listdir(b.mnt / "sessions")
    append(b.mnt, "s1", *turn(3, "Deploys go through the staging cluster."))
    wait_for(lambda: len(lines_of(a_log)) == 10, what="A to have B's turn")
    assert a_log.read_bytes() == b_log.read_bytes()
    for m in (a, b):
        manifest = json.loads((m.mnt / "sessions" / "s1" / "manifest.json").read_text())
        assert (manifest["turn_count"], manifest["event_count"]) == (3, 10)
        turns = json.loads((m.mnt / "sessions" / "s1" / "index" / "turns.json").read_text())
        assert [t["turn_number"] for t in turns["entries"]] == [1, 2, 3]  # continuous across hosts
    # search on B finds A's facts
    out = sh('cat "sessions/s1/search/retry loop"', cwd=b.mnt).stdout
    assert "exponential backoff" in out
    # the replica's position and staleness are visible on the session folder
    seq = os.getxattr(b.mnt / "sessions" / "s1", "user.memfs.cluster_seq").decode()
    assert int(seq) >= 10
    lag = float(os.getxattr(b.mnt / "sessions" / "s1", "user.memfs.cluster_lag").decode())
    assert lag >= 0.0
    # a refused line (one write() of one line: the loop's fast path) is refused as without a
    # cluster — an errno, the reason, rejected.jsonl — and never published
    with pytest.raises(OSError) as err:
        write_line(b.mnt, "s1", '{"type": "turn.completed"}')  # no open turn
    assert err.value.errno == errno.EBADMSG  # the errno table's answer for a lifecycle refusal
    assert "turn.completed" in os.getxattr(b.mnt / "sessions" / "s1", "user.memfs.last_error").decode()
    assert (b.store / "s1" / "rejected.jsonl").exists()
    append(b.mnt, "s1", *turn(4, "Refusals are local."))
    wait_for(lambda: len(lines_of(a_log)) == 13, what="A to have B's next turn")
    assert a_log.read_bytes() == b_log.read_bytes()


def test_concurrent_appends_agree_byte_for_byte(hosts):
    a, b = hosts
    session_on_both(a, b, "c")
    n = 60

    def writer(m, tag):
        with open(m.mnt / "sessions" / "c" / "events.jsonl", "a") as f:
            for i in range(n):
                f.write(event("item.completed", item={"id": f"{tag}{i}", "type": "agent_message",
                                                      "text": f"{tag} line {i}"}) + "\n")
                f.flush()  # one write() per line: each acknowledged on its own

    on_both(writer, a, b)
    a_log, b_log = a.store / "c" / "events.jsonl", b.store / "c" / "events.jsonl"
    wait_for(lambda: len(lines_of(a_log)) == 1 + 2 * n and len(lines_of(b_log)) == 1 + 2 * n,
             what="both replicas to hold every line")
    assert a_log.read_bytes() == b_log.read_bytes()
    ids = [json.loads(l)["event"]["item"]["id"] for l in lines_of(a_log)[1:]]
    assert sorted(ids) == sorted([f"A{i}" for i in range(n)] + [f"B{i}" for i in range(n)])  # each exactly once
    # each host's own lines keep their order
    assert [i for i in ids if i[0] == "A"] == [f"A{i}" for i in range(n)]
    assert [i for i in ids if i[0] == "B"] == [f"B{i}" for i in range(n)]


def test_appends_continue_after_kill_9_of_one_nats_server(tmp_path, request):
    cluster = NatsCluster.started(tmp_path / "nats")  # its own cluster: this test kills a server
    try:
        stream = stream_name(request)
        config = tmp_path / "c.toml"
        # a killed stream leader pauses appends for the election (~7 s measured here): a timeout
        # above that lets the appends wait for the new leader instead of failing with ETIMEDOUT
        config.write_text(f'[cluster]\nstream = "{stream}"\ntimeout = 20\n')
        with ExitStack() as stack:
            a, b = two_hosts(stack, tmp_path, cluster.urls, config)
            os.mkdir(a.mnt / "sessions" / "k")
            append(a.mnt, "k", event("thread.started", thread_id="t"), *turn(1, "before the kill"))
            leader = stream_leader(cluster.urls, stream)
            next(s for s in cluster.servers if s.name == leader).kill()  # kill -9 of the stream's leader
            append(a.mnt, "k", *turn(2, "after the kill"))
            wait_for(lambda: len(lines_of(b.store / "k" / "events.jsonl")) == 7, what="B to catch up")
            append(b.mnt, "k", *turn(3, "from B after the kill"))
            wait_for(lambda: len(lines_of(a.store / "k" / "events.jsonl")) == 10, what="A to have B's turn")
            assert (a.store / "k" / "events.jsonl").read_bytes() == (b.store / "k" / "events.jsonl").read_bytes()
    finally:
        cluster.stop()


def test_a_retried_publish_is_stored_once(nats_cluster, request):
    """The ack of a fenced publish was lost and the client retries it: the deterministic
    Nats-Msg-Id makes JetStream store it once (and the retry's ack names the same sequence)."""
    stream = stream_name(request)

    async def run():
        nc = await nats.connect(nats_cluster.urls.split(","))
        js = nc.jetstream()
        await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"], num_replicas=3, duplicate_window=120)
        headers = {"Nats-Expected-Last-Subject-Sequence": "0", "Nats-Msg-Id": "hostA:s:0"}
        first = await js.publish(f"{stream.lower()}.s", b"line", headers=headers)
        again = await js.publish(f"{stream.lower()}.s", b"line", headers=headers)  # the retry
        info = await js.stream_info(stream)
        other = None
        try:  # another host's publish with the same (now stale) fence is refused, not deduplicated
            await js.publish(f"{stream.lower()}.s", b"other",
                             headers={"Nats-Expected-Last-Subject-Sequence": "0", "Nats-Msg-Id": "hostB:s:0"})
        except nats.js.errors.APIError as exc:
            other = exc.err_code
        await nc.close()
        return first, again, info.state.messages, other

    try:
        first, again, stored, other = asyncio.run(run())
    finally:
        delete_stream(nats_cluster.urls, stream)
    assert again.duplicate and again.seq == first.seq
    assert stored == 1
    assert other == 10071


# --- faults (SPEC §9): no quorum, a host killed mid-turn, a host frozen; restarts ------------


def cluster_config(tmp_path: Path, request, timeout: float = 5) -> tuple[str, Path]:
    stream = stream_name(request)
    config = tmp_path / "cluster.toml"
    config.write_text(f'[cluster]\nstream = "{stream}"\ntimeout = {timeout}\n')
    return stream, config


def host(store: Path, mnt: Path, urls: str, config: Path):
    """A memfs host on ``store``, not yet in an ExitStack (tests that kill or restart hosts)."""
    return start(store, mnt, "--cluster", urls, "--config", str(config), "-o", "idle_release=0.2")


def write_line(mnt: Path, session: str, line: str) -> None:
    """One ``write()`` of one line (its errno, if refused, as the OSError's)."""
    fd = os.open(mnt / "sessions" / session / "events.jsonl", os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def same_replicas(a, b, session: str, n: int) -> bytes:
    """Wait until both replicas hold ``n`` lines; assert they are byte-identical."""
    a_log, b_log = a.store / session / "events.jsonl", b.store / session / "events.jsonl"
    wait_for(lambda: len(lines_of(a_log)) == n and len(lines_of(b_log)) == n, timeout=30,
             what=f"both replicas of {session} to hold {n} lines")
    assert a_log.read_bytes() == b_log.read_bytes()
    return a_log.read_bytes()


def item(i: str) -> str:
    return event("item.completed", item={"id": i, "type": "agent_message", "text": f"line {i}"})


def test_no_quorum_fails_appends_with_etimedout_keeps_reads_and_recovers(tmp_path, request):
    cluster = NatsCluster.started(tmp_path / "nats")  # its own cluster: this test kills two servers
    stream, config = cluster_config(tmp_path, request, timeout=2)
    try:
        with ExitStack() as stack:
            stack.callback(cluster.stop)
            a, b = two_hosts(stack, tmp_path, cluster.urls, config)
            os.mkdir(a.mnt / "sessions" / "q")
            append(a.mnt, "q", event("thread.started", thread_id="t"), *turn(1, "The quorum fact is here."))
            same_replicas(a, b, "q", 4)
            leader = stream_leader(cluster.urls, stream)
            # kill -9 of the two servers that are not the stream's leader: no quorum. (The leader may
            # keep the append that fails below and commit it once they are back.)
            killed = [s for s in cluster.servers if s.name != leader]
            for s in killed:
                s.kill()
            t0 = time.monotonic()
            with pytest.raises(OSError) as refused:
                write_line(a.mnt, "q", item("lost"))
            waited = time.monotonic() - t0
            assert refused.value.errno == errno.ETIMEDOUT
            assert waited >= 2.0  # it waited for the configured timeout before failing
            reason = os.getxattr(a.mnt / "sessions" / "q", "user.memfs.last_error").decode()
            assert "no acknowledgement" in reason and "within 2 s" in reason
            # reads keep serving the local replica meanwhile, on both hosts
            for m in (a, b):
                assert len(sh("cat sessions/q/events.jsonl", cwd=m.mnt).stdout.splitlines()) == 4
                memory = json.loads(sh("cat sessions/q/derived/memory.json", cwd=m.mnt).stdout)
                assert "quorum fact" in json.dumps(memory)
                assert "quorum fact" in sh('cat "sessions/q/search/quorum fact"', cwd=m.mnt).stdout
            # the two servers come back (same ports and store dirs): appends resume once
            # JetStream elected a leader (~7.5 s measured here); each try fails after 2 s until then
            for s in killed:
                s.start()
            acked = []

            def resumed():
                try:
                    write_line(a.mnt, "q", item("after"))
                except OSError as exc:
                    assert exc.errno == errno.ETIMEDOUT
                    return False
                acked.append("after")
                return True

            wait_for(resumed, timeout=60, what="appends to resume after the servers restarted")
            write_line(b.mnt, "q", item("from-b"))
            a_log = a.store / "q" / "events.jsonl"
            wait_for(lambda: "from-b" in a_log.read_text(), timeout=30, what="A to have B's line")
            n = len(lines_of(a_log))
            data = same_replicas(a, b, "q", n).decode()
            ids = [json.loads(l)["event"].get("item", {}).get("id") for l in data.splitlines()]
            # nothing acknowledged lost nor doubled, in order; the append that failed may still have
            # been stored (its ack, not the message, was lost) — then on both hosts, once
            assert [i for i in ids if i != "lost"] == [None, None, "m1", None, "after", "from-b"]
            assert ids.count("lost") <= 1
    finally:
        cluster.stop()


def test_a_host_mounted_before_its_cluster_has_a_quorum_comes_up_once_it_has(tmp_path, request):
    """A mount that joins while JetStream cannot answer asks again every ``JOIN_ATTEMPT``
    seconds, not once per the configured timeout — 60 s here, as set to ride out elections:
    waiting that out kept such a mount down for as long after the cluster could answer. Its log
    says why it is not up yet.

    One server of three is up (a cluster starting, its other machines not yet): for its first
    seconds it does not answer JetStream requests at all (later it answers 503). With two of
    three killed instead, the one left answered for an existing stream, or with 503, as often as
    not, and the test had nothing to wait for."""
    cluster = NatsCluster(tmp_path / "nats")  # started here one server at a time
    stream, config = cluster_config(tmp_path, request, timeout=60)

    def listening(server) -> bool:
        try:
            server.jsz()
        except (OSError, ValueError):
            return False
        return True

    try:
        with ExitStack() as stack:
            first, rest = cluster.servers[0], cluster.servers[1:]
            first.start()
            wait_for(lambda: listening(first), what="the first server to listen")
            outcome = {}

            def mount_b():  # (it returns once B is up, or raises after 45 s: less than the timeout)
                try:
                    outcome["b"] = start(tmp_path / "sb", tmp_path / "B", "--cluster", cluster.urls,
                                         "--config", str(config), timeout=45)
                except Exception as exc:
                    outcome["error"] = exc

            starting = threading.Thread(target=mount_b)
            starting.start()
            b_log = tmp_path / "B.log"
            try:
                wait_for(lambda: b_log.exists() and "JetStream did not answer within 2 s" in b_log.read_text(),
                         timeout=30, what="B's log to say why it is not up")
            finally:
                try:
                    for s in rest:
                        s.start()
                finally:
                    starting.join()
                    if "b" in outcome:  # (unmounted whatever happens)
                        stack.callback(cleanup, outcome["b"])
            assert "error" not in outcome, outcome.get("error")
            b = outcome["b"]  # it made the stream once JetStream answered: A joins it and follows B
            a = stack.enter_context(mounted(tmp_path / "sa", tmp_path / "A", "--cluster", cluster.urls,
                                            "--config", str(config)))
            os.mkdir(b.mnt / "sessions" / "j")
            append(b.mnt, "j", event("thread.started", thread_id="t"), *turn(1, "Written on B once it joined."))
            same_replicas(a, b, "j", 4)
    finally:
        cluster.stop()


def test_host_killed_mid_turn_b_continues_a_catches_up(tmp_path, nats_cluster, request):
    stream, config = cluster_config(tmp_path, request)
    with ExitStack() as stack:
        stack.callback(delete_stream, nats_cluster.urls, stream)
        a = host(tmp_path / "sa", tmp_path / "A", nats_cluster.urls, config)
        stack.callback(cleanup, a)
        b = stack.enter_context(mounted(tmp_path / "sb", tmp_path / "B", "--cluster", nats_cluster.urls,
                                        "--config", str(config)))
        os.mkdir(a.mnt / "sessions" / "m")
        acked = [event("thread.started", thread_id="t"), event("turn.started"), item("a1"), item("a2")]
        for line in acked:
            write_line(a.mnt, "m", line)  # each returned: acknowledged
        a.stop(signal.SIGKILL)  # kill -9 mid-turn: turn.started, two items, no turn.completed
        cleanup(a)
        b_log = b.store / "m" / "events.jsonl"
        wait_for(lambda: len(lines_of(b_log)) == 4, what="B to have every acknowledged line")
        assert lines_of(b_log) == acked
        # B continues: the open turn is closed as failed (SPEC §3.1), then a turn of B's own
        write_line(b.mnt, "m", event("turn.failed", message="host A died mid-turn"))
        for line in turn(2, "B took over."):
            write_line(b.mnt, "m", line)
        a = host(tmp_path / "sa", tmp_path / "A", nats_cluster.urls, config)  # A again, on its old store
        stack.callback(cleanup, a)
        same_replicas(a, b, "m", 8)
        for m in (a, b):
            turns = json.loads((m.mnt / "sessions" / "m" / "index" / "turns.json").read_text())["entries"]
            assert [t["turn_number"] for t in turns] == [1, 2]
        # and A continues after its restart
        write_line(a.mnt, "m", event("turn.started"))
        same_replicas(a, b, "m", 9)


def test_frozen_host_is_fenced_and_lands_after_b(hosts):
    a, b = hosts
    os.mkdir(a.mnt / "sessions" / "f")
    append(a.mnt, "f", event("thread.started", thread_id="t"), event("turn.started"))
    same_replicas(a, b, "f", 2)
    n = 1500  # enough that A, resumed, publishes before its follower applied them all (300 were not, at times)
    fd = os.open(a.mnt / "sessions" / "f" / "events.jsonl", os.O_WRONLY | os.O_APPEND)  # A's writer, open
    errors = []

    def a_writes():
        try:
            os.write(fd, (item("from-a") + "\n").encode())  # waits in the kernel while A is stopped
        except OSError as exc:
            errors.append(exc)

    writer = threading.Thread(target=a_writes)
    try:
        os.kill(a.proc.pid, signal.SIGSTOP)
        try:
            writer.start()  # A's write() is queued with A's view of the session stale
            for i in range(n):  # B writes while A is frozen (no lock to take over: the fence decides)
                write_line(b.mnt, "f", item(f"b{i}"))
        finally:
            os.kill(a.proc.pid, signal.SIGCONT)
        writer.join(60)
    finally:
        os.close(fd)
    assert not writer.is_alive() and not errors
    data = same_replicas(a, b, "f", n + 3).decode().splitlines()
    assert [json.loads(l)["event"]["item"]["id"] for l in data[2:]] == [f"b{i}" for i in range(n)] + ["from-a"]
    write_line(a.mnt, "f", item("a-later"))
    same_replicas(a, b, "f", n + 4)
    # A's stale publish was refused (10071), A caught up and published again, after B's lines
    assert "session f: fenced at sequence" in a.log_text()


def test_a_pre_cluster_session_published_halfway_is_finished_not_orphaned(tmp_path, nats_cluster, request):
    """A session written before cluster mode whose publishing stopped midway (the stream has its
    first lines, the host no sidecar): the next mount publishes the rest after them, instead of
    taking the stream's lines for another host's session of that name."""
    stream, config = cluster_config(tmp_path, request)
    memfs = [str(Path(os.sys.executable).parent / "memfs"), "append"]

    def local(*lines: str) -> None:  # written without a mount, not in cluster mode
        subprocess.run([*memfs, "--store", str(tmp_path / "sa"), "half"], input="\n".join(lines) + "\n",
                       text=True, check=True, capture_output=True)

    local(event("thread.started", thread_id="t"), *turn(1, "written before the cluster"))
    try:
        with mounted(tmp_path / "sa", tmp_path / "A", "--cluster", nats_cluster.urls, "--config", str(config)) as a:
            wait_for(lambda: (tmp_path / "sa" / "half" / "index" / "cluster.json").exists(),
                     what="A to publish its pre-cluster session")
        # as if that publish had stopped after these four lines: no sidecar, a line more locally
        (tmp_path / "sa" / "half" / "index" / "cluster.json").unlink()
        local(item("after-the-crash"))
        with ExitStack() as stack:
            a = stack.enter_context(mounted(tmp_path / "sa", tmp_path / "A", "--cluster", nats_cluster.urls,
                                            "--config", str(config)))
            b = stack.enter_context(mounted(tmp_path / "sb", tmp_path / "B", "--cluster", nats_cluster.urls,
                                            "--config", str(config)))
            same_replicas(a, b, "half", 5)
            assert "4 were in the stream already" in a.log_text()
            assert "another history" not in a.log_text()
            write_line(b.mnt, "half", item("from-b"))  # and it is a replica like any other
            same_replicas(a, b, "half", 6)
    finally:
        delete_stream(nats_cluster.urls, stream)


def test_a_pre_cluster_session_the_stream_went_on_with_is_caught_up_not_orphaned(tmp_path, nats_cluster, request):
    """Every local line of a pre-cluster session is in the stream (its publish went through,
    the sidecar write was lost) and other hosts went on: the host is a replica behind — it
    catches up, and is not taken for a clash of histories."""
    stream, config = cluster_config(tmp_path, request)
    memfs = [str(Path(os.sys.executable).parent / "memfs"), "append"]
    subprocess.run([*memfs, "--store", str(tmp_path / "sa"), "behind"], text=True, check=True, capture_output=True,
                   input="\n".join([event("thread.started", thread_id="t"), *turn(1, "written before")]) + "\n")
    args = ("--cluster", nats_cluster.urls, "--config", str(config))
    try:
        with ExitStack() as stack:
            b = stack.enter_context(mounted(tmp_path / "sb", tmp_path / "B", *args))
            with mounted(tmp_path / "sa", tmp_path / "A", *args):
                wait_for(lambda: (tmp_path / "sa" / "behind" / "index" / "cluster.json").exists(),
                         what="A to publish its pre-cluster session")
            wait_for(lambda: len(lines_of(b.store / "behind" / "events.jsonl")) == 4, what="B to replicate it")
            (tmp_path / "sa" / "behind" / "index" / "cluster.json").unlink()  # the sidecar write lost
            (tmp_path / "sa" / ".memfs-cluster.json").unlink(missing_ok=True)  # and the checkpoint
            write_line(b.mnt, "behind", item("while-a-was-down"))
            a = stack.enter_context(mounted(tmp_path / "sa", tmp_path / "A", *args))
            same_replicas(a, b, "behind", 5)
            assert "another history" not in a.log_text()
            write_line(a.mnt, "behind", item("from-a"))  # a replica like any other
            same_replicas(a, b, "behind", 6)
    finally:
        delete_stream(nats_cluster.urls, stream)


def test_a_cluster_started_with_no_attempts_is_refused(tmp_path):
    """``NatsCluster.started`` with no attempt to make says so, rather than returning None."""
    with pytest.raises(ValueError, match="attempts must be at least 1"):
        NatsCluster.started(tmp_path, attempts=0)
    assert not list(tmp_path.iterdir())  # nothing was started
