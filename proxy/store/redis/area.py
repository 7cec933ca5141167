"""What each area of the Redis store is a part of."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis

from ...identity import ConversationKey


class RedisArea:
    """What an area of the store (inbox.py, knowledge.py, request_parts.py) runs with: RedisStore's
    client and keys (store.py), which it is a part of."""

    _redis: aioredis.Redis
    _prefix: str
    _conv: Callable[[ConversationKey, str], str]
    _global: Callable[[str], str]
    _keys: Callable[[ConversationKey], list[str]]
    _args: Callable[..., list[Any]]
