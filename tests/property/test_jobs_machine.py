"""Jobs placed whole among the single pods, reservations and nodes of each protocol's machine (`job_machine.py`):
gpushare's GPUs judged in arrays, HAMi's HAMi-core and MIG GPUs."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from extender.core.protocols.hami import VGPU_MODE
from tests.builders import make_hami_pod, make_pod
from tests.property.fresh import property_settings
from tests.property.job_machine import JobMachine
from tests.property.test_gpushare_machine import GpushareMachine
from tests.property.test_hami_machine import HamiMachine

EXAMPLES = 80
STEPS = 80


class GpushareJobMachine(JobMachine, GpushareMachine):
    gib = 1

    def worker(self, data: st.DataObject) -> dict[str, Any]:
        return make_pod(
            "worker",
            gpu_mem=data.draw(st.integers(min_value=1, max_value=8)),
            cpu=data.draw(st.sampled_from((None, "1"))),
            memory=data.draw(st.sampled_from((None, "2Gi"))),
        )


class HamiJobMachine(JobMachine, HamiMachine):
    gib = 1024

    def worker(self, data: st.DataObject) -> dict[str, Any]:
        """By memory or by percent, or a MIG instance."""
        share = data.draw(st.sampled_from(("nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "mig")))
        if share == "mig":
            pod = make_hami_pod("worker", mem=data.draw(st.sampled_from((5000, 10000, 20000))))
            pod["metadata"]["annotations"][VGPU_MODE] = "mig"
            return pod
        pod = make_hami_pod("worker")
        amount = data.draw(st.integers(1000, 20000) if share == "nvidia.com/gpumem" else st.sampled_from((10, 25, 50)))
        pod["spec"]["containers"][0]["resources"]["limits"][share] = str(amount)
        return pod


GpushareJobMachine.TestCase.settings = property_settings(EXAMPLES, STEPS)
test_gpushare_jobs_held_whole = GpushareJobMachine.TestCase
HamiJobMachine.TestCase.settings = property_settings(EXAMPLES, STEPS)
test_hami_jobs_held_whole = HamiJobMachine.TestCase
