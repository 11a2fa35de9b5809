"""What the state machines found, kept as plain tests: each the shortest sequence Hypothesis shrank it to."""

from __future__ import annotations

from extender.core.holds import Allocation
from extender.core.placement.learned import Learned
from tests.builders import FakeClock, make_cluster, make_ledger, make_node, make_pod


def test_a_deleted_node_left_when_its_last_pod_goes_keeps_no_slot_in_the_arrays() -> None:
    """A node deleted while a pod still held GPUs there stays in the cache until that pod goes. The pod's deletion
    (one batch of changes) forgets the node, and then must not tell the listeners the node changed: the arrays would
    give a slot again to a node the cache no longer has, and keep it for good (one per node that left this way)."""
    pod = make_pod("p", gpu_mem=1, uid="uid-p")
    cluster = make_cluster(make_node("n0", gpus=1, mem=8), pods=(pod,))
    learned = Learned(cluster)
    ledger = make_ledger(cluster, clock=FakeClock())
    assert ledger.reserve(Allocation.uniform("uid-p", "default/p", "n0", (0,), 1)) is None
    cluster.apply_node(make_node("n0"), deleted=True)
    assert "n0" in cluster.nodes and "n0" in learned.arrays.slot_of

    cluster.apply_pod(pod, deleted=True)

    assert "n0" not in cluster.nodes
    assert "n0" not in learned.arrays.slot_of
