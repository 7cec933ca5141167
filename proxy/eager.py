"""A coroutine started at once, as its own task: 3.12's eager tasks, on 3.11 too.

A turn's writes each run as a task, shielded from the request's cancellation (turns.py), and so
does the turn's end (engine.py's `whole`). The embedded store usually runs a write in place
(store/disk/worker.py's `inline`): the step ends without ever waiting, yet its task's first step
waited for the loop's next pass and its awaiter for another, three times a turn. `eager` runs the
coroutine's first step now, inside its task (`asyncio.current_task()` is that task, so a timeout
or a cancellation check taken there applies to it, not to the caller): if the coroutine ends
there, the caller gets a done future at once; else the task runs the rest, exactly as it would
have. The caller is never suspended meanwhile, so no cancellation of its own can reach the step.

Python 3.12 and later do this themselves (`eager_start`); 3.11 through asyncio's own
`_enter_task` / `_leave_task`, which swap the loop's current task as a task's step does.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")


def eager(coro: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
    """`coro` as a task whose first step runs now: a done future if it ended there, else the task."""
    loop = asyncio.get_running_loop()
    if sys.version_info >= (3, 12):  # pragma: no cover  # the runtime here is 3.11
        return asyncio.Task(coro, loop=loop, eager_start=True)  # type: ignore[call-arg]
    context = contextvars.copy_context()
    rest = _Rest(coro)
    task = loop.create_task(rest, context=context)  # its first step, on the loop's next pass, goes on from here
    caller = asyncio.current_task(loop)
    if caller is not None:
        asyncio.tasks._leave_task(loop, caller)
    asyncio.tasks._enter_task(loop, task)
    try:
        context.run(rest.start)
    finally:
        asyncio.tasks._leave_task(loop, task)
        if caller is not None:
            asyncio.tasks._enter_task(loop, caller)
    if rest.running:
        return task
    done: asyncio.Future[T] = loop.create_future()
    if rest.error is None:
        done.set_result(rest.value)
    elif isinstance(rest.error, asyncio.CancelledError):
        done.cancel()
    else:
        done.set_exception(rest.error)
    return done


_STARTED = object()


class _Rest(Coroutine[Any, Any, Any]):
    """A coroutine whose first step `start` took, for its task to go on with: the task's first
    step hands it what the coroutine waits on (or ends at once, the outcome being the done
    future's); every later send or throw goes to the coroutine itself."""

    __slots__ = ("_coro", "_waiting_on", "running", "value", "error")

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._coro = coro
        self._waiting_on: Any = _STARTED
        self.running = False  # it waits: the task goes on with it
        self.value: Any = None  # else what it returned, or
        self.error: BaseException | None = None  # what it raised

    def start(self) -> None:
        try:
            self._waiting_on = self._coro.send(None)
        except StopIteration as finished:
            self.value = finished.value
        except (Exception, asyncio.CancelledError) as exc:  # the done future carries it
            self.error = exc
        else:
            self.running = True

    def send(self, value: Any) -> Any:
        if not self.running:  # it ended in `start`: the task ends too, its outcome told elsewhere
            raise StopIteration
        if self._waiting_on is not _STARTED:
            waiting_on, self._waiting_on = self._waiting_on, _STARTED
            return waiting_on
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if not self.running:
            raise typ if val is None else val
        self._waiting_on = _STARTED
        return self._coro.throw(typ) if val is None and tb is None else self._coro.throw(typ, val, tb)

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, Any, Any]:
        raise TypeError("run by its task, not awaited")
