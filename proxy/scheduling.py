"""The store's threads wait for the event loop's core instead of taking it from the loop (Linux).

The diskcache store's thread and its checkpointer (and the trajectory files' writer) are woken
by the event loop (a call queued, a write counted) while the loop still holds the GIL and has
work left. Under Linux's default policy a woken thread preempts the one that woke it on a busy
core: it runs only to block on the GIL at once, and the loop waits for the core back, two
context switches for nothing, several times a turn (a later turn: 12, 4 of them the loop's
involuntary ones). SCHED_BATCH is the same fair share of the CPU without that preemption at
wake-up: the thread runs when the loop blocks (awaiting it, in epoll) or at the next tick. With
a core to spare it changes nothing.
Measured (docs/performance.md): 16 clients served ~14% more requests a second on one core, later turns
paced 50 ms apart ~6% less CPU; the price, a first turn after the process sat idle ~8% more.

asyncio's executor threads are left as they are: they count a first turn's tokens, and with them
under SCHED_BATCH too a first turn measured no cheaper and 16 clients no faster (docs/performance.md).
"""

from __future__ import annotations

import os


def run_behind_the_loop() -> None:
    """Put the calling thread (Linux: the policy is per thread) under SCHED_BATCH; where that is
    not available or refused, leave it as it is."""
    setter, batch = getattr(os, "sched_setscheduler", None), getattr(os, "SCHED_BATCH", None)
    if setter is None or batch is None:
        return
    try:
        setter(0, batch, os.sched_param(0))
    except OSError:
        pass
