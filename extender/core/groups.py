"""Jobs, not pods: which pods start together, as their users already declare it. Reads labels, annotations and
PodGroup objects handed in; never asks the API, never raises on what a pod carries.

Three schemes, each read as its own project reads it (file:line at the version named):

- **Kueue's plain-pod groups** (sigs.k8s.io/kueue v0.17.0): the label `kueue.x-k8s.io/pod-group-name` names
  the group, the annotation `kueue.x-k8s.io/pod-group-total-count` its size (pkg/controller/jobs/pod/constants/
  constants.go:27-28). Both or neither (pod_webhook.go:274-306); the name a DNS-1123 subdomain
  (`ValidateLabelAsCRDName`, jobframework/validation.go:111-119); the count a base-10 `strconv.Atoi` of at least
  1 (pod_controller.go:599-621); every member, failed pods skipped, the same count (pod_controller.go:800-825).
- **scheduler-plugins' coscheduling** (sigs.k8s.io/scheduler-plugins v0.31.8): the label
  `scheduling.x-k8s.io/pod-group` (`PodGroupLabel`, apis/scheduling/v1alpha1/types.go:111-112) names a PodGroup
  of the pod's namespace (`GetPodGroup`, pkg/coscheduling/core/core.go:352-362), whose `spec.minMember` is the
  minimum to start (types.go:146-151; a member past it is permitted at once, core.go:296-298). A pod that names
  a PodGroup the cluster lacks is refused (`PodGroupNotFound`, core.go:281-284).
- **Volcano** (volcano.sh/apis v1.12.1): the annotation `scheduling.k8s.io/group-name`, or
  `scheduling.volcano.sh/group-name`, names the pod's PodGroup (pkg/apis/scheduling/v1beta1/labels.go:30-36),
  whose `spec.minMember` is its minimum (types.go:174-177). Volcano's scheduler itself is not on the module proxy
  (volcano.sh/volcano), so which key it prefers could not be read: both are read, and must agree.

A PodGroup's scheme counts only where its CRD is installed (`PodGroups`: None for a CRD the cluster lacks):
without it the label or annotation means nothing to the cluster, and the pod is placed as any pod.

A group's size is its minimum to start: once that many members are bound, the others are placed as any pod.
Every declaration that cannot be used says why (`Declared.problem`, `Group.problem`), never by an exception.

How a job is placed whole, held and let go is `jobs.py`'s (the filter and the bind of a member), `gang.py`'s (the
plan) and `ledger.py`'s (the holds). The cache reads each pod's declarations from the pod alone into its record
(`read`, `PodRecord.group`) and keeps every job's pods (`Jobs`). A PodGroup's minimum is not read then: the
PodGroup may be created after its pods, its minMember changed, its CRD installed later. The sources keep the
cluster's PodGroups in the cache (`Cache.podgroups`: the API source watches both CRDs, the file source takes
those the file lists), and a member's filter and bind resolve its declaration against them at that moment
(`resolve`): a PodGroup not there yet makes its members wait, a CRD not installed places them as any pod.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from extender.core import objects
from extender.core.holds import Allocation
from extender.core.memo import Lru
from extender.core.objects import Raw, as_object

KUEUE_GROUP = "kueue.x-k8s.io/pod-group-name"
"""Label: the Kueue pod group's name (constants.go:27 at v0.17.0)."""
KUEUE_TOTAL = "kueue.x-k8s.io/pod-group-total-count"
"""Annotation: how many pods the Kueue pod group has (constants.go:28 at v0.17.0)."""
COSCHEDULING_GROUP = "scheduling.x-k8s.io/pod-group"
"""Label: the coscheduling PodGroup's name (apis/scheduling/v1alpha1/types.go:112 at v0.31.8)."""
VOLCANO_GROUPS = ("scheduling.k8s.io/group-name", "scheduling.volcano.sh/group-name")
"""Annotations: the Volcano PodGroup's name (pkg/apis/scheduling/v1beta1/labels.go:32, 36 at v1.12.1)."""

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_ATOI = re.compile(r"[+-]?[0-9]+")
"""What Go's `strconv.Atoi` reads: an optional sign and decimal digits, nothing else (no spaces, no `_`)."""
_INT32 = 2**31 - 1
_INT64 = 2**63 - 1


class Scheme(enum.StrEnum):
    KUEUE = "Kueue's pod group"
    COSCHEDULING = "coscheduling's PodGroup"
    VOLCANO = "Volcano's PodGroup"


@dataclass(frozen=True, slots=True)
class GroupKey:
    """A group: its scheme, and its name in its namespace (groups of two schemes never merge)."""

    scheme: Scheme
    namespace: str
    name: str

    def __str__(self) -> str:
        return objects.key(self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class PodGroups:
    """The PodGroup objects the cluster has, by `namespace/name`, per CRD; None where that CRD is not installed."""

    coscheduling: Mapping[str, Raw] | None = None
    """scheduling.x-k8s.io/v1alpha1 PodGroups (scheduler-plugins)."""
    volcano: Mapping[str, Raw] | None = None
    """scheduling.volcano.sh/v1beta1 PodGroups."""


NO_CRDS = PodGroups()

API_VERSIONS = {Scheme.COSCHEDULING: "scheduling.x-k8s.io/v1alpha1", Scheme.VOLCANO: "scheduling.volcano.sh/v1beta1"}
"""The PodGroup CRD of each scheme, as its project serves it (types.go of each at the version named above; the
only version either CRD serves)."""


def slim_podgroup(podgroup: Raw) -> Raw:
    """What is kept of a PodGroup: its name, namespace and `spec.minMember` as the object has it (`min_member` reads
    it). Its status, which its controller rewrites as its pods come and go, is of no use here."""
    spec = as_object(podgroup.get("spec"))
    kept: Raw = {"metadata": {"name": objects.name(podgroup), "namespace": objects.namespace(podgroup)}, "spec": {}}
    if "minMember" in spec:
        kept["spec"]["minMember"] = spec["minMember"]
    return kept


def podgroup_key(podgroup: Raw) -> str:
    """`namespace/name`: how `PodGroups` finds a PodGroup."""
    return objects.key(objects.namespace(podgroup), objects.name(podgroup))


def having(podgroups: PodGroups, scheme: Scheme, known: Mapping[str, Raw] | None) -> PodGroups:
    """`podgroups` with the scheme's CRD's PodGroups swapped for `known` (None: that CRD is not installed)."""
    if scheme is Scheme.COSCHEDULING:
        return replace(podgroups, coscheduling=known)
    return replace(podgroups, volcano=known)


def listed(podgroups: Iterable[Raw]) -> PodGroups:
    """The PodGroups of a list of objects of either CRD (a cluster file), by `apiVersion`: a CRD none of whose
    PodGroups is listed is taken as not installed, and a PodGroup of another API group is no one's."""
    found, podgroups = NO_CRDS, list(podgroups)
    for scheme, api_version in API_VERSIONS.items():
        known = {podgroup_key(pg): slim_podgroup(pg) for pg in podgroups if pg.get("apiVersion") == api_version}
        if known:
            found = having(found, scheme, known)
    return found


@dataclass(frozen=True, slots=True)
class Declared:
    """What one pod says of its group."""

    group: GroupKey | None
    minimum: int = 0
    """Members the group needs bound to start, by this pod's declaration."""
    problem: str = ""
    """Why the declaration cannot be used ("" when it can): the pod is refused with it."""


def min_member(podgroup: Raw) -> int | str:
    """A PodGroup's `spec.minMember` (both CRDs: an int32, 0 when absent, as Go's `omitempty` leaves it), or why
    it cannot be read."""
    value = as_object(podgroup.get("spec")).get("minMember", 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _INT32:
        return f"spec.minMember {value!r} is not a count"
    return value


@dataclass(frozen=True, slots=True)
class Declarations:
    """Every group a pod declares, read from the pod alone, when one of them names a PodGroup (`read`): what the
    cache records of such a pod (`PodRecord.group`). A PodGroup's declaration carries its key only (or a problem
    the pod alone shows); `resolve` reads its minimum, and whether its CRD is installed, when it is needed."""

    pod: str
    """The pod's `namespace/name`, for the reason when it declares two groups."""
    found: tuple[Declared, ...]
    """In the order Kueue, coscheduling, Volcano; at least one names a PodGroup."""


Said = Declared | Declarations | None
"""What a pod declares, read from the pod alone (`read`): a Kueue declaration says it all; one naming a PodGroup
needs the cluster's PodGroups (`resolve`)."""


def declared(pod: Raw, podgroups: PodGroups = NO_CRDS) -> Declared | None:
    """The group the pod declares (None when it declares none), its minimum, or why the declaration is unusable.

    A pod may declare one group only: two schemes at once would have two schedulers' views of when it starts."""
    return resolve(read(pod), podgroups)


def read(pod: Raw) -> Said:
    """What the pod declares, from the pod alone: Kueue's declaration whole; with a PodGroup named, every scheme's
    declaration, to be resolved against the PodGroups when they are needed (`resolve`); None when it declares
    none."""
    labels, annotations = objects.labels_of(pod), objects.annotations_of(pod)
    if (  # nearly every pod: none of the keys (read on every watch event and filter, so kept cheap)
        KUEUE_GROUP not in labels
        and COSCHEDULING_GROUP not in labels
        and KUEUE_TOTAL not in annotations
        and VOLCANO_GROUPS[0] not in annotations
        and VOLCANO_GROUPS[1] not in annotations
    ):
        return None
    namespace = objects.namespace(pod)
    kueue = _kueue(pod, namespace)
    named = tuple(found for found in (_coscheduling(pod, namespace), _volcano(pod, namespace)) if found is not None)
    if not named:
        return kueue
    return Declarations(objects.pod_key(pod), ((kueue,) if kueue is not None else ()) + named)


def resolve(said: Said, podgroups: PodGroups) -> Declared | None:
    """The declaration as the cluster's PodGroups make it now: a PodGroup's minimum read from the object (or why it
    cannot be), the PodGroups of a CRD not installed ignored (the label or annotation means nothing to the cluster:
    the pod is placed as any pod)."""
    if not isinstance(said, Declarations):
        return said
    found = [resolved for one in said.found if (resolved := _resolved(one, podgroups)) is not None]
    if not found:
        return None
    if len(found) > 1:
        named = " and ".join(f"{one.group.scheme} {one.group}" for one in found if one.group is not None)
        return Declared(None, 0, f"pod {said.pod} declares two groups ({named}); it may start with one")
    return found[0]


def keys(said: Said) -> frozenset[GroupKey]:
    """Every group the pod may be a member of, whatever PodGroups the cluster has (what `Jobs` files it under)."""
    if said is None:
        return frozenset()
    found = said.found if isinstance(said, Declarations) else (said,)
    return frozenset(one.group for one in found if one.group is not None and not one.problem)


def _kueue(pod: Raw, namespace: str) -> Declared | None:
    name = str(objects.labels_of(pod).get(KUEUE_GROUP) or "")
    total = objects.annotations_of(pod).get(KUEUE_TOTAL)
    if not name and total is None:
        return None
    key = GroupKey(Scheme.KUEUE, namespace, name)
    if not name or total is None:
        return Declared(key, 0, f"both the label {KUEUE_GROUP} and the annotation {KUEUE_TOTAL} are needed")
    if not _DNS_SUBDOMAIN.fullmatch(name):  # its 253 characters are more than a label value's 63
        return Declared(key, 0, f"{KUEUE_GROUP} {name!r} is not a DNS-1123 subdomain, as Kueue requires")
    count = _atoi(total)
    if count is None or count < 1:
        return Declared(key, 0, f"{KUEUE_TOTAL} {total!r} is not a count of at least 1")
    return Declared(key, count)


def _atoi(text: object) -> int | None:
    if not isinstance(text, str) or not _ATOI.fullmatch(text):
        return None
    value = int(text)
    return value if -_INT64 - 1 <= value <= _INT64 else None


def _coscheduling(pod: Raw, namespace: str) -> Declared | None:
    name = str(objects.labels_of(pod).get(COSCHEDULING_GROUP) or "")
    return Declared(GroupKey(Scheme.COSCHEDULING, namespace, name)) if name else None


def _volcano(pod: Raw, namespace: str) -> Declared | None:
    annotations = objects.annotations_of(pod)
    names = {str(annotations.get(label) or "") for label in VOLCANO_GROUPS} - {""}
    if not names:
        return None
    if len(names) > 1:
        first, second = (str(annotations.get(label)) for label in VOLCANO_GROUPS)
        key = GroupKey(Scheme.VOLCANO, namespace, first)
        said = f"{VOLCANO_GROUPS[0]} {first!r} and {VOLCANO_GROUPS[1]} {second!r}"
        return Declared(key, 0, f"{said} name two PodGroups")
    return Declared(GroupKey(Scheme.VOLCANO, namespace, names.pop()))


def _resolved(one: Declared, podgroups: PodGroups) -> Declared | None:
    """One scheme's declaration with its PodGroup's minimum; None when that PodGroup's CRD is not installed."""
    key = one.group
    if key is None or key.scheme is Scheme.KUEUE:
        return one
    known = podgroups.coscheduling if key.scheme is Scheme.COSCHEDULING else podgroups.volcano
    if known is None:
        return None
    if one.problem:
        return one
    podgroup = known.get(str(key))
    if podgroup is None:
        return Declared(key, 0, f"{key.scheme} {key} does not exist (yet)")
    minimum = min_member(podgroup)
    if isinstance(minimum, str):
        return Declared(key, 0, f"{key.scheme} {key}: {minimum}")
    return Declared(key, minimum)


@dataclass(frozen=True, slots=True)
class MemberPod:
    """A pod of a group, as far as starting it matters."""

    uid: str
    name: str
    bound: bool
    """Has a node (`spec.nodeName`): it counts toward the minimum."""
    gated: bool = False
    """Has scheduling gates: kube-scheduler will not place it yet."""


@dataclass(frozen=True, slots=True)
class Gang:
    """What a group needs now: the members to place together (none: placed as any pod), or why it waits."""

    members: tuple[MemberPod, ...] = ()
    waiting: str = ""
    """Why none of its members may be placed yet ("" when they may)."""


@dataclass(frozen=True, slots=True)
class Group:
    key: GroupKey
    minimum: int
    members: tuple[MemberPod, ...]
    """Its pods that have not failed, by name (then UID): the order the gang takes the pending ones in."""
    problem: str = ""
    """Why the group cannot be placed as declared ("" when it can): its members disagree."""

    def gang(self) -> Gang:
        """The pending members that must be placed together for the group to start: as many as its minimum lacks
        bound, the first by name. None once the minimum is bound (the rest are placed as any pod)."""
        if self.problem:
            return Gang(waiting=self.problem)
        bound = sum(1 for member in self.members if member.bound)
        lacking = self.minimum - bound
        if lacking <= 0:
            return Gang()
        pending = [member for member in self.members if not member.bound and not member.gated]
        if len(pending) < lacking:
            gated = sum(1 for member in self.members if member.gated)
            exist = f"{len(self.members)} exist" + (f" ({gated} gated)" if gated else "")
            return Gang(waiting=f"job {self.key} needs {self.minimum} pods to start; {exist}, {bound} bound")
        return Gang(tuple(pending[:lacking]))


@dataclass(slots=True)
class Membership:
    """Every group of a set of pods, and the pods whose declaration cannot be used. Built by `membership`."""

    groups: dict[GroupKey, Group] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    """Pod UID -> why its declaration cannot be used."""
    group_of: dict[str, GroupKey] = field(default_factory=dict)
    """Pod UID -> its group."""


def membership(pods: Iterable[Raw], podgroups: PodGroups = NO_CRDS) -> Membership:
    """Who belongs to which group. Failed pods are left out (Kueue skips them, pod_controller.go:801-803);
    members that disagree on the group's size make the whole group's problem."""
    found = Membership()
    declarations: dict[GroupKey, list[tuple[MemberPod, int]]] = {}
    for pod in pods:
        status = as_object(pod.get("status"))
        if status.get("phase") == "Failed":
            continue
        said = declared(pod, podgroups)
        if said is None:
            continue
        uid = objects.uid(pod)
        if said.problem or said.group is None:
            found.refused[uid] = said.problem
            continue
        spec = as_object(pod.get("spec"))
        member = MemberPod(uid, objects.name(pod), bool(spec.get("nodeName")), bool(spec.get("schedulingGates")))
        declarations.setdefault(said.group, []).append((member, said.minimum))
        found.group_of[uid] = said.group
    for key, said_by in declarations.items():
        found.groups[key] = group_of(key, said_by)
    return found


def group_of(key: GroupKey, said_by: Iterable[tuple[MemberPod, int]]) -> Group:
    """The group its members make, each with the size it declares (at least one member)."""
    ordered = sorted(said_by, key=lambda pair: (pair[0].name, pair[0].uid))
    members = tuple(member for member, _ in ordered)
    return Group(key, ordered[0][1], members, _disagreement(key, ordered))


def _disagreement(key: GroupKey, said_by: list[tuple[MemberPod, int]]) -> str:
    """Why the members' sizes cannot all hold ("" when they agree). A PodGroup's minimum is one object's, so only
    Kueue's members, each with its own annotation, can disagree."""
    first, size = said_by[0]
    for member, other in said_by[1:]:
        if other != size:
            return (
                f"pods {first.name} and {member.name} of job {key} disagree on its size ({KUEUE_TOTAL} {size} and "
                f"{other})"
            )
    return ""


@dataclass(frozen=True, slots=True)
class WrittenHold:
    """A job's hold as a member's bind wrote it on its pod (`jobplan.py`)."""

    job: GroupKey
    since: float
    """When the hold was taken (Unix seconds): it expires `group_hold_ttl` after, written or not."""
    waiting: tuple[Allocation, ...]
    """The members still to bind then, each with its node and GPUs."""


WRITTEN_FORGOTTEN = 4096
"""Written holds let go remembered at most (`Jobs.forget`), so a relist does not bring them back."""


class Jobs:
    """Every job's pods whose declaration can be used, by pod UID, kept by the cache as pods come, change and go;
    and the newest hold written for each job on its pods (`jobplan.py`), until the ledger has done with it.
    Mutable."""

    def __init__(self) -> None:
        self._members: dict[GroupKey, set[str]] = {}
        self._written: dict[GroupKey, WrittenHold] = {}
        self._forgotten: Lru[tuple[GroupKey, float], bool] = Lru(WRITTEN_FORGOTTEN)

    def move(self, uid: str, before: Said, after: Said, written: WrittenHold | None = None) -> None:
        """The pod declared `before` and now declares `after` (None: nothing, or it is gone). A pod is filed under
        every group it may be a member of (`keys`): which one counts is the PodGroups' to say when it is asked.
        `written`: the job's hold its annotations carry, kept if it is the newest for its job and not forgotten."""
        if written is not None:
            self._write(written)
        if before == after:
            return
        for key in keys(before):
            members = self._members.get(key)
            if members is not None:
                members.discard(uid)
                if not members:
                    del self._members[key]
        for key in keys(after):
            self._members.setdefault(key, set()).add(uid)

    def members(self, key: GroupKey) -> frozenset[str]:
        return frozenset(self._members.get(key, ()))

    def written(self) -> list[WrittenHold]:
        """The newest hold written for each job, not yet forgotten (few: `Ledger.restore_groups` forgets each once
        it is held again, expired or of no use)."""
        return list(self._written.values())

    def forget(self, job: GroupKey, since: float) -> None:
        """Done with the job's hold taken at `since`, as written: it is never kept again (a relist shows the same
        annotations). The ledger says so when it lets go of a hold, and when it has held one again or found it of
        no use."""
        self._forgotten.put((job, since), True)
        known = self._written.get(job)
        if known is not None and known.since == since:
            del self._written[job]

    def _write(self, hold: WrittenHold) -> None:
        known = self._written.get(hold.job)
        if (known is None or hold.since > known.since) and (hold.job, hold.since) not in self._forgotten:
            self._written[hold.job] = hold

    def __len__(self) -> int:
        return len(self._members)
