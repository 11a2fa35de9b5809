"""Jobs placed whole among the single pods, reservations and nodes of each protocol's machine (`job_machine.py`):
gpushare's GPUs judged in arrays, HAMi's HAMi-core and MIG GPUs."""

from __future__ import annotations

from tests.property.fresh import property_settings
from tests.property.job_machine import JobMachine
from tests.property.test_gpushare_machine import GpushareMachine
from tests.property.test_hami_machine import HamiMachine

EXAMPLES = 60
STEPS = 60


class GpushareJobMachine(JobMachine, GpushareMachine):
    gib = 1


class HamiJobMachine(JobMachine, HamiMachine):
    gib = 1024


GpushareJobMachine.TestCase.settings = property_settings(EXAMPLES, STEPS)
test_gpushare_jobs_held_whole = GpushareJobMachine.TestCase
HamiJobMachine.TestCase.settings = property_settings(EXAMPLES, STEPS)
test_hami_jobs_held_whole = HamiJobMachine.TestCase
