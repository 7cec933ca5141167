"""What every call of the Redis store goes through: Redis's failures as the store's errors (a
write's outcome kept as the store's health), and the JSON its values are written in."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..base import StoreError, StoreFull, StoreReadOnly, StoreUnavailable

log = logging.getLogger("proxy.store.redis")

P = ParamSpec("P")
T = TypeVar("T")


@contextmanager
def available() -> Iterator[None]:
    # The cause (host, errno, Redis's words) goes to the logs via the chain, not to the client.
    try:
        yield
    except (RedisConnectionError, RedisTimeoutError) as exc:
        raise StoreUnavailable("The conversation store is unavailable; try again shortly.") from exc
    except OutOfMemoryError as exc:
        raise StoreFull(
            "The conversation store is out of memory: nothing was stored. Delete conversations, or raise "
            "Redis's maxmemory, and retry."
        ) from exc
    except ReadOnlyError as exc:
        raise StoreReadOnly("The conversation store is a read-only replica: nothing was stored.") from exc
    except ResponseError as exc:
        if str(exc).startswith("MISCONF"):  # it cannot save its snapshots (often: its disk is full)
            raise StoreReadOnly("The conversation store refuses writes (it cannot persist): nothing was stored.") from exc
        raise


def raise_if_cancelled(task: asyncio.Task[Any] | None) -> None:
    """Raise the cancellation a Redis call swallowed: a cancel that lands in redis-py's read can
    end as the call's reply (about one in a hundred short timeouts on a lock wait, measured), and
    a waiter whose cancellation is lost polls on, while its holder may be waiting for it."""
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def guarded(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Redis's failures as StoreErrors; a write's outcome (a method named in WRITES) is the store's health."""
    writes = fn.__name__ in WRITES

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        store = args[0]
        try:
            with available():
                result = await fn(*args, **kwargs)
        except StoreError as exc:
            if writes and not isinstance(exc, StoreUnavailable):
                store._health.failed(exc)  # type: ignore[attr-defined]
                log.warning("store write failed: %s", exc.message, exc_info=exc.__cause__)
            raise
        if writes:
            store._health.succeeded()  # type: ignore[attr-defined]
        return result

    return wrapper


# (Not delete: it works on a full store by design, so its success says nothing of writes.)
WRITES = frozenset(
    {"append", "set_statuses", "finish_turn", "count_llm_call", "mark_forwarded", "set_rewrites", "add_summary",
     "fail_pending", "secret", "_take_lock", "set_marks", "set_title", "post_inbox", "deliver_inbox", "put_knowledge"}
)


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
