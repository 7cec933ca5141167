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
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from ...scheduling import run_behind_the_loop

T = TypeVar("T")

_Job = tuple[Callable[..., Any], tuple[Any, ...], "asyncio.Future[Any]", asyncio.AbstractEventLoop]


class StoreThread:
    """Runs functions in one daemon thread, in the order they were asked for."""

    def __init__(self, name: str, initializer: Callable[[], None] | None = None) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._initializer = initializer
        self._closed = False
        # Calls handed to the thread and calls it is done with: each written by one thread only
        # (the loop's, the store thread's), so equal means it has nothing queued or running.
        self._asked = 0
        self._done = 0
        self._running = threading.Lock()  # held while a call runs, there or in place
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """`fn(*args)`, queued now for the thread: the future gets its result or its exception."""
        if self._closed:
            raise RuntimeError("the store's thread is shut down")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._asked += 1
        self._jobs.put((fn, args, future, loop))
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
        while (job := self._jobs.get()) is not None:
            fn, args, future, loop = job
            if future.cancelled():  # read without the loop: at worst a cancelled call still runs
                self._done += 1
                continue
            with self._running:
                try:
                    result, error = fn(*args), None
                except BaseException as exc:  # noqa: BLE001  # handed to the awaiting task, raised there
                    result, error = None, exc
            self._done += 1  # after the lock is let go: equal counts mean `inline` can take it
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:  # the loop closed meanwhile: nobody waits any more
                pass


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
