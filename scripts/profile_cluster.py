#!/usr/bin/env python3
"""Where a cluster append's time goes (issue 17): the library path without FUSE, beside raw
``nats-py`` fenced publishes, on a real three-node cluster, interleaved rounds.

Series: raw ``nats-py`` fenced publishes, one at a time, on a loop of their own thread (the
benchmark's baseline); :meth:`ClusterNode.append` of one validated record at a time from a
thread (the hop to the NATS thread and back, the fenced publish, the local commit and the
sidecar), with the node following its stream and, in the next series, without the follower
(``--no-follow``-like: the subscription skipped), each with 1 and 8 writer threads. Compare
with ``scripts/bench_cluster.py``'s mount figures: the difference is FUSE, the trio loop and
its worker-thread hop, and the other host's daemon sharing the CPUs.

Usage: ``.venv/bin/python scripts/profile_cluster.py [--rounds R] [--events N]``
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from bench_cluster import Raw  # noqa: E402
from memfs.cluster import ClusterConfig  # noqa: E402
from memfs.cluster import node as cluster_node  # noqa: E402
from memfs.cluster.testing import NatsCluster  # noqa: E402
from memfs.samples import sized_message  # noqa: E402
from memfs.store.root import Store, StoreSettings  # noqa: E402


def start_node(store: Store, urls: str, stream: str, follow: bool) -> cluster_node.ClusterNode:
    node = cluster_node.ClusterNode(store, ClusterConfig(servers=urls.split(","), stream=stream, timeout=10))
    if not follow:
        import nats.js.client

        real = nats.js.client.JetStreamContext.subscribe

        async def no_subscription(*args, **kwargs):
            return None

        nats.js.client.JetStreamContext.subscribe = no_subscription
        try:
            return node.start()
        finally:
            nats.js.client.JetStreamContext.subscribe = real
    return node.start()


def rate(node, handles, lines, threads: int) -> float:
    def run(i):
        for line in lines:
            node.append(handles[i].name, [handles[i].validate(line)])

    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    t = time.perf_counter()
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    return threads * len(lines) / (time.perf_counter() - t)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--events", type=int, default=300)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="memfs-profile-cluster-"))
    cluster = NatsCluster.started(work / "nats")
    lines = [sized_message(i)[:-1] for i in range(args.events)]
    series: dict[str, list[float]] = {}
    try:
        raw = Raw(cluster.urls)
        # two nodes would follow each other's subjects (both memfs.>): one at a time, following first
        for follow in (True, False):
            store = Store(work / f"store{follow}", StoreSettings(max_events=0))
            node = start_node(store, cluster.urls, f"P{int(follow)}", follow)
            handles = [store.create(f"s{i}") for i in range(8)]
            rate(node, handles, lines[:30], 1)  # warm-up
            for _ in range(args.rounds):
                for k in (1, 8):
                    series.setdefault(f"raw nats-py fenced, {k} subject(s)", []).append(
                        raw.rate([f"raw.p{follow}{k}.{i}" for i in range(k)], lines))
                    series.setdefault(f"ClusterNode.append, follower {'on' if follow else 'off'}, {k} thread(s)",
                                      []).append(rate(node, handles, lines, k))
            node.stop()
            store.close()
            raw.run(raw.js.delete_stream(f"P{int(follow)}"))  # both streams take memfs.>: one at a time
        raw.close()
    finally:
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    width = max(map(len, series))
    for k, v in series.items():
        print(f"{k:<{width}}  {statistics.median(v):,.0f} ev/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
