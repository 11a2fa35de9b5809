"""How long the event loop is held: a probe that wakes every `INTERVAL` and measures how late it woke.

Every request, watch event and background chore of a process runs on its one event loop, so while one handler
holds it (a filter judging thousands of nodes afresh, a full garbage collection, a slow scrape), everything
due meanwhile waits: kube-scheduler's next filter, a bind, a probe. The probe is due every `INTERVAL` seconds;
how late it runs is how long the loop was held, as anything else waiting saw it. Its histogram and the longest
since the start (`extender_event_loop_lag_seconds`, `extender_event_loop_lag_max_seconds`) are what `make
bench`'s scale run and the load test read, and what an operator alerts on (DESIGN §8: no request may hold the
loop more than 50 ms at 5,000 nodes). It costs one timer a probe: 50 wake-ups a second.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

INTERVAL = 0.02
"""Seconds between probes: a stall shorter than this may fall between two and be seen shorter than it was."""


class Lag(Protocol):
    """Where the lateness goes (`metrics.Metrics.loop_lag`)."""

    def observe(self, seconds: float) -> None: ...


async def probe(lag: Lag, interval: float = INTERVAL) -> None:
    """Measure the loop's lateness every `interval` seconds, forever."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval
        await asyncio.sleep(interval)
        lag.observe(max(0.0, loop.time() - due))
