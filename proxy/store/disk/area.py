"""What each area of the diskcache store is a part of."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from .rows import Rows


class DiskArea:
    """What an area of the store (inbox.py, knowledge.py, request_parts.py) runs with: DiskStore's
    rows and its thread (store.py), which it is a part of: a reading call goes through `_run`, a
    writing one through `_write` (its outcome is the store's health)."""

    _rows: Rows
    _run: Callable[..., Awaitable[Any]]
    _write: Callable[..., Awaitable[Any]]
