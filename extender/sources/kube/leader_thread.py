"""Leader election on a thread of its own, so that nothing the handlers do can delay a renewal.

Why: the verbs' handlers run inline on the serving event loop (`service/transport.py`), and every await of a
renewal (connecting, sending, reading the answer) waits there behind whatever is ready to run before it. A loop
held longer than the renew deadline (a relist of a big cluster replacing the cache in one step, a full garbage
collection, a slow handler, a CPU-starved process with a queue of ready work) made a replica that was alive and
serving stop leading. A lease must be renewed while the process lives, whatever the handlers do; client-go's
elector runs in a goroutine of its own for the same reason.

So the `LeaderElector` runs here on an asyncio loop of its own, in a daemon thread, with a `KubeClient` of its
own (an aiohttp session belongs to one loop). The thread still needs the GIL for its Python code, but the
interpreter hands it over every `sys.getswitchinterval()` (5 ms): a CPU-bound handler delays a renewal by
milliseconds, not by its own length.

What crosses between the threads, and nothing else:
- Changes of leadership go to the serving loop (`call_soon_threadsafe`), in order. There `leading` changes and
  `on_change` runs in one step: readiness reads `leading`, and the source asks for a relist in `on_change`, so
  no bind can see this replica lead before its relist is asked for (`source.py`).
- `time_left()`, read by binds on the serving loop, comes from the elector as it is now (a bool, an int and
  floats, each read whole under the GIL), and is 0 unless the serving loop has been told of that very
  leadership (its `term`): a lease lost and taken again is a new term, which waits for its own relist.
- `holder`, for messages.

This module never touches the cache; the elector's rules are in `leader.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any

from extender.settings import LeaseTimings
from extender.sources.kube.client import KubeClient
from extender.sources.kube.leader import LeaderElector


class LeaderThread:
    """Mutable: `leading` and the elector change as the thread runs. `run()` it on the serving loop."""

    def __init__(
        self,
        make_client: Callable[[], KubeClient],
        namespace: str,
        name: str,
        identity: str,
        timings: LeaseTimings,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self.make_client = make_client
        """Builds the thread's own client (called on the thread, which closes it when it ends)."""
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timings = timings
        self.on_change = on_change
        self.leading = False
        """The serving loop's view: set there when the elector's news of leading arrives, cleared likewise."""
        self._term = 0
        """The elector's term whose news of leading arrived last."""
        self._elector: LeaderElector | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Future[None] | None = None
        self._stopping = False

    @property
    def holder(self) -> str:
        """The Lease's holder as the elector last read it ("" when none or unknown)."""
        return self._elector.holder if self._elector is not None else ""

    def time_left(self) -> float:
        """Seconds this replica surely stays leader: the elector's figure for the term the serving loop knows of,
        else 0."""
        elector = self._elector
        if not self.leading or elector is None or elector.term != self._term:
            return 0.0
        return elector.time_left()

    async def run(self) -> None:
        """Run the election on its thread until cancelled, then stop it (the lease is given up) and wait for the
        thread to end. An error that ends the thread is raised here."""
        serving = asyncio.get_running_loop()
        ended: asyncio.Future[None] = serving.create_future()
        thread = threading.Thread(
            target=self._main, args=(serving, ended), name=f"lease {self.namespace}/{self.name}", daemon=True
        )
        thread.start()
        try:
            await asyncio.shield(ended)
        except asyncio.CancelledError:
            self._stop()
            with contextlib.suppress(Exception):
                await asyncio.shield(ended)
            raise

    def _stop(self) -> None:
        """Ask the thread to stop (from the serving loop); its elector releases the lease as it ends."""
        self._stopping = True
        loop, task = self._loop, self._task
        if loop is not None and task is not None:
            with contextlib.suppress(RuntimeError):  # its loop has closed: the thread has ended already
                loop.call_soon_threadsafe(task.cancel)

    def _main(self, serving: asyncio.AbstractEventLoop, ended: asyncio.Future[None]) -> None:
        """The thread: run the elector on a loop of its own; tell the serving loop how it ended."""
        error: BaseException | None = None
        try:
            asyncio.run(self._elect(serving))
        except BaseException as caught:  # told to the serving loop, where `run` raises it
            error = caught

        def settle() -> None:
            if not ended.done():
                if error is None:
                    ended.set_result(None)
                else:
                    ended.set_exception(error)

        _post(serving, settle)

    async def _elect(self, serving: asyncio.AbstractEventLoop) -> None:
        self._loop = asyncio.get_running_loop()
        async with self.make_client() as client:

            def changed(leading: bool) -> None:
                _post(serving, self._changed, leading, elector.term)

            elector = LeaderElector(client, self.namespace, self.name, self.identity, self.timings, changed)
            self._elector = elector
            self._task = asyncio.ensure_future(elector.run())
            if self._stopping:  # asked to stop before the task existed: `_stop` found nothing to cancel
                self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def _changed(self, leading: bool, term: int) -> None:
        """On the serving loop: the elector's news, in the order it was sent."""
        self.leading, self._term = leading, term
        if self.on_change is not None:
            self.on_change(leading)


def _post(loop: asyncio.AbstractEventLoop, callback: Callable[..., Any], *args: Any) -> None:
    """Run `callback(*args)` on `loop` from another thread; nothing when that loop has closed (shutting down)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, *args)
