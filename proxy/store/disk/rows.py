"""The embedded store's rows: a table of our own in diskcache's SQLite file.

diskcache stays the embedded store's database (its file, connection, WAL mode and pragmas), but
its `Cache.set` does far more than a store row needs: a SELECT, an INSERT or UPDATE, its Settings
triggers (count, size) and eviction upkeep — about three statements and two pickles a row, 14
statements for a later turn's five rows in two transactions. Here a row is a pickled value (or
bytes as they are) in a table keyed by text, on diskcache's own connection, and a write is one
statement: inside `transact()` the rows set and deleted are held (reads see them) and written
when it ends, all in one `INSERT OR REPLACE` (a statement alone is its own transaction: no BEGIN,
no COMMIT to send) — or, with deletes too or more rows than one statement takes, in one
BEGIN ... COMMIT. A write that raises writes nothing. A rowid table, not WITHOUT ROWID: rows are
KBs, and a B-tree holding whole rows made a 2,000-message first turn 1.3x dearer than diskcache.
Measured with `python -m bench.store_turn` (docs/performance.md has the figures).

A store written before this table (its rows in diskcache's Cache table) is moved into it when
opened, in one transaction; diskcache's table is emptied after.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import diskcache

log = logging.getLogger("proxy.store.disk")

TABLE = "context_proxy_rows"
_GET = f"SELECT value, raw FROM {TABLE} WHERE key = ?"
_HAS = f"SELECT 1 FROM {TABLE} WHERE key = ?"
_SET = f"INSERT INTO {TABLE} (key, value, raw) VALUES "
# An existing row is updated where it stands (its rowid and its index entry kept): INSERT OR
# REPLACE deletes it and inserts it anew at the table's end, which touched both leaves, the
# key's index and the freelist, each page of them a WAL frame and then a checkpoint's write.
_UPSERT = " ON CONFLICT (key) DO UPDATE SET value = excluded.value, raw = excluded.raw"
_DELETE = f"DELETE FROM {TABLE} WHERE key IN "
_KEYS = f"SELECT key FROM {TABLE} ORDER BY key"
PROTOCOL = pickle.HIGHEST_PROTOCOL
PER_STATEMENT = 300  # rows (three variables each) per statement: far below SQLite's variable limit
_GONE = object()  # a row deleted in the write under way
# How a row's value is kept: pickled, or as the bytes it is (a part's pickled messages: not copied again).
PICKLED, RAW = 0, 1


class Rows:
    """Pickled values by text key, in our table of `cache`'s database; the subset of diskcache's
    `Cache` API the store uses (`get`, `set`, `delete`, `incr`, `transact`, `iterkeys`)."""

    def __init__(self, cache: diskcache.Cache) -> None:
        self._cache = cache
        self._local = threading.local()  # each thread's connection, as diskcache hands them out
        self._on_connect: Callable[[sqlite3.Connection], None] | None = None
        # The write under way (the store's calls only, one at a time: the one writer): key -> (value, raw) or _GONE.
        self._held: dict[str, Any] | None = None
        self.commits = 0  # writes made, each one transaction (what a turn costs the disk, for tests)
        self._con.execute(f"CREATE TABLE IF NOT EXISTS {TABLE} "
                         "(key TEXT PRIMARY KEY, value BLOB NOT NULL, raw INTEGER NOT NULL)")
        self._move_cache_rows()

    @property
    def _con(self) -> sqlite3.Connection:
        con = getattr(self._local, "con", None)
        if con is None:
            con = self._local.con = self._cache._con  # diskcache's connection for this thread
            if self._on_connect is not None:
                self._on_connect(con)
        return con

    def on_connect(self, setup: Callable[[sqlite3.Connection], None]) -> None:
        """`setup(connection)` for each thread's connection: this one's now, the others' when made."""
        self._on_connect = setup
        setup(self._con)

    @property
    def connection(self) -> sqlite3.Connection:
        """This thread's connection (diskcache's): for pragmas and checkpoints."""
        return self._con

    @contextmanager
    def transact(self) -> Iterator[None]:
        """One write: what is set and deleted inside is written at the end, at once (nested: by
        the outermost); nothing of it if it raises (nested: the outer write goes on without it)."""
        if self._held is not None:
            before = dict(self._held)
            try:
                yield
            except BaseException:
                self._held.clear()
                self._held.update(before)
                raise
            return
        self._held = {}
        try:
            yield
            held = self._held
        finally:
            self._held = None
        self._write(held)

    def committed(self, key: str) -> bool:
        """Whether `key` has a row as last committed: any thread, on its own connection (a WAL
        reader waits for no writer), never the write under way (the store's calls' alone)."""
        return self._con.execute(_HAS, (key,)).fetchone() is not None

    def get(self, key: str, default: Any = None) -> Any:
        if self._held is not None and key in self._held:
            row = self._held[key]
            if row is _GONE:
                return default
        else:
            row = self._con.execute(_GET, (key,)).fetchone()
            if row is None:
                return default
        value, raw = row
        return value if raw == RAW else pickle.loads(value)

    def set(self, key: str, value: Any) -> None:
        row = (value, RAW) if type(value) is bytes else (pickle.dumps(value, PROTOCOL), PICKLED)
        if self._held is not None:
            self._held[key] = row
        else:
            self._write({key: row})

    def delete(self, key: str) -> None:
        if self._held is not None:
            self._held[key] = _GONE
        else:
            self._write({key: _GONE})

    def _write(self, held: dict[str, Any]) -> None:
        sets = [(key, *row) for key, row in held.items() if row is not _GONE]
        gone = [key for key, row in held.items() if row is _GONE]
        statements = [
            *(_SET + ",".join(["(?, ?, ?)"] * len(chunk)) + _UPSERT for chunk in _chunks(sets)),
            *(_DELETE + "(" + ",".join(["?"] * len(chunk)) + ")" for chunk in _chunks(gone)),
        ]
        values = [*([v for row in chunk for v in row] for chunk in _chunks(sets)), *_chunks(gone)]
        con = self._con
        self.commits += bool(statements)
        if len(statements) == 1:
            con.execute(statements[0], values[0])  # its own transaction
        elif statements:
            con.execute("BEGIN IMMEDIATE")
            try:
                for statement, args in zip(statements, values):
                    con.execute(statement, args)
                con.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):  # SQLite may have rolled back already
                    con.execute("ROLLBACK")
                raise

    def incr(self, key: str, delta: int = 1, default: int = 0) -> int:
        """The counter at `key` plus `delta` (`default` plus `delta` for a new one), stored."""
        with self.transact():
            value = self.get(key, default) + delta
            self.set(key, value)
        return value

    def iterkeys(self) -> Iterator[str]:
        """Every key, in order (read whole first: the caller may write while it goes)."""
        keys = {key for (key,) in self._con.execute(_KEYS).fetchall()}
        if self._held:
            keys |= {key for key, row in self._held.items() if row is not _GONE}
            keys -= {key for key, row in self._held.items() if row is _GONE}
        return iter(sorted(keys))

    def close(self) -> None:
        self._local = threading.local()
        self._cache.close()

    def _move_cache_rows(self) -> None:
        """Rows a store wrote through `Cache.set` (before this table) move here, once."""
        if not len(self._cache):
            return
        moved = 0
        with self.transact():
            for key in list(self._cache.iterkeys()):
                if isinstance(key, str):
                    self.set(key, self._cache.get(key))
                    moved += 1
        self._cache.clear()  # after the commit: the rows are in our table by then
        log.info("store rows moved into table %s: %d", TABLE, moved)


def _chunks(rows: list[Any]) -> list[list[Any]]:
    return [rows[i:i + PER_STATEMENT] for i in range(0, len(rows), PER_STATEMENT)]
