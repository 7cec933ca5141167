"""A coroutine started at once, in a task of its own only if it has to wait (3.12's eager tasks, on 3.11).

A turn's writes each run as a task, shielded from the request's cancellation (turns.py), and so
does the turn's end (engine.py's `whole`). The embedded store usually runs a write in place
(store/disk/worker.py's `inline`): the step ends without ever waiting, and its task, shield and
wait cost two loop iterations and ~10 µs each for nothing, three times a turn. `eager` runs the
coroutine now, up to its first wait: if it ends there, it is a done future; else what is left of
it runs in a task, exactly as it would have. The part run now never yields, so no cancellation
can reach it; the task, when there is one, is shielded by its callers as before.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")


def eager(coro: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
    """`coro` run up to its first wait: a done future if it ended there, else a task running the rest."""
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()  # as a task's: what the coroutine sets stays its own
    try:
        waiting_on = context.run(coro.send, None)
    except StopIteration as finished:
        done: asyncio.Future[T] = loop.create_future()
        done.set_result(finished.value)
        return done
    except asyncio.CancelledError:
        done = loop.create_future()
        done.cancel()
        return done
    except Exception as exc:  # noqa: BLE001  # the future carries it, as a task's would
        done = loop.create_future()
        done.set_exception(exc)
        return done
    return loop.create_task(_Rest(coro, waiting_on), context=context)


_FIRST = object()


class _Rest(Coroutine[Any, Any, Any]):
    """What is left of a coroutine `eager` started, for a task to run: its first step hands the
    task what the coroutine waits on; every later send or throw goes to the coroutine itself (a
    cancellation before that first step included, at the wait where the coroutine stands)."""

    __slots__ = ("_coro", "_waiting_on")

    def __init__(self, coro: Coroutine[Any, Any, Any], waiting_on: Any) -> None:
        self._coro, self._waiting_on = coro, waiting_on

    def send(self, value: Any) -> Any:
        if self._waiting_on is not _FIRST:
            waiting_on, self._waiting_on = self._waiting_on, _FIRST
            return waiting_on
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        self._waiting_on = _FIRST
        return self._coro.throw(typ) if val is None and tb is None else self._coro.throw(typ, val, tb)

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, Any, Any]:
        raise TypeError("run by a task, not awaited")
