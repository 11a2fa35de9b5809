"""MIG: a GPU cut into hardware instances, each of a profile at one of the placements the GPU allows.

A GPU in MIG mode (HAMi's `"mode":"mig"`) is not shared by memory and compute: each pod's container gets an
instance of a profile (`1g.10gb`, `3g.40gb`, `7g.80gb`) at a placement, a run of the GPU's memory slices
(`start`, `size`) that NVML lists per profile. Two instances may not overlap, so a GPU with free memory may
still refuse a profile whose placements are all cut through: `placeable` answers that, not the memory left.

The rules are HAMi v2.10.0's (commit 4707fb02, `pkg/device/nvidia/`), which its device plugin realises at
Allocate:

- overlap: `a.start < b.start + b.size and b.start < a.start + a.size` (`migPlacementsOverlap`,
  `mig_topology.go:78-80`);
- a request of `memory` MiB takes the smallest profile (by memory, then slices) whose memory is at least that
  and that has a placement free (`selectMigCandidate`, `device.go:621-639`);
- HAMi tries a profile's placements highest start first for `1g.*` and `3g.*`, lowest first for the others
  (`orderedMigPlacements`, `mig_topology.go:26-40`), and takes the first free one: `hami_placement`.

HAMi's first free placement is blind to what it cuts (its users report fragmented GPUs: issues #2830, #2831).
We take the same profile (the smallest that holds the request wastes least memory) and, among its free
placements, the one that leaves the most room for every profile after it (`least_cut`), HAMi's order breaking
ties. Pure functions over plain tuples; the cache reads `largest_placeable`, the general fit `choose`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

MODE = "mig"
"""The device mode of a GPU in MIG mode (HAMi's `MigMode`)."""
MAX_PROFILES = 64
"""Profiles read per GPU: NVML lists about 20 for the largest GPUs; more is a malformed registration."""
MAX_PLACEMENTS = 64
"""Placements read per profile (a GPU has at most 8 memory slices)."""
MAX_SLICES = 64
"""The end of a placement, in memory slices, at most (8 on today's GPUs)."""


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One profile a MIG GPU offers: what an instance of it gives, and where one may be made."""

    name: str
    memory: int
    """MiB an instance gives (HAMi records this as the container's memory on the GPU)."""
    cores: int
    """% of the GPU's compute an instance gives (HAMi records this as the container's cores)."""
    slices: int
    """Memory slices an instance covers (HAMi's `sliceCount`)."""
    placements: tuple[tuple[int, int], ...]
    """Each placement NVML allows: (start, size) in slices."""


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One MIG instance reserved for one container (`holds.Grant.instance`; the container and the GPU are the
    grant's): HAMi's `hami.io/vgpu-mig-allocations` entry."""

    profile: str
    start: int
    size: int


Occupied = Sequence[tuple[int, int]]
"""The (start, size) of the instances a GPU holds."""


def overlaps(start: int, size: int, occupied: Occupied) -> bool:
    """Whether the placement overlaps any occupied one."""
    return any(start < other + other_size and other < start + size for other, other_size in occupied)


def clash(placements: Occupied) -> tuple[int, int] | None:
    """A placement that overlaps another of the same list (the later of the first such pair), or None: two
    instances in one place, which the device plugin cannot make (the invariant a MIG GPU keeps)."""
    for number, (start, size) in enumerate(placements):
        if overlaps(start, size, placements[:number]):
            return start, size
    return None


def hami_order(profile: MigProfile) -> tuple[tuple[int, int], ...]:
    """The profile's placements in the order HAMi tries them (`orderedMigPlacements`: a stable sort)."""
    high = profile.name.startswith(("1g.", "3g."))
    return tuple(sorted(profile.placements, key=lambda placement: -placement[0] if high else placement[0]))


def by_size(profiles: Iterable[MigProfile]) -> list[MigProfile]:
    """Smallest first, by memory then slices (HAMi's candidate order: a stable sort)."""
    return sorted(profiles, key=lambda profile: (profile.memory, profile.slices))


def free_placements(profile: MigProfile, occupied: Occupied) -> list[tuple[int, int]]:
    """The profile's placements that overlap nothing occupied, in HAMi's order."""
    return [(start, size) for start, size in hami_order(profile) if not overlaps(start, size, occupied)]


def placeable(profiles: Sequence[MigProfile], occupied: Occupied, memory: int) -> MigProfile | None:
    """The profile a request of `memory` MiB gets on this GPU now (HAMi's choice of profile), or None."""
    for profile in by_size(profiles):
        if profile.memory >= memory and free_placements(profile, occupied):
            return profile
    return None


def largest_placeable(profiles: Sequence[MigProfile], occupied: Occupied) -> int:
    """The most memory one more instance could give on this GPU now (0: no placement is free)."""
    return _largest(tuple(profiles), tuple(sorted(occupied)))


@functools.lru_cache(maxsize=65536)
def _largest(profiles: tuple[MigProfile, ...], occupied: tuple[tuple[int, int], ...]) -> int:
    """`largest_placeable`, remembered: a cluster's MIG GPUs are in few distinct states."""
    return max((profile.memory for profile in profiles if free_placements(profile, occupied)), default=0)


@functools.lru_cache(maxsize=1024)
def slices(profiles: tuple[MigProfile, ...]) -> int:
    """The GPU's memory slices: the end of the furthest placement (8 on an A100, whose 7g.80gb covers 0-7)."""
    return max((start + size for profile in profiles for start, size in profile.placements), default=0)


def hami_placement(profile: MigProfile, occupied: Occupied) -> tuple[int, int] | None:
    """HAMi's placement for the profile: the first free one in its order."""
    free = free_placements(profile, occupied)
    return free[0] if free else None


def room_left(profiles: Sequence[MigProfile], occupied: Occupied) -> tuple[int, ...]:
    """How much room the free slices keep for each later instance: per profile, largest first, how many of its
    placements are free. Compared as a tuple, it prefers keeping a big profile placeable over any number of
    small ones."""
    ordered = sorted(profiles, key=lambda profile: (-profile.slices, -profile.memory, profile.name))
    return tuple(len(free_placements(profile, occupied)) for profile in ordered)


def least_cut(profiles: Sequence[MigProfile], profile: MigProfile, occupied: Occupied) -> tuple[int, int] | None:
    """Our placement for the profile: of its free placements, the one after which `room_left` is greatest
    (HAMi's order breaking ties); None when none is free."""
    best: tuple[tuple[int, ...], int] | None = None
    chosen = None
    for rank, (start, size) in enumerate(free_placements(profile, occupied)):
        room = room_left(profiles, [*occupied, (start, size)])
        key = (room, -rank)
        if best is None or key > best:
            best, chosen = key, (start, size)
    return chosen


def choose(
    profiles: Sequence[MigProfile], occupied: Occupied, memory: int, greedy: bool = False
) -> tuple[MigProfile, MigInstance]:
    """The profile and instance a container asking `memory` MiB gets on this GPU now (HAMi's profile; our
    placement, or HAMi's with `greedy`). Raises ValueError when none fits: the fit asks only where `placeable`
    found one."""
    chosen = _choice(tuple(profiles), tuple(sorted(occupied)), memory, greedy)
    if chosen is None:
        raise ValueError(f"no MIG profile of at least {memory} MiB has a placement free")
    profile, (start, size) = chosen
    return profile, MigInstance(profile.name, start, size)


@functools.lru_cache(maxsize=65536)
def _choice(
    profiles: tuple[MigProfile, ...], occupied: tuple[tuple[int, int], ...], memory: int, greedy: bool
) -> tuple[MigProfile, tuple[int, int]] | None:
    """`choose`, remembered by the GPU's state (the measure asks it for every GPU a pod could take)."""
    profile = placeable(profiles, occupied, memory)
    if profile is None:
        return None
    placement = hami_placement(profile, occupied) if greedy else least_cut(profiles, profile, occupied)
    return None if placement is None else (profile, placement)


def profile_named(profiles: Sequence[MigProfile], name: str) -> MigProfile | None:
    for profile in profiles:
        if profile.name == name:
            return profile
    return None
