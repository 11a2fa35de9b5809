"""The state machine of `machine.py` with jobs placed whole among its pods (`core/jobs.py`, the ledger's group holds).

Rules make what Kueue and kube-scheduler do with plain-pod groups: jobs of a few pods created (seen by the cache
at once or later, sometimes one pod more than the job's size, and replacements later), a member filtered (its job
planned and held whole, or refused whole), a member bound (its job's hold taken on its planned node, or refused
elsewhere; without a hold, refused while its job lacks members started), members deleted (also between another
member's filter and its bind), binds failing (the job's other holds let go with it), the node, GPUs or quota of a
held job changing before its binds, time passing past the jobs' hold TTL and the sweep letting jobs go, and the team's
ResourceQuota on GPU memory set, lowered below what it holds, or deleted; the single pods, reservations and nodes
of `machine.py` interleave. The jobs live in their own namespace, so the single pods' rules meet no quota.

After every step, besides `machine.py`'s invariants:
- a job's hold is whole: every member it waits for holds its GPUs as a job's hold, on its planned node, but for a
  member deleted since, which the next sweep closes (after a sweep, no job is held in part); a job without a hold
  has no member held for it, and no GROUPED hold belongs to no job;
- no GROUPED hold is ever released as abandoned (nothing was written for it);
- the team's quota book counts what its pods hold, and no step takes that above the quota (a quota lowered below
  what is held leaves that, and nothing more is given);
- the cache files each member under its job.
A restart at any step (and always just after a member's bind that leaves others waiting): an extender started
from the API's objects alone holds again, as its binds wrote it, every job this one holds whole with a member bound;
what it holds again it holds whole, and nothing is over capacity; what a bind writes is the job's hold as it stands.
And at the step itself: a member's filter passes the node its job's hold planned for it (a hold still whole, covering
exactly the members the job lacked when planned), or refuses it with the job holding nothing; a member's bind takes
its hold only to its planned node, where it still fits, and while its job's hold is whole (else the job is let go
whole); a member's bind without a hold is refused while its job lacks members started (`jobs.unheld`).

Binds are modelled here as `binding.py` makes them (as `machine.py` does), not run through it.
"""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from extender.core import jobplan, jobs
from extender.core.cache import Cache
from extender.core.groups import KUEUE_GROUP, KUEUE_TOTAL, GroupKey, Scheme, declared
from extender.core.holds import Allocation, Hold, HoldState
from extender.core.ledger import GROUP_HOLD_TTL, Ledger
from extender.core.placement.config import ask_of
from extender.core.pods import PodRecord, pod_record
from extender.core.quota.book import Quotas
from extender.core.quota.limits import read_quota
from tests.builders import make_quota
from tests.property import oracle
from tests.property.machine import OUTCOMES, TTL, CacheMachine

TEAM = "team"
"""The namespace of the jobs, and of the ResourceQuota."""
SIZES = st.integers(min_value=1, max_value=4)
"""Pods a job needs to start: from one (a job of one is still held whole) to more GPUs than most nodes have."""
SEEN_AT_ONCE = st.sampled_from((True,) * 5 + (False,))
"""Whether the cache sees a member created before the next step: mostly (a job is planned once its members are
all seen), not always (a member's filter may come before the watch shows it, or the others)."""
CHANGES = ("node removed", "GPUs unhealthy", "quota lowered")
"""What may change under a job's hold before its members bind (`bind_after_a_change`)."""
QUOTA_CHANGES = (-4, 4, 16, 64)
"""GiB the team's quota is set above what it holds: below (no more is given until pods go), a member or two above,
room for several jobs."""


class JobMachine(CacheMachine):
    """`CacheMachine` with jobs; a protocol's machine gives `gib`."""

    gib: int
    """The protocol's memory unit in one GiB (the quota is drawn in GiB)."""

    def __init__(self) -> None:
        super().__init__()
        self.quotas = Quotas.following(self.cache)
        self.ledger = Ledger(self.cache, TTL, self.clock, self.quotas)
        self.jobs: dict[GroupKey, int] = {}
        """Every job created, with its size (Kueue's total count), in the order created."""
        self.workers: dict[GroupKey, dict[str, Any] | None] = {}
        """The pod each member of a job copies (None: each is drawn on its own)."""
        self.member_of: dict[str, GroupKey] = {}
        """Pod UID -> its job, for every member ever created."""
        self.charged = 0
        """The GPU memory the team held after the last step."""
        self.grouped_abandoned: list[str] = []
        """UIDs whose GROUPED hold the cache was told to release as abandoned (must stay empty)."""
        release = self.cache.release

        def watched_release(uid: str, abandon: bool = False) -> Hold | None:
            hold = self.cache.hold_of(uid)
            if abandon and hold is not None and hold.state is HoldState.GROUPED:
                self.grouped_abandoned.append(uid)
            return release(uid, abandon)

        self.cache.release = watched_release  # type: ignore[method-assign]

    def worker(self, data: st.DataObject) -> dict[str, Any]:
        """A pod whose copies make a job: a share of one GPU, as a distributed job's workers each ask, drawn so
        that several fit the cluster at once (the single pods' drawing fills a node with a pod or two)."""
        raise NotImplementedError

    def pending(self) -> list[str]:
        """The pods `machine.py`'s rules filter and bind alone: not the members of a job (this machine's rules)."""
        return [uid for uid in super().pending() if uid not in self.member_of]

    # -- jobs

    @initialize(data=st.data(), size=SIZES)
    def a_job(self, data: st.DataObject, size: int) -> None:
        self.create_job(data, size, extra=False, filtered=True)

    @rule(data=st.data(), size=SIZES, extra=st.booleans(), filtered=st.booleans())
    def create_job(self, data: st.DataObject, size: int, extra: bool, filtered: bool) -> None:
        """A Kueue pod group of `size` pods, sometimes with one more (placed as any pod once `size` started): workers
        alike (copies of one `worker`), or each drawn as the single pods are. When `filtered`, kube-scheduler filters
        one of them at once (the job planned and held then, if it can be: its members' binds come later)."""
        key = GroupKey(Scheme.KUEUE, TEAM, f"job{len(self.jobs)}")
        self.jobs[key] = size
        self.workers[key] = self.worker(data) if data.draw(st.booleans()) else None
        for _ in range(size + extra):
            self.create_member(data, key)
        members = [uid for uid in self.unstarted() if self.member_of[uid] == key]
        if filtered and self.nodes and members:
            self.filtered(data, data.draw(st.sampled_from(members)))

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def replace_member(self, data: st.DataObject) -> None:
        """One more pod of a job, as Kueue creates one for a member deleted."""
        self.create_member(data, data.draw(st.sampled_from(list(self.jobs))))

    def create_member(self, data: st.DataObject, key: GroupKey) -> None:
        """A pod of the protocol's drawing (or a copy of the job's worker), labelled and annotated as Kueue's
        plain-pod groups are, shown to the cache now or later (its filter may come first)."""
        self.names += 1
        name, worker = f"p{self.names}", self.workers[key]
        pod = self.pod(data, name) if worker is None else copy.deepcopy(worker)
        metadata = pod["metadata"]
        metadata["name"], metadata["uid"] = name, f"uid-{name}"
        metadata["namespace"] = TEAM
        metadata["labels"] = {**metadata.get("labels", {}), KUEUE_GROUP: key.name}
        metadata["annotations"] = {**metadata.get("annotations", {}), KUEUE_TOTAL: str(self.jobs[key])}
        uid = metadata["uid"]
        self.api[uid] = pod
        self.member_of[uid] = key
        if data.draw(SEEN_AT_ONCE):
            self.show(uid)

    def unstarted(self) -> list[str]:
        """Members kube-scheduler still filters and binds: not bound, and no bind of theirs took GPUs."""
        return [
            uid
            for uid in self.member_of
            if uid in self.api
            and not self.api[uid]["spec"].get("nodeName")
            and ((hold := self.cache.hold_of(uid)) is None or hold.state is HoldState.GROUPED)
        ]

    def held_for_jobs(self, uids: list[str]) -> list[str]:
        """Those of `uids` whose job holds GPUs for them."""
        return [uid for uid in uids if self.ledger.held_for(uid) is not None]

    def records_of(self, key: GroupKey, asking: PodRecord) -> list[PodRecord]:
        """The job's members as the cache has them, and the one asking as kube-scheduler sent it."""
        members = [
            self.cache.pods[uid]
            for uid, job in self.member_of.items()
            if job == key and uid in self.cache.pods and uid != asking.uid
        ]
        return [*members, asking]

    @precondition(lambda self: self.nodes and self.unstarted())
    @rule(data=st.data())
    def filter_a_member(self, data: st.DataObject) -> None:
        self.filtered(data, data.draw(st.sampled_from(self.unstarted())))

    @precondition(lambda self: self.nodes and self.unstarted())
    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES[:-1]))
    def bind_a_member(self, data: st.DataObject, outcome: str) -> None:
        """A member's bind: mostly one its job holds GPUs for, to its planned node or another."""
        unstarted = self.unstarted()
        uid = data.draw(mostly(self.held_for_jobs(unstarted), unstarted))  # kube-scheduler binds the pods it passed
        hold = self.cache.hold_of(uid)
        planned = [hold.allocation.node] if hold is not None else []
        elsewhere = [node for node in sorted(self.nodes) if node not in planned]
        self.bind_member(uid, data.draw(mostly(planned, elsewhere or planned)), outcome)

    @precondition(lambda self: self.nodes and self.unstarted())
    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES[:-1]))
    def schedule_a_member(self, data: st.DataObject, outcome: str) -> None:
        self.schedule(data, data.draw(st.sampled_from(self.unstarted())), outcome)

    @precondition(lambda self: self.nodes and self.unstarted())
    @rule(data=st.data())
    def schedule_a_job(self, data: st.DataObject) -> None:
        """kube-scheduler's cycles for every member of a job not started, one after another in any order (once a job
        is held, kube-scheduler is asked to retry its members at once: `Requeue.job_held`)."""
        unstarted = self.unstarted()
        key = self.member_of[data.draw(st.sampled_from(unstarted))]
        for uid in data.draw(st.permutations([uid for uid in unstarted if self.member_of[uid] == key])):
            self.schedule(data, uid, data.draw(st.sampled_from(OUTCOMES[:-1])))

    @precondition(lambda self: self.held_for_jobs(self.unstarted()))
    @rule(data=st.data(), change=st.sampled_from(CHANGES), outcome=st.sampled_from(OUTCOMES[:-1]))
    def bind_after_a_change(self, data: st.DataObject, change: str, outcome: str) -> None:
        """What a job holds changes before one of its members binds to its planned node: the node leaves, the GPUs
        are listed unhealthy (gpushare), or the team's quota is lowered below what it holds. The bind is refused
        where the ledger's rules say it no longer fits, its job's hold left whole for the sweep."""
        uid = data.draw(st.sampled_from(self.held_for_jobs(self.unstarted())))
        allocation = self.cache.reserved[uid].allocation
        node = allocation.node
        if change == "node removed" and node in self.nodes:
            self.cache.apply_node(self.nodes.pop(node), deleted=True)
        elif change == "GPUs unhealthy" and self.protocol.unhealthy_namespace is not None:
            self.unhealthy[node] = self.unhealthy.get(node, frozenset()) | {use.index for use in allocation.uses}
            self.cache.apply_unhealthy(node, self.unhealthy[node])
        elif change == "quota lowered":
            self.set_quota(-4)
        self.bind_member(uid, node, outcome)

    def schedule(self, data: st.DataObject, uid: str, outcome: str) -> None:
        """kube-scheduler's cycle for a member: its filter, and its bind to the node passed (the first passed, for
        one placed as any pod), if any, ending in `outcome`."""
        names, verdict = self.filtered(data, uid)
        if verdict is None:
            self.bind_member(uid, names[0], outcome)
        elif verdict.node in names:
            self.bind_member(uid, verdict.node, outcome)

    def filtered(self, data: st.DataObject, uid: str) -> tuple[list[str], jobs.MemberFilter | None]:
        """A member's filter, on every node or some (those kube-scheduler's own filters passed): the node its job's
        hold planned for it, the job planned and held whole now if it held nothing, or a refusal that holds nothing;
        nothing to say of it (placed as any pod) once as many members as the job's size started. Returns the nodes
        sent and the verdict."""
        key, pod = self.member_of[uid], self.api[uid]
        said = declared(pod)
        assert said is not None and said.group == key and said.minimum == self.jobs[key], said
        record = pod_record(pod, self.protocol)
        everything = sorted(self.nodes)
        names = data.draw(st.one_of(st.just(everything), st.sets(st.sampled_from(everything), min_size=1).map(sorted)))
        gang = oracle.gang(self.cache, self.records_of(key, record), self.jobs[key])
        before = self.ledger.group_hold(key)
        self.ledger.unassume(uid)
        verdict = jobs.filter_member(record, said, names, self.cache, self.ledger, self.placer)
        after = self.ledger.group_hold(key)
        if gang is None:
            assert verdict is None, f"{uid} of {key}, whose size started: {verdict}"
            return names, verdict
        assert verdict is not None, f"{uid} of {key} placed as any pod, its job lacking {gang}"
        if verdict.node:
            assert after is not None and uid in after.waiting, f"{uid} passed {verdict.node}, its job holding {after}"
            assert oracle.whole(self.cache, after), f"{uid} passed {verdict.node} for a job held in part: {after}"
            assert self.ledger.held_for(uid) == verdict.node, f"{uid} passed {verdict.node}, held elsewhere"
            if verdict.planned:
                assert sorted(after.planned) == sorted(gang), f"{key} held {after.planned}, lacking {gang}"
            else:  # planned by an earlier filter, for the members the job lacked then
                assert after is before, f"{uid} passed {verdict.node}, its job's hold changed: {before}, {after}"
        elif uid in gang:
            assert after is None, f"{key} refused ({verdict.reason}), yet holding {after}"
        else:
            assert verdict.reason and (after is before or after is None), f"{uid} of {key}: {verdict}, {after}"
        return names, verdict

    def bind_member(self, uid: str, node: str, outcome: str) -> None:
        """A member's bind (`binding.py`): with its job's hold, to its planned node it takes it when it still fits
        there (its GPUs usable, the quota kept) and the job's hold is whole, and is refused anywhere else; a job
        that lost a member it was held for is let go whole then (it never starts in part). Without a hold, it is
        refused while its job lacks members started (`jobs.unheld`), else placed as any pod. The binding then ends
        as `machine.py`'s do (a failure lets go of the job's other holds)."""
        hold = self.cache.hold_of(uid)
        if hold is not None:
            expected = node == hold.allocation.node and oracle.fits(self.cache, hold.allocation, self.memory_quotas)
            job = self.ledger.group_of(uid)
            group = self.ledger.group_hold(job) if job is not None else None
            in_part = group is not None and not oracle.whole(self.cache, group)
            taken = self.ledger.take_grouped(uid, node)
            assert (taken is not None) == (expected and not in_part), f"{uid} to {node}: took {taken}, {in_part=}"
            if expected and in_part:  # a member it was held for is gone: the job is let go whole, not started in part
                assert job is not None and self.ledger.group_hold(job) is None, f"{job} still held: {group}"
            elif taken is None:
                assert self.cache.hold_of(uid) == hold, f"{uid}'s hold for its job changed by a refused bind"
            else:
                written = self.ledger.written(job)
                self.written_as_held(job, written)
                self.bound(uid, taken.allocation, outcome)
                if written is not None and outcome in ("accepted", "landed"):  # in the Binding, with its allocation
                    self.api[uid]["metadata"]["annotations"][jobplan.ANNOTATION] = written
                    self.restarted_now()  # the window that matters: members bound, others waiting
            return
        key, pod = self.member_of[uid], self.api[uid]
        record = pod_record(pod, self.protocol)
        lacking = oracle.gang(self.cache, self.records_of(key, record), self.jobs[key])
        refusal = jobs.unheld(record, self.cache, self.ledger)
        assert (refusal is None) == (lacking is None), f"{uid} of {key} without a hold: {refusal!r}, lacking {lacking}"
        if refusal is not None:
            return
        demand = self.protocol.pod_demand(pod)
        placement = self.placer.choose(demand, self.cache.nodes[node], ask_of(pod, demand))
        if placement is None:
            return
        allocation = Allocation(uid, record.key, node, placement.containers, placement.init_containers)
        expected = oracle.fits(self.cache, allocation, self.memory_quotas)
        refused = self.ledger.reserve(allocation)
        assert (refused is None) == expected, f"{allocation}: the ledger says {refused!r}, the rules {expected}"
        if refused is None:
            self.bound(uid, allocation, outcome)

    @precondition(lambda self: any(uid in self.api for uid in self.member_of))
    @rule(data=st.data(), swept=st.booleans())
    def delete_member(self, data: st.DataObject, swept: bool) -> None:
        """A member deleted (its job cancelled, or the pod evicted): mostly one held for its job; and sometimes the
        expiry sweep comes next, before any other change."""
        alive = [uid for uid in self.member_of if uid in self.api]
        self.show(data.draw(mostly(self.held_for_jobs(alive), alive)), deleted=True)
        if swept:
            self.sweep_jobs()

    @precondition(lambda self: self.nodes and self.unstarted())
    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES[:-1]), bound=st.booleans())
    def delete_member_between_filter_and_bind(self, data: st.DataObject, outcome: str, bound: bool) -> None:
        """The race a job's hold must win: a member's filter passes its planned node, another member the job is held
        for is deleted, and before the sweep the first one's bind comes, or its filter again: neither may start the
        job in part (the job is let go whole, or planned again)."""
        uid = data.draw(st.sampled_from(self.unstarted()))
        names, verdict = self.filtered(data, uid)
        if verdict is None or verdict.node not in names:
            return
        job = self.member_of[uid]
        others = [other for other in self.held_for_jobs(self.unstarted()) if self.member_of[other] == job]
        others.remove(uid)
        if others:
            self.show(data.draw(st.sampled_from(others)), deleted=True)
        if bound:
            self.bind_member(uid, verdict.node, outcome)
        else:
            self.schedule(data, uid, outcome)

    @rule(more=st.sampled_from((None, *QUOTA_CHANGES)))
    def set_quota(self, more: int | None) -> None:
        """The team's ResourceQuota on GPU memory set to what it holds now and `more` GiB (below it: what is held
        stays, nothing more is given), or deleted (None)."""
        resource = f"limits.{self.protocol.quota_resources.memory}"
        amount = max(0, oracle.memory_held(self.cache, TEAM) + (more or 0) * self.gib)
        quota = read_quota(make_quota("gpu-memory", TEAM, **{resource: str(amount)}), self.protocol.quota_resources)
        self.quotas.apply(quota, deleted=more is None)
        if more is None:
            self.memory_quotas.pop(TEAM, None)
        else:
            (limit,) = quota.limits
            self.memory_quotas[TEAM] = limit.amount

    @rule(seconds=st.sampled_from((1.0, 10.0, TTL + 1, GROUP_HOLD_TTL + 1)), watching=st.booleans())
    def time_passes(self, seconds: float, watching: bool) -> None:
        """`machine.py`'s, then the sweep's second half (`verbs._expire`): the jobs' holds due let go, each whole,
        and no job held in part after it."""
        super().time_passes(seconds, watching)
        self.sweep_jobs()

    def written_as_held(self, job: GroupKey | None, written: str | None) -> None:
        """What a member's bind writes of its job's hold is the hold as it stands: its time, and every member still
        waiting with its GPUs (nothing once none waits)."""
        group = self.ledger.group_hold(job) if job is not None else None
        if group is None:
            assert written is None, f"{job} holds nothing, yet its bind writes {written}"
            return
        assert written is not None, f"{job} held, its bind writes nothing"
        hold = jobplan.decode(written)
        assert (hold.job, hold.since) == (group.key, group.since), f"{job}: wrote {hold}, holds {group}"
        assert {allocation.pod_uid: allocation for allocation in hold.waiting} == {
            uid: self.cache.reserved[uid].allocation for uid in group.waiting
        }, f"{job}: wrote {hold}, holds {group}"

    @rule()
    def a_restart_reads_what_binds_wrote(self) -> None:
        self.restarted_now()

    def restarted_now(self) -> None:
        """This replica's watch catches up, and an extender started now, from the API's objects alone (its holds in
        memory gone), holds again every job that this one holds whole, within its expiry, a member's bind having
        written it: the same members, on the same GPUs. Whatever it holds again, it holds whole, and nothing is over
        capacity. This replica is left as it was, but for what its watch showed."""
        for uid in sorted(uid for uid, pod in self.api.items() if self.shown.get(uid) is not pod):
            self.show(uid)  # else the API may show a pod this replica has not counted, and the new one has
        fresh = Cache(self.protocol, clock=self.clock)
        fresh.replace_unhealthy(dict(self.unhealthy))
        fresh.replace(list(self.nodes.values()), list(self.api.values()))
        ledger = Ledger(fresh, TTL, self.clock, Quotas.following(fresh))
        restored = set(ledger.restore_groups())
        for key in self.jobs:
            group = self.ledger.group_hold(key)
            if group is None or not group.taken or not oracle.whole(self.cache, group):
                continue
            waiting = [uid for uid in group.waiting if uid in self.api]
            if len(waiting) < len(group.waiting) or group.since < self.clock() - GROUP_HOLD_TTL:
                continue
            written = [
                jobplan.written(self.api[uid]["metadata"]["annotations"]) for uid in group.taken if uid in self.api
            ]
            if not any(hold is not None and hold.since == group.since for hold in written):
                continue  # its binds failed or have not landed: nothing written yet
            assert key in restored, f"{key} not held again after a restart: {group}"
            again = {uid: fresh.reserved[uid].allocation for uid in waiting if uid in fresh.reserved}
            assert again == {uid: self.cache.reserved[uid].allocation for uid in waiting}, f"{key}: {again}"
        for key in restored:
            group = ledger.group_hold(key)
            assert group is not None and oracle.whole(fresh, group), f"{key} held again in part: {group}"
        assert not fresh.overcommitted(), fresh.overcommitted()

    def sweep_jobs(self) -> None:
        """The jobs' holds due let go, each whole, and no job held in part after it."""
        now, due = self.clock(), {}
        for key in self.jobs:
            group = self.ledger.group_hold(key)
            if group is not None and oracle.job_due(self.cache, group, now, GROUP_HOLD_TTL):
                due[key] = sorted(uid for uid in group.waiting if self.ledger.held_for(uid) is not None)
        released = self.ledger.expire_groups()
        freed = {gone.group.key: sorted(hold.allocation.pod_uid for hold in gone.holds) for gone in released}
        assert freed == due, f"the sweep let go {freed}, due {due}"
        for key in self.jobs:
            group = self.ledger.group_hold(key)
            assert group is None or oracle.whole(self.cache, group), f"{key} held in part after the sweep: {group}"

    # -- after every step

    @invariant()
    def jobs_held_whole_or_not_at_all(self) -> None:
        grouped = {uid: hold for uid, hold in self.cache.reserved.items() if hold.state is HoldState.GROUPED}
        for key in self.jobs:
            group = self.ledger.group_hold(key)
            members = {uid for uid, job in self.member_of.items() if job == key}
            if group is None:
                assert not members & grouped.keys(), f"{key} holds nothing, yet {sorted(members & grouped.keys())}"
                continue
            assert set(group.planned) <= members and group.taken <= set(group.planned), f"{key}: {group}"
            for uid in group.waiting:
                hold = grouped.get(uid)
                if hold is None or hold.allocation.node != group.planned[uid]:
                    assert uid in self.gone, f"{key} held in part: {uid} holds {hold}, planned {group.planned[uid]}"
        for uid, hold in grouped.items():
            job = self.ledger.group_of(uid)
            group = self.ledger.group_hold(job) if job is not None else None
            assert group is not None and uid in group.waiting, f"{uid} held for no job: {hold}"
            assert group.planned[uid] == hold.allocation.node, f"{uid} held on {hold.allocation.node}: {group}"

    @invariant()
    def no_job_hold_released_as_abandoned(self) -> None:
        assert not self.grouped_abandoned, f"GROUPED holds released as abandoned: {self.grouped_abandoned}"

    @invariant()
    def quota_kept(self) -> None:
        held = oracle.memory_held(self.cache, TEAM)
        limit = self.memory_quotas.get(TEAM)
        if limit is not None:
            (quota,) = self.quotas.quotas()
            counted = self.quotas.used(TEAM, quota.limits[0])
            assert counted == held, f"the quota book counts {counted} for {TEAM}, its pods hold {held}"
            assert held <= max(limit, self.charged), f"{TEAM} holds {held} of its {limit} (it held {self.charged})"
        self.charged = held

    @invariant()
    def members_filed_by_job(self) -> None:
        for key in self.jobs:
            expected = {uid for uid, job in self.member_of.items() if job == key and uid in self.cache.pods}
            filed = self.cache.groups.members(key)
            assert filed == expected, f"{key}: the cache files {sorted(filed)}, its members there {sorted(expected)}"


def mostly(preferred: list[str], anyone: list[str]) -> st.SearchStrategy[str]:
    """One of `preferred` half the time (when there are any), else any of `anyone` (not empty)."""
    return st.one_of(st.sampled_from(preferred), st.sampled_from(anyone)) if preferred else st.sampled_from(anyone)
