"""Topology: how well a node's GPUs are linked (HAMi's pair scores, `hami.io/node-nvidia-score`: 100 an NVLink,
10-60 PCIe paths), in the choice of a pod's GPUs and of its node.

- **The GPUs** (`best_linked`, HAMi's `topology-aware` policy): several GPUs for one container are the set whose
  pairs' scores sum highest; one GPU is the one least linked to the other candidates, so the well-linked ones
  stay together for the pods that need them.
- **The node** (`link_term`, beyond HAMi, whose node score for topology is always 0: pkg/device/nvidia/device.go:
  641-643 at v2.10.0): the fragmentation policy adds to what a placement costs a term, so that a topology-aware
  pod goes where its set is linked by NVLink unless that wastes a whole GPU more, and any other pod, among nodes
  that waste alike, takes GPUs poorly linked to those left free: an 8-GPU box whose NVLink islands are intact is
  kept for the pod that needs one. On nodes without scores only topology-aware pods asking several GPUs get a
  term (their GPUs count as unlinked): the trace's figures, which have none, are unchanged.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

from extender.core.devices import Demand, Device
from extender.core.nodes import NodeState

COMBINATIONS = 2_000
"""Sets of GPUs compared at most for one topology-aware container (4 of 16 GPUs are 1,820, about 5 ms); beyond
(8 of 16: 12,870), the set is grown from the best-linked pair one best-linked GPU at a time, as the judgement of
every node runs on the event loop."""


def best_linked(serving: list[int], devices: Sequence[Device], count: int) -> list[int]:
    """`serving` with the GPUs a topology-aware container gets first (HAMi's `topology-aware`, pkg/device/nvidia/
    device.go:850-869 and 927-978 at v2.10.0): for one GPU, the one whose links to the other candidates sum
    lowest (it keeps the well-linked ones together for pods that need them); for several, the set whose pairs'
    scores sum highest. Ties go to the earlier in `serving`'s order (HAMi: to the first found)."""
    score = pair_scores(devices)

    def together(group: Iterable[int]) -> int:
        return sum(score[a][b] for a, b in itertools.combinations(group, 2))

    if count == 1:
        chosen = [min(serving, key=lambda p: sum(score[p][q] for q in serving if q != p))]
    elif math.comb(len(serving), count) <= COMBINATIONS:
        chosen = list(max(itertools.combinations(serving, count), key=together))  # max and min: the first of equals
    else:
        chosen = list(max(itertools.combinations(serving, 2), key=together))
        while len(chosen) < count:
            rest = [p for p in serving if p not in chosen]
            chosen.append(max(rest, key=lambda p: sum(score[c][p] for c in chosen)))
    return chosen + [p for p in serving if p not in chosen]


def pair_scores(devices: Sequence[Device]) -> list[list[int]]:
    """The pair scores by position, from each GPU's entry (`Device.link`): `[a][b]` as GPU a names b."""
    return [[first.link(second) if first is not second else 0 for second in devices] for first in devices]


LINK_WEIGHT = 0.05
"""What the worst use of a node's links costs a pod that did not ask for them, in GPUs of fragmentation
(`link_term`): a twentieth of a GPU, so it decides between nodes that waste alike or nearly, never against a GPU
really wasted."""
ASKED_WEIGHT = 1.0
"""What a topology-aware pod's GPUs not linked by NVLink cost it, in GPUs of fragmentation: a pod that asked for
its links goes to a node where its set is linked unless that wastes a whole GPU more (measured in
`tests/e2e/test_hami_topology.py`: at the twentieth of a GPU of the other pods, a 4-GPU topology-aware pod went
to a box of PCIe paths while an NVLink island stood empty)."""
NVLINK = 100
"""One NVLink's score (calculate_score.go:211-285): an average link this strong or more counts in full."""


def link_term(demand: Demand, state: NodeState, positions: Sequence[int]) -> float:
    """What taking the GPUs at `positions` costs the node's links: for a topology-aware pod asking several GPUs,
    up to `ASKED_WEIGHT` as they fall short of an NVLink between each pair (a node without scores: the full
    cost); for any other pod, up to `LINK_WEIGHT` as they were linked to the GPUs left free (0 where the node has
    no scores). Links are counted against one NVLink, the same on every node, so a box of PCIe paths costs less
    to break into than an NVLink island."""
    devices = state.devices
    if not positions:
        return 0.0
    if demand.selectors.topology and len(positions) > 1:  # a node without scores: no NVLink known, the full cost
        score = pair_scores(devices)
        pairs = list(itertools.combinations(positions, 2))
        together = sum(score[a][b] for a, b in pairs) / len(pairs)
        return ASKED_WEIGHT * (1.0 - min(max(together, 0) / NVLINK, 1.0))
    if not any(device.links for device in devices):
        return 0.0
    taken = set(positions)
    left = [p for p in range(len(devices)) if p not in taken and state.free[p] > 0]
    if not left:
        return 0.0
    score = pair_scores(devices)
    broken = sum(score[p][q] for p in positions for q in left) / (len(positions) * len(left))
    return LINK_WEIGHT * min(max(broken, 0) / NVLINK, 1.0)
