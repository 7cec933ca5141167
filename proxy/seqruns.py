"""The seqs a prompt sent, kept as runs of consecutive ones.

A turn record names every stored message its prompt sent, in prompt order: the system prompt,
then what the window kept of the history, then the turn's new items: [1, 57, 58, ..., 2040] is two
runs. Kept as a list, it grew with the conversation: the fast path copied it every turn, and each
turn's record stored it whole (~6 KB pickled at 2,000 items, more as JSON in Redis: a long run's
records alone grew with the square of its turns). As runs, a later turn's additions cost what
they number, and a record is the size of what its prompt left out. Backends keep the runs
(`TurnRecord.stored_row`); exports and the admin API see the list.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any


class SeqRuns:
    """An ordered list of seqs (any order, repeats included) as (first, count) pairs of ascending
    runs; immutable: `plus` and `without_last` make new ones, in time of the runs they touch."""

    __slots__ = ("_count", "_runs")

    def __init__(self, seqs: Iterable[int] = ()) -> None:
        runs: list[int] = []
        for seq in seqs:
            if runs and seq == runs[-2] + runs[-1]:
                runs[-1] += 1
            else:
                runs += (seq, 1)
        self._runs = runs
        self._count = sum(runs[1::2])

    @classmethod
    def from_runs(cls, runs: Sequence[int]) -> SeqRuns:
        """From `runs` as `runs()` gave them (a stored record's)."""
        made = cls()
        for i in range(0, len(runs) - 1, 2):  # joined where a run goes on the one before, as __init__ would
            first, count = runs[i], runs[i + 1]
            if count <= 0:
                continue
            if made._runs and first == made._runs[-2] + made._runs[-1]:
                made._runs[-1] += count
            else:
                made._runs += (first, count)
        made._count = sum(made._runs[1::2])
        return made

    def runs(self) -> list[int]:
        """The flat (first, count) pairs, to store: [3, 4, 5, 9] -> [3, 3, 9, 1]."""
        return list(self._runs)

    def plus(self, seqs: Iterable[int]) -> SeqRuns:
        """These seqs and then `seqs`."""
        runs, added = list(self._runs), 0
        for seq in seqs:
            if runs and seq == runs[-2] + runs[-1]:
                runs[-1] += 1
            else:
                runs += (seq, 1)
            added += 1
        return SeqRuns._made(runs, self._count + added) if added else self

    def without_last(self, k: int) -> SeqRuns:
        """These seqs less the last `k`."""
        if k <= 0:
            return self
        runs = list(self._runs)
        while k > 0 and runs:
            if runs[-1] > k:
                runs[-1] -= k
                break
            k -= runs.pop()
            runs.pop()
        return SeqRuns._made(runs, sum(runs[1::2]))

    @classmethod
    def _made(cls, runs: list[int], count: int) -> SeqRuns:
        """From runs already joined (this class's own), of `count` seqs."""
        made = cls.__new__(cls)
        made._runs, made._count = runs, count
        return made

    def last(self, k: int) -> list[int]:
        """The last `k` seqs, in order."""
        out: list[int] = []
        i = len(self._runs) - 2
        while k > 0 and i >= 0:
            first, count = self._runs[i], self._runs[i + 1]
            take = min(k, count)
            out[:0] = range(first + count - take, first + count)
            k -= take
            i -= 2
        return out

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[int]:
        for i in range(0, len(self._runs), 2):
            yield from range(self._runs[i], self._runs[i] + self._runs[i + 1])

    def __eq__(self, other: Any) -> bool:
        if isinstance(other, SeqRuns):
            return self._runs == other._runs
        if isinstance(other, list):  # a list of the same seqs (tests, rows read back)
            return len(other) == self._count and list(self) == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which are not hashable

    def __repr__(self) -> str:
        return f"SeqRuns.from_runs({self._runs!r})"
