"""The state machine the cache, the ledger and the placement arrays are driven by, for either device protocol.

Rules make what a cluster does: nodes added, re-registered, made NotReady and back, removed; pods created, filtered
and bound by the ledger (the bind accepted, failed, or lost in a way that may have landed), shown by the watch on
time or late, finished, deleted, and their deletion followed by a stale event; reservations taken at random (often
ones that must be refused), released and expired. After every step the incremental state equals one built afresh
from the objects the cache was shown (`fresh.py`), and nothing is over capacity or overlaps.

A protocol's machine (`test_gpushare_machine.py`, `test_hami_machine.py`) says how its nodes, pods and random
allocations are drawn.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from extender.core.cache import Cache
from extender.core.devices import Device
from extender.core.holds import Allocation, Grant, HoldState
from extender.core.ledger import UNWRITTEN, Ledger
from extender.core.placement.config import PolicyConfig, ask_of
from extender.core.placement.learned import Learned
from extender.core.placement.placer import Placer
from extender.core.placement.workload import Workload, shape_of
from extender.core.pods import pod_record
from extender.core.protocols import DeviceProtocol
from tests.builders import FakeClock
from tests.property import oracle
from tests.property.fresh import (
    arrays_differences,
    cache_differences,
    fresh_placer,
    outcome_of,
    rebuilt,
    scores_of,
    workload_differences,
)

NODE_NAMES = tuple(f"n{number}" for number in range(6))
FILL_LIMIT = 20
"""Reservations `fill_a_gpu` makes at most: more than a GPU's split count, or its memory in gpushare's units."""
OUTCOMES = ("accepted", "failed", "landed", "lost", "assumed")
"""How a bind ends (its binding accepted; refused; failed uncertainly, having landed or not), or that the filter
only assumed the GPUs."""
TTL = 30.0


class CacheMachine(RuleBasedStateMachine):
    """One cache, its ledger and what placement learns of it, against the objects it was shown. Subclasses give
    the protocol and draw its objects (`node`, `pod`, `random_allocation`)."""

    protocol: DeviceProtocol
    config = PolicyConfig()

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.cache = Cache(self.protocol, clock=self.clock)
        self.learned = Learned(self.cache)
        self.placer = Placer(self.cache, self.config, self.learned)
        self.ledger = Ledger(self.cache, TTL, self.clock)
        self.nodes: dict[str, dict[str, Any]] = {}
        """The nodes as the API (and the cache: node events are shown at once) has them."""
        self.api: dict[str, dict[str, Any]] = {}
        """Pods as the API has them, by UID."""
        self.shown: dict[str, dict[str, Any]] = {}
        """Pods as the cache was last shown them, by UID (what a cache built afresh is built from)."""
        self.gone: dict[str, dict[str, Any]] = {}
        """Pods deleted, as last shown: a late event of one must change nothing."""
        self.expected = Workload()
        """The workload the cache's pods teach, observed here as each first shows."""
        self.drawn: dict[str, dict[str, Any]] = {}
        """The last node drawn by each name (a node deleted comes back as it was while pods hold GPUs there)."""
        self.unhealthy: dict[str, frozenset[int]] = {}
        """GPUs operators listed unhealthy, by node (gpushare's ConfigMaps)."""
        self.memory_quotas: dict[str, int] = {}
        """Namespace -> the GPU memory its ResourceQuota allows (the ledger's quota book holds the same)."""
        self.needs: set[int] = set()
        self.names = 0

    # -- what a protocol draws

    def node(self, data: st.DataObject, name: str) -> dict[str, Any]:
        raise NotImplementedError

    def pod(self, data: st.DataObject, name: str) -> dict[str, Any]:
        raise NotImplementedError

    def random_allocation(self, data: st.DataObject, uid: str, key: str, node: str) -> Allocation:
        raise NotImplementedError

    # -- showing objects to the cache

    def show(self, uid: str, deleted: bool = False) -> None:
        pod = self.api[uid]
        record = pod_record(pod, self.protocol)
        if not deleted and not record.finished and uid not in self.cache.pods and uid not in self.gone:
            self.expected.observe(shape_of(record.demand, record.cpu, record.memory, record.models), self.clock())
        self.cache.apply_pod(pod, deleted)
        if deleted:
            self.gone[uid] = self.shown.pop(uid, pod)
            del self.api[uid]
        else:
            self.shown[uid] = pod

    def pending(self) -> list[str]:
        return sorted(uid for uid, pod in self.api.items() if not pod["spec"].get("nodeName"))

    # -- nodes

    @initialize(data=st.data(), count=st.integers(min_value=2, max_value=len(NODE_NAMES)))
    def a_cluster(self, data: st.DataObject, count: int) -> None:
        """A few nodes to start with (rows of one kind are then many), and the pods the cache lists first."""
        for name in NODE_NAMES[:count]:
            self.register_node(data, name)
        for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
            self.create_pod(data, shown=True)

    @rule(data=st.data(), name=st.sampled_from(NODE_NAMES))
    def register_node(self, data: st.DataObject, name: str) -> None:
        """A node joins, or re-registers with other GPUs: the same ones while pods hold GPUs there (a node whose GPUs
        shrink under its pods is over capacity by no decision of ours), or NotReady or back."""
        state = self.cache.nodes.get(name)
        if state is not None and state.holds:
            node = copy.deepcopy(self.drawn[name])
            node["status"]["conditions"] = [{"type": "Ready", "status": data.draw(st.sampled_from(("True", "False")))}]
        else:
            node = self.drawn[name] = self.node(data, name)
        self.nodes[name] = node
        self.cache.apply_node(node)

    @precondition(lambda self: self.nodes)
    @rule(data=st.data(), ready=st.booleans())
    def set_ready(self, data: st.DataObject, ready: bool) -> None:
        name = data.draw(st.sampled_from(sorted(self.nodes)))
        node = self.nodes[name] = copy.deepcopy(self.nodes[name])
        node["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready else "False"}]
        self.cache.apply_node(node)

    @precondition(lambda self: self.nodes and self.protocol.unhealthy_namespace is not None)
    @rule(data=st.data(), indexes=st.sets(st.integers(min_value=0, max_value=3), max_size=2))
    def list_unhealthy(self, data: st.DataObject, indexes: set[int]) -> None:
        """Operators list some GPUs of a node unhealthy (or none: the list is deleted)."""
        name = data.draw(st.sampled_from(sorted(self.nodes)))
        if indexes:
            self.unhealthy[name] = frozenset(indexes)
        else:
            self.unhealthy.pop(name, None)
        self.cache.apply_unhealthy(name, frozenset(indexes) or None)

    @precondition(lambda self: self.nodes)
    @rule(data=st.data())
    def remove_node(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.nodes)))
        self.cache.apply_node(self.nodes.pop(name), deleted=True)

    # -- pods

    @rule(data=st.data(), shown=st.booleans())
    def create_pod(self, data: st.DataObject, shown: bool) -> None:
        self.names += 1
        pod = self.pod(data, f"p{self.names}")
        uid = pod["metadata"]["uid"]
        self.api[uid] = pod
        if shown:
            self.show(uid)

    @precondition(lambda self: self.pending() and self.nodes)
    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES))
    def filter_and_bind(self, data: st.DataObject, outcome: str) -> None:
        """The filter's answer equals a fresh cache's; it assumes the GPUs the policy chooses on a node it passed
        (no bind comes yet), or the bind to that node reserves them (`bind`)."""
        uid = data.draw(st.sampled_from(self.pending()))
        pod = self.api[uid]
        self.ledger.unassume(uid)  # filtered again: an assumption made by the last filter goes
        demand = self.protocol.pod_demand(pod)
        ask = ask_of(pod, demand)
        if demand.plain and demand.devices == 1:
            self.needs.add(demand.per_device)
        names = sorted(self.nodes)
        fresh = rebuilt(self.protocol, self.clock, self.nodes.values(), self.shown.values(), self.cache, self.unhealthy)
        afresh = fresh_placer(fresh, self.learned, self.config)
        expected = outcome_of(afresh, ask, names)
        found = outcome_of(self.placer, ask, names)
        assert found == expected, f"filter of {uid}: {found} kept, {expected} afresh"
        scores, expected_scores = scores_of(self.placer, ask, names), scores_of(afresh, ask, names)
        assert scores == expected_scores, f"scores of {uid}: {scores} kept, {expected_scores} afresh"
        if not found[0]:
            return
        node = data.draw(st.sampled_from(found[0]))
        placement = self.placer.choose(demand, self.cache.nodes[node], ask)
        if placement is None:
            return
        allocation = Allocation(uid, self.key(uid), node, placement.containers, placement.init_containers)
        if outcome == "assumed":
            assert self.ledger.assume(allocation, self.placer.build()) or self.cache.hold_of(uid) is not None
        else:
            assert self.ledger.reserve(allocation) is None, f"{allocation} chosen on {node}, refused by the ledger"
            self.bound(uid, allocation, outcome)

    @precondition(lambda self: any(hold.state is HoldState.ASSUMED for hold in self.cache.reserved.values()))
    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES[:-1]))
    def bind_assumed(self, data: st.DataObject, outcome: str) -> None:
        """The bind of a pod whose filter assumed GPUs: to that node, it reserves them as they are when they still
        fit and the typical shapes are those they were chosen by; else it decides afresh (`binding.py`)."""
        assumed = sorted(uid for uid, hold in self.cache.reserved.items() if hold.state is HoldState.ASSUMED)
        uid = data.draw(st.sampled_from(assumed))
        assumed_on = self.cache.reserved[uid].allocation.node
        node = data.draw(st.one_of(st.just(assumed_on), st.sampled_from(sorted({assumed_on, *self.nodes}))))
        taken = self.ledger.take_assumed(uid, node, self.placer.build())
        if taken is not None:
            self.bound(uid, taken.allocation, outcome)
            return
        self.ledger.unassume(uid)
        state = self.cache.nodes.get(node)
        pod = self.api.get(uid)
        if state is None or pod is None:
            return
        demand = self.protocol.pod_demand(pod)
        placement = self.placer.choose(demand, state, ask_of(pod, demand))
        if placement is None:
            return
        allocation = Allocation(uid, self.key(uid), node, placement.containers, placement.init_containers)
        if self.ledger.reserve(allocation) is None:
            self.bound(uid, allocation, outcome)

    def key(self, uid: str) -> str:
        return f"default/{self.api[uid]['metadata']['name']}"

    def bound(self, uid: str, allocation: Allocation, outcome: str) -> None:
        """The binding of a reserved pod is accepted, fails, or fails uncertainly having landed or not. A failure
        lets go of the holds of the pod's job too, if it is a member of one held whole (`binding.py`)."""
        if outcome == "failed":
            self.ledger.release(uid)
            self.ledger.release_group(self.ledger.group_of(uid))
            return
        if outcome in ("accepted", "landed"):
            bound = self.api[uid] = copy.deepcopy(self.api[uid])
            bound["spec"]["nodeName"] = allocation.node
            devices = self.cache.nodes[allocation.node].devices
            annotations = self.protocol.allocation_annotations(allocation, devices, self.clock())
            bound["metadata"]["annotations"] = {**bound["metadata"]["annotations"], **annotations}
        if outcome == "accepted":
            self.ledger.mark_bound(uid)
        else:
            self.ledger.mark_uncertain(uid)

    @precondition(lambda self: any(self.api[uid] is not self.shown.get(uid) for uid in self.api))
    @rule(data=st.data())
    def watch_shows(self, data: st.DataObject) -> None:
        """The watch shows a pod as the API has it now (late, after the bind, or after a TTL expired)."""
        uid = data.draw(st.sampled_from(sorted(uid for uid in self.api if self.api[uid] is not self.shown.get(uid))))
        self.show(uid)

    @precondition(lambda self: any(pod["spec"].get("nodeName") for pod in self.api.values()))
    @rule(data=st.data())
    def finish_pod(self, data: st.DataObject) -> None:
        uid = data.draw(st.sampled_from(sorted(uid for uid, pod in self.api.items() if pod["spec"].get("nodeName"))))
        finished = self.api[uid] = copy.deepcopy(self.api[uid])
        finished["status"]["phase"] = data.draw(st.sampled_from(("Succeeded", "Failed")))
        self.show(uid)

    @precondition(lambda self: self.api)
    @rule(data=st.data())
    def delete_pod(self, data: st.DataObject) -> None:
        self.show(data.draw(st.sampled_from(sorted(self.api))), deleted=True)

    @rule()
    def relist(self) -> None:
        """The watch restarts: a full listing of nodes and pods replaces what the cache had (pods absent from it
        are gone, those it shows are as it shows them)."""
        listed = list(self.api.values())
        for pod in listed:
            record = pod_record(pod, self.protocol)
            uid = record.uid
            if not record.finished and uid not in self.cache.pods and uid not in self.gone:
                self.expected.observe(shape_of(record.demand, record.cpu, record.memory, record.models), self.clock())
        self.cache.replace(list(self.nodes.values()), listed)
        self.shown = dict(self.api)

    @precondition(lambda self: self.gone)
    @rule(data=st.data())
    def stale_event(self, data: st.DataObject) -> None:
        """An event for a pod older than its deletion arrives after it (a relist or a read that crossed it)."""
        self.cache.apply_pod(self.gone[data.draw(st.sampled_from(sorted(self.gone)))])

    # -- reservations

    @precondition(lambda self: self.nodes)
    @rule(data=st.data())
    def reserve_at_random(self, data: st.DataObject) -> None:
        """A reservation of GPUs drawn at random, for a pending pod or one the cache has not seen: the ledger
        takes it if it fits, and the invariants say whether it should have."""
        candidates = [uid for uid in self.pending() if (hold := self.cache.hold_of(uid)) is None or not hold.observed]
        self.names += 1
        uid = data.draw(st.sampled_from([*candidates, f"uid-unseen-{self.names}"]))
        node = data.draw(st.sampled_from(sorted(self.nodes)))
        key = f"default/{self.api[uid]['metadata']['name']}" if uid in self.api else f"default/unseen-{self.names}"
        allocation = self.random_allocation(data, uid, key, node)
        expected = oracle.fits(self.cache, allocation, self.memory_quotas)
        refusal = self.ledger.reserve(allocation)
        assert (refusal is None) == expected, f"{allocation}: the ledger says {refusal!r}, the rules {expected}"

    @precondition(lambda self: any(state.known and state.devices for state in self.cache.nodes.values()))
    @rule(data=st.data())
    def fill_a_gpu(self, data: st.DataObject) -> None:
        """Reservations of the least a pod can take, one after another on one GPU, until the ledger refuses one: its
        memory, compute or split count is then full, as the rules say."""
        node = data.draw(st.sampled_from(sorted(name for name, state in self.cache.nodes.items() if state.known)))
        state = self.cache.nodes[node]
        if not state.devices:
            return
        device = data.draw(st.sampled_from(state.devices))
        for _ in range(FILL_LIMIT):
            self.names += 1
            allocation = self.smallest(f"uid-filler-{self.names}", f"default/filler-{self.names}", node, device)
            expected = oracle.fits(self.cache, allocation, self.memory_quotas)
            refusal = self.ledger.reserve(allocation)
            assert (refusal is None) == expected, f"{allocation}: the ledger says {refusal!r}, the rules {expected}"
            if refusal is not None:
                return

    def smallest(self, uid: str, key: str, node: str, device: Device) -> Allocation:
        """The least a pod can take of the GPU."""
        return Allocation(uid, key, node, ((Grant(device.index, 1, 0, device.uuid),),))

    @precondition(lambda self: any(hold.state not in UNWRITTEN for hold in self.cache.reserved.values()))
    @rule(data=st.data())
    def reserve_again(self, data: st.DataObject) -> None:
        """A pod's reservation taken again as it is (its own hold given back first: it still fits, unless its GPUs
        changed meanwhile). Not an assumption nor a job's hold: no bind reserves those over themselves. Nor one whose
        binding landed: a bind of it finds it bound or writes the same again (`binding._settled`, `_earlier_decision`),
        never reserving it anew; a reservation taken again would be one the TTL frees while the watch fails, the API
        having the pod bound (seen: a quota overrun once the watch showed it), by a sequence the product never makes."""
        held = sorted(uid for uid, hold in self.cache.reserved.items() if hold.state not in UNWRITTEN)
        uid = data.draw(st.sampled_from(held))
        if self.api.get(uid, {}).get("spec", {}).get("nodeName"):
            return
        allocation = self.cache.reserved[uid].allocation
        expected = oracle.fits(self.cache, allocation, self.memory_quotas)
        refusal = self.ledger.reserve(allocation)
        assert (refusal is None) == expected, f"{allocation}: the ledger says {refusal!r}, the rules {expected}"

    @precondition(lambda self: any(hold.state is not HoldState.GROUPED for hold in self.cache.reserved.values()))
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        """A pod's hold let go alone (a bind that failed, or decided afresh elsewhere): never a job's hold, which
        leaves with the job's others (`Ledger.release_group`)."""
        held = sorted(uid for uid, hold in self.cache.reserved.items() if hold.state is not HoldState.GROUPED)
        uid = data.draw(st.sampled_from(held))
        landed = self.api.get(uid, {}).get("spec", {}).get("nodeName")
        if not landed:  # a definite failure: nothing was written
            self.ledger.release(uid)

    @rule(seconds=st.sampled_from((1.0, 10.0, TTL + 1)), watching=st.booleans())
    def time_passes(self, seconds: float, watching: bool) -> None:
        """Time passes, and the ledger expires what waited too long (while the watch fails, not what is bound).

        A watch that works has shown every binding that landed by then: the ledger frees a bound pod's hold after
        the TTL on that assumption (DESIGN §3.4), so a binding shown only after its hold was given away would put
        the GPU over capacity by a history the product rules out, not by a decision it made."""
        if watching:
            for uid in sorted(self.api):
                if self.api[uid]["spec"].get("nodeName") and self.api[uid] is not self.shown.get(uid):
                    self.show(uid)
        self.clock.advance(seconds)
        expired, dropped = oracle.due(self.cache, self.clock(), TTL, watching)
        freed = {hold.allocation.pod_uid for hold in self.ledger.expire(include_bound=watching)}
        assert freed == expired, f"expired {sorted(freed)}, due {sorted(expired)}"
        assert not (expired | dropped) & self.cache.reserved.keys(), f"still held: {sorted(self.cache.reserved)}"

    @rule()
    def measure_every_node(self) -> None:
        """The policy measures every node (what a filter does for those it narrows), and remembers each."""
        for state in list(self.cache.nodes.values()):
            if state.known:
                self.learned.measure(state)

    # -- after every step

    @invariant()
    def equals_a_cache_built_afresh(self) -> None:
        fresh = rebuilt(self.protocol, self.clock, self.nodes.values(), self.shown.values(), self.cache, self.unhealthy)
        problems = cache_differences(self.cache, fresh, sorted(self.needs))
        fresh_learned = Learned(fresh)
        problems += arrays_differences(self.learned, fresh_learned)
        problems += workload_differences(self.learned, self.expected)
        assert not problems, "\n".join(problems)
