"""The node tier's fixture: the one-node cluster of `make cluster` (devtools/cluster), one per test session.

A cluster already up (a developer's `make cluster`) is used as it is (its images imported again, so a rebuilt one
is what the tests run) and left up; otherwise the session brings one
up and removes it at the end. The session holds the cluster's lock (`processes.cluster_lock`), so a second session
or a bench waits for it rather than installing into the same namespaces. The tier needs root (network namespace,
cgroups, mounts) and the tools `make test` installs and builds (`make node-build`): without root or without Go it
is skipped, saying why; with both, anything missing or a cluster that does not come up fails the tier, with the
part's log, so CI cannot pass by skipping it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from devtools.cluster import addons, network, node
from devtools.cluster.layout import Paths
from devtools.cluster.processes import ClusterError, cluster_lock
from tests.e2e.controlplane import go_toolchain
from tests.node.operator import Operator


@pytest.fixture(scope="session")
def cluster() -> Iterator[Operator]:
    if os.geteuid() != 0:
        pytest.skip("node tier skipped: it needs root (a network namespace, cgroups, mounts)")
    if go_toolchain() is None:
        pytest.skip("node tier skipped: no Go toolchain to build kubelet and the images (make node-build)")
    paths = Paths()
    with cluster_lock():
        brought_up = False
        if node.is_up(paths):
            addons.import_images(paths)  # what `make node-build` rebuilt since the cluster came up
            addons.start_device_plugin(paths, "gpushare")  # the tests start from gpushare's, as `up` does
        else:
            if network.exists() or paths.state.exists():
                node.down(paths)  # what an interrupted session left
            try:
                node.up(paths, protocol="gpushare")
            except ClusterError as error:
                pytest.fail(f"node tier: the cluster did not come up (make node-build, then make cluster):\n{error}")
            brought_up = True
        yield Operator(paths)
        if brought_up:
            node.down(paths)
