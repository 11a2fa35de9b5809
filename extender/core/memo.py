"""Bounded memory of recent things, and the answers derived from node states that the cache keeps current.

`Lru` is the one bounded map of the code base: every memory of "the most recent N" (pods filtered, demands
asked, refusals, preemption offers) is one, so none can grow with the traffic. `FitIndex` and `NodeMemo` are
kept current by the cache (`cache.py`) on every node change, `SlotMemo` by the placement's `Learned`, so a
filter reads answers instead of computing them; they never hold a stale answer.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar, cast

import numpy as np
import numpy.typing as npt

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")


class Lru(OrderedDict[K, V]):
    """A map of at most `limit` entries: `put` and `touch` make an entry the newest, and the oldest goes first
    when the map is full. Mutable."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def put(self, key: K, value: V) -> None:
        """Add or replace `key` as the newest entry, forgetting the oldest beyond `limit`."""
        self.pop(key, None)
        self[key] = value
        if len(self) > self.limit:
            self.popitem(last=False)

    def touch(self, key: K) -> V | None:
        """The value of `key`, made the newest entry; None when absent."""
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value

    def setdefault_newest(self, key: K, make: Callable[[], V]) -> V:
        """The value of `key` made the newest, or `make()` put there first."""
        value = self.touch(key)
        if value is None:
            value = make()
            self.put(key, value)
        return value


class Summary(Protocol):
    """What FitIndex reads of a node (`cache.NodeState`)."""

    @property
    def name(self) -> str: ...
    @property
    def fit_free(self) -> int: ...


class FitIndex:
    """For the one-GPU demands asked recently, the set of nodes that can take each now.

    A filter then costs one set membership per node name (C speed: `fitting.issuperset(names)` when all fit)
    instead of a Python loop. Kept current by the cache on every node change; bounded to the `limit` demand
    sizes used most recently (a cluster's pods come in a handful of sizes).
    """

    def __init__(self, limit: int = 32) -> None:
        self._sets: Lru[int, set[str]] = Lru(limit)

    @property
    def limit(self) -> int:
        return self._sets.limit

    @limit.setter
    def limit(self, limit: int) -> None:
        self._sets.limit = limit

    def fitting(self, need: int, nodes: Mapping[str, Summary]) -> set[str]:
        """The names of the nodes whose largest free GPU holds `need` (known and Ready ones only)."""
        return self._sets.setdefault_newest(
            need, lambda: {name for name, state in nodes.items() if state.fit_free >= need}
        )

    def update(self, state: Summary) -> None:
        for need, names in self._sets.items():
            if state.fit_free >= need:
                names.add(state.name)
            else:
                names.discard(state.name)

    def forget(self, name: str) -> None:
        for names in self._sets.values():
            names.discard(name)


class Question(Generic[T]):
    """Names a question asked of every node (a verdict for a demand, a score for a demand and a policy), and
    the type of its answers: the key of one `NodeMemo` table. Equal names are the same question."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class _ChangeLog(Generic[K]):
    """What `NodeMemo` and `SlotMemo` share: their tables, bounded to the `limit` questions asked most recently,
    and the log of the nodes changed (by name, or slot), from which a table learns what to drop when it is read
    (`_unseen`). A table left unread while more than `LOG_LIMIT` changes went by is emptied instead."""

    LOG_LIMIT = 100_000

    def __init__(self, limit: int) -> None:
        self._tables: Lru[str, list[Any]] = Lru(limit)
        """Question name -> [its table, the log position it has seen up to]."""
        self._log: list[K] = []
        """The nodes changed, oldest first; `_start` is the position of its first entry."""
        self._start = 0

    @property
    def limit(self) -> int:
        return self._tables.limit

    @limit.setter
    def limit(self, limit: int) -> None:
        self._tables.limit = limit

    def _entry(self, name: str, new: Callable[[], Any]) -> list[Any]:
        """The question's [table, seen], made by `new` when it has none."""
        return self._tables.setdefault_newest(name, lambda: [new(), self._start + len(self._log)])

    def _unseen(self, entry: list[Any]) -> list[K] | None:
        """The nodes changed since the entry's table was last read ([] for none; None when it fell behind what
        the log keeps: every answer is to drop), and the entry marked as having seen them."""
        end = self._start + len(self._log)
        seen: int = entry[1]
        entry[1] = end
        if seen >= end:
            return []
        return None if seen < self._start else self._log[seen - self._start :]

    def forget(self, node: K) -> None:
        """The node changed: its answers are dropped from each table when that table is read next."""
        log = self._log
        log.append(node)
        if len(log) > self.LOG_LIMIT:
            half = len(log) // 2
            del log[:half]
            self._start += half


class NodeMemo(_ChangeLog[str]):
    """Answers derived from node states, one table per question, by node name.

    A node's answers are dropped from every table when the node changes, so a table never holds a stale
    answer. One dict per question, not one per node: at 5,000 nodes, per-node dicts cost a cache miss each.
    Bounded to the `limit` questions asked most recently.

    Dropped lazily: a change is one entry in a log (`forget`), and a table drops the answers of the nodes
    changed since it was last read when it is read next (`table`). A change used to pop the node from every
    table at once, and with hundreds of tables (one per kind of pod asked lately) that was most of what a bind
    cost.
    """

    def __init__(self, limit: int = 64) -> None:
        super().__init__(limit)

    def table(self, question: Question[T]) -> dict[str, T]:
        entry = self._entry(question.name, dict)
        table = cast(dict[str, T], entry[0])  # every table of one question name holds that question's T
        unseen = self._unseen(entry)
        if unseen is None:
            table.clear()
        elif unseen:
            pop = table.pop
            for name in unseen:
                pop(name, None)
        return table


class SlotMemo(_ChangeLog[int]):
    """Answers derived from node states as float arrays, one per question, indexed by the node's slot (a small
    integer per node: `placement.arrays.NodeArrays.slot_of`); NaN where a node has no answer, or has changed
    since it was answered. What `NodeMemo` is for one dict a question, for answers read a thousand at a time:
    a filter gathers them by the slots of its names in one step (`values[slots]`), and finds the missing ones
    with `isnan`, instead of probing a dict twice a name.

    Dropped lazily as in `NodeMemo`: a change is one entry in a log, and a table sets the slots changed since it
    was last read to NaN (in one step) when it is read next. Mutable.
    """

    def __init__(self, limit: int = 64) -> None:
        super().__init__(limit)

    def table(self, question: Question[float], size: int) -> npt.NDArray[np.float64]:
        """The question's values, at least `size` long (NaN where not answered or changed)."""
        entry = self._entry(question.name, lambda: np.full(max(size, 64), np.nan))
        values: npt.NDArray[np.float64] = entry[0]
        if len(values) < size:
            grown = np.full(max(size, 2 * len(values)), np.nan)
            grown[: len(values)] = values
            values = entry[0] = grown
        unseen = self._unseen(entry)
        if unseen is None:
            values.fill(np.nan)
        elif unseen:
            values[unseen] = np.nan
        return values
