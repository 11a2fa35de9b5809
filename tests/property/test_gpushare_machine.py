"""The cache, the ledger and the placement arrays under gpushare's protocol, driven at random (`machine.py`).

gpushare's nodes are the ones judged in arrays (GPUs of one size and model, no compute tracked): nodes of a few
kinds join, change kind, go NotReady and back and leave, so rows are added, moved and dropped, with their
remembered measures.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from extender.core.holds import Allocation
from tests.builders import PROFILE, make_node, make_pod
from tests.property.fresh import property_settings
from tests.property.machine import CacheMachine

KINDS = ((2, 16, ""), (2, 16, ""), (2, 16, ""), (4, 16, ""), (1, 8, "T4"))
"""(GPUs, GiB each, model) of the nodes drawn."""
EXAMPLES = 120
STEPS = 60


class GpushareMachine(CacheMachine):
    protocol = PROFILE

    def node(self, data: st.DataObject, name: str) -> dict[str, Any]:
        """Mostly of two kinds, so that rows of one kind are many, and move when one of them goes."""
        gpus, mem, model = data.draw(st.sampled_from(KINDS))
        return make_node(
            name,
            gpus=gpus,
            mem=mem,
            ready=data.draw(st.sampled_from((True, True, False))),
            cpu=data.draw(st.sampled_from(("4", "16"))),
            memory=data.draw(st.sampled_from(("8Gi", "64Gi"))),
            model=model,
        )

    def pod(self, data: st.DataObject, name: str) -> dict[str, Any]:
        return make_pod(
            name,
            uid=f"uid-{name}",
            gpu_mem=data.draw(st.integers(min_value=1, max_value=16)),
            cpu=data.draw(st.sampled_from((None, "1", "2", "4"))),
            memory=data.draw(st.sampled_from((None, "2Gi", "8Gi"))),
            models=data.draw(st.sampled_from(((), ("T4",)))),
        )

    def random_allocation(self, data: st.DataObject, uid: str, key: str, node: str) -> Allocation:
        """One GPU (maybe one the node does not have) and memory at random, or exactly what it has free, or 1 more."""
        index = data.draw(st.integers(min_value=0, max_value=4))
        state = self.cache.nodes.get(node)
        position = state.position(index) if state is not None else -1
        left = state.devices[position].capacity - state.used[position] if state is not None and position >= 0 else 8
        memory = data.draw(st.one_of(st.integers(min_value=1, max_value=17), st.sampled_from((left, left + 1))))
        return Allocation.uniform(uid, key, node, (index,), max(memory, 1))


GpushareMachine.TestCase.settings = property_settings(EXAMPLES, STEPS)
test_gpushare_cache_equals_one_built_afresh = GpushareMachine.TestCase
