"""The store's thread (proxy/store/disk/worker.py): calls run in order, off the loop, their outcome
comes back to the caller, and a call cancelled before its turn never runs."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest

from proxy.store.disk.worker import GROUP_MAX, StoreThread


async def test_calls_run_in_the_thread_in_the_order_asked_and_their_outcome_comes_back():
    ran: list[tuple[int, str]] = []
    store_thread = StoreThread("test-store", initializer=lambda: ran.append((0, threading.current_thread().name)))

    def call(n: int) -> int:
        ran.append((n, threading.current_thread().name))
        if n == 3:
            raise ValueError("three")
        return n * 10

    outcomes = await asyncio.gather(*(store_thread.run(call, n) for n in range(1, 6)), return_exceptions=True)
    assert outcomes[:2] == [10, 20] and outcomes[3:] == [40, 50]
    assert isinstance(outcomes[2], ValueError) and str(outcomes[2]) == "three"
    assert ran == [(n, "test-store") for n in range(6)]  # the initializer first, then each call, in order
    store_thread.shutdown()
    with pytest.raises(RuntimeError):
        store_thread.run(call, 6)


async def test_a_call_cancelled_before_its_turn_never_runs_and_shutdown_runs_the_rest():
    store_thread = StoreThread("test-store")
    release = threading.Event()
    ran: list[str] = []

    def blocking() -> None:
        release.wait(10)
        ran.append("first")

    first = store_thread.run(blocking)  # queued as it is asked for: the thread is held by the first
    second = store_thread.run(ran.append, "cancelled")
    third = store_thread.run(ran.append, "third")
    second.cancel()
    release.set()
    await first
    await third
    assert ran == ["first", "third"]
    assert second.cancelled()
    store_thread.shutdown()


async def test_a_call_runs_in_place_only_when_the_thread_has_nothing_to_do():
    store_thread = StoreThread("test-store")
    release, started = threading.Event(), threading.Event()

    def hold() -> str:
        started.set()
        release.wait(10)
        return "held"

    try:
        assert store_thread.inline(threading.current_thread) == (True, threading.current_thread())  # idle: here
        busy = store_thread.run(hold)
        assert store_thread.inline(lambda: "in place") == (False, None)  # asked of it, maybe not begun yet
        await asyncio.to_thread(started.wait, 10)
        assert store_thread.inline(lambda: "in place") == (False, None)  # running: nothing runs beside it
        release.set()
        assert await busy == "held"
        assert store_thread.inline(lambda: "in place") == (True, "in place")
        queued = [store_thread.run(lambda n=n: n) for n in range(3)]
        assert store_thread.inline(lambda: "in place") == (False, None)  # queued calls keep their order
        assert await asyncio.gather(*queued) == [0, 1, 2]
        with pytest.raises(ZeroDivisionError):  # its error is the caller's, as from the thread
            store_thread.inline(lambda: 1 / 0)
        assert store_thread.inline(lambda: "again") == (True, "again")
    finally:
        release.set()
        store_thread.shutdown()
    assert store_thread.inline(lambda: "closed") == (False, None)


async def test_calls_waiting_while_the_thread_is_busy_run_together_each_alone():
    """Group commit's shape: the calls asked for `together` queued in a row behind a busy thread
    (up to GROUP_MAX) run inside one `together()`, each inside `alone()`; one that raises fails
    alone; a `together()` that fails at its end fails every call in it; any other call, or one
    with nothing queued behind it, runs on its own."""
    entered: list[str] = []
    fail_together = threading.Event()

    @contextlib.contextmanager
    def together():
        entered.append("together")
        yield
        if fail_together.is_set():
            raise OSError("the write of them all failed")

    @contextlib.contextmanager
    def alone():
        entered.append("alone")
        yield

    store_thread = StoreThread("test-store", together=together, alone=alone)
    release, started = threading.Event(), threading.Event()

    def hold() -> str:
        started.set()
        release.wait(10)
        return "held"

    def boom() -> None:
        raise ValueError("this one")

    try:
        busy = store_thread.run(hold)
        await asyncio.to_thread(started.wait, 10)
        queued = [store_thread.run(lambda n=n: n, together=True) for n in range(GROUP_MAX + 2)]
        queued += [store_thread.run(boom, together=True), store_thread.run(lambda: "big", together=False)]
        queued += [store_thread.run(lambda n=n: n, together=True) for n in range(2)]
        release.set()
        outcomes = await asyncio.gather(*queued, return_exceptions=True)
        assert await busy == "held" and outcomes[: GROUP_MAX + 2] == list(range(GROUP_MAX + 2))
        assert isinstance(outcomes[GROUP_MAX + 2], ValueError) and outcomes[GROUP_MAX + 3:] == ["big", 0, 1]
        # 8, then 3 (the third one raising), then the big one on its own, then the last 2
        assert entered == ["together", *["alone"] * GROUP_MAX, "together", *["alone"] * 3, "together", "alone", "alone"]

        entered.clear()
        started.clear()
        release.clear()
        busy = store_thread.run(hold)
        await asyncio.to_thread(started.wait, 10)
        queued = [store_thread.run(lambda n=n: n, together=True) for n in range(3)]
        fail_together.set()
        release.set()
        await busy
        outcomes = await asyncio.gather(*queued, return_exceptions=True)
        assert all(isinstance(o, OSError) for o in outcomes)
        entered.clear()
        assert await store_thread.run(lambda: "alone", together=True) == "alone" and entered == []  # nothing behind it
    finally:
        release.set()
        store_thread.shutdown()
