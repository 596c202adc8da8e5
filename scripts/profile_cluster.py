#!/usr/bin/env python3
"""Where a cluster append's time goes (issue 17): the worker-thread path without FUSE, beside
raw ``nats-py`` fenced publishes, on a real three-node cluster, interleaved rounds.

Series: raw ``nats-py`` fenced publishes, one at a time, on a loop of their own thread (the
benchmark's baseline); :meth:`ClusterNode.append` of one validated record at a time from a
thread — what the mount's worker path does for a line the event loop hands it (the hop to
the NATS thread and back, the fenced publish, the local commit and the sidecar) — with 1 and
8 writer threads. The node does not follow its stream here: the follower runs on the mount's
event loop (:mod:`memfs.cluster.follow`). Compare with ``scripts/bench_cluster.py``'s mount
figures, whose single appends take the event loop's own connection instead.

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

from memfs.cluster import ClusterConfig  # noqa: E402
from memfs.cluster import node as cluster_node  # noqa: E402
from memfs.cluster.testing import NatsCluster  # noqa: E402
from memfs.samples import sized_message  # noqa: E402
from memfs.store.root import Store, StoreSettings  # noqa: E402

from bench_cluster import Raw  # noqa: E402


def start_node(store: Store, urls: str, stream: str) -> cluster_node.ClusterNode:
    return cluster_node.ClusterNode(store, ClusterConfig(servers=urls.split(","), stream=stream, timeout=10)).start()


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
        store = Store(work / "store", StoreSettings(max_events=0))
        node = start_node(store, cluster.urls, "P")
        handles = [store.create(f"s{i}") for i in range(8)]
        rate(node, handles, lines[:30], 1)  # warm-up
        for _ in range(args.rounds):
            for k in (1, 8):
                series.setdefault(f"raw nats-py fenced, {k} subject(s)", []).append(
                    raw.rate([f"raw.p{k}.{i}" for i in range(k)], lines))
                series.setdefault(f"ClusterNode.append (the worker path), {k} thread(s)", []).append(
                    rate(node, handles, lines, k))
        node.stop()
        store.close()
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
