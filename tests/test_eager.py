"""proxy/eager.py: a coroutine run at once, in a task only for what is left after its first wait."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from proxy.eager import eager

NAME: contextvars.ContextVar[str] = contextvars.ContextVar("name", default="caller's")


async def test_a_coroutine_that_never_waits_ends_before_eager_returns_with_no_task() -> None:
    ran: list[str] = []

    async def step() -> int:
        ran.append("step")  # a store call run in place: nothing to wait for
        return 7

    tasks = len(asyncio.all_tasks())
    future = eager(step())
    assert ran == ["step"] and future.done() and future.result() == 7
    assert len(asyncio.all_tasks()) == tasks
    assert await asyncio.shield(future) == 7  # what turns.py awaits


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

    future = eager(step())
    assert future.done()
    with pytest.raises(ValueError, match="no room"):
        await future


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

    waiting = asyncio.ensure_future(caller())
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
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
