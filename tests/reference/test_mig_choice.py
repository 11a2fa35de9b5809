"""The MIG profile a container gets, against HAMi's own rule, on every profile table HAMi ships.

HAMi paths at tag v2.10.0 (commit 4707fb02): `nv/` = pkg/device/nvidia/, `sch/` = pkg/scheduler/, `chart/` =
charts/hami/templates/scheduler/. The rule is written out here from HAMi's Go, not taken from `core/mig.py`:

- `selectMigCandidate` (nv/device.go:621-637): the profiles stably sorted by memory, then by slice count; the
  first whose memory holds the request and that has a placement free, at its first free placement;
- `selectMigPlacement` (nv/mig_topology.go:58-76): a profile's placements in `orderedMigPlacements` order
  (nv/mig_topology.go:26-39: a stable sort, highest start first for `1g.*` and `3g.*`, lowest first otherwise),
  the first that overlaps no occupied one (`migPlacementsOverlap`, nv/mig_topology.go:78-80).

Our profile must be HAMi's; our greedy placement (`mig.hami_placement`) HAMi's; our own placement (`least_cut`) a
free placement of that profile.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.core import mig
from extender.core.mig import MigProfile
from tests.property.fresh import property_settings

EXAMPLES = 100


class HamiProfile(NamedTuple):
    """`device.MigProfile` (pkg/device/devices.go:80-92): what the rule reads of it."""

    name: str
    memory_mb: int
    slice_count: int
    placements: tuple[tuple[int, int], ...]


def hami_overlap(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


def hami_ordered(profile: HamiProfile) -> list[tuple[int, int]]:
    if profile.name.startswith("1g.") or profile.name.startswith("3g."):
        return sorted(profile.placements, key=lambda placement: -placement[0])
    return sorted(profile.placements, key=lambda placement: placement[0])


def hami_select(
    profiles: list[HamiProfile], occupied: list[tuple[int, int]], memory: int
) -> tuple[str, tuple[int, int]] | None:
    """HAMi's `selectMigCandidate`: (profile name, placement), or None (ok = false)."""
    candidates = sorted(profiles, key=lambda profile: (profile.memory_mb, profile.slice_count))
    for profile in candidates:
        if profile.memory_mb < memory:
            continue
        for candidate in hami_ordered(profile):
            if not any(hami_overlap(candidate, existing) for existing in occupied):
                return profile.name, candidate
    return None


def table(*rows: tuple[str, int, int, tuple[int, ...], int]) -> list[HamiProfile]:
    return [
        HamiProfile(name, memory, slices, tuple((start, size) for start in starts))
        for name, memory, slices, starts, size in rows
    ]


GEOMETRY = {
    8: {1: (range(7), 1), 2: ((0, 2, 4), 2), 3: ((0, 4), 4), 4: ((0,), 4), 7: ((0,), 8)},
    4: {1: (range(4), 1), 2: ((0, 2), 2), 4: ((0,), 4)},
}
"""Placements (starts, size) by a profile's compute slices, on GPUs of 8 memory slices (A100, H100, H20, H200,
B200) and of 4 (A30, RTX PRO 6000), as `nvidia-smi mig -lgipp` lists them."""


def from_allowlist(names: tuple[str, ...], memory_slices: int) -> list[HamiProfile]:
    """A table of HAMi's chart allowlist (names alone: memory, slice counts and placements come from NVML on the
    node, `plugin/register.go:209-255`): memory from the name (GB x 1024 MiB, as HAMi's own geometry table gives it
    for the A30, A100 and RTX PRO 6000 profiles, docs/develop/dynamic-mig.md:35-103: 7g.79gb 80896), slice count
    from its `Ng`, placements as NVML lays them out (`GEOMETRY`). The rule reads only these."""
    rows = []
    for name in names:
        compute, memory = name.split(".")
        slices = int(compute[:-1])
        starts, size = GEOMETRY[memory_slices][slices]
        rows.append((name, int(float(memory[:-2]) * 1024), slices, tuple(starts), size))
    return table(*rows)


TABLES: dict[str, list[HamiProfile]] = {
    # nv/mig_capability_test.go:27-33 (`a100MigProfiles`)
    "a100MigProfiles": table(
        ("1g.5gb", 5120, 1, tuple(range(7)), 1), ("2g.10gb", 10240, 2, (0, 2, 4), 2), ("3g.20gb", 20480, 3, (0, 4), 4)
    ),
    # nv/mig_topology_test.go:26-30 and 47-51: names and placements only (memory and slice counts zero: every
    # profile ties, and the stable sort keeps the table's order)
    "mig_topology_test": table(
        ("1g.5gb", 0, 0, tuple(range(7)), 1), ("2g.10gb", 0, 0, (0, 2, 4), 2), ("3g.20gb", 0, 0, (0, 4), 4)
    ),
    # sch/mig_allocation_test.go:39, 65 and 88; 151 (placements given per case)
    "mig_allocation_test:39": table(("1g.5gb", 5120, 0, (6,), 1)),
    "mig_allocation_test:88": table(("1g.5gb", 5120, 0, (5, 6), 1)),
    # sch/score_test.go:3637
    "score_test:3637": table(("1g.test", 2048, 0, (0,), 1)),
    # chart/device-configmap.yaml:36-53, one table per allowlist entry
    "A30": from_allowlist(("1g.6gb", "2g.12gb", "4g.24gb"), 4),
    "A100-40GB": from_allowlist(("1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"), 8),
    "A100-80GB": from_allowlist(("1g.10gb", "2g.20gb", "3g.40gb", "7g.79gb"), 8),
    "H100-80GB": from_allowlist(("1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"), 8),
    "H100-94GB": from_allowlist(("1g.12gb", "2g.24gb", "3g.47gb", "7g.94gb"), 8),
    "H20": from_allowlist(("1g.12gb", "2g.24gb", "3g.48gb", "7g.96gb"), 8),
    "H200": from_allowlist(("1g.18gb", "2g.35gb", "3g.71gb", "7g.141gb"), 8),
    "B200": from_allowlist(("1g.23gb", "2g.45gb", "3g.90gb", "7g.180gb"), 8),
    "RTX PRO 6000": from_allowlist(("1g.24gb", "2g.48gb", "4g.96gb"), 4),
    # Every profile NVML offers on an A100-SXM4-80GB (bench/placement/mig.py; docs/benchmarks/placement.md), which
    # HAMi publishes when its allowlist names them: 1g.20gb and 2g.20gb, 3g.40gb and 4g.40gb have equal memory.
    "A100-80GB, every NVML profile": table(
        ("1g.10gb", 9856, 1, tuple(range(7)), 1),
        ("1g.20gb", 19968, 1, (0, 2, 4, 6), 2),
        ("2g.20gb", 19968, 2, (0, 2, 4), 2),
        ("3g.40gb", 40192, 3, (0, 4), 4),
        ("4g.40gb", 40192, 4, (0,), 4),
        ("7g.80gb", 80384, 7, (0,), 8),
    ),
}


def ours(profiles: list[HamiProfile]) -> tuple[MigProfile, ...]:
    return tuple(MigProfile(p.name, p.memory_mb, 0, p.slice_count, p.placements) for p in profiles)


@st.composite
def gpu_states(draw: st.DrawFn, profiles: list[HamiProfile]) -> tuple[list[tuple[int, int]], int]:
    """A GPU of this table with instances made one by one where they fit (as a device plugin would), and a request
    in MiB: around each profile's memory, where the tie-breaks are."""
    occupied: list[tuple[int, int]] = []
    for _ in range(draw(st.integers(min_value=0, max_value=6))):
        profile = draw(st.sampled_from(profiles))
        free = [p for p in profile.placements if not any(hami_overlap(p, other) for other in occupied)]
        if free:
            occupied.append(draw(st.sampled_from(free)))
    sizes = sorted({profile.memory_mb for profile in profiles})
    memory = draw(
        st.one_of(
            st.sampled_from(sizes),
            st.sampled_from(sizes).map(lambda size: max(size - 1, 0)),
            st.sampled_from(sizes).map(lambda size: size + 1),
            st.integers(min_value=0, max_value=max(sizes) + 1),
        )
    )
    return occupied, memory


@pytest.mark.parametrize("name", list(TABLES))
def test_the_profile_and_greedy_placement_are_hamis_on_every_table(name: str) -> None:
    profiles = TABLES[name]

    @property_settings(EXAMPLES)
    @given(gpu_states(profiles))
    def check(state: tuple[list[tuple[int, int]], int]) -> None:
        occupied, memory = state
        expected = hami_select(profiles, occupied, memory)
        placeable = mig.placeable(ours(profiles), occupied, memory)
        assert (placeable.name if placeable else None) == (expected[0] if expected else None)
        if expected is None:
            with pytest.raises(ValueError, match="no MIG profile"):
                mig.choose(ours(profiles), occupied, memory, greedy=True)
            return
        profile, instance = mig.choose(ours(profiles), occupied, memory, greedy=True)
        assert (profile.name, (instance.start, instance.size)) == expected
        profile, instance = mig.choose(ours(profiles), occupied, memory)
        assert profile.name == expected[0]
        assert (instance.start, instance.size) in profile.placements
        assert not any(hami_overlap((instance.start, instance.size), other) for other in occupied)

    check()


@pytest.mark.parametrize(
    ("memory", "profile"),
    [
        (15000, "1g.20gb"),  # 1g.20gb and 2g.20gb both 19968 MiB: the fewer slices (nv/device.go:624-627)
        (19968, "1g.20gb"),
        (19969, "3g.40gb"),  # 3g.40gb and 4g.40gb both 40192 MiB
        (9856, "1g.10gb"),
        (9857, "1g.20gb"),
    ],
)
def test_profiles_of_equal_memory_go_to_the_one_of_fewer_slices(memory: int, profile: str) -> None:
    profiles = TABLES["A100-80GB, every NVML profile"]
    assert hami_select(profiles, [], memory) is not None and hami_select(profiles, [], memory)[0] == profile  # type: ignore[index]
    assert mig.choose(ours(profiles), [], memory)[0].name == profile
