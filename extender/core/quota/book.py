"""The quota book: the ResourceQuotas' GPU limits per namespace, what each namespace holds under them, and why a
namespace may not be given more (`QuotaRefusal`).

It follows the cache's holds as a listener, so a reservation counts the moment the ledger records it, and a
restart counts again what the pods' annotations say. Nothing is counted while no quota limits anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from extender.core.cache import Cache
from extender.core.devices import Device
from extender.core.holds import Allocation, Hold
from extender.core.objects import Raw
from extender.core.placement.fit import Verdict
from extender.core.pods import PodRecord
from extender.core.protocols import QuotaResources
from extender.core.quota.charges import NO_CHARGE, RESOURCE_INDEX, Charge, charge_of, namespace_of
from extender.core.quota.limits import MAX_NAMESPACE_LIMITS, Limit, Quota, Resource, counts_model, read_quota


@dataclass(frozen=True, slots=True)
class QuotaRefusal:
    """Why a pod may not be given this: the quota, what its namespace holds under it and what the pod needs."""

    namespace: str
    quota: str
    key: str
    used: int
    limit: int
    need: int
    reason: str

    def verdict(self, freeable: int) -> Verdict:
        """FAILED when evicting pods that free `freeable` of it (the namespace's own, of lower priority) would
        make room; else UNRESOLVABLE: evicting another namespace's pods frees none of this one's quota."""
        if self.key and self.need <= self.limit and self.used + self.need - freeable <= self.limit:
            return Verdict.FAILED
        return Verdict.UNRESOLVABLE


def _reason(namespace: str, quota: str, limit: Limit, used: int, need: int, unit: str) -> str:
    model = limit.model
    if limit.resource is Resource.MEMORY:
        what, needs = f"{unit} of {model or 'GPU'} memory", f"{need} {unit}"
    elif limit.resource is Resource.COMPUTE:
        what, needs = f"% of {model or 'GPU'} compute", f"{need} %"
    else:
        what, needs = (f"{model} GPUs" if model else "GPUs"), f"{need}"
    return (
        f"namespace {namespace} uses {used} of its {limit.amount} {what} (ResourceQuota {quota}); "
        f"this pod needs {needs}"
    )


# --- the book: quotas, and what each namespace holds ------------------------------------------------------


class Holding(Protocol):
    """What the book reads of a node (`cache.NodeState`): its GPUs and the holds on them."""

    @property
    def name(self) -> str: ...
    @property
    def devices(self) -> tuple[Device, ...]: ...
    @property
    def holds(self) -> Mapping[str, Hold]: ...


@dataclass(frozen=True, slots=True)
class _Held:
    """One pod's charge, as last counted."""

    namespace: str
    node: str
    allocation: Allocation
    devices: tuple[Device, ...]
    charge: Charge


class Quotas:
    """The ResourceQuotas' GPU limits by namespace, and what each namespace holds per GPU model. Mutable.

    Usage follows the cache's holds: it listens to the cache (`following`), which tells `node_changed` on every
    change of a node's holds or GPUs,
    so a reservation counts the moment the ledger records it and stops counting the moment it is released, and a
    restart counts again whatever the pods' annotations say. Nothing is counted while no quota limits anything
    (a cluster without GPU quotas pays nothing); the first quota counts everything held, from `nodes`.
    """

    def __init__(self, resources: QuotaResources, unit: str, nodes: Callable[[], Iterable[Holding]]) -> None:
        self.resources = resources
        self.unit = unit
        self._nodes = nodes
        self._quotas: dict[tuple[str, str], Quota] = {}
        self._limits: dict[str, tuple[tuple[str, Limit], ...]] = {}
        """Namespace -> (quota name, limit), by quota name and key."""
        self._broken: dict[str, QuotaRefusal] = {}
        """Namespace -> why every GPU pod of it is refused (a quota that cannot be read)."""
        self._held: dict[str, _Held] = {}
        self._on_node: dict[str, set[str]] = {}
        self._in_namespace: dict[str, set[str]] = {}
        self._used: dict[str, dict[str, list[int]]] = {}
        """Namespace -> model -> [memory, compute, GPUs] its pods hold."""

    @classmethod
    def following(cls, cache: Cache) -> Quotas:
        """The book of the cache's protocol, counting the cache's holds from now on."""
        quotas = cls(cache.protocol.quota_resources, cache.protocol.unit, lambda: cache.nodes.values())
        cache.listen(quotas)
        return quotas

    @property
    def active(self) -> bool:
        """Some quota limits something: usage is counted."""
        return bool(self._quotas)

    # -- the quotas

    def read(self, obj: Raw) -> Quota:
        """A ResourceQuota object's GPU keys (what the informer keeps of it)."""
        return read_quota(obj, self.resources)

    def apply(self, quota: Quota, deleted: bool = False) -> bool:
        """A quota was added, changed or deleted; returns whether what it limits changed."""
        before = self._quotas.get(quota.key)
        was_active = self.active
        if deleted or not (quota.limits or quota.broken or quota.unread):  # no GPU key: nothing to keep
            if before is None:
                return False
            del self._quotas[quota.key]
        else:
            if before == quota:
                return False
            self._quotas[quota.key] = quota
        self._changed({quota.namespace}, was_active)
        return True

    def replace(self, quotas: Iterable[Quota]) -> list[str]:
        """Swap in a full listing; returns the namespaces whose limits changed."""
        listed = {quota.key: quota for quota in quotas if quota.limits or quota.broken or quota.unread}
        changed = {key[0] for key in self._quotas.keys() ^ listed.keys()}
        changed |= {key[0] for key, quota in listed.items() if self._quotas.get(key, quota) != quota}
        was_active = self.active
        self._quotas = listed
        self._changed(changed, was_active)
        return sorted(changed)

    def _changed(self, namespaces: set[str], was_active: bool) -> None:
        """Derive the namespaces' limits again; start counting usage when the first quota came, stop after the
        last went."""
        for namespace in namespaces:
            self._limits.pop(namespace, None)
            self._broken.pop(namespace, None)
        for (namespace, name), quota in sorted(self._quotas.items()):
            if namespace not in namespaces:
                continue
            if quota.broken:
                self._broken.setdefault(namespace, self._refusal_of(quota))
            self._limits[namespace] = (*self._limits.get(namespace, ()), *((name, limit) for limit in quota.limits))
        for namespace in namespaces:
            found = len(self._limits.get(namespace, ()))
            if found > MAX_NAMESPACE_LIMITS:
                self._limits.pop(namespace)
                reason = (
                    f"namespace {namespace}: its ResourceQuotas have {found} GPU keys, more than the "
                    f"{MAX_NAMESPACE_LIMITS} the extender reads; none of its GPU pods is placed until they have fewer"
                )
                self._broken[namespace] = QuotaRefusal(namespace, "", "", 0, 0, 0, reason)
            elif not found:
                self._limits.pop(namespace, None)
        if self.active and not was_active:
            for node in self._nodes():
                self.node_changed(node)
        elif not self.active:
            self._held.clear()
            self._on_node.clear()
            self._in_namespace.clear()
            self._used.clear()

    def _refusal_of(self, quota: Quota) -> QuotaRefusal:
        reason = (
            f"namespace {quota.namespace}: ResourceQuota {quota.name} {quota.broken}; none of the namespace's GPU "
            "pods is placed until it is fixed"
        )
        return QuotaRefusal(quota.namespace, quota.name, "", 0, 0, 0, reason)

    def quotas(self) -> list[Quota]:
        """Every quota with a GPU key, by namespace and name."""
        return [self._quotas[key] for key in sorted(self._quotas)]

    def limits(self, namespace: str) -> tuple[tuple[str, Limit], ...]:
        """The GPU limits on a namespace, (quota name, limit) by quota name and key."""
        return self._limits.get(namespace, ())

    def limited(self, namespace: str) -> bool:
        """Whether any quota limits (or blocks) the namespace's GPU pods."""
        return namespace in self._limits or namespace in self._broken

    def blocked(self, namespace: str) -> QuotaRefusal | None:
        """Why every GPU pod of the namespace is refused (a quota that cannot be read), if one is."""
        return self._broken.get(namespace)

    # -- what the namespaces hold

    def node_changed(self, node: Holding) -> None:
        """The node's holds or GPUs changed (the cache calls this): count its holds again."""
        if not self.active:
            return
        name, devices = node.name, node.devices
        before = self._on_node.pop(name, set())
        now: set[str] = set()
        for uid, hold in node.holds.items():
            now.add(uid)
            counted = self._held.get(uid)
            if counted is not None and counted.allocation is hold.allocation and counted.devices is devices:
                continue
            allocation = hold.allocation
            fresh = _Held(namespace_of(allocation), name, allocation, devices, charge_of(allocation, devices))
            if counted is not None:
                self._count(counted, -1)
                if counted.node != name:
                    self._on_node.get(counted.node, set()).discard(uid)
            self._held[uid] = fresh
            self._count(fresh, 1)
        for uid in before - now:
            counted = self._held.get(uid)
            if counted is not None and counted.node == name:
                del self._held[uid]
                self._count(counted, -1)
        if now:
            self._on_node[name] = now

    def node_forgotten(self, name: str) -> None:
        """A node leaves the cache only once nothing is held there. Its last holds are counted out here if they
        still count: a pod's release that empties a deleted node is told in the pod's batch of changes, and the
        cache tells no `node_changed` for a node forgotten within a batch."""
        for uid in self._on_node.pop(name, set()):
            counted = self._held.get(uid)
            if counted is not None and counted.node == name:
                del self._held[uid]
                self._count(counted, -1)

    def pod_arrived(self, record: PodRecord) -> None:
        """What a pod is given counts from its hold (`node_changed`), not from the pod."""

    def _count(self, held: _Held, sign: int) -> None:
        """Add (`sign` 1) or take away (-1) one pod's charge."""
        pods = self._in_namespace.setdefault(held.namespace, set())
        if sign > 0:
            pods.add(held.allocation.pod_uid)
        else:
            pods.discard(held.allocation.pod_uid)
            if not pods:
                del self._in_namespace[held.namespace]
        models = self._used.setdefault(held.namespace, {})
        for model, amounts in held.charge.models:
            total = models.setdefault(model, [0, 0, 0])
            for index, amount in enumerate(amounts):
                total[index] += sign * amount
            if not any(total):
                del models[model]
        if not models:
            del self._used[held.namespace]

    def held(self, uid: str) -> Charge:
        """What the pod's hold counts now (nothing when it holds nothing, or nothing is counted)."""
        counted = self._held.get(uid)
        return counted.charge if counted is not None else NO_CHARGE

    def held_in(self, namespace: str) -> list[tuple[str, str, Charge]]:
        """(uid, node, charge) of every hold of the namespace's pods."""
        return [
            (uid, self._held[uid].node, self._held[uid].charge) for uid in sorted(self._in_namespace.get(namespace, ()))
        ]

    def used(self, namespace: str, limit: Limit) -> int:
        """What the namespace's pods hold of what the limit counts."""
        return sum(
            total[RESOURCE_INDEX[limit.resource]]
            for model, total in self._used.get(namespace, {}).items()
            if counts_model(limit, model)
        )

    # -- the verdict

    def refusal(self, namespace: str, charge: Charge, less: Iterable[Charge] = ()) -> QuotaRefusal | None:
        """Why the namespace may not be given `charge` more (None when it may). `less`: what no longer counts
        (the pod's own hold when it is decided again, victims to be evicted)."""
        broken = self._broken.get(namespace)
        if broken is not None:
            return broken
        limits = self._limits.get(namespace)
        if not limits:
            return None
        less = tuple(less)
        for quota, limit in limits:
            need = charge.amount(limit)
            if limit.model and not need:
                continue
            used = self.used(namespace, limit) - sum(freed.amount(limit) for freed in less)
            if used + need > limit.amount:
                reason = _reason(namespace, quota, limit, used, need, self.unit)
                return QuotaRefusal(namespace, quota, limit.key, used, limit.amount, need, reason)
        return None

    def admits(self, allocation: Allocation, devices: Sequence[Device]) -> QuotaRefusal | None:
        """Whether the allocation may be recorded (the ledger asks at every reservation): None when it may."""
        namespace = namespace_of(allocation)
        if not self.limited(namespace):
            return None
        uid = allocation.pod_uid
        return self.refusal(namespace, charge_of(allocation, devices), (self.held(uid),))

    # -- for people

    def report(self) -> list[Raw]:
        """Every quota with a GPU key, its limits and what its namespace holds under each (`/inspect`)."""
        shown = []
        for quota in self.quotas():
            entry: Raw = {
                "namespace": quota.namespace,
                "name": quota.name,
                "limits": [
                    {
                        "key": limit.key,
                        "resource": limit.resource.value,
                        "model": limit.model,
                        "limit": limit.amount,
                        "used": self.used(quota.namespace, limit),
                    }
                    for limit in quota.limits
                ],
            }
            if quota.unread:
                entry["unread"] = list(quota.unread)
            if quota.broken:
                entry["broken"] = quota.broken
            shown.append(entry)
        return shown

    def series(self) -> list[tuple[str, str, Limit, int]]:
        """(namespace, quota, limit, used) of every limit, by namespace, quota and key (`/metrics`)."""
        return [
            (quota.namespace, quota.name, limit, self.used(quota.namespace, limit))
            for quota in self.quotas()
            for limit in quota.limits
        ]
