"""Quotas on what pods are given: the GPU keys of ResourceQuotas, per namespace and per GPU model, counted on
the allocations the cache holds.

Why. Kubernetes' own ResourceQuota counts what a pod's spec asks, at admission: a HAMi pod asking a percentage
of a GPU's memory, or a whole card without naming memory, counts nothing, and no native quota knows GPU models.
hami-scheduler enforces its own keys instead, on the memory and compute each container is given (HAMi v2.10.0,
`pkg/device/quota.go`, and the nvidia device's `fitQuota`, `pkg/device/nvidia/device.go:666-692`). This module
reads the same keys with HAMi's rules, the same rule for gpushare's resources, and keys of our own for one GPU
model (`docs/operations/quotas.md`):

- `limits.<memory>` (HAMi `nvidia.com/gpumem`, gpushare `aliyun.com/gpu-mem`): GPU memory given, in the
  protocol's unit; HAMi's quota is in units of its memory factor (`quota.go:81-83`).
- `limits.<cores>` (HAMi `nvidia.com/gpucores`): compute given, in % of a GPU.
- `limits.<gpus>` (HAMi `nvidia.com/gpu`, gpushare `aliyun.com/gpu-count`): GPUs the pod is given any share
  of. HAMi does not read this key; nothing else enforces it.
- `limits.<resource>.<model>`: the same, counting only GPUs of that model. A model is matched by its words
  (split at `-`, `_`, `.`, `/` and spaces, any case): every word of the key's model, in order, must be a word of
  the GPU's model, so `A100` and `A100-40GB` are GPUs of `NVIDIA A100-SXM4-40GB`, while `A10` is not (HAMi's
  `use-gputype` matches substrings, for which `A10` would be an A100).

What is counted is what pods hold: every allocation in the cache (observed, bound, reserved or uncertain),
collapsed over init containers as HAMi counts it (`holds.Allocation.uses`, HAMi `quota.go:97-117` over
`CollapseInitContainerUsage`). A pod is refused when what its namespace holds plus what the pod would be given
exceeds the limit (`quota.go:84,90`): a limit of 0 refuses every pod that takes any of it; a limit without a
model applies to every GPU pod of its namespace, so one over it (a quota lowered) refuses even a pod taking
none of it, as HAMi does; a limit for a model only pods given GPUs of that model. A quantity that is not a whole
number within int64 leaves that key unread, as HAMi's `AsInt64` does (`quota.go:244-245`); keys other than
`limits.` ones are not ours (`quota.go:291`). Unlike HAMi, which keeps one limit per namespace and key (the
last quota written wins, and deleting any quota unsets it: `quota.go:242-286`), every ResourceQuota counts
on its own, as Kubernetes counts them. Scopes (`spec.scopes`, `scopeSelector`) are not read: every quota
applies to every pod of its namespace, as in HAMi.

Bounded: at most `MAX_LIMITS` GPU keys per ResourceQuota and `MAX_NAMESPACE_LIMITS` per namespace (beyond,
the quota cannot be read and refuses every GPU pod of its namespace, saying so: failing open would let a
namespace use what it was denied); each key and its model are of bounded length; usage is kept per namespace
and model, never per request.

This module never does I/O and never places pods: `quota_fit.py` asks the policy where a pod would go, the
ledger checks a reservation here before recording it, and the cache tells it every change of a node's holds.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from extender.core import objects
from extender.core.devices import Device
from extender.core.fit import Verdict
from extender.core.holds import Allocation, Hold
from extender.core.objects import Raw, as_object
from extender.core.protocols import QuotaResources
from extender.core.resources import InvalidQuantity, parse_count

PREFIX = "limits."
"""The only keys read, as HAMi reads them (`quota.go:291`)."""
MAX_LIMITS = 32
"""GPU keys one ResourceQuota may hold: a few resources times a few models. More is no quota anyone writes."""
MAX_NAMESPACE_LIMITS = 128
"""GPU keys all the ResourceQuotas of one namespace may hold: every filter of its pods reads each."""
MAX_KEY = 317
"""Characters of a key: the API's longest resource name (a 253-character prefix, `/`, 63 characters)."""
MAX_MODEL = 128
"""Characters of a model in a key (a resource name's part after its `/` is at most 63 in the API)."""
MAX_WORDS = 16
MAX_PROBLEMS = 8
"""Unread keys named per quota (the rest counted)."""
_WORD = re.compile(r"[^-_./ \t]+")


class Resource(enum.StrEnum):
    """What a limit counts (the `resource` label of the quota metrics)."""

    MEMORY = "memory"
    COMPUTE = "compute"
    GPUS = "gpus"


@dataclass(frozen=True, slots=True)
class Limit:
    """One GPU key of a ResourceQuota, read."""

    key: str
    """As written: `limits.nvidia.com/gpumem.A100`."""
    resource: Resource
    amount: int
    """In the protocol's unit: memory in its memory unit (the memory factor applied), compute in % of a GPU."""
    model: str = ""
    """The GPU model it counts, as written ("" for every GPU)."""
    words: tuple[str, ...] = field(default=(), compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "words", model_words(self.model))


@dataclass(frozen=True, slots=True)
class Quota:
    """What one ResourceQuota says about GPUs."""

    namespace: str
    name: str
    limits: tuple[Limit, ...] = ()
    unread: tuple[str, ...] = ()
    """GPU keys that were not read, each with why (at most `MAX_PROBLEMS`, then how many more)."""
    broken: str = ""
    """Non-empty: the quota could not be read as a whole, and refuses every GPU pod of its namespace."""

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name


def model_words(model: str) -> tuple[str, ...]:
    """A model's words, upper-cased: `NVIDIA A100-SXM4-40GB` is (NVIDIA, A100, SXM4, 40GB)."""
    return tuple(word.upper() for word in _WORD.findall(model[:MAX_MODEL]))


@functools.lru_cache(maxsize=4096)
def _words_match(wanted: tuple[str, ...], model: str) -> bool:
    have = iter(model_words(model))
    return all(word in have for word in wanted)  # each found after the one before: a subsequence


def counts_model(limit: Limit, model: str) -> bool:
    """Whether the limit counts GPUs of this model: every word of its model, in order, is one of the GPU's."""
    return not limit.words or _words_match(limit.words, model[:MAX_MODEL])


# --- reading a ResourceQuota ------------------------------------------------------------------------------


def _resource_of(key: str, resources: QuotaResources) -> tuple[Resource, str | None] | None:
    """The resource a `limits.` key limits and the model it names (None for none); None for a key not ours."""
    if not key.startswith(PREFIX):
        return None
    rest = key[len(PREFIX) :]
    named = _names(resources)
    for name, resource in named:
        if rest == name:
            return resource, None
    for name, resource in sorted(named, key=lambda pair: -len(pair[0])):
        if rest.startswith(name + "."):
            return resource, rest[len(name) + 1 :]
    return None


def _names(resources: QuotaResources) -> list[tuple[str, Resource]]:
    pairs = ((resources.memory, Resource.MEMORY), (resources.cores, Resource.COMPUTE), (resources.gpus, Resource.GPUS))
    return [(name, resource) for name, resource in pairs if name]


def read_quota(obj: Raw, resources: QuotaResources) -> Quota:
    """The GPU keys of a ResourceQuota object (`spec.hard`), read with HAMi's rules; never raises."""
    namespace, name = objects.namespace(obj), objects.name(obj)
    hard = as_object(as_object(obj.get("spec")).get("hard"))
    limits: list[Limit] = []
    unread: list[str] = []
    found = 0
    for key, value in hard.items():
        if not isinstance(key, str):
            continue
        resource = _resource_of(key, resources)
        if resource is None:
            continue
        found += 1
        if found > MAX_LIMITS:
            continue
        kind, model = resource
        if len(key) > MAX_KEY:
            unread.append(f"{key[:80]}...: longer than a resource name can be ({MAX_KEY} characters)")
            continue
        if model is not None and (len(model) > MAX_MODEL or not 0 < len(model_words(model)) <= MAX_WORDS):
            unread.append(
                f"{key[:80]}: no GPU model after the resource (1 to {MAX_WORDS} words, {MAX_MODEL} characters)"
            )
            continue
        try:
            amount = parse_count(value)
        except InvalidQuantity as error:
            unread.append(f"{key}: {error}; HAMi reads only whole numbers too")  # key: at most MAX_KEY
            continue
        if kind is Resource.MEMORY and resources.memory_factor > 1:
            amount *= resources.memory_factor
        limits.append(Limit(key, kind, amount, model or ""))
    broken = ""
    if found > MAX_LIMITS:
        broken = f"has {found} GPU keys, more than the {MAX_LIMITS} the extender reads"
        limits = []
    if len(unread) > MAX_PROBLEMS:
        unread[MAX_PROBLEMS:] = [f"and {len(unread) - MAX_PROBLEMS} more"]
    return Quota(namespace, name, tuple(sorted(limits, key=lambda limit: limit.key)), tuple(unread), broken)


# --- what a pod is given ----------------------------------------------------------------------------------


Amounts = tuple[int, int, int]
"""Memory, compute, GPUs."""
_INDEX = {Resource.MEMORY: 0, Resource.COMPUTE: 1, Resource.GPUS: 2}


def part(amounts: Amounts, resource: Resource) -> int:
    """What of `amounts` a limit of this resource counts."""
    return amounts[_INDEX[resource]]


@dataclass(frozen=True, slots=True)
class Charge:
    """What one pod is given, per GPU model, as a quota counts it."""

    models: tuple[tuple[str, Amounts], ...] = ()

    @classmethod
    def summed(cls, parts: Iterable[tuple[str, Amounts]]) -> Charge:
        """The charge of these (model, amounts), added up per model."""
        totals: dict[str, list[int]] = {}
        for model, amounts in parts:
            total = totals.setdefault(model, [0, 0, 0])
            for index, amount in enumerate(amounts):
                total[index] += amount
        return cls(tuple((model, (m, c, g)) for model, (m, c, g) in sorted(totals.items())))

    @classmethod
    def merged(cls, charges: Iterable[Charge]) -> Charge:
        """Several pods' charges as one."""
        return cls.summed(part for charge in charges for part in charge.models)

    def amount(self, limit: Limit) -> int:
        """What of it the limit counts."""
        return sum(part(amounts, limit.resource) for model, amounts in self.models if counts_model(limit, model))


NO_CHARGE = Charge()


def charge_of(allocation: Allocation, devices: Sequence[Device]) -> Charge:
    """What the allocation gives on GPUs of each model (`devices`: the node's; a GPU it does not have is of an
    unknown model, "")."""
    by_index = {device.index: device.model for device in devices}
    by_uuid = {device.uuid: device.model for device in devices if device.uuid}
    return Charge.summed(
        (by_index.get(use.index, "") if use.index >= 0 else by_uuid.get(use.uuid, ""), (use.memory, use.cores, 1))
        for use in allocation.uses
    )


def namespace_of(allocation: Allocation) -> str:
    return allocation.pod.partition("/")[0]


# --- the verdict ------------------------------------------------------------------------------------------


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

    Usage follows the cache's holds: the cache calls `node_changed` on every change of a node's holds or GPUs,
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
            total[_INDEX[limit.resource]]
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
