"""HAMi's MIG formats (v2.10.0, commit 4707fb02): the profiles a MIG-mode GPU registers, and the reservation
`hami.io/vgpu-mig-allocations` that tells HAMi's device plugin which instance to make for each container.

`shared/protocols/hami-mig-topology.md` §1 has the rules with file and line; `core/mig.py` the geometry and the
choice. The plugin takes the next entry of `hami.io/vgpu-devices-to-allocate` at each Allocate and resolves
its container from the entry's position, init containers first (`popNextContainerDevices`, pkg/device-plugin/
nvidiadevice/nvinternal/plugin/util.go:106-128 at v2.10.0); then (`GetContainerDeviceStrArray`, util.go:291-386)
it takes the reservations whose `containerIndex` is that position, sorted by `deviceIndex`, requires one per GPU
of the entry and the same GPU UUID at each position, and makes exactly the profile at the placement reserved.
So `containerIndex` is the entry's position: the container's among the pod's GPU containers (HAMi's own
`EncodeMigAllocations` numbers them so), not among all its containers.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson

from extender.core import mig
from extender.core.holds import Grant
from extender.core.mig import MigInstance, MigProfile
from extender.core.protocols.gofields import field, json_text
from extender.core.resources import MAX_DEVICES

MIG_ALLOCATIONS = "hami.io/vgpu-mig-allocations"
MAX_RESERVATIONS = MAX_DEVICES * 16
"""Reservations read from one pod: more than a pod could ever hold is a malformed annotation."""


def read_profiles(value: object) -> tuple[MigProfile, ...]:
    """A GPU's `migProfiles` (HAMi's `[{name, memoryMB, core, sliceCount, placements:[{start, size}]}]`,
    pkg/device/devices.go:79-90 at v2.10.0), bounded. A profile without a name, or a placement of no slices or
    beyond `mig.MAX_SLICES`, is refused: an instance of it is one HAMi's device plugin would refuse to make
    (`DecodeMigAllocations` requires a profile and a size, pkg/device/nvidia/mig_allocations.go:89), or one that
    overlaps nothing and would be given to every pod.

    A name given twice is read as HAMi reads it. The plugin lists a profile twice when `migProfileAllowlist`
    names it twice (`discoverMigProfiles`, plugin/register.go:218-249), and HAMi's scheduler keeps every entry as a
    candidate but finds a profile's placements by its name, the first entry of it (`findMigProfile` in
    `selectMigPlacement`, pkg/device/nvidia/mig_topology.go:41-63). So a repeat takes the first's placements; one
    the same as the first is left out (the same candidate again changes no choice)."""
    if value is None:
        return ()
    if not isinstance(value, list) or len(value) > mig.MAX_PROFILES:
        raise ValueError(f"migProfiles must be an array of at most {mig.MAX_PROFILES} profiles")
    profiles: list[MigProfile] = []
    for entry in value:
        if not isinstance(entry, dict):
            raise ValueError("each MIG profile must be an object")
        name = field(entry, "name", str, "")
        if not name:
            raise ValueError("MIG profile name is empty")
        placements = entry.get("placements") or []
        if not isinstance(placements, list) or len(placements) > mig.MAX_PLACEMENTS:
            raise ValueError(f"MIG profile {name[:40]!r}: placements must be an array of at most {mig.MAX_PLACEMENTS}")
        spots = []
        for placement in placements:
            if not isinstance(placement, dict):
                raise ValueError(f"MIG profile {name[:40]!r}: each placement must be an object")
            start, size = field(placement, "start", int, 0), field(placement, "size", int, 0)
            if not size or start + size > mig.MAX_SLICES:
                raise ValueError(
                    f"MIG profile {name[:40]!r}: placement ({start}, {size}) is not within the GPU's slices"
                )
            spots.append((start, size))
        first = mig.profile_named(profiles, name)
        profile = MigProfile(
            name,
            field(entry, "memoryMB", int, 0),
            field(entry, "core", int, 0),
            field(entry, "sliceCount", int, 0),
            tuple(spots) if first is None else first.placements,
        )
        if profile != first:
            profiles.append(profile)
    return tuple(profiles)


def encode_instances(containers: Sequence[Sequence[Grant]], uuids: dict[int, str]) -> str:
    """`hami.io/vgpu-mig-allocations` for the grants that have a MIG instance ("" when none has): a JSON array
    of `{"containerIndex","deviceIndex","gpuUUID","profile","placement":{"start","size"}}`, `containerIndex` the
    container's entry in `hami.io/vgpu-devices-allocated` and `deviceIndex` the grant's in it, as HAMi's
    `EncodeMigAllocations` writes it (pkg/device/nvidia/mig_allocations.go:48-77 at v2.10.0). The device plugin
    makes each instance at Allocate and fails a container with fewer reservations than GPUs
    (plugin/util.go:329-333)."""
    entries = [
        {
            "containerIndex": container,
            "deviceIndex": number,
            "gpuUUID": grant.uuid or uuids.get(grant.index, ""),
            "profile": grant.instance.profile,
            "placement": {"start": grant.instance.start, "size": grant.instance.size},
        }
        for container, grants in enumerate(containers)
        for number, grant in enumerate(grants)
        if grant.instance is not None
    ]
    return orjson.dumps(entries).decode() if entries else ""


def decode_instances(value: object) -> list[tuple[str, MigInstance]]:
    """The GPU UUID and instance of each reservation in `hami.io/vgpu-mig-allocations`, by HAMi's rules
    (`DecodeMigAllocations`, mig_allocations.go:79-112): ValueError for one that is not complete (a GPU, a
    profile, a placement of some size), has a partial runtime identity, or repeats a (container, device)."""
    if value is None or value == "":
        return []
    listed = json_text(value, 64 * 1024)
    if not isinstance(listed, list) or len(listed) > MAX_RESERVATIONS:
        raise ValueError("expected a JSON array of reservations")
    found: list[tuple[str, MigInstance]] = []
    seen: set[tuple[int, int]] = set()
    for number, entry in enumerate(listed):
        if not isinstance(entry, dict):
            raise ValueError(f"reservation {number} is not an object")
        placement = entry.get("placement")
        placement = placement if isinstance(placement, dict) else {}
        key = field(entry, "containerIndex", int, 0), field(entry, "deviceIndex", int, 0)
        uuid, profile = field(entry, "gpuUUID", str, ""), field(entry, "profile", str, "")
        start, size = field(placement, "start", int, 0), field(placement, "size", int, 0)
        if not uuid or not profile or not size:
            raise ValueError(f"MIG allocation {number} is incomplete")
        runtime = sum(
            1 for name in ("migUUID", "gpuInstanceID", "computeInstanceID") if entry.get(name) not in (None, "")
        )
        if runtime not in (0, 3):
            raise ValueError(f"MIG allocation {number} has partial runtime identity")
        if key in seen:
            raise ValueError(f"duplicate MIG allocation for container {key[0]} device {key[1]}")
        seen.add(key)
        found.append((uuid, MigInstance(profile, start, size)))
    return found


def with_instances(
    entries: tuple[tuple[Grant, ...], ...], reservations: list[tuple[str, MigInstance]]
) -> tuple[tuple[Grant, ...], ...]:
    """The grants read back, each given the next reservation of its GPU in order, as HAMi's rebuild matches them
    (`getNodesUsage`, scheduler.go:788-797). A reservation left over (no grant on its GPU) is not counted: HAMi's
    own scheduler never writes one."""
    if not reservations:
        return entries
    by_gpu: dict[str, list[MigInstance]] = {}
    for uuid, instance in reservations:
        by_gpu.setdefault(uuid, []).append(instance)
    matched = []
    for grants in entries:
        given = []
        for grant in grants:
            waiting = by_gpu.get(grant.uuid)
            given.append(
                Grant(grant.index, grant.memory, grant.cores, grant.uuid, waiting.pop(0)) if waiting else grant
            )
        matched.append(tuple(given))
    return tuple(matched)
