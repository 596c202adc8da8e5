#!/usr/bin/env python3
"""Cluster benchmark (SPEC §9, issue 17 item 6): memfs in cluster mode beside raw ``nats-py``.

A real three-node NATS JetStream cluster on 127.0.0.1 (:mod:`memfs.cluster.testing`, the one
the tests start) and two memfs mounts with separate local stores standing in for hosts A and
B, measured in one run, in interleaved rounds (this machine's speed drifts 2x within seconds:
each ratio is the median of the ratios of neighbours in time):

* fenced single appends: one ``write()`` of a 300-byte event per append on an ``O_APPEND``
  descriptor of A's ``sessions/s0/events.jsonl`` (each returns after JetStream's ack and the
  local commit) beside raw ``nats-py``: ``js.publish`` of the same line with
  ``Nats-Expected-Last-Subject-Sequence``, one at a time, awaiting each ack, to a stream of
  the same settings (replicas 3, file storage) on the same cluster, connected to the same
  server as A's event-loop connection (the first one); goal ≥ 0.8. Each series runs twice:
  with both streams' leaders on that server, then on another one (a publish then crosses a
  route to the leader; a stream's leader is wherever the cluster elected it, and its place
  moves a publish's latency more than anything memfs does); the goal takes the lesser. A third
  series is the same raw publisher whose connection also follows its stream (an ordered
  consumer delivering every message, as each memfs host follows ``memfs.>``): the cost of
  following, which the mount always pays;
* the event loop's own connection (:mod:`memfs.cluster.wire`) beside ``nats-py``: the same
  single appends through a third mount (host A', its own store) started with
  ``MEMFS_CLUSTER_LOOP_CLIENT=0``, whose single-line writes take the worker path's ``nats-py``
  publish (its follower stays on the event loop's connection), interleaved with A's rounds;
  the ratio A / A' is printed (the issue keeps the hand-written client only at >= 1.5);
* 8 sessions in parallel: 8 threads each appending to its own session of A, beside 8
  ``nats-py`` tasks each publishing fenced to its own subject (one connection);
* replication lag: an append acknowledged on A (its ``write()`` returned) until the line is in
  B's ``events.jsonl`` (B's store file polled every 0.2 ms); p50/p99, goal p99 ≤ 100 ms — B
  is delivered the line as JetStream acknowledges it, so it often has it before A's
  ``write()`` returns (0 ms); the lag from the ``write()`` call is reported beside it;
* catch-up: B unmounted, 100,000 appends through A (``cat`` of a file into the session: the
  pipelined atomic batches), B mounted again: the time until B's replica has them all;
* where a single append's time goes: the same raw fenced publisher on a stream of one replica
  in memory (what replication and the disk add to each round trip), and raw unfenced publishes
  pipelined 256 at a time (what not waiting for each ack — batching — buys a client).

Nothing is asserted; ``--json FILE`` writes ``{"results", "goals"}``.

Usage: ``.venv/bin/python scripts/bench_cluster.py [--rounds R] [--events N] [--catchup N] [--json FILE]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import nats  # noqa: E402
from memfs.cluster.testing import NatsCluster  # noqa: E402
from memfs.samples import sized_message  # noqa: E402
from nats.js import api  # noqa: E402

from bench_fs import report_goals, start_server, stop_server  # noqa: E402

SESSIONS = 8
NO_LOOP = "memfs mount A, 1 session, without the event loop's connection"
STREAM = "BENCH"
SERIES = ("raw nats-py fenced, 1 subject", "raw nats-py fenced + following the stream, 1 subject",
          "memfs mount A, 1 session", NO_LOOP, "raw nats-py fenced, 8 subjects", "memfs mount A, 8 sessions",
          "raw nats-py fenced, 1 subject, 1 replica in memory", "raw nats-py unfenced, 256 in flight, 1 subject")
# where the streams' leaders are: the first server (which the mount's event-loop connection and
# the raw publishers connect to), or another one (a publish then crosses a route to the leader)
PLACEMENTS = (("leader on the connected server", 0), ("leader on another server", 1))


class Raw:
    """Raw ``nats-py`` on a loop of its own thread: fenced publishes, one at a time per subject."""

    def __init__(self, urls: str, follow: bool = False):
        self.follow = follow
        self.followed = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.seq: dict[str, int] = {}
        self.run(self._connect(urls))

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(600)

    async def _connect(self, urls):
        # the first server, as the mount's event-loop connection (memfs.cluster.wire): the same
        # path to the stream leader for both
        self.nc = await nats.connect(urls.split(","), dont_randomize=True)
        self.js = self.nc.jetstream(timeout=10)
        for name, replicas, storage in (("RAW", 3, api.StorageType.FILE), ("RAW1", 1, api.StorageType.MEMORY)):
            try:
                await self.js.stream_info(name)
            except nats.js.errors.NotFoundError:
                await self.js.add_stream(api.StreamConfig(name=name, subjects=[f"{name.lower()}.>"], num_replicas=replicas,
                                                          storage=storage, duplicate_window=120.0))
        if self.follow:  # as every memfs host does: an ordered consumer of the whole stream, here only counted

            async def delivered(msg):
                md = msg.metadata  # what memfs's follower reads of each message
                self.followed = md.sequence.stream

            await self.js.subscribe("raw.>", cb=delivered, ordered_consumer=True, deliver_policy=api.DeliverPolicy.NEW,
                                    idle_heartbeat=2.0, flow_control=True)

    async def _fenced(self, subject: str, lines: list[bytes]) -> None:
        for line in lines:
            expected = self.seq.get(subject, 0)
            headers = {"Nats-Expected-Last-Subject-Sequence": str(expected), "Nats-Msg-Id": f"raw:{subject}:{expected}"}
            deadline = time.monotonic() + 10
            while True:
                try:
                    ack = await self.js.publish(subject, line, headers=headers)
                    break
                except nats.js.errors.APIError as exc:
                    # a stream just created (or electing its leader) refuses fenced publishes for
                    # a moment (err_code 10164, no sequence named): retried, as memfs's node does
                    if exc.err_code == 10071 or time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.05)
            self.seq[subject] = ack.seq

    async def _timed(self, subjects: list[str], lines: list[bytes]) -> float:
        t = time.perf_counter()
        await asyncio.gather(*(self._fenced(s, lines) for s in subjects))
        return len(subjects) * len(lines) / (time.perf_counter() - t)

    def rate(self, subjects: list[str], lines: list[bytes]) -> float:
        return self.run(self._timed(subjects, lines))

    async def _pipelined(self, subject: str, lines: list[bytes], window: int) -> float:
        t = time.perf_counter()
        for i in range(0, len(lines), window):
            await asyncio.gather(*(self.js.publish(subject, line) for line in lines[i:i + window]))
        return len(lines) / (time.perf_counter() - t)

    def pipelined_rate(self, subject: str, lines: list[bytes], window: int = 256) -> float:
        """Unfenced publishes, ``window`` in flight at a time (one ack awaited per window)."""
        return self.run(self._pipelined(subject, lines, window))

    async def _move_leader(self, stream: str, server: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while (await self.js.stream_info(stream)).cluster.leader != server:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the leader of stream {stream} did not move to {server}")
            try:  # a preferred placement (nats-server >= 2.11); asked again until it holds
                await self.nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}",
                                      json.dumps({"placement": {"preferred": server}}).encode(), timeout=5)
            except (TimeoutError, nats.errors.Error):
                pass
            await asyncio.sleep(0.5)

    def move_leader(self, stream: str, server: str) -> None:
        """Make ``server`` (a server's name) the leader of ``stream``."""
        self.run(self._move_leader(stream, server))

    def close(self):
        self.run(self.nc.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def mount_rate(paths: list[Path], lines: list[bytes]) -> float:
    """Appends/s of ``len(paths)`` threads, each one ``write()`` per line into its own session."""
    errors = []

    def one(path):
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        try:
            for line in lines:
                os.write(fd, line)
        except OSError as exc:
            errors.append(exc)
        finally:
            os.close(fd)

    threads = [threading.Thread(target=one, args=(p,)) for p in paths]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return len(paths) * len(lines) / (time.perf_counter() - t)


def lag_samples(a_log: Path, b_log: Path, lines: list[bytes]) -> list[tuple[float, float]]:
    """Seconds from A's acknowledged ``write()`` (its return) to B's log holding the line, and
    from the ``write()`` call (publish and ack included), one line at a time."""
    out = []
    fd = os.open(a_log, os.O_WRONLY | os.O_APPEND)
    try:
        for line in lines:
            target = os.stat(b_log).st_size + len(line)
            t0 = time.perf_counter()
            os.write(fd, line)
            t = time.perf_counter()
            deadline = t + 10
            while os.stat(b_log).st_size < target:
                if time.perf_counter() > deadline:
                    raise RuntimeError("B did not apply a line within 10 s")
                time.sleep(0.0002)
            seen = time.perf_counter()
            out.append((seen - t, seen - t0))
            time.sleep(0.002)  # let B settle: each sample measures one line on its own
    finally:
        os.close(fd)
    return out


def count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except FileNotFoundError:
        return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (medians are reported)")
    ap.add_argument("--events", type=int, default=400, help="single appends per writer and round")
    ap.add_argument("--lag", type=int, default=300, help="replication lag samples")
    ap.add_argument("--catchup", type=int, default=100_000, help="appends made while B is down")
    ap.add_argument("--solo", action="store_true",
                    help="profiling: B is mounted only after the append rounds (what following costs A's appends)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="memfs-bench-cluster-"))
    cluster = raw = follower = None
    procs: dict[str, tuple] = {}
    lines = [sized_message(i) for i in range(args.events)]
    results: dict[str, float] = {}
    config = work / "cluster.toml"

    def mount(host: str, env: dict | None = None):
        store, mnt = work / f"store{host}", work / host
        mnt.mkdir(exist_ok=True)
        procs[host] = (start_server([sys.executable, "-m", "memfs", "mount", str(store), str(mnt), "--cluster",
                                     cluster.urls, "--config", str(config), "--max-events", "0",
                                     "--log-level", "WARNING"], mnt, work / f"{host}.log",
                                    env={**os.environ, **env} if env else None), mnt)
        return store, mnt

    def unmount(host: str):
        proc, mnt = procs.pop(host)
        stop_server(proc, mnt)

    try:
        cluster = NatsCluster.started(work / "nats")
        config.write_text(f'[cluster]\nstream = "{STREAM}"\nreplicas = 3\ntimeout = 10\n')
        # the raw publishers first: creating their stream waits until JetStream takes streams
        # (right after the cluster came up a mount's first stream request can wait past its timeout)
        raw = Raw(cluster.urls)
        follower = Raw(cluster.urls, follow=True)  # its own connection and loop thread
        store_a, a = mount("A")
        _, a_nl = mount("A-no-loop", {"MEMFS_CLUSTER_LOOP_CLIENT": "0"})  # single lines through nats-py
        if not args.solo:
            store_b, b = mount("B")
        sessions = []
        for i in range(SESSIONS):
            (a / "sessions" / f"s{i}").mkdir()
            sessions.append(a / "sessions" / f"s{i}" / "events.jsonl")
        (a_nl / "sessions" / "n0").mkdir()
        no_loop = [a_nl / "sessions" / "n0" / "events.jsonl"]
        mount_rate(sessions[:1], lines[:50])  # warm-up: connections, the sessions' writers
        mount_rate(no_loop, lines[:50])
        raw.rate(["raw.warm"], lines[:50])
        follower.rate(["raw.fwarm"], lines[:50])
        single = []
        for where, server in PLACEMENTS:
            # both streams' leaders on the same server: a publish takes the same path for both
            leader = cluster.servers[server].name
            for stream in (STREAM, "RAW"):  # (RAW1 has one replica: it stays where it was placed)
                raw.move_leader(stream, leader)
            rates = {k: [] for k in SERIES}
            for _ in range(args.rounds):
                rates["raw nats-py fenced, 1 subject"].append(raw.rate(["raw.s0"], lines))
                rates["raw nats-py fenced + following the stream, 1 subject"].append(follower.rate(["raw.f0"], lines))
                rates["memfs mount A, 1 session"].append(mount_rate(sessions[:1], lines))
                rates[NO_LOOP].append(mount_rate(no_loop, lines))
                rates["raw nats-py fenced, 8 subjects"].append(raw.rate([f"raw.s{i}" for i in range(SESSIONS)], lines))
                rates["memfs mount A, 8 sessions"].append(mount_rate(sessions, lines))
                rates["raw nats-py fenced, 1 subject, 1 replica in memory"].append(raw.rate(["raw1.s0"], lines))
                rates["raw nats-py unfenced, 256 in flight, 1 subject"].append(raw.pipelined_rate("raw.p0", lines))
            for k, v in rates.items():
                results[f"{where}: {k} ev/s"] = statistics.median(v)

            def ratio(x: str, y: str, rates: dict = rates) -> float:  # (this iteration's rates)
                return statistics.median(p / q for p, q in zip(rates[x], rates[y]))

            single.append(ratio("memfs mount A, 1 session", "raw nats-py fenced, 1 subject"))
            results[f"{where}: mount 1 session / raw 1 subject"] = single[-1]
            results[f"{where}: mount 1 session / raw + following"] = ratio(
                "memfs mount A, 1 session", "raw nats-py fenced + following the stream, 1 subject")
            results[f"{where}: mount 1 session: event loop's connection / nats-py"] = ratio(
                "memfs mount A, 1 session", NO_LOOP)
            results[f"{where}: raw + following / raw"] = ratio("raw nats-py fenced + following the stream, 1 subject",
                                                               "raw nats-py fenced, 1 subject")
            results[f"{where}: mount 8 sessions / raw 8 subjects"] = ratio("memfs mount A, 8 sessions",
                                                                           "raw nats-py fenced, 8 subjects")
            # where a single append's time goes: one fenced round trip each (ms), and what is left
            # of it without replication and the disk; what pipelining (batching) buys the raw client
            for key, label in (("raw nats-py fenced, 1 subject", "raw fenced round trip, 3 replicas on disk"),
                               ("raw nats-py fenced, 1 subject, 1 replica in memory", "raw fenced round trip, 1 replica in memory"),
                               ("memfs mount A, 1 session", "mount write() of one line")):
                results[f"{where}: {label} ms"] = 1000 / statistics.median(rates[key])
            results[f"{where}: raw unfenced 256 in flight / raw fenced one at a time"] = ratio(
                "raw nats-py unfenced, 256 in flight, 1 subject", "raw nats-py fenced, 1 subject")
        results["mount 1 session / raw 1 subject, the lesser placement"] = min(single)
        # which client each mount's single lines took (user.memfs.cluster_direct_appends)
        results["mount A: lines published on the event loop's connection"] = float(
            os.getxattr(a, "user.memfs.cluster_direct_appends"))
        results["mount A-no-loop: lines published on the event loop's connection"] = float(
            os.getxattr(a_nl, "user.memfs.cluster_direct_appends"))
        unmount("A-no-loop")

        if args.solo:
            store_b, b = mount("B")
        # replication lag, A's ack → B's events.jsonl
        (a / "sessions" / "lag").mkdir()
        a_lag = a / "sessions" / "lag" / "events.jsonl"
        with open(a_lag, "ab") as f:
            f.write(lines[0])
        b_lag = store_b / "lag" / "events.jsonl"
        deadline = time.monotonic() + 20
        while count_lines(b_lag) < 1:
            if time.monotonic() > deadline:
                raise RuntimeError("the lag session did not reach B")
            time.sleep(0.01)
        samples = lag_samples(a_lag, b_lag, [sized_message(10_000 + i) for i in range(args.lag)])
        for label, values in (("", [s[0] for s in samples]), (" from the write() call", [s[1] for s in samples])):
            lag = sorted(values)
            results[f"replication lag{label} p50 ms"] = lag[len(lag) // 2] * 1000
            results[f"replication lag{label} p99 ms"] = lag[min(len(lag) - 1, int(len(lag) * 0.99))] * 1000
            results[f"replication lag{label} max ms"] = lag[-1] * 1000

        # catch-up of a host that was down during N appends
        unmount("B")
        bulk = work / "bulk.jsonl"
        with open(bulk, "wb") as f:
            for i in range(args.catchup):
                f.write(sized_message(100_000 + i))
        (a / "sessions" / "cu").mkdir()
        t = time.perf_counter()
        subprocess.run(["sh", "-c", f'cat "{bulk}" >> "{a}/sessions/cu/events.jsonl"'], check=True)
        results["bulk cat through A (pipelined batches) ev/s"] = args.catchup / (time.perf_counter() - t)
        results["bulk cat through A / mount 1 session (what batching buys)"] = (
            results["bulk cat through A (pipelined batches) ev/s"]
            / min(results[f"{where}: memfs mount A, 1 session ev/s"] for where, _ in PLACEMENTS))
        t = time.perf_counter()
        store_b, b = mount("B")
        mounted = time.perf_counter() - t
        b_cu = store_b / "cu" / "events.jsonl"
        deadline = time.monotonic() + 600
        while count_lines(b_cu) < args.catchup:
            if time.monotonic() > deadline:
                raise RuntimeError(f"B had {count_lines(b_cu)} of {args.catchup} lines after 600 s")
            time.sleep(0.05)
        results[f"catch-up of B after {args.catchup:,} appends s"] = time.perf_counter() - t
        results["catch-up: B mounted after s"] = mounted
        results["catch-up rate ev/s"] = args.catchup / results[f"catch-up of B after {args.catchup:,} appends s"]
        same = b_cu.read_bytes() == (store_a / "cu" / "events.jsonl").read_bytes()
        results["catch-up: B's log byte-identical to A's"] = float(same)
    finally:
        for host in list(procs):
            unmount(host)
        for r in (raw, follower):
            if r is not None:
                r.close()
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    goals = {
        "cluster: fenced single appends through the mount >= 0.8 of raw nats-py":
            {"measured": f"{results['mount 1 session / raw 1 subject, the lesser placement']:.2f} (the lesser of "
                         "the two placements of the stream leader)",
             "met": results["mount 1 session / raw 1 subject, the lesser placement"] >= 0.8},
        "cluster: replication lag p99 <= 100 ms":
            {"measured": f"{results['replication lag p99 ms']:.1f} ms", "met": results["replication lag p99 ms"] <= 100},
    }
    width = max(map(len, results))
    print(f"workload: 300-byte events; a real 3-node JetStream cluster on 127.0.0.1 (replicas 3, file storage); "
          f"{args.rounds} interleaved rounds of {args.events} appends per writer (medians; ratios are medians of "
          f"neighbours' ratios); {args.lag} lag samples; catch-up after {args.catchup:,} appends")
    for key, value in results.items():
        print(f"{key:<{width}}  {value:,.2f}" if value < 100 else f"{key:<{width}}  {value:,.0f}")
    where = PLACEMENTS[0][0]
    print(f"where a single append's time goes ({where}): each write() waits for one fenced JetStream round trip "
          f"({results[f'{where}: raw fenced round trip, 3 replicas on disk ms']:.2f} ms raw, of the mount's "
          f"{results[f'{where}: mount write() of one line ms']:.2f} ms), and a fence needs the previous line's "
          f"sequence, so one session's appends cannot overlap; replication to three replicas on disk is "
          f"{results[f'{where}: raw fenced round trip, 3 replicas on disk ms'] - results[f'{where}: raw fenced round trip, 1 replica in memory ms']:.2f} ms "
          f"of that round trip. Batching buys {results['bulk cat through A / mount 1 session (what batching buys)']:.1f}x: "
          f"a write() of many lines is already one atomic batch (one round trip for up to 256 lines).")
    loop_ratios = [results[f"{where}: mount 1 session: event loop's connection / nats-py"] for where, _ in PLACEMENTS]
    print("single appends of one session, the event loop's connection (memfs.cluster.wire) / nats-py (the worker "
          "path, MEMFS_CLUSTER_LOOP_CLIENT=0): " + ", ".join(f"{r:.2f}x {w}" for r, (w, _) in zip(loop_ratios, PLACEMENTS))
          + f"; the hand-written client stays only at >= 1.5x ({'met' if min(loop_ratios) >= 1.5 else 'not met'})")
    report_goals(results, goals, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
