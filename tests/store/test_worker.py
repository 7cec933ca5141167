"""The store's thread (proxy/store/disk/worker.py): calls run in order, off the loop, their outcome
comes back to the caller, and a call cancelled before its turn never runs."""

from __future__ import annotations

import asyncio
import threading

import pytest

from proxy.store.disk.worker import StoreThread


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
