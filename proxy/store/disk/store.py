"""The embedded store: one SQLite database in one directory (diskcache's), for one proxy process.

SQLite is synchronous, so the store's calls run on one dedicated thread, one at a time: the
event loop does not wait on a big one, and one writer at a time means no lock contention between
our own operations. Each call is one hop to that thread (worker.py) and one write of the rows it
changed (one statement, usually: see rows.py, a table of ours in diskcache's database, which
writes a row for a fraction of what `Cache.set` costs) — except a small write (a later turn's
new observation, its end, a quota count: `_small`), which runs in place of the thread when the
thread has nothing to do: its commit costs less than the hop's two wake-ups, and the calls still
run one at a time, in order. SQLite's checkpoints run on a thread of their own (checkpoints.py). Since this process is the store's only writer, it keeps the latest snapshot of
recent conversation records in memory: `get()`, called on every turn, usually needs no hop at all.

Nothing is ever evicted or culled: this is a database, not a cache.

A later turn's new items are staged (`stage`): added to the conversation's record held in
memory, read by every call from then on, and written with the record's next write — its turn's
end, when its reply came whole, so the turn is one commit — or by `flush`, before a streamed
reply's first byte. A conversation not held in memory, a large write, or a disk short of room
(STAGE_ROOM) writes them at once; a failing write drops what was staged (the turns' ends then
fail, their replies still go out).

Layout: one row per key; a conversation's rows are named by its tenant and id. A turn's writes
cost what the turn adds, whatever the conversation holds:
- conv: the conversation record: its small fields (times, counters, marks, what the list shows,
  the seqs still pending) and the newest chunk of its index.
- chunk n: the index of seqs [n * INDEX_CHUNK, (n + 1) * INDEX_CHUNK) (CHUNK_BEFORE in a record
  written before its size was kept in it): the live ones with their
  hashes, first-forwarded marks, rewritten seqs, and the batches that start there. The newest
  chunk rides in the record; an older one has a row of its own, rewritten only when one of its
  messages changes. The store thread holds recent conversations' whole index in memory.
- batch s: the messages one write added, from seq s on (an append's items; a turn's reply joins
  its turn's items, whose statuses the turn's end rewrites anyway), with their hashes, statuses
  and times, at most BATCH_MAX of them. A status change rewrites the batches it touches; the
  batch of a turn still pending stays in memory, so the turn's end does not read it back.
- part s: the messages of a write, from seq s on, when pickled they pass INLINE_PART bytes (a
  first turn's transcript, a long tool output): written once, so that a status change rewrites
  their small batch row, not them.
- msg s: a message written before batches existed, one row each (the seqs below the record's
  `legacy`): still read and changed in place, and such a conversation goes on in batches.
- rewrite s, turn n, summary n, inbox n, response id, knowledge, index pages: one row each.
- pending n: the conversations that may have pending messages, in PENDING_BUCKETS small sets
  (see _PendingFlags): what fail_pending looks at after a crash.

Faults: a full disk, a read-only filesystem or file, or a broken database raise StoreFull,
StoreReadOnly or StoreUnavailable (OpenAI-shaped 507/503), never sqlite3's or the OS's own
error; the latest write's outcome is what `health()` reports. SQLite needs room even to delete
(its journal), so a reserve file of `storage.reserve_mb` is kept beside the database and let go
when a delete finds the disk full; it is made again once there is room. On a small disk it is at
most RESERVE_SHARE of it (else it could never be made there, and a full store could not delete). Transcripts and the ref
secret are private: the folder is 0700, every file 0600.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import sqlite3
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import diskcache

from ...config import ConfigError
from ...identity import ConversationKey
from ...transcript import Raw
from ..base import (
    FAILED,
    INBOX_DELIVERED,
    LIVE,
    PENDING,
    Conversation,
    ConversationDump,
    ConversationExists,
    StoredMessage,
    StoreError,
    StoreFull,
    StoreHealth,
    Summary,
    TurnFacts,
    TurnRecord,
    WriteHealth,
    check_statuses,
    failed_health,
    now,
    imported_turn_row,
    turn_row_read,
)
from ..search import DEFAULT_HITS, HistoryIndexes, SearchHit
from .checkpoints import Checkpointer
from .faults import LOW_SPACE, MB, PRIVATE_DIR, RESERVE_FILE, Reserve, make_private, missing_row, store_error
from .held import Held
from .inbox import DiskInbox, inbox_record
from .keys import (
    ALL_TENANTS,
    CREATED,
    FAILED_SCOPE,
    INDEX_PAGE,
    PROBE,
    SECRET,
    TENANTS,
    batch_key,
    chunk_key,
    conv_key,
    inbox_key,
    index_page,
    msg_key,
    part_key,
    request_part_key,
    request_parts_key,
    response_key,
    rewrite_key,
    summary_key,
    turn_key,
)
from .knowledge import DiskKnowledge
from .pending import PendingFlags
from .records import BATCH_MAX, Batch, Record, snapshot_of
from .request_parts import DiskRequestParts
from .rows import Rows
from .worker import StoreThread

log = logging.getLogger("proxy.store.disk")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a store call runs: `in_place` on the caller's thread if the store thread has nothing to
    do; else on the store thread, `together` with the calls so marked waiting beside it there."""

    in_place: bool = False
    together: bool = False


ON_THREAD = Placement()
# A write this small runs in place of the store thread when it has nothing to do (see _small):
# a commit of a few KB costs less than the hop's two wake-ups.
INLINE_ITEMS = 4
INLINE_CHARS = 32_000
INLINE_DEPTH = 8
# ... and while fewer than this many other conversations have a turn under way (its items staged,
# its end to come). Past it the thread is cheaper: with the loop saturated, the writes handed over
# run one after another behind it instead of between its own work. CPU a turn, in place against
# handed over (`bench.turn_cpu --derived --concurrency N`): one at a time 1.62 / 1.72 ms (bench.run),
# 2 clients 1.36 / 1.50, 4 1.35 / 1.30, 8 1.36 / 1.24, 16 1.30 / 1.13.
INLINE_BESIDE = 3
# A turn's new items wait for its end's write (`stage`) only with this much room on the disk, on a
# store whose last write worked: short of it they are written at once, so that a full or read-only
# disk is still a 507/503 before anything is forwarded (the WAL grows ~6 MB between checkpoints).
STAGE_ROOM = 16 * MB
MAX_SNAPSHOTS = 1024  # conversation records kept in memory (the active ones)
MAX_RECORDS = 256  # of those, the stored form kept for the next write (with their whole index)
# Index pages kept as last written (the store thread's): registering a conversation rewrote the
# newest page of its tenant's index and of the all-tenants one after reading them back, and a
# full page (1,000 conversations) took ~0.2 ms to unpickle; the newest ones are all a turn needs.
MAX_PAGES = 8


def open_cache(path: str) -> diskcache.Cache:
    """diskcache's database, whose connection and pragmas our rows use (see rows.py)."""
    return diskcache.Cache(
        path,
        eviction_policy="none",  # never drop a stored message (our table is not diskcache's: belt and braces)
        cull_limit=0,
        size_limit=2**62,
        statistics=False,
        sqlite_mmap_size=0,  # reads through SQLite's own cache: no 64 MB map in our resident set
        sqlite_cache_size=2**9,  # pages (2 MB): the pages a turn touches (the B-tree's upper levels, the newest rows) fit
    )


class DiskStore(DiskInbox, DiskKnowledge, DiskRequestParts):
    """The embedded backend: conversations and their items here; the inbox, knowledge and request
    parts in modules of their own (inbox.py, knowledge.py, request_parts.py), run the same way."""

    def __init__(self, path: str | Path, reserve_bytes: int = 0) -> None:
        self._path = Path(path)
        try:
            self._path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
            self._rows = Rows(open_cache(str(path)))
        except (sqlite3.Error, OSError) as exc:  # e.g. a read-only filesystem: SQLite's WAL can't open there
            raise ConfigError(f"storage.path: cannot open the store in {path}: {exc}") from exc
        make_private(self._path)  # also a store made before files were private
        self._reserve = Reserve(self._path / RESERVE_FILE, reserve_bytes)
        self._reserve.make()
        self._health = WriteHealth()
        self._snapshots: Held[Conversation] = Held(MAX_SNAPSHOTS)  # written by the store's calls only (one at a time)
        # The latest saved record of recent conversations, with their whole index (the store's calls
        # only): a turn's write updates it instead of reading it again. Safe because this process
        # is the store's only writer.
        self._records: Held[Record] = Held(MAX_RECORDS)
        # Records holding items a turn staged (`stage`), not yet written: kept here, out of
        # `_records`' reach (a record pushed out would take them along), until their next write.
        self._staged: dict[ConversationKey, Record] = {}
        self._pages: OrderedDict[str, dict[int, Any]] = OrderedDict()  # index pages as last written (the store's calls)
        self._tenants: set[str] | None = None  # the TENANTS row as last written (the store's calls)
        self._pending = PendingFlags(self._rows)
        # SQLite's checkpoints in a thread of their own (see checkpoints.py); the connections that
        # write (the store thread's, the loop's for small writes) are made to leave them to it.
        self._checkpoints = Checkpointer(os.path.join(path, diskcache.core.DBNAME))
        self._rows.on_connect(self._checkpoints.writer)  # every thread's: the store thread's, the loop's
        # Calls that queue while it is busy are written together, each alone inside (worker.py).
        self._thread = StoreThread("diskstore", together=self._together, alone=self._rows.transact)
        self._locks: weakref.WeakValueDictionary[ConversationKey, asyncio.Lock] = weakref.WeakValueDictionary()
        self._leases: dict[str, tuple[str, float]] = {}  # name -> (token, monotonic expiry)
        self._search = HistoryIndexes()  # history search: built from the log, see search.py

    async def _run(self, fn: Callable[..., T], *args: Any, place: Placement = ON_THREAD) -> T:
        """`fn(*args)` on the store thread, or where `place` says (worker.py: a hop's wake-ups
        cost more than a small write's commit; writes waiting there together are one commit)."""
        try:
            if place.in_place:
                ran, result = self._thread.inline(fn, *args)
                if ran:
                    return result  # type: ignore[return-value]
            return await self._thread.run(fn, *args, together=place.together)
        except (sqlite3.Error, OSError, diskcache.Timeout) as exc:
            raise store_error(exc, self._path) from exc

    async def _write(self, fn: Callable[..., T], *args: Any, telling: bool = True, place: Placement = ON_THREAD) -> T:
        """`_run` for an operation that writes: its outcome is the store's health (a success only
        if `telling`: a delete works on a full disk by design, so it says nothing of writes)."""
        try:
            result = await self._run(self._written, fn, *args, place=place)
        except StoreError as exc:
            self._health.failed(exc)
            log.warning("store write failed: %s", exc.message, exc_info=exc.__cause__)
            raise
        if telling:
            self._health.succeeded()
        return result

    def _written(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            result = fn(*args)
        except BaseException:
            self._forget_held()
            raise
        if not self._reserve.held:  # let go of for a delete: made again once there is room
            self._reserve.make()
        self._checkpoints.wrote()
        return result

    def _forget_held(self) -> None:
        """A write failed: its transaction was rolled back, but what is held in memory may have
        been changed in it. Staged items go too: never written, they are lost with the store's
        failure, which the turns that staged them are told of at their end (a failing store
        fails them all). What is left is read from the rows again."""
        self._snapshots.clear()
        self._records.clear()
        self._staged.clear()
        self._pages.clear()
        self._tenants = None
        self._pending.forget()

    @contextmanager
    def _together(self) -> Iterator[None]:
        """The store thread's calls that waited while it was busy, written as one (group commit:
        one statement or transaction for several turns' rows, where each would commit its own);
        if that write fails, so does each of them, and memory is read from the rows again."""
        try:
            with self._rows.transact():
                yield
        except BaseException:
            self._forget_held()
            raise

    def _placed(self, key: ConversationKey, items: Sequence[Raw] = ()) -> Placement:
        """Where a write of `items` to `key` runs (`_run`): a small one in place of the store thread
        while few turns of other conversations are under way, else there, with the small writes
        waiting beside it (one commit); a big one on the store thread, alone."""
        small = self._small(key, items)
        return Placement(small and not self._crowded(key), small)

    def _staged_placed(self, key: ConversationKey) -> Placement:
        """`_placed` for what a turn stages, or makes durable, of items already judged small."""
        return Placement(not self._crowded(key), True)

    def _crowded(self, key: ConversationKey) -> bool:
        """Whether INLINE_BESIDE other conversations have a turn under way (items staged, their end
        to come): writes are cheaper on the store thread then. A hint read without the lock."""
        return len(self._staged) - (key in self._staged) >= INLINE_BESIDE

    def _small(self, key: ConversationKey, items: Sequence[Raw] = ()) -> bool:
        """Whether a write of `items` to `key` is small: its record held in memory (no index to
        read back) and a few messages of a few KB (a turn's reply, its new observation; not a
        first turn's transcript). Such a write may wait for the turn's end (`stage`) and run in
        place (`_placed`). A hint read without the store's lock: at worst a write that could
        have hopped runs in place."""
        if (key not in self._staged and self._records.get(key) is None) or len(items) > INLINE_ITEMS:
            return False
        left = INLINE_CHARS
        for item in items:
            left = _rough_left(item, left)
            if left < 0:
                return False
        return True

    def lock(self, key: ConversationKey) -> asyncio.Lock:
        """The conversation's lock itself (this process is the store's only writer): held by the
        `async with` that takes it, it stays in `_locks` while anyone holds or waits for it."""
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        return lock

    # -- conversations -------------------------------------------------------------------------

    async def get(self, key: ConversationKey) -> Conversation | None:
        snapshot = self._snapshots.get(key)
        if snapshot is not None:
            return snapshot
        # A conversation that does not exist is told on the loop, by one indexed read: a derived-id
        # agent's first turn asks before its turn (which run is it?), and a hop would wait behind
        # other turns' writes holding its parsed body (2.5 MB more at the peak of the bench's 16
        # first turns at once). One being made this moment reads as not yet made, as a hop queued
        # before its write would.
        try:
            made = self._rows.committed(conv_key(key))
        except (sqlite3.Error, OSError, diskcache.Timeout) as exc:
            raise store_error(exc, self._path) from exc
        return await self._run(self._get, key) if made else None

    def _get(self, key: ConversationKey) -> Conversation | None:
        record = self._load(key)
        return None if record is None else self._snapshot(key, record)

    def _current(self, key: ConversationKey) -> Conversation | None:
        """The snapshot, without reading anything when there is one (this process is the only writer)."""
        return self._snapshots.get(key) or self._get(key)

    def _load(self, key: ConversationKey) -> Record | None:
        """The conversation's record: as held in memory, else read with its index (and not kept:
        only a write keeps a record, so reading many does not push out the active ones)."""
        held = self._staged.get(key) or self._records.get(key)
        if held is not None:
            return held
        row = self._rows.get(conv_key(key))
        if row is None:
            return None
        return Record.stored(row, lambda number: self._rows.get(chunk_key(key, number)))

    def _fields(self, key: ConversationKey) -> dict[str, Any] | None:
        """The record's small fields alone (counters, order): no index chunk read."""
        held = self._staged.get(key) or self._records.get(key)
        return held.fields if held is not None else self._rows.get(conv_key(key))

    def _save(self, key: ConversationKey, record: Record) -> None:
        """Write what the write under way changed, inside its transaction: the batches it touched,
        the index chunks behind the newest that changed, the record with the newest chunk; then
        keep the record in memory for the next write, and its snapshot for `get` (a turn's end
        reads it after its first write: made here, it costs that `get` no hop)."""
        fields = record.fields
        for batch in record.unsaved.values():
            for first, blob in batch.unwritten.items():
                self._rows.set(part_key(key, first), blob)
            batch.unwritten.clear()
            legacy = batch.legacy is not None
            self._rows.set(msg_key(key, batch.first) if legacy else batch_key(key, batch.first), batch.row())
        tail = (fields["next_seq"] - 1) // record.chunk
        if tail != fields["tail"]:
            record.changed.add(fields["tail"])  # the chunk the record held: a row of its own from now on
            fields["tail"] = tail
        for number in record.changed:
            if number != tail:
                self._rows.set(chunk_key(key, number), record.chunk_row(number))
        self._rows.set(conv_key(key), record.row())
        self._pending.saw(key, bool(fields["pending"]))
        record.saved()
        self._staged.pop(key, None)
        self._snapshot(key, record)
        self._records.put(key, record, record.entries)

    def _snapshot(self, key: ConversationKey, record: Record) -> Conversation:
        conversation = snapshot_of(key, record)
        self._snapshots.put(key, conversation, record.entries)
        return conversation

    async def list_conversations(
        self, tenant: str | None, *, after: str | None = None, limit: int = 20, failed: bool = False
    ) -> tuple[list[Conversation], bool]:
        return await self._run(self._list, tenant, after, limit, failed)

    def _list(self, tenant: str | None, after: str | None, limit: int, failed: bool) -> tuple[list[Conversation], bool]:
        """Newest first, from the creation-order index pages, starting below the `after` conversation."""
        scope = tenant if tenant is not None else ALL_TENANTS
        index = FAILED_SCOPE + scope if failed else scope
        start = self._rows.get(CREATED, 0) + 1
        if after is not None:
            candidates = [ConversationKey(tenant, after)] if tenant is not None else [c.key for c in self._find(after)]
            orders = [fields["order"] for k in candidates if (fields := self._fields(k)) is not None]
            if not orders:
                return [], False
            start = max(orders)
        keys: list[ConversationKey] = []
        for page_no in range((start - 1) // INDEX_PAGE, -1, -1):
            page = self._page(index_page(index, page_no))
            for order in sorted((o for o in page if o < start), reverse=True):
                keys.append(_index_entry(scope, page[order]))
            if len(keys) > limit:
                break
        found = [c for k in keys[:limit] if (c := self._current(k)) is not None]
        return found, len(keys) > limit

    async def find(self, conversation_id: str) -> list[Conversation]:
        return await self._run(self._find, conversation_id)

    def _find(self, conversation_id: str) -> list[Conversation]:
        found = []
        for tenant in sorted(self._known_tenants()):
            conv = self._current(ConversationKey(tenant, conversation_id))
            if conv is not None:
                found.append(conv)
        return found

    async def delete(self, key: ConversationKey) -> bool:
        self._search.forget(key)
        try:
            return await self._write(self._delete, key, telling=False)
        except StoreFull:
            if not await self._run(self._reserve.release):
                raise
            log.warning("store full: released its reserve so that a delete can run")
            return await self._write(self._delete, key, telling=False)

    def _delete(self, key: ConversationKey) -> bool:
        with self._rows.transact():
            record = self._load(key)
            if record is None:
                return False
            fields = record.fields
            for seq in range(1, min(fields["legacy"], fields["next_seq"])):
                self._rows.delete(msg_key(key, seq))
            for first in record.starts():
                batch = self._batch_of(key, record, first)
                for part in batch.own_parts() if batch is not None else ():
                    self._rows.delete(part_key(key, part))
                self._rows.delete(batch_key(key, first))
            for number in range(fields["tail"]):
                self._rows.delete(chunk_key(key, number))
            for seq in record.rewritten():
                self._rows.delete(rewrite_key(key, seq))
            for summary_id in range(1, fields["summaries"] + 1):
                self._rows.delete(summary_key(key, summary_id))
            for message_id in range(1, fields["inbox"] + 1):
                self._rows.delete(inbox_key(key, message_id))
            for turn in range(1, fields["turns"] + 1):
                turn_record = self._rows.get(turn_key(key, turn))
                if isinstance(turn_record, dict) and turn_record.get("response_id"):
                    self._rows.delete(response_key(key.tenant, turn_record["response_id"]))
                self._rows.delete(turn_key(key, turn))
            self._delete_request_parts(key)
            self._rows.delete(conv_key(key))
            self._snapshots.pop(key)
            self._records.pop(key)
            self._staged.pop(key, None)
            self._pending.drop([key])
            scopes = (key.tenant, ALL_TENANTS)
            if fields.get("failures"):
                scopes += (FAILED_SCOPE + key.tenant, FAILED_SCOPE + ALL_TENANTS)
            for scope in scopes:
                page_key = index_page(scope, fields["order"] // INDEX_PAGE)
                page = self._page(page_key)
                page.pop(fields["order"], None)
                self._set_page(page_key, page)
            return True

    async def set_title(self, key: ConversationKey, title: str | None) -> Conversation | None:
        return await self._write(self._set_title, key, title)

    def _set_title(self, key: ConversationKey, title: str | None) -> Conversation | None:
        with self._rows.transact():
            record = self._load(key)
            if record is None:
                return None
            record.fields["title"] = title
            self._save(key, record)
            return snapshot_of(key, record)

    # -- messages ------------------------------------------------------------------------------

    async def append(self, key: ConversationKey, items: list[Raw], hashes: list[str], status: str) -> list[int]:
        check_statuses(status)
        return await self._write(self._append, key, items, hashes, status, place=self._placed(key, items))

    def _append(self, key: ConversationKey, items: list[Raw], hashes: list[str], status: str) -> list[int]:
        return self._update_record(key, lambda record: self._add_items(record, items, hashes, status))

    async def stage(self, key: ConversationKey, items: list[Raw], hashes: list[str], status: str) -> list[int]:
        # Held in memory when the conversation's record is (a later turn's few items), and the disk
        # has room; else written now, as `append`.
        if not self._small(key, items) or not self._room():
            return await self.append(key, items, hashes, status)
        check_statuses(status)
        return await self._write(self._stage, key, items, hashes, status, place=self._staged_placed(key))

    def _stage(self, key: ConversationKey, items: list[Raw], hashes: list[str], status: str) -> list[int]:
        record = self._staged.get(key) or self._records.get(key)
        if record is None:  # pushed out of memory since `_small` looked: written now
            return self._append(key, items, hashes, status)
        seqs = self._add_items(record, items, hashes, status)
        self._staged[key] = record
        self._snapshot(key, record)
        return seqs

    async def flush(self, key: ConversationKey) -> None:
        if key in self._staged:
            await self._write(self._flush, key, place=self._staged_placed(key))

    def _flush(self, key: ConversationKey) -> None:
        with self._rows.transact():
            record = self._staged.get(key)
            if record is not None:
                self._save(key, record)

    def _room(self) -> bool:
        """Whether the disk has room to wait with a write (STAGE_ROOM free, writable, the last write
        worked): a statvfs, microseconds."""
        if self._health.failure is not None:
            return False
        try:
            fs = os.statvfs(self._path)
        except OSError:
            return False
        return not fs.f_flag & os.ST_RDONLY and fs.f_bavail * fs.f_frsize >= STAGE_ROOM

    def _add_items(self, record: Record, items: list[Raw], hashes: list[str], status: str) -> list[int]:
        """Add items after the last one, in memory (`_save` writes them): a batch of their own,
        or the newest batch if this write already rewrites it (a turn's reply joins its items)."""
        if len(items) != len(hashes):
            raise ValueError("one hash per item")
        stamp = now()
        fields = record.fields
        first, count = fields["next_seq"], len(items)
        taken = 0
        newest = record.unsaved.get(record.last_start) if record.last_start is not None else None
        if newest is not None and newest.end == first:
            taken = min(count, BATCH_MAX - len(newest.hashes))
            if taken:
                newest.add(items[:taken], hashes[:taken], [status] * taken, [stamp] * taken)
        for start in range(taken, count, BATCH_MAX):
            size = min(BATCH_MAX, count - start)
            batch = Batch(first + start, [], [], [], [])
            batch.add(items[start:start + size], hashes[start:start + size], [status] * size, [stamp] * size)
            record.new_batch(batch.first)
            record.unsaved[batch.first] = batch
        seqs = list(range(first, first + count))
        if status == LIVE and seqs:
            record.extend_live(first, hashes)
        if status == PENDING and seqs:
            fields["pending"] = [*fields["pending"], *seqs]
        fields["next_seq"] += count
        fields["updated_at"] = stamp
        return seqs

    def _batch_of(self, key: ConversationKey, record: Record, seq: int, *, keep: bool = False) -> Batch | None:
        """The batch holding message `seq` (None if there is none): the one this write changed, the
        pending one held in memory, else read. `keep`: the caller changes it, `_save` writes it."""
        first = record.first_of(seq)
        if first is None:
            return None
        batch = record.unsaved.get(first)
        if batch is None:
            held = record.pending_batch
            if held is not None and held.first == first:
                batch = held
            else:
                row = self._rows.get(msg_key(key, first) if first < record.fields["legacy"] else batch_key(key, first))
                if row is None:
                    return None
                batch = Batch.of_row(first, row)
            if keep:
                record.unsaved[first] = batch
        return batch

    def _status(self, key: ConversationKey, record: Record, seq: int) -> str | None:
        batch = self._batch_of(key, record, seq)
        return None if batch is None else batch.statuses[seq - batch.first]

    def _read(self, key: ConversationKey, record: Record, seqs: Sequence[int]) -> list[StoredMessage]:
        """The messages `seqs` (ascending), each batch read once."""
        out: list[StoredMessage] = []
        batch: Batch | None = None
        messages: list[Raw] = []
        for seq in seqs:
            if batch is None or not batch.first <= seq < batch.end:
                batch = self._batch_of(key, record, seq)
                if batch is None:
                    raise missing_row(key, seq)
                messages = batch.messages(self._part_reader(key))
            i = seq - batch.first
            out.append(StoredMessage(seq, messages[i], batch.hashes[i], batch.statuses[i], batch.stamps[i]))
        return out

    def _register(self, key: ConversationKey, record: Record) -> Record:
        """Index a new conversation: by a counter, not a timestamp, so that two made in the same
        microsecond still list in order; one index page per 1,000 conversations is rewritten."""
        record.fields["order"] = self._rows.incr(CREATED, default=0)
        self._index(key, record.fields["order"], key.tenant, ALL_TENANTS)
        tenants = self._known_tenants()
        if key.tenant not in tenants:
            self._tenants = tenants | {key.tenant}
            self._rows.set(TENANTS, self._tenants)
        return record

    def _index(self, key: ConversationKey, order: int, tenant_scope: str, all_scope: str) -> None:
        """List the conversation, at its creation order, in a tenant's index and the all-tenants one."""
        for scope, entry in ((tenant_scope, key.id), (all_scope, (key.tenant, key.id))):
            page_key = index_page(scope, order // INDEX_PAGE)
            page = self._page(page_key)
            page[order] = entry
            self._set_page(page_key, page)

    def _page(self, page_key: str) -> dict[int, Any]:
        """An index page as stored (empty if there is none): the one held if it is, else read.
        The caller changes it only to write it back (`_set_page`) in the same transaction."""
        page = self._pages.get(page_key)
        if page is not None:
            self._pages.move_to_end(page_key)
            return page
        return self._rows.get(page_key) or {}

    def _set_page(self, page_key: str, page: dict[int, Any]) -> None:
        self._rows.set(page_key, page)
        self._pages[page_key] = page
        self._pages.move_to_end(page_key)
        while len(self._pages) > MAX_PAGES:
            self._pages.popitem(last=False)

    def _known_tenants(self) -> set[str]:
        """The tenants that have conversations (the TENANTS row): held once read."""
        if self._tenants is None:
            self._tenants = set(self._rows.get(TENANTS, set()))
        return self._tenants

    async def set_statuses(self, key: ConversationKey, changes: Mapping[int, str]) -> None:
        check_statuses(*changes.values())
        if changes:
            await self._write(self._set_statuses, key, dict(changes))

    def _set_statuses(self, key: ConversationKey, changes: dict[int, str]) -> None:
        with self._rows.transact():
            record = self._load(key)
            if record is None:
                raise KeyError(str(key))
            self._change_statuses(key, record, changes)
            self._save(key, record)

    def _change_statuses(self, key: ConversationKey, record: Record, changes: dict[int, str]) -> None:
        """Set message statuses in their batches and keep the live index in step, in memory."""
        found: list[tuple[Batch, list[int]]] = []  # each batch touched, with its seqs
        end = 0
        for seq in sorted(changes):  # every one found before anything is changed
            if not found or not found[-1][0].first <= seq < end:
                batch = self._batch_of(key, record, seq, keep=True)
                if batch is None:
                    raise KeyError(f"{key}: no message {seq}")  # _written drops what this write held
                found.append((batch, []))
                end = batch.end
            found[-1][1].append(seq)
        live, other = [], []
        for batch, seqs in found:
            for seq in seqs:
                i = seq - batch.first
                batch.statuses[i] = status = changes[seq]
                if status == LIVE:
                    live.append((seq, batch.hashes[i]))
                else:
                    other.append(seq)
        record.drop_live(other)
        record.add_live(live)
        fields = record.fields
        fields["updated_at"] = now()
        if fields["pending"]:
            fields["pending"] = [seq for seq in fields["pending"] if changes.get(seq, PENDING) == PENDING]

    async def finish_turn(
        self,
        key: ConversationKey,
        changes: Mapping[int, str],
        reply: Sequence[tuple[Raw, str]],
        reply_status: str,
        record: TurnRecord | None,
        *,
        llm_calls: int = 0,
        forwarded: Mapping[int, int] | None = None,
        marks: Mapping[str, int] | None = None,
    ) -> int | None:
        check_statuses(*changes.values(), *([reply_status] if reply else []))
        return await self._write(
            self._finish_turn, key, dict(changes), list(reply), reply_status, record.stored_row() if record is not None else None,
            llm_calls, dict(forwarded or {}), dict(marks or {}), place=self._placed(key, [m for m, _ in reply]),
        )

    def _finish_turn(
        self,
        key: ConversationKey,
        changes: dict[int, str],
        reply: list[tuple[Raw, str]],
        reply_status: str,
        record: dict[str, Any] | None,
        llm_calls: int = 0,
        forwarded: dict[int, int] | None = None,
        marks: dict[str, int] | None = None,
    ) -> int | None:
        def end(conversation: Record) -> int | None:  # one save of the record per turn's end
            fields = conversation.fields
            fields["llm_calls"] += llm_calls
            if forwarded:
                conversation.forward(forwarded)
            self._change_statuses(key, conversation, changes)
            if marks:
                fields.setdefault("marks", {}).update(marks)
            seq = None
            if reply:
                seq = self._add_items(conversation, [m for m, _ in reply], [h for _, h in reply], reply_status)[0]
            if record is not None:
                fields["turns"] += 1
                self._rows.set(turn_key(key, fields["turns"]), {**record, "turn": fields["turns"], "reply_seq": seq})
                if seq is not None and record.get("response_id"):
                    self._rows.set(response_key(key.tenant, record["response_id"]), (key.id, seq + len(reply) - 1))
                self._keep_facts(key, fields, TurnFacts.of(record), record.get("created_at"))
            return seq

        return self._update_record(key, end)

    def _keep_facts(self, key: ConversationKey, fields: dict[str, Any], facts: TurnFacts, created_at: Any) -> None:
        fields.update(facts.latest)
        if facts.task and not fields.get("task"):
            fields["task"] = facts.task
        if facts.error is not None:
            if not fields.get("failures"):  # its first failure: listed among the failed from now on
                self._index(key, fields["order"], FAILED_SCOPE + key.tenant, FAILED_SCOPE + ALL_TENANTS)
            fields["failures"] = fields.get("failures", 0) + 1
            fields["last_error"] = facts.last_error(fields["turns"], created_at)

    async def response_owner(self, tenant: str, response_id: str) -> tuple[str, int] | None:
        found = await self._run(self._rows.get, response_key(tenant, response_id))
        return (found[0], int(found[1])) if found else None

    async def turn_records(self, key: ConversationKey, *, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        return await self._run(self._turn_records, key, after, limit)

    def _turn_records(self, key: ConversationKey, after: int, limit: int | None) -> list[dict[str, Any]]:
        fields = self._fields(key)
        last = fields["turns"] if fields else 0
        end = last if limit is None else min(last, after + limit)
        return [turn_row_read(r) for t in range(after + 1, end + 1) if (r := self._rows.get(turn_key(key, t))) is not None]

    async def messages(
        self, key: ConversationKey, *, live_only: bool, after: int | None = None, limit: int | None = None
    ) -> list[StoredMessage]:
        return await self._run(self._messages, key, live_only, after, limit)

    def _messages(self, key: ConversationKey, live_only: bool, after: int | None, limit: int | None) -> list[StoredMessage]:
        record = self._load(key)
        if record is None:
            return []
        if live_only:
            seqs: Sequence[int] = record.live_seqs(after, limit)
        else:
            start = 1 if after is None else max(1, after + 1)
            end = record.fields["next_seq"] if limit is None else min(record.fields["next_seq"], start + limit)
            seqs = range(start, end)
        return self._read(key, record, seqs)

    async def message(self, key: ConversationKey, seq: int) -> StoredMessage | None:
        return await self._run(self._message, key, seq)

    def _message(self, key: ConversationKey, seq: int) -> StoredMessage | None:
        record = self._load(key)
        batch = None if record is None else self._batch_of(key, record, seq)
        if batch is None:
            return None
        i = seq - batch.first
        return StoredMessage(seq, batch.messages(self._part_reader(key))[i], batch.hashes[i], batch.statuses[i], batch.stamps[i])

    def _part_reader(self, key: ConversationKey) -> Callable[[int], bytes]:
        def read(first: int) -> bytes:
            blob = self._rows.get(part_key(key, first))
            if blob is None:
                raise missing_row(key, first)
            return blob

        return read

    async def count_llm_call(self, key: ConversationKey, limit: int | None = None) -> int | None:
        return await self._write(self._update_record, key, lambda record: _count_call(record, limit), place=self._placed(key))

    async def mark_forwarded(self, key: ConversationKey, marks: Mapping[int, int]) -> None:
        if marks:
            await self._write(self._update_record, key, lambda record: record.forward(marks), place=self._placed(key))

    async def set_marks(self, key: ConversationKey, marks: Mapping[str, int]) -> None:
        if marks:
            await self._write(
                self._update_record, key, lambda record: record.fields.setdefault("marks", {}).update(marks),
                place=self._placed(key),
            )

    async def set_rewrites(self, key: ConversationKey, rewrites: Mapping[int, str]) -> None:
        if rewrites:
            await self._write(self._set_rewrites, key, dict(rewrites))

    def _set_rewrites(self, key: ConversationKey, rewrites: dict[int, str]) -> None:
        with self._rows.transact():
            for seq, content in rewrites.items():
                self._rows.set(rewrite_key(key, seq), content)
            self._update_record(key, lambda record: record.rewrote(rewrites))

    async def rewrites(self, key: ConversationKey, seqs: list[int]) -> dict[int, str]:
        return await self._run(self._rewrites, key, seqs)

    def _rewrites(self, key: ConversationKey, seqs: list[int]) -> dict[int, str]:
        found = {seq: self._rows.get(rewrite_key(key, seq)) for seq in seqs}
        return {seq: content for seq, content in found.items() if content is not None}

    def _update_record(self, key: ConversationKey, change: Callable[[Record], Any]) -> Any:
        """Apply `change` to the conversation record (creating it if new); returns what `change` returns."""
        with self._rows.transact():
            record = self._load(key)
            if record is None:
                record = self._register(key, Record.new(now()))
            result = change(record)
            self._save(key, record)
            return result

    async def add_summary(self, key: ConversationKey, summary: Summary) -> Summary:
        return await self._write(self._add_summary, key, summary)

    def _add_summary(self, key: ConversationKey, summary: Summary) -> Summary:
        def change(record: Record) -> Summary:
            fields = record.fields
            fields["summaries"] += 1
            stored = replace(summary, id=fields["summaries"])
            self._rows.set(summary_key(key, stored.id), stored.to_record())
            if summary.last_seq > fields["boundary"]:
                fields["boundary"], fields["summary_id"] = summary.last_seq, stored.id
            return stored

        return self._update_record(key, change)

    async def summaries(self, key: ConversationKey) -> list[Summary]:
        return await self._run(self._summaries, key)

    def _summaries(self, key: ConversationKey) -> list[Summary]:
        fields = self._fields(key)
        count = fields["summaries"] if fields else 0
        return [s for i in range(1, count + 1) if (s := self._summary(key, i)) is not None]

    async def summary(self, key: ConversationKey, summary_id: int) -> Summary | None:
        return await self._run(self._summary, key, summary_id)

    def _summary(self, key: ConversationKey, summary_id: int) -> Summary | None:
        raw = self._rows.get(summary_key(key, summary_id))
        return None if raw is None else Summary.from_record(raw)

    async def import_conversation(self, dump: ConversationDump, *, replace: bool = False) -> None:
        dump.check()
        await self._write(self._import, dump, replace)
        self._search.forget(dump.conversation.key)

    async def search(self, key: ConversationKey, query: str, *, limit: int = DEFAULT_HITS) -> list[SearchHit]:
        return await self._search.search(self, key, query, limit)

    def _import(self, dump: ConversationDump, replace: bool) -> None:
        c = dump.conversation
        key = c.key
        with self._rows.transact():
            if self._fields(key) is not None:
                if not replace:
                    raise ConversationExists(str(key))
                self._delete(key)
            record = self._register(key, Record.new(c.created_at))
            record.fields.update(
                updated_at=c.updated_at, next_seq=c.next_seq, llm_calls=c.llm_calls, summaries=len(dump.summaries),
                boundary=c.boundary, summary_id=c.summary_id, turns=len(dump.turns), marks=dict(c.marks),
                **c.description(),
            )
            record.add_live(sorted(map(tuple, c.live)))
            record.forward(c.first_forwarded)
            record.rewrote(dump.rewrites)
            for start in range(0, len(dump.messages), BATCH_MAX):
                part = dump.messages[start:start + BATCH_MAX]
                batch = Batch(part[0].seq, [], [], [], [])
                batch.add([m.message for m in part], [m.hash for m in part], [m.status for m in part],
                          [m.created_at for m in part])
                record.new_batch(batch.first)
                record.unsaved[batch.first] = batch
            record.touch(1, c.next_seq)
            if c.failures:
                self._index(key, record.fields["order"], FAILED_SCOPE + key.tenant, FAILED_SCOPE + ALL_TENANTS)
            for seq, content in dump.rewrites.items():
                self._rows.set(rewrite_key(key, seq), content)
            fields = record.fields
            fields.update(inbox=len(dump.inbox), inbox_open=[], inbox_at={})
            for m in dump.inbox:
                self._rows.set(inbox_key(key, m.id), inbox_record(m))
                if m.status != INBOX_DELIVERED:
                    fields["inbox_open"].append(m.id)
                if m.seq is not None:
                    fields["inbox_at"].setdefault(m.seq, []).append(m.id)
            for summary in dump.summaries:
                self._rows.set(summary_key(key, summary.id), summary.to_record())
            for turn in dump.turns:
                self._rows.set(turn_key(key, turn["turn"]), imported_turn_row(turn))
            for response_id, seq in dump.responses.items():
                self._rows.set(response_key(key.tenant, response_id), (key.id, seq))
            for n, part in enumerate(dump.parts, 1):
                self._rows.set(request_part_key(key, n), part.to_record())
            if dump.parts:
                self._rows.set(request_parts_key(key), {part.hash: n for n, part in enumerate(dump.parts, 1)})
            self._save(key, record)

    async def acquire_lease(self, name: str, ttl_s: float) -> str | None:
        # One process owns this store (diskcache is not shared between replicas): leases live here.
        now_ = time.monotonic()
        held = self._leases.get(name)
        if held is not None and held[1] > now_:
            return None
        token = secrets.token_hex(8)
        ttl_ms = round(ttl_s * 1000)  # Redis's resolution: both backends grant the same leases
        if ttl_ms > 0:
            self._leases[name] = (token, now_ + ttl_ms / 1000)
        else:  # shorter than that: granted already expired, as Redis grants it
            self._leases.pop(name, None)
        return token

    async def release_lease(self, name: str, token: str) -> None:
        held = self._leases.get(name)
        if held is not None and held[0] == token:
            del self._leases[name]

    async def secret(self) -> bytes:
        return await self._write(self._secret)

    def _secret(self) -> bytes:
        value = self._rows.get(SECRET)
        if value is not None:  # read without a transaction: a store that can't write still starts
            return value
        with self._rows.transact():
            value = self._rows.get(SECRET)
            if value is None:
                value = secrets.token_bytes(32)
                self._rows.set(SECRET, value)
            return value

    async def fail_pending(self) -> int:
        # One process owns this store, so only its own locks can mean a turn is running.
        running = {key for key, lock in list(self._locks.items()) if lock.locked()}
        return await self._write(self._fail_pending, running)

    def _fail_pending(self, running: set[ConversationKey]) -> int:
        flagged = [key for key in self._pending.flagged() if key not in running]
        cut = [key for key in flagged if (fields := self._fields(key)) is not None and fields.get("pending")]
        self._pending.settle(set(flagged) - set(cut))  # cleared by a later write: none needed here
        if not cut:  # the common case, and no write: a full store starts too
            return 0
        failed = 0
        with self._rows.transact():
            for key in cut:
                record = self._load(key)
                assert record is not None
                seqs = [seq for seq in record.fields["pending"] if self._status(key, record, seq) == PENDING]
                self._change_statuses(key, record, dict.fromkeys(seqs, FAILED))
                record.fields["pending"] = []
                self._save(key, record)
                failed += len(seqs)
            self._pending.sweep()
        return failed

    async def health(self) -> StoreHealth:
        try:
            if self._health.failure is None:  # right here: not queued behind a big write in the store thread
                return self._check_health()
            return await self._run(self._check_health)
        except (StoreError, OSError) as exc:
            return failed_health(exc if isinstance(exc, StoreError) else store_error(exc, self._path))

    def _check_health(self) -> StoreHealth:
        if self._health.failure is not None:  # does a write work again (room made, remounted)?
            try:
                self._rows.set(PROBE, now())
            except (sqlite3.Error, OSError, diskcache.Timeout):
                pass
            else:
                self._health.succeeded()
        fs = os.statvfs(self._path)  # a syscall of microseconds: fine on the loop too
        free = fs.f_bavail * fs.f_frsize
        facts = {"free_mb": round(free / MB, 1), "reserve_held": self._reserve.held}
        if self._health.failure is None:
            if fs.f_flag & os.ST_RDONLY:
                return StoreHealth("read_only", "The store's filesystem is mounted read-only", facts)
            if free < LOW_SPACE:
                return StoreHealth("full", "The store's disk is (nearly) full", facts)
        return self._health.health(**facts)

    async def close(self) -> None:
        await self._run(self._close)
        self._thread.shutdown()

    def _close(self) -> None:
        try:  # turns still in flight: their items written pending (the next start marks them failed)
            for key in list(self._staged):
                self._flush(key)
        except (sqlite3.Error, OSError, diskcache.Timeout) as exc:
            log.warning("store: items of turns in flight not kept at stop", extra={"error": str(exc)})
        self._checkpoints.close()  # before the cache's connection: the last to close checkpoints everything
        try:  # a clean stop leaves flags only where messages are pending: the next start reads no more
            if self._pending.any_settled:
                with self._rows.transact():
                    self._pending.sweep()
        except (sqlite3.Error, OSError, diskcache.Timeout) as exc:  # e.g. a full disk: the next start sweeps
            log.info("store: pending flags left for the next start", extra={"error": str(exc)})
        self._rows.close()


def _index_entry(scope: str, entry: Any) -> ConversationKey:
    return ConversationKey(*entry) if scope == ALL_TENANTS else ConversationKey(scope, entry)


def _rough_left(value: Any, left: int, depth: int = 0) -> int:
    """What is left of `left` characters after a message's strings, each part of it counting 8
    more (a number, a string's quotes, a container), or less than 0 once they are spent: the walk
    stops there, so it takes at most `left` / 8 steps whatever the message. Deeper than
    INLINE_DEPTH counts as spent. A chat message's text is one level down, a Messages tool
    result's five, a Gemini call's arguments four or more: the rule must reach them, or every
    later turn of Claude Code and Gemini CLI hops to the store thread."""
    left -= 8
    if isinstance(value, str):
        return left - len(value)
    if depth > INLINE_DEPTH:
        return -1
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, list):
        return left  # a number, a bool, None
    for child in value:
        left = _rough_left(child, left, depth + 1)
        if left < 0:
            break
    return left


def _count_call(record: Record, limit: int | None = None) -> int | None:
    if limit is not None and record.fields["llm_calls"] >= limit:
        return None
    record.fields["llm_calls"] += 1
    return record.fields["llm_calls"]
