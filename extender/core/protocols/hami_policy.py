"""HAMi's GPU policies as a pod and a node state them (v2.10.0, commit 4707fb02): the policy chain, the scoring
weights, and the links between a node's GPUs (`shared/protocols/hami-mig-topology.md` §2-3).

- **`hami.io/gpu-scheduler-policy`**: a comma list (`binpack,numa,topology-aware`). `binpack`, `spread` and
  `numa` are sort keys in the order written (`gpuSortKeyChain`, pkg/scheduler/policy/gpu_policy.go:58-75);
  `mutex` (only GPUs no pod uses) and `topology-aware` are filters (`PolicyContains`, pkg/util/util.go:290-298).
  HAMi reads a word it does not know as nothing (or, alone, as spread); we refuse it with a message naming it,
  since a typo would otherwise silently change where pods go.
- **`hami.io/device-scoring-weights`**: `slot=1,core=1,memory=3`, all three keys, integers of at least 0, one
  above 0 (`ParseDeviceScoringWeights`, pkg/util/device_scoring_weights.go:43-102); an invalid value fails the
  pod's filter in HAMi (pkg/scheduler/score.go:360-364), a 400 naming it here. They weigh the three terms of a
  GPU's fill (`ComputeScore`, gpu_policy.go:194-221), by which binpack and spread order the GPUs.
- **`hami.io/node-nvidia-score`** (node): `[{"uuid":"GPU-a","score":{"GPU-b":100,...}},...]`, what the device
  plugin measured of each pair of GPUs (NVLink 100 a link, PCIe 10-60; pkg/device/nvidia/calculate_score.go:
  211-285), published with `ENABLE_TOPOLOGY_SCORE=true`. Present but not decodable, HAMi fails the node
  (pkg/device/nvidia/device.go:323-327): so do we. Pairs are read from the first GPU's entry, as HAMi does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from extender.core.devices import Device, Strategy
from extender.core.protocols.gofields import json_text
from extender.core.resources import MAX_DEVICES

SCORES = "hami.io/node-nvidia-score"
WEIGHTS = "hami.io/device-scoring-weights"
TOPOLOGY = "topology-aware"
NUMA = "numa"
MUTEX = "mutex"
KEYS = ("binpack", "spread", NUMA)
"""The sort keys a chain may name (HAMi's `gpuSortKeyOrder`)."""
MAX_SCORE = 10_000
"""A pair's score is at most 18 NVLinks x 100 (calculate_score.go:211-285): larger is a malformed annotation."""


@dataclass(frozen=True, slots=True)
class GpuPolicy:
    """What `hami.io/gpu-scheduler-policy` asks."""

    strategy: Strategy | None = None
    """The first of binpack or spread written (HAMi's primary key); None: none written."""
    order: tuple[str, ...] = ()
    """The sort keys in the order written, when a chain (a comma list, or `numa` alone) was given."""
    exclusive: bool = False
    topology: bool = False


def gpu_policy(value: object) -> GpuPolicy:
    """The policy a pod asks; ValueError naming a word that is not one of HAMi's policies."""
    words = [word.strip() for word in str(value or "").split(",") if word.strip()]
    unknown = [word for word in words if word not in (*KEYS, MUTEX, TOPOLOGY)]
    if unknown:
        raise ValueError(f"{unknown[0][:40]!r} is not one of binpack, spread, numa, mutex, topology-aware")
    order = tuple(dict.fromkeys(word for word in words if word in KEYS))
    strategy = next((Strategy(word) for word in order if word != NUMA), None)
    chained = len(words) > 1 or words == [NUMA]
    return GpuPolicy(strategy, order if chained else (), MUTEX in words, TOPOLOGY in words)


def weights(value: object) -> tuple[int, int, int]:
    """(slot, core, memory) weights of a GPU's fill (1, 1, 1 by default); ValueError saying what is wrong."""
    if value is None:
        return (1, 1, 1)
    parts = str(value).split(",")
    if len(parts) != 3:
        raise ValueError("expected slot, core and memory weights (slot=1,core=1,memory=3)")
    found: dict[str, int] = {}
    for part in parts:
        key, equals, number = part.strip().partition("=")
        key, number = key.strip(), number.strip()
        if not equals:
            raise ValueError("expected key=value entries (slot=1,core=1,memory=3)")
        if key in found:
            raise ValueError(f"duplicate {key[:20]!r} weight")
        if key not in ("slot", "core", "memory"):
            raise ValueError(f"unknown weight {key[:20]!r}")
        digits = number.removeprefix("+")
        if not digits.isascii() or not digits.isdigit() or len(digits) > 18:
            raise ValueError(f"{key} weight {number[:20]!r} must be a whole number of at least 0")
        found[key] = int(digits)
    if not any(found.values()):
        raise ValueError("at least one weight must be above 0")
    return (found["slot"], found["core"], found["memory"])


def with_links(devices: Sequence[Device], value: object) -> tuple[Device, ...]:
    """The devices with their pair scores from `hami.io/node-nvidia-score` (unchanged without it); ValueError
    when it is present and Go's decoder would refuse it."""
    if value is None:
        return tuple(devices)
    listed = json_text(value, 256 * 1024)
    if listed is None:
        return tuple(devices)
    if not isinstance(listed, list) or len(listed) > MAX_DEVICES:
        raise ValueError(f"expected a JSON array of at most {MAX_DEVICES} GPUs")
    links: dict[str, tuple[tuple[str, int], ...]] = {}
    for entry in listed:
        if not isinstance(entry, dict):
            raise ValueError("each GPU's scores must be an object")
        uuid, scores = entry.get("uuid", ""), entry.get("score") or {}
        if not isinstance(uuid, str) or not isinstance(scores, dict) or len(scores) > MAX_DEVICES:
            raise ValueError("expected {uuid: string, score: {uuid: number}}")
        pairs = []
        for peer, score in scores.items():
            if isinstance(score, bool) or not isinstance(score, int) or not -MAX_SCORE <= score <= MAX_SCORE:
                raise ValueError(f"score {str(score)[:20]!r} of {uuid[:40]} to {peer[:40]} is not a whole number")
            pairs.append((peer, score))
        links.setdefault(uuid, tuple(sorted(pairs)))  # HAMi takes the first entry of a UUID (device.go:333-340)
    return tuple(replace(device, links=links[device.uuid]) if device.uuid in links else device for device in devices)
