"""PodGroups, where two schemes of jobs placed whole keep their minimum (`core/groups.py`): one informer per CRD,
scheduler-plugins' `scheduling.x-k8s.io/v1alpha1` and Volcano's `scheduling.volcano.sh/v1beta1`, each PodGroup
reduced as soon as it is decoded to its name, namespace and `spec.minMember` (`groups.slim_podgroup`), kept in
the cache (`Cache.podgroups`), where a member's filter and bind read its job's minimum.

Either CRD may be missing, and neither is ours to install: a 404 on its list means "not installed"
(`Informer.absent`); the cache then says so (None for that CRD: the pods naming its PodGroups are placed as any
pod), readiness does not wait for it, and the list is tried again every `WatchOptions.unserved_relist` seconds
(30 by default), so a CRD installed later is read within that. Where a CRD is installed, readiness waits for its
first list (`KubeSource._listed`): a member filtered before its PodGroup is known would be placed as any pod,
part of a job.

A PodGroup that appears or changes its minimum, or whose CRD goes, is news kube-scheduler does not act on (it
watches no PodGroup), while members of it may wait in its queue, refused by us ("does not exist (yet)", "needs 4
pods to start"): each feed tells the source which groups changed so (`changed`), and the source asks
kube-scheduler to retry where the cache knows a member still to place. A PodGroup deleted is not such news (its
members can only wait), nor is its status, which its controller rewrites as pods come and go: nothing kept of it
changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from extender.core import objects
from extender.core.cache import Cache
from extender.core.groups import API_VERSIONS, GroupKey, Scheme, having, podgroup_key, slim_podgroup
from extender.core.objects import Raw
from extender.sources.kube.informer import Kind


def podgroups_kind(scheme: Scheme) -> Kind[Raw]:
    """Every namespace's PodGroups of the scheme's CRD, named for /metrics by resource and API group."""
    api_version = API_VERSIONS[scheme]
    group = api_version.split("/")[0]
    return Kind(f"podgroups.{group}", f"/apis/{api_version}/podgroups", slim_podgroup)


def waiting(cache: Cache, keys: Iterable[GroupKey]) -> GroupKey | None:
    """The first of these groups of which the cache knows a member not bound (None when there is none)."""
    for key in keys:
        for uid in cache.groups.members(key):
            record = cache.pods.get(uid)
            if record is not None and not record.node_name:
                return key
    return None


class PodGroupFeed:
    """One CRD's PodGroups into the cache, as its informer lists and watches them. Mutable: its mapping is the
    one the cache's `podgroups` holds for the CRD, changed in place as events come (a frozen `PodGroups` swapped in
    only when the CRD comes or goes, or a list replaces them all)."""

    def __init__(self, cache: Cache, scheme: Scheme, changed: Callable[[list[GroupKey]], None]) -> None:
        self.cache = cache
        self.scheme = scheme
        self.changed = changed
        """Told the groups whose PodGroup appeared or changed its minimum, or whose CRD went."""
        self.known: dict[str, Raw] = {}

    def _key(self, podgroup: Raw) -> GroupKey:
        return GroupKey(self.scheme, objects.namespace(podgroup), objects.name(podgroup))

    def _kept(self) -> Mapping[str, Raw] | None:
        """What the cache holds for this CRD now."""
        podgroups = self.cache.podgroups
        return podgroups.coscheduling if self.scheme is Scheme.COSCHEDULING else podgroups.volcano

    def apply(self, podgroup: Raw, deleted: bool) -> None:
        """A watch event (always after a list, which gave the cache this feed's mapping)."""
        key = podgroup_key(podgroup)
        before = self.known.get(key)
        if deleted:
            self.known.pop(key, None)
        else:
            self.known[key] = podgroup
        if not deleted and before != podgroup:
            self.changed([self._key(podgroup)])

    def replace(self, listed: list[Raw]) -> None:
        """A full list. Tells what is new or changed since what the feed knew (a relist after a gap), but not at
        the first list since the CRD was found: no member was refused for these PodGroups before it (readiness
        waits for it; without the CRD its members were placed as any pod)."""
        before = self.known if self._kept() is not None else None
        self.known = {podgroup_key(podgroup): podgroup for podgroup in listed}
        self.cache.podgroups = having(self.cache.podgroups, self.scheme, self.known)
        changed = [
            self._key(pg) for key, pg in sorted(self.known.items()) if before is not None and before.get(key) != pg
        ]
        if changed:
            self.changed(changed)

    def absent(self) -> None:
        """The API does not serve this CRD: its PodGroups mean nothing now."""
        before = self.known if self._kept() is not None else {}
        self.known = {}
        self.cache.podgroups = having(self.cache.podgroups, self.scheme, None)
        if before:  # their members are placed as any pod now
            self.changed([self._key(before[key]) for key in sorted(before)])
