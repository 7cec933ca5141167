"""Which conversations may have pending messages: what fail_pending looks at after a crash.
"""

from __future__ import annotations

from collections.abc import Iterable

from ...identity import ConversationKey
from .keys import LEGACY_PENDING, PENDING_BUCKETS, pending_bucket, pending_row
from .rows import Rows

SETTLED_FLAGS = 256  # flags of conversations seen without pending, cleared this many at a time


class PendingFlags:
    """Which conversations may have pending messages: what `fail_pending` looks at after a crash.

    The write that gives a conversation pending messages flags it (in one of PENDING_BUCKETS small
    rows, by its key's crc32), and the flag stays while the conversation is in use: a turn's two
    writes flag nothing once it is. A flagged conversation saved without pending is settled; the
    settled flags are cleared SETTLED_FLAGS at a time (and at close), so a crash leaves at most
    that many more to look at than had pending. A set written before the buckets (LEGACY_PENDING)
    is read as one more bucket. Used by the store's calls only (one at a time), inside the
    caller's transaction; a write that failed makes it read its rows again."""

    def __init__(self, store_rows: Rows) -> None:
        self._store_rows = store_rows
        self._rows: dict[str, set[tuple[str, str]]] | None = None  # row key -> its members
        self._where: dict[ConversationKey, str] = {}  # a flagged conversation -> its row
        self._settled: set[ConversationKey] = set()

    def _loaded(self) -> dict[str, set[tuple[str, str]]]:
        if self._rows is None:
            rows = {}
            for row_key in (LEGACY_PENDING, *map(pending_row, range(PENDING_BUCKETS))):
                members = self._store_rows.get(row_key)
                if members:
                    rows[row_key] = set(members)
            self._rows = rows
            self._where = {ConversationKey(*m): row_key for row_key, members in rows.items() for m in members}
        return self._rows

    def flagged(self) -> list[ConversationKey]:
        self._loaded()
        return sorted(self._where, key=lambda k: (k.tenant, k.id))

    def saw(self, key: ConversationKey, has_pending: bool) -> None:
        """A save of `key`: flag it if it has pending messages; else its flag may go."""
        rows = self._loaded()
        if has_pending:
            self._settled.discard(key)
            if key not in self._where:
                row_key = self._where[key] = pending_bucket(key)
                rows.setdefault(row_key, set()).add((key.tenant, key.id))
                self._write(row_key)
        elif key in self._where:
            self._settled.add(key)
            if len(self._settled) >= SETTLED_FLAGS:
                self.sweep()

    def settle(self, keys: Iterable[ConversationKey]) -> None:
        """These were found without pending messages: their flags go with the next sweep."""
        self._settled.update(k for k in keys if k in self._where)

    @property
    def any_settled(self) -> bool:
        return bool(self._settled)

    def sweep(self) -> None:
        """Clear the flags of the settled conversations."""
        if self._settled:
            self.drop(self._settled)
            self._settled = set()

    def drop(self, keys: Iterable[ConversationKey]) -> None:
        """Clear these conversations' flags now."""
        rows = self._loaded()
        touched = set()
        for key in list(keys):
            row_key = self._where.pop(key, None)
            if row_key is not None:
                rows[row_key].discard((key.tenant, key.id))
                touched.add(row_key)
            self._settled.discard(key)
        for row_key in touched:
            self._write(row_key)

    def forget(self) -> None:
        """A write failed (rolled back): what is held may be ahead of the rows."""
        self._rows, self._where, self._settled = None, {}, set()

    def _write(self, row_key: str) -> None:
        assert self._rows is not None
        members = self._rows[row_key]
        if members:
            self._store_rows.set(row_key, members)
        else:
            self._store_rows.delete(row_key)
            del self._rows[row_key]
