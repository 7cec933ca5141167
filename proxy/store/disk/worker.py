"""The store's own thread: its calls run there one after another, and the event loop waits on each.

A turn makes up to two such calls on its path (its items, staged, then its end), so the
hop's own cost counts: concurrent.futures' executor makes a work item, a future with its
condition, and hands the result back through asyncio's future chaining (~34 µs of CPU a hop on
one core, measured); a plain queue and a callback on the loop take half that. A call whose
awaiting task was cancelled before the thread got to it is not run (as an executor's queued
work is not).

Even half is the store's biggest cost after its commits: the wake-ups both ways (`make
bench-profile` put 12% of a later turn's samples in the loop's `_write_to_self`). So a small call
may run in place instead (`inline`), on the caller's thread, when the store thread has nothing to
do: nothing asked of it is still queued or running, so the calls still run one at a time, in the
order they were asked for.

Calls asked for `together` that wait while the thread is busy (turns at once: the store's small
writes) run together (group commit): up to GROUP_MAX of them in a row inside one `together()`
(the store's: one write for them all), each inside `alone()` (one that raises leaves nothing in
the others' write); their outcomes come back once the write of them all is done, with one
wake-up of the loop, and if that write fails, each of them fails with it. Any other call, or one
with nothing waiting behind it, runs as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from ...scheduling import run_behind_the_loop

T = TypeVar("T")

_Job = tuple[Callable[..., Any], tuple[Any, ...], "asyncio.Future[Any]", asyncio.AbstractEventLoop, bool]
_Outcome = tuple["asyncio.Future[Any]", Any, BaseException | None]
# Calls run together at most: the first of them waits for the others' outcomes too.
GROUP_MAX = 8
_NOTHING = object()


class StoreThread:
    """Runs functions in one daemon thread, in the order they were asked for."""

    def __init__(
        self,
        name: str,
        initializer: Callable[[], None] | None = None,
        together: Callable[[], AbstractContextManager[Any]] | None = None,
        alone: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
    ) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._initializer = initializer
        self._together, self._alone = together, alone  # None: no group commit, each call on its own
        self._closed = False
        # Calls handed to the thread and calls it is done with: each written by one thread only
        # (the loop's, the store thread's), so equal means it has nothing queued or running.
        self._asked = 0
        self._done = 0
        self._running = threading.Lock()  # held while a call runs, there or in place
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def run(self, fn: Callable[..., T], *args: Any, together: bool = False) -> asyncio.Future[T]:
        """`fn(*args)`, queued now for the thread: the future gets its result or its exception.
        `together`: it may run with other such calls waiting beside it, in one `together()`."""
        if self._closed:
            raise RuntimeError("the store's thread is shut down")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._asked += 1
        self._jobs.put((fn, args, future, loop, together))
        return future

    def inline(self, fn: Callable[..., T], *args: Any) -> tuple[bool, T | None]:
        """`(True, fn(*args))` run here and now if the thread has nothing to do; else `(False, None)`
        and nothing run (the caller hands it to `run`). Called from the loop's thread, the one
        that asks: what it reads of `_asked` cannot change meanwhile."""
        if self._closed or self._asked != self._done or not self._running.acquire(blocking=False):
            return False, None
        try:
            return True, fn(*args)
        finally:
            self._running.release()

    def shutdown(self) -> None:
        """Run what was asked for, then end the thread (and wait for it)."""
        if not self._closed:
            self._closed = True
            self._jobs.put(None)
        self._thread.join()

    def _work(self) -> None:
        run_behind_the_loop()
        if self._initializer is not None:
            with self._running:
                self._initializer()
        behind: Any = _NOTHING  # taken off the queue while gathering calls, not one of them: the next
        while True:
            job = self._jobs.get() if behind is _NOTHING else behind
            if job is None:
                break
            jobs, behind = self._gathered(job)
            # Read without the loop: at worst a cancelled call still runs.
            live = [job for job in jobs if not job[2].cancelled()]
            with self._running:
                outcomes = self._one(live[0]) if len(live) == 1 else self._group(live) if live else []
            self._done += len(jobs)  # after the lock is let go: equal counts mean `inline` can take it
            loops: dict[asyncio.AbstractEventLoop, list[_Outcome]] = {}
            for (_, _, _, loop, _), outcome in zip(live, outcomes, strict=True):
                loops.setdefault(loop, []).append(outcome)
            for loop, settled in loops.items():
                try:
                    loop.call_soon_threadsafe(_settle, settled)
                except RuntimeError:  # the loop closed meanwhile: nobody waits any more
                    pass

    def _gathered(self, first: _Job) -> tuple[list[_Job], Any]:
        """`first` with the `together` calls queued right behind it (GROUP_MAX in all at most), and
        the item that ended them, taken off the queue (a call, or None to stop), else _NOTHING."""
        jobs = [first]
        while first[4] and self._together is not None and len(jobs) < GROUP_MAX:
            try:
                more = self._jobs.get_nowait()
            except queue.Empty:
                break
            if more is None or not more[4]:
                return jobs, more
            jobs.append(more)
        return jobs, _NOTHING

    @staticmethod
    def _one(job: _Job) -> list[_Outcome]:
        fn, args, future, _, _ = job
        try:
            return [(future, fn(*args), None)]
        except BaseException as exc:  # noqa: BLE001  # handed to the awaiting task, raised there
            return [(future, None, exc)]

    def _group(self, jobs: list[_Job]) -> list[_Outcome]:
        """`jobs` run together, each alone: their outcomes once the write of them all is done."""
        assert self._together is not None
        outcomes: list[_Outcome] = []
        try:
            with self._together():
                for fn, args, future, _, _ in jobs:
                    try:
                        with self._alone():
                            outcomes.append((future, fn(*args), None))
                    except BaseException as exc:  # noqa: BLE001  # this one's alone
                        outcomes.append((future, None, exc))
        except BaseException as exc:  # noqa: BLE001  # the write of them all failed: each of them with it
            return [(future, None, exc) for _, _, future, _, _ in jobs]
        return outcomes


def _settle(outcomes: list[_Outcome]) -> None:
    for future, result, error in outcomes:
        if future.cancelled():
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
