"""Work per request, bounded: how many messages a request may carry, and where the work that
grows with a body's size runs.

A 32 MB body costs a second or more of pure-Python work (parsing, validating, hashing each
message): on the event loop, nobody else would be served meanwhile, `/healthz` included. Past
OFFLOAD_BYTES that work runs in a thread, so the loop keeps answering (the GIL is shared, but
handed over every few milliseconds). Below it a thread hop would cost more than the work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import orjson

from .errors import BodyTooLarge

T = TypeVar("T")

OFFLOAD_BYTES = 1024 * 1024


class TooManyMessages(BodyTooLarge):
    code = "too_many_messages"


def check_message_count(items: Sequence[Any], max_messages: int, param: str = "messages") -> None:
    """413 when a request's transcript (`param`: messages, input, ...) has more than
    `max_messages` (server.max_messages) items: each costs work on every turn, and no real agent
    sends that many (Anthropic refuses 100,000 messages)."""
    if len(items) > max_messages:
        raise TooManyMessages(
            f"'{param}' has {len(items)} items; at most {max_messages} are accepted (server.max_messages)",
            param=param,
        )


async def parse_json(raw: bytes, max_messages: int) -> Any:
    """`orjson.loads(raw)` for a request body, off the loop past OFFLOAD_BYTES. orjson holds the
    GIL while it parses (a 20 MB body of 400,000 tiny messages: ~0.6 s in which the loop can't
    run either), so a body that plainly holds too many messages is refused before parsing: every
    message has a "role" key (and inside a JSON string a quote is escaped, so the bytes `"role"`
    are a key), and one with more than twice the cap in role keys is a 413 unparsed."""
    if len(raw) > OFFLOAD_BYTES and raw.count(b'"role"') > 2 * max_messages + 100:
        raise TooManyMessages(f"The request has far more than {max_messages} messages (server.max_messages)")
    return await off_loop(len(raw), orjson.loads, raw)


async def off_loop(size: int, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)`, in a thread when `size` (the bytes the work is proportional to) is over
    OFFLOAD_BYTES, else right here."""
    if size > OFFLOAD_BYTES:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)


async def validated_hashes(
    validate: Callable[[Sequence[Any], int], None], hash_: Callable[[Any], str], items: Sequence[Any], start: int,
    size: int,
) -> list[str]:
    """`validate(items, start)`, then the hash of each of `items[start:]` (a dialect's check and
    its codec's hash), off the loop for a large body (`size` bytes)."""
    return await off_loop(size, _validate_and_hash, validate, hash_, items, start)


def _validate_and_hash(
    validate: Callable[[Sequence[Any], int], None], hash_: Callable[[Any], str], items: Sequence[Any], start: int
) -> list[str]:
    validate(items, start)
    return [hash_(item) for item in items[start:]]
