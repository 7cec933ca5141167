"""proxy/eager.py: a coroutine run at once, in a task only for what is left after its first wait."""

from __future__ import annotations

import asyncio
import contextvars
import gc
from collections.abc import Coroutine
from typing import Any

import pytest

from proxy.eager import eager

NAME: contextvars.ContextVar[str] = contextvars.ContextVar("name", default="caller's")


async def cancelled(caller: Coroutine[Any, Any, None]) -> None:
    """Run `caller` until it waits, cancel it (as aiohttp cancels a handler whose client left), and
    see the cancellation through."""
    task = asyncio.ensure_future(caller)
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_coroutine_that_never_waits_ends_before_eager_returns_and_its_caller_never_waits() -> None:
    ran: list[str] = []

    async def step() -> int:
        ran.append("step")  # a store call run in place: nothing to wait for
        return 7

    tasks = len(asyncio.all_tasks())
    future = eager(step())
    assert ran == ["step"] and future.done() and future.result() == 7
    assert await asyncio.shield(future) == 7  # what turns.py awaits: no suspension
    await asyncio.sleep(0)  # the task it ran as ends on the loop's next pass, with nothing to say
    assert len(asyncio.all_tasks()) == tasks


async def test_what_is_left_after_the_first_wait_runs_in_a_task_to_the_same_result() -> None:
    gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    ran: list[str] = []

    async def step() -> str:
        ran.append("before")
        got = await gate
        ran.append("after")
        return got + "!"

    future = eager(step())
    assert ran == ["before"] and not future.done() and isinstance(future, asyncio.Task)
    gate.set_result("done")
    assert await future == "done!" and ran == ["before", "after"]


async def test_an_error_before_any_wait_is_the_futures_and_raised_where_it_is_awaited() -> None:
    async def step() -> None:
        raise ValueError("no room")

    loop = asyncio.get_running_loop()
    reported: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    future = eager(step())
    assert future.done()
    with pytest.raises(ValueError, match="no room"):
        await future
    await asyncio.sleep(0)  # its task ends too, the error told only by the future awaited
    del future
    gc.collect()
    assert reported == []


async def test_a_task_cancelled_before_its_first_step_cancels_the_coroutine_where_it_waits() -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    seen: list[str] = []

    async def step() -> None:
        try:
            await gate
        except asyncio.CancelledError:
            seen.append("cancelled at its wait")
            raise
        finally:
            seen.append("cleaned up")

    future = eager(step())
    future.cancel()  # before the task took a step
    with pytest.raises(asyncio.CancelledError):
        await future
    assert seen == ["cancelled at its wait", "cleaned up"]


async def test_a_shielded_rest_ends_though_its_awaiter_is_cancelled() -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    ended: list[str] = []

    async def step() -> None:
        await gate
        ended.append("written")

    future = eager(step())

    async def caller() -> None:
        await asyncio.shield(future)

    await cancelled(caller())
    gate.set_result(None)
    await future
    assert ended == ["written"]


async def test_what_the_coroutine_sets_in_its_context_stays_its_own_across_its_wait() -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def step() -> str:
        NAME.set("the step's")
        await gate
        return NAME.get()

    future = eager(step())
    assert NAME.get() == "caller's"
    gate.set_result(None)
    assert await future == "the step's" and NAME.get() == "caller's"


async def test_the_first_step_runs_as_its_own_task_so_a_timeout_taken_there_cancels_it_not_the_caller() -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    seen: dict[str, object] = {}
    caller = asyncio.current_task()

    async def step() -> str:
        seen["task"] = asyncio.current_task()
        try:
            async with asyncio.timeout(0.01):  # taken in the first step, before the wait
                await gate  # never set: the timeout ends the wait
        except TimeoutError:
            return "timed out"
        return "set"

    future = eager(step())
    assert seen["task"] is future and seen["task"] is not caller  # the task that goes on with it
    assert asyncio.current_task() is caller  # the caller's again once the step is taken
    assert await future == "timed out"
    assert caller is not None and not caller.cancelling()


async def test_a_caller_being_cancelled_is_not_what_the_step_sees_as_its_own_cancellation() -> None:
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    seen: list[int] = []

    async def step() -> None:
        task = asyncio.current_task()  # taken before the wait, as the redis store's lock does
        assert task is not None
        await gate
        seen.append(task.cancelling())  # ... to check after each wait whether it is being cancelled

    started: list[asyncio.Future[None]] = []

    async def caller() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:  # the client went away: the turn's end still runs whole
            started.append(eager(step()))
            raise

    await cancelled(caller())
    gate.set_result(None)
    await started[0]
    assert seen == [0]
