"""Clients' activity, for the housekeeping that only has work once clients sent something.

An idle proxy should not wake up: on this project's VM each wake-up of an idle core was charged
~2.5 ms of CPU (a bare `time.sleep(1)` loop: 2.5 ms/s), so the connection sweep (once a second)
and the malloc trimmer (four times a second) cost an idle proxy ~36 ms of CPU a second, and the
turns of an agent that pauses between them paid for those wake-ups. The trimmer, lightly loaded
or quiet, waits here instead, and the connection tracker pokes on every new connection and every
request's first byte (an attribute test when no one waits). The sweep keeps deadlines of its own
(connections.py: it sleeps until the earliest).
"""

from __future__ import annotations

import asyncio


class Activity:
    """`await wait()` returns at the next `poke()` (every waiter at once)."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None  # only while someone waits

    def poke(self) -> None:
        event = self._event
        if event is not None:
            self._event = None
            event.set()

    async def wait(self) -> None:
        if self._event is None:
            self._event = asyncio.Event()
        await self._event.wait()
