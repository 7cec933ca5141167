"""A stream relay run over a stream's bytes as the exchange runs one round, with its text frames
(proxy/upstream/frames.py) and as before them: what each gave, to compare."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def network_reads(rng: random.Random, data: bytes) -> list[bytes]:
    """`data` cut as a network might: an event a read, several, an event in pieces."""
    out, at = [], 0
    while at < len(data):
        end = data.find(b"\n\n", at)
        step = max(1, rng.choice([end + 2 - at if end >= 0 else 5, 5, 200]))
        out.append(data[at : at + step])
        at += step
    return out


@dataclass
class Relayed:
    out: list[bytes]  # what each read gave the client, then the release and the closing
    reply: tuple[Any, ...]  # the round's reply: its items, its id, our calls' and the client's names
    seen: list[Any]
    usage: Any
    framed: bool  # a frame was learned

    def same_as(self, other: Relayed) -> bool:
        return (self.out, self.reply, self.seen, self.usage) == (other.out, other.reply, other.seen, other.usage)


def relayed(make: Callable[[], Any], chunks: list[bytes], ours: frozenset[str], frames: bool = True) -> Relayed:
    relay = make()
    if not frames:
        relay._frames_left = 0  # the relay as before frames: every event parsed
    relay.begin_round(ours)
    out = [relay.feed(c) for c in chunks]
    end = relay.end_round()
    out += [relay.release(), relay.closing()]
    reply = (end.reply.items, end.reply.response_id, [c.name for c in end.ours], [c.name for c in end.theirs])
    return Relayed(out, reply, relay.seen(), relay.usage, relay._frame is not None)


def with_and_without_frames(make: Callable[[], Any], chunks: list[bytes], ours: frozenset[str]) -> tuple[Relayed, Relayed]:
    """The relay with its frames and without, over the same reads; asserted to give the same."""
    fast, slow = relayed(make, chunks, ours), relayed(make, chunks, ours, frames=False)
    assert fast.same_as(slow), (fast, slow)
    return fast, slow
