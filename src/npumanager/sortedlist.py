"""A sorted set of unique keys with O(log n) insert and remove and ordered iteration.

Keys live in a list of short sorted runs (the layout of `sortedcontainers`), so an insert
moves at most a run's worth of references, not the whole collection. The policies use it
to walk requests in rank order from the most important without scanning the rest.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator
from typing import Any, Generic, Protocol, TypeVar


class _Ordered(Protocol):
    def __lt__(self, other: Any, /) -> bool: ...


K = TypeVar("K", bound=_Ordered)

_RUN = 256
"""Keys per run before it is split in two."""


class SortedKeys(Generic[K]):
    """Unique, totally ordered keys; iteration yields them smallest first."""

    __slots__ = ("_len", "_maxes", "_runs")

    def __init__(self) -> None:
        self._runs: list[list[K]] = []
        self._maxes: list[K] = []
        self._len = 0

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[K]:
        for run in self._runs:
            yield from run

    def add(self, key: K) -> None:
        """Insert `key`, which must not be present."""
        maxes = self._maxes
        if not maxes:
            self._runs.append([key])
            maxes.append(key)
        else:
            i = bisect_left(maxes, key)
            if i == len(maxes):
                i -= 1
                self._runs[i].append(key)
                maxes[i] = key
            else:
                insort(self._runs[i], key)
            run = self._runs[i]
            if len(run) > 2 * _RUN:
                self._runs[i : i + 1] = [run[:_RUN], run[_RUN:]]
                maxes[i : i + 1] = [run[_RUN - 1], run[-1]]
        self._len += 1

    def remove(self, key: K) -> None:
        """Remove `key`; `KeyError` if it is not present."""
        maxes = self._maxes
        i = bisect_left(maxes, key)
        if i < len(maxes):
            run = self._runs[i]
            j = bisect_left(run, key)
            if j < len(run) and not (key < run[j]) and not (run[j] < key):
                del run[j]
                self._len -= 1
                if not run:
                    del self._runs[i]
                    del maxes[i]
                elif j == len(run):
                    maxes[i] = run[-1]
                return
        raise KeyError(key)
