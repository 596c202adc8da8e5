"""The cluster tests' three-node JetStream cluster: :mod:`memfs.cluster.testing` (the benchmark
uses it too, and benchmarks do not import from tests/)."""

from memfs.cluster.testing import NatsCluster, NatsServer, free_ports, nats_server_binary  # noqa: F401
