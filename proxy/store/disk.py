"""The embedded store: diskcache (SQLite plus files) in one directory, for one proxy process.

diskcache is synchronous, so every write runs on one dedicated thread: the event loop never
waits on SQLite, and the single writer thread means no SQLite lock contention between our own
operations. Each store call is one executor hop and one diskcache transaction. Since this
process is the store's only writer, it keeps the latest snapshot of recent conversation records
in memory: `get()`, called on every turn, usually needs no hop at all.

diskcache is a cache by default; here it is a database: no eviction, no culling, ever.

Faults: a full disk, a read-only filesystem or file, or a broken database raise StoreFull,
StoreReadOnly or StoreUnavailable (OpenAI-shaped 507/503), never sqlite3's or the OS's own
error; the latest write's outcome is what `health()` reports. SQLite needs room even to delete
(its journal), so a reserve file of `storage.reserve_mb` is kept beside the database and let go
when a delete finds the disk full; it is made again once there is room. Transcripts and the ref
secret are private: the folder is 0700, every file 0600.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import secrets
import sqlite3
import time
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import diskcache

from ..config import ConfigError
from ..identity import ConversationKey
from ..messages import Message
from .base import (
    FAILED,
    INBOX_DELIVERED,
    INBOX_DELIVERING,
    LIVE,
    PENDING,
    STATUSES,
    Conversation,
    ConversationDump,
    ConversationExists,
    InboxFull,
    InboxMessage,
    KnowledgeVersion,
    StoredMessage,
    StoreError,
    StoreFull,
    StoreHealth,
    StoreReadOnly,
    StoreUnavailable,
    Summary,
    TurnFacts,
    WriteHealth,
    failed_health,
    now,
)

log = logging.getLogger("proxy.store.disk")

T = TypeVar("T")
SEP = "\0"
TENANTS = "tenants"
SECRET = "ref-secret"
CREATED = "created-counter"
ALL_TENANTS = "\x01all"  # the index of every conversation (tenant names are hex: never this)
PENDING_SET = "pending"  # the conversations with pending messages: what a crash may have left
PROBE = "health-probe"  # written by health() to see whether a failed store writes again
FAILED_SCOPE = "\x02failed:"  # + a scope: the index of that scope's conversations with a failed turn
INDEX_PAGE = 1000  # conversations per index page: registering one rewrites one page, not an index
MAX_SNAPSHOTS = 1024  # conversation records kept in memory (the active ones)
MAX_RECORDS = 256  # of those, the stored form kept for the next write
RESERVE_FILE = "reserve"
LOW_SPACE = 1024 * 1024  # less free than this (beside the reserve) is a full store for health()
PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600
MB = 1024 * 1024


class _PrivateDisk(diskcache.Disk):
    """diskcache's value files (records over 4 MB) created 0600 in 0700 folders. Disk._write as
    in diskcache 5, with the modes given to os.open / makedirs instead of the umask's."""

    def _write(self, full_path: str, iterator: Any, mode: str, encoding: str | None = None) -> int:
        full_dir = os.path.dirname(full_path)
        for count in range(1, 11):
            _private_folders(full_dir)
            try:
                fd = os.open(full_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
            except OSError:
                if count == 10:  # another cache may have deleted the folder meanwhile: retried
                    raise
                continue
            with open(fd, mode.replace("x", "w"), encoding=encoding) as writer:
                size = 0
                for chunk in iterator:
                    size += len(chunk)
                    writer.write(chunk)
                return size
        raise AssertionError("unreachable")


def _private_folders(folder: str) -> None:
    """Make `folder` and its missing parents, each 0700 (makedirs gives parents the umask's mode)."""
    missing = []
    while folder and not os.path.isdir(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, PRIVATE_DIR)


def _open_cache(path: str) -> diskcache.Cache:
    return diskcache.Cache(
        path,
        disk=_PrivateDisk,
        eviction_policy="none",  # never drop a stored message, whatever the size
        cull_limit=0,
        size_limit=2**62,
        statistics=False,
        disk_min_file_size=2**22,  # records up to 4 MB stay in SQLite: no file churn per turn
        sqlite_mmap_size=0,  # reads through SQLite's own cache: no 64 MB map in our resident set
        sqlite_cache_size=2**11,  # pages (8 MB)
    )


def _conv_key(key: ConversationKey) -> str:
    return f"conv{SEP}{key.tenant}{SEP}{key.id}"


def _msg_key(key: ConversationKey, seq: int) -> str:
    return f"msg{SEP}{key.tenant}{SEP}{key.id}{SEP}{seq:012d}"


def _rewrite_key(key: ConversationKey, seq: int) -> str:
    return f"rewrite{SEP}{key.tenant}{SEP}{key.id}{SEP}{seq:012d}"


def _turn_key(key: ConversationKey, turn: int) -> str:
    return f"turn{SEP}{key.tenant}{SEP}{key.id}{SEP}{turn:08d}"


def _summary_key(key: ConversationKey, summary_id: int) -> str:
    return f"summary{SEP}{key.tenant}{SEP}{key.id}{SEP}{summary_id:08d}"


def _response_key(tenant: str, response_id: str) -> str:
    return f"response{SEP}{tenant}{SEP}{response_id}"


def _inbox_key(key: ConversationKey, message_id: int) -> str:
    return f"inbox{SEP}{key.tenant}{SEP}{key.id}{SEP}{message_id:08d}"


def _knowledge_key(tenant: str, namespace: str, version: int) -> str:
    return f"knowledge{SEP}{tenant}{SEP}{namespace}{SEP}{version:08d}"


def _knowledge_index(tenant: str) -> str:
    """namespace -> its newest version number, for one tenant."""
    return f"knowledge-index{SEP}{tenant}"


KNOWLEDGE_TENANTS = "knowledge-tenants"


def _index_page(scope: str, page: int) -> str:
    return f"index{SEP}{scope}{SEP}{page:012d}"


class DiskStore:
    def __init__(self, path: str | Path, reserve_bytes: int = 0) -> None:
        self._path = Path(path)
        try:
            self._path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
            self._cache = _open_cache(str(path))
        except (sqlite3.Error, OSError) as exc:  # e.g. a read-only filesystem: SQLite's WAL can't open there
            raise ConfigError(f"storage.path: cannot open the store in {path}: {exc}") from exc
        _make_private(self._path)  # also a store made before files were private
        self._reserve = _Reserve(self._path / RESERVE_FILE, reserve_bytes)
        self._reserve.make()
        self._health = WriteHealth()
        self._snapshots: dict[ConversationKey, Conversation] = {}  # written by the store thread only
        # The latest saved record of recent conversations, as saved (store thread only): a turn's
        # write updates it instead of reading and unpickling it again (its live index grows with
        # the conversation). Safe because this process is the store's only writer.
        self._records: OrderedDict[ConversationKey, dict[str, Any]] = OrderedDict()
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="diskstore")
        self._locks: weakref.WeakValueDictionary[ConversationKey, asyncio.Lock] = weakref.WeakValueDictionary()
        self._leases: dict[str, tuple[str, float]] = {}  # name -> (token, monotonic expiry)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)
        except (sqlite3.Error, OSError, diskcache.Timeout) as exc:
            raise _store_error(exc, self._path) from exc

    async def _write(self, fn: Callable[..., T], *args: Any, telling: bool = True) -> T:
        """`_run` for an operation that writes: its outcome is the store's health (a success only
        if `telling`: a delete works on a full disk by design, so it says nothing of writes)."""
        try:
            result = await self._run(self._written, fn, *args)
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
            # The transaction was rolled back, but a record snapshot may have been taken inside it.
            self._snapshots.clear()
            self._records.clear()
            raise
        if not self._reserve.held:  # let go of for a delete: made again once there is room
            self._reserve.make()
        return result

    @asynccontextmanager
    async def lock(self, key: ConversationKey) -> AsyncIterator[None]:
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        async with lock:
            yield

    # -- conversations -------------------------------------------------------------------------

    async def get(self, key: ConversationKey) -> Conversation | None:
        snapshot = self._snapshots.get(key)
        return snapshot if snapshot is not None else await self._run(self._get, key)

    def _get(self, key: ConversationKey) -> Conversation | None:
        raw = self._load(key)
        return None if raw is None else self._snapshot(key, raw)

    def _load(self, key: ConversationKey) -> dict[str, Any] | None:
        return self._cache.get(_conv_key(key))

    def _save(self, key: ConversationKey, raw: dict[str, Any]) -> None:
        self._cache.set(_conv_key(key), raw)
        self._snapshot(key, raw)
        self._records[key] = raw
        self._records.move_to_end(key)
        if len(self._records) > MAX_RECORDS:
            self._records.popitem(last=False)

    def _snapshot(self, key: ConversationKey, raw: dict[str, Any]) -> Conversation:
        conversation = self._snapshots[key] = _conversation(key, raw)
        if len(self._snapshots) > MAX_SNAPSHOTS:
            del self._snapshots[next(iter(self._snapshots))]  # the oldest inserted
        return conversation

    async def list_conversations(
        self, tenant: str | None, *, after: str | None = None, limit: int = 20, failed: bool = False
    ) -> tuple[list[Conversation], bool]:
        return await self._run(self._list, tenant, after, limit, failed)

    def _list(self, tenant: str | None, after: str | None, limit: int, failed: bool) -> tuple[list[Conversation], bool]:
        """Newest first, from the creation-order index pages, starting below the `after` conversation."""
        scope = tenant if tenant is not None else ALL_TENANTS
        index = FAILED_SCOPE + scope if failed else scope
        start = self._cache.get(CREATED, 0) + 1
        if after is not None:
            candidates = [ConversationKey(tenant, after)] if tenant is not None else [c.key for c in self._find(after)]
            orders = [raw["order"] for k in candidates if (raw := self._load(k)) is not None]
            if not orders:
                return [], False
            start = max(orders)
        keys: list[ConversationKey] = []
        for page_no in range((start - 1) // INDEX_PAGE, -1, -1):
            page = self._cache.get(_index_page(index, page_no))
            for order in sorted((o for o in page or () if o < start), reverse=True):
                keys.append(_index_entry(scope, page[order]))
            if len(keys) > limit:
                break
        found = [c for k in keys[:limit] if (c := self._get(k)) is not None]
        return found, len(keys) > limit

    async def find(self, conversation_id: str) -> list[Conversation]:
        return await self._run(self._find, conversation_id)

    def _find(self, conversation_id: str) -> list[Conversation]:
        found = []
        for tenant in sorted(self._cache.get(TENANTS, set())):
            conv = self._get(ConversationKey(tenant, conversation_id))
            if conv is not None:
                found.append(conv)
        return found

    async def delete(self, key: ConversationKey) -> bool:
        try:
            return await self._write(self._delete, key, telling=False)
        except StoreFull:
            if not await self._run(self._reserve.release):
                raise
            log.warning("store full: released its reserve so that a delete can run")
            return await self._write(self._delete, key, telling=False)

    def _delete(self, key: ConversationKey) -> bool:
        with self._cache.transact():
            raw = self._load(key)
            if raw is None:
                return False
            for seq in range(1, raw["next_seq"]):
                self._cache.delete(_msg_key(key, seq))
                self._cache.delete(_rewrite_key(key, seq))
            for summary_id in range(1, raw["summaries"] + 1):
                self._cache.delete(_summary_key(key, summary_id))
            for message_id in range(1, raw.get("inbox", 0) + 1):
                self._cache.delete(_inbox_key(key, message_id))
            for turn in range(1, raw["turns"] + 1):
                record = self._cache.get(_turn_key(key, turn))
                if isinstance(record, dict) and record.get("response_id"):
                    self._cache.delete(_response_key(key.tenant, record["response_id"]))
                self._cache.delete(_turn_key(key, turn))
            self._cache.delete(_conv_key(key))
            self._snapshots.pop(key, None)
            self._records.pop(key, None)
            if raw.get("pending"):
                self._track_pending(key, False)
            scopes = (key.tenant, ALL_TENANTS)
            if raw.get("failures"):
                scopes += (FAILED_SCOPE + key.tenant, FAILED_SCOPE + ALL_TENANTS)
            for scope in scopes:
                page_key = _index_page(scope, raw["order"] // INDEX_PAGE)
                page = self._cache.get(page_key, {})
                page.pop(raw["order"], None)
                self._cache.set(page_key, page)
            return True

    async def set_title(self, key: ConversationKey, title: str | None) -> Conversation | None:
        return await self._write(self._set_title, key, title)

    def _set_title(self, key: ConversationKey, title: str | None) -> Conversation | None:
        with self._cache.transact():
            raw = self._load(key)
            if raw is None:
                return None
            raw["title"] = title
            self._save(key, raw)
            return _conversation(key, raw)

    # -- messages ------------------------------------------------------------------------------

    async def append(self, key: ConversationKey, messages: list[Message], hashes: list[str], status: str) -> list[int]:
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}")
        return await self._write(self._append, key, messages, hashes, status)

    def _append(self, key: ConversationKey, messages: list[Message], hashes: list[str], status: str) -> list[int]:
        return self._update_record(key, lambda raw: self._add_messages(key, raw, messages, hashes, status))

    def _add_messages(
        self, key: ConversationKey, raw: dict[str, Any], messages: list[Message], hashes: list[str], status: str
    ) -> list[int]:
        """Write messages after the last one; `raw` (the conversation record) is updated, not saved."""
        stamp = now()
        seqs = list(range(raw["next_seq"], raw["next_seq"] + len(messages)))
        for seq, msg, h in zip(seqs, messages, hashes, strict=True):
            self._cache.set(_msg_key(key, seq), {"message": msg, "hash": h, "status": status, "created_at": stamp})
            if status == LIVE:
                raw["live"].append((seq, h))
        if status == PENDING and seqs:
            if not raw.get("pending"):
                self._track_pending(key, True)
            raw["pending"] = [*raw.get("pending", ()), *seqs]
        raw["next_seq"] += len(messages)
        raw["updated_at"] = stamp
        return seqs

    def _track_pending(self, key: ConversationKey, has_pending: bool) -> None:
        """Keep the set of conversations with pending messages (inside the caller's transaction)."""
        pending = self._cache.get(PENDING_SET, set())
        if has_pending:
            pending.add((key.tenant, key.id))
        else:
            pending.discard((key.tenant, key.id))
        self._cache.set(PENDING_SET, pending)

    def _register(self, key: ConversationKey, raw: dict[str, Any]) -> dict[str, Any]:
        """Index a new conversation: by a counter, not a timestamp, so that two made in the same
        microsecond still list in order; one index page per 1,000 conversations is rewritten."""
        raw["order"] = self._cache.incr(CREATED, default=0)
        self._index(key, raw["order"], key.tenant, ALL_TENANTS)
        tenants = self._cache.get(TENANTS, set())
        if key.tenant not in tenants:
            self._cache.set(TENANTS, tenants | {key.tenant})
        return raw

    def _index(self, key: ConversationKey, order: int, tenant_scope: str, all_scope: str) -> None:
        """List the conversation, at its creation order, in a tenant's index and the all-tenants one."""
        for scope, entry in ((tenant_scope, key.id), (all_scope, (key.tenant, key.id))):
            page_key = _index_page(scope, order // INDEX_PAGE)
            page = self._cache.get(page_key, {})
            page[order] = entry
            self._cache.set(page_key, page)

    async def set_statuses(self, key: ConversationKey, changes: Mapping[int, str]) -> None:
        if not set(changes.values()) <= STATUSES:
            raise ValueError(f"unknown status in {set(changes.values())}")
        if changes:
            await self._write(self._set_statuses, key, dict(changes))

    def _set_statuses(self, key: ConversationKey, changes: dict[int, str]) -> None:
        with self._cache.transact():
            raw = self._load(key)
            if raw is None:
                raise KeyError(str(key))
            self._change_statuses(key, raw, changes)
            self._save(key, raw)

    def _change_statuses(self, key: ConversationKey, raw: dict[str, Any], changes: dict[int, str]) -> None:
        """Set message statuses and keep the record's live index in step; `raw` is not saved."""
        records = {seq: self._cache.get(_msg_key(key, seq)) for seq in changes}
        missing = [seq for seq, record in records.items() if record is None]
        if missing:  # before anything is changed (the caller's transaction rolls back the rest)
            raise KeyError(f"{key}: no message {missing[0]}")
        live = dict(raw["live"])
        for seq, status in changes.items():
            record = records[seq]
            record["status"] = status
            self._cache.set(_msg_key(key, seq), record)
            if status == LIVE:
                live[seq] = record["hash"]
            else:
                live.pop(seq, None)
        raw["live"] = sorted(live.items())
        raw["updated_at"] = now()
        if raw.get("pending"):
            raw["pending"] = [seq for seq in raw["pending"] if changes.get(seq, PENDING) == PENDING]
            if not raw["pending"]:
                self._track_pending(key, False)

    async def finish_turn(
        self,
        key: ConversationKey,
        changes: Mapping[int, str],
        reply: Sequence[tuple[Message, str]],
        reply_status: str,
        record: Mapping[str, Any] | None,
        *,
        llm_calls: int = 0,
        forwarded: Mapping[int, int] | None = None,
    ) -> int | None:
        if not set(changes.values()) <= STATUSES or (reply and reply_status not in STATUSES):
            raise ValueError("unknown status")
        return await self._write(
            self._finish_turn, key, dict(changes), list(reply), reply_status, dict(record) if record else None,
            llm_calls, dict(forwarded or {}),
        )

    def _finish_turn(
        self,
        key: ConversationKey,
        changes: dict[int, str],
        reply: list[tuple[Message, str]],
        reply_status: str,
        record: dict[str, Any] | None,
        llm_calls: int = 0,
        forwarded: dict[int, int] | None = None,
    ) -> int | None:
        def end(raw: dict[str, Any]) -> int | None:  # one load and one save of the record per turn
            raw["llm_calls"] += llm_calls
            if forwarded:
                raw["first_forwarded"].update(forwarded)
            self._change_statuses(key, raw, changes)
            seq = None
            if reply:
                seq = self._add_messages(key, raw, [m for m, _ in reply], [h for _, h in reply], reply_status)[0]
            if record is not None:
                raw["turns"] += 1
                self._cache.set(_turn_key(key, raw["turns"]), {**record, "turn": raw["turns"], "reply_seq": seq})
                if seq is not None and record.get("response_id"):
                    self._cache.set(_response_key(key.tenant, record["response_id"]), (key.id, seq + len(reply) - 1))
                self._keep_facts(key, raw, TurnFacts.of(record), record.get("created_at"))
            return seq

        return self._update_record(key, end)

    def _keep_facts(self, key: ConversationKey, raw: dict[str, Any], facts: TurnFacts, created_at: Any) -> None:
        raw.update(facts.latest)
        if facts.task and not raw.get("task"):
            raw["task"] = facts.task
        if facts.error is not None:
            if not raw.get("failures"):  # its first failure: listed among the failed from now on
                self._index(key, raw["order"], FAILED_SCOPE + key.tenant, FAILED_SCOPE + ALL_TENANTS)
            raw["failures"] = raw.get("failures", 0) + 1
            raw["last_error"] = facts.last_error(raw["turns"], created_at)

    async def response_owner(self, tenant: str, response_id: str) -> tuple[str, int] | None:
        found = await self._run(self._cache.get, _response_key(tenant, response_id))
        return (found[0], int(found[1])) if found else None

    async def turn_records(self, key: ConversationKey, *, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        return await self._run(self._turn_records, key, after, limit)

    def _turn_records(self, key: ConversationKey, after: int, limit: int | None) -> list[dict[str, Any]]:
        raw = self._load(key)
        last = raw["turns"] if raw else 0
        end = last if limit is None else min(last, after + limit)
        return [r for t in range(after + 1, end + 1) if (r := self._cache.get(_turn_key(key, t))) is not None]

    async def messages(
        self, key: ConversationKey, *, live_only: bool, after: int | None = None, limit: int | None = None
    ) -> list[StoredMessage]:
        return await self._run(self._messages, key, live_only, after, limit)

    def _messages(self, key: ConversationKey, live_only: bool, after: int | None, limit: int | None) -> list[StoredMessage]:
        raw = self._load(key)
        if raw is None:
            return []
        seqs = [s for s, _ in raw["live"]] if live_only else list(range(1, raw["next_seq"]))
        if after is not None:
            seqs = [s for s in seqs if s > after]
        if limit is not None:
            seqs = seqs[:limit]
        out = []
        for seq in seqs:
            r = self._cache.get(_msg_key(key, seq))
            out.append(StoredMessage(seq, r["message"], r["hash"], r["status"], r["created_at"]))
        return out

    async def message(self, key: ConversationKey, seq: int) -> StoredMessage | None:
        return await self._run(self._message, key, seq)

    def _message(self, key: ConversationKey, seq: int) -> StoredMessage | None:
        r = self._cache.get(_msg_key(key, seq))
        return None if r is None else StoredMessage(seq, r["message"], r["hash"], r["status"], r["created_at"])

    async def count_llm_call(self, key: ConversationKey) -> int:
        return await self._write(self._update_record, key, _count_call)

    async def mark_forwarded(self, key: ConversationKey, marks: Mapping[int, int]) -> None:
        if marks:
            await self._write(self._update_record, key, lambda raw: raw["first_forwarded"].update(marks))

    async def set_marks(self, key: ConversationKey, marks: Mapping[str, int]) -> None:
        if marks:
            await self._write(self._update_record, key, lambda raw: raw.setdefault("marks", {}).update(marks))

    async def set_rewrites(self, key: ConversationKey, rewrites: Mapping[int, str]) -> None:
        if rewrites:
            await self._write(self._set_rewrites, key, dict(rewrites))

    def _set_rewrites(self, key: ConversationKey, rewrites: dict[int, str]) -> None:
        with self._cache.transact():
            for seq, content in rewrites.items():
                self._cache.set(_rewrite_key(key, seq), content)
            self._update_record(key, lambda raw: raw["rewritten"].update(rewrites))

    async def rewrites(self, key: ConversationKey, seqs: list[int]) -> dict[int, str]:
        return await self._run(self._rewrites, key, seqs)

    def _rewrites(self, key: ConversationKey, seqs: list[int]) -> dict[int, str]:
        found = {seq: self._cache.get(_rewrite_key(key, seq)) for seq in seqs}
        return {seq: content for seq, content in found.items() if content is not None}

    def _update_record(self, key: ConversationKey, change: Callable[[dict[str, Any]], Any]) -> Any:
        """Apply `change` to the conversation record (creating it if new); returns what `change` returns."""
        with self._cache.transact():
            raw = self._records.get(key) or self._load(key)
            if raw is None:
                raw = self._register(key, _new_record(now()))
            result = change(raw)
            self._save(key, raw)
            return result

    async def add_summary(self, key: ConversationKey, summary: Summary) -> Summary:
        return await self._write(self._add_summary, key, summary)

    def _add_summary(self, key: ConversationKey, summary: Summary) -> Summary:
        def change(raw: dict[str, Any]) -> Summary:
            raw["summaries"] += 1
            stored = replace(summary, id=raw["summaries"])
            self._cache.set(_summary_key(key, stored.id), stored.to_record())
            if summary.last_seq > raw["boundary"]:
                raw["boundary"], raw["summary_id"] = summary.last_seq, stored.id
            return stored

        return self._update_record(key, change)

    async def summaries(self, key: ConversationKey) -> list[Summary]:
        return await self._run(self._summaries, key)

    def _summaries(self, key: ConversationKey) -> list[Summary]:
        raw = self._load(key)
        count = raw["summaries"] if raw else 0
        return [s for i in range(1, count + 1) if (s := self._summary(key, i)) is not None]

    async def summary(self, key: ConversationKey, summary_id: int) -> Summary | None:
        return await self._run(self._summary, key, summary_id)

    def _summary(self, key: ConversationKey, summary_id: int) -> Summary | None:
        raw = self._cache.get(_summary_key(key, summary_id))
        return None if raw is None else Summary.from_record(raw)

    async def import_conversation(self, dump: ConversationDump, *, replace: bool = False) -> None:
        dump.check()
        await self._run(self._import, dump, replace)

    def _import(self, dump: ConversationDump, replace: bool) -> None:
        c = dump.conversation
        key = c.key
        with self._cache.transact():
            if self._load(key) is not None:
                if not replace:
                    raise ConversationExists(str(key))
                self._delete(key)
            raw = self._register(key, _new_record(c.created_at))
            raw.update(
                updated_at=c.updated_at, next_seq=c.next_seq, live=list(c.live), llm_calls=c.llm_calls,
                first_forwarded=dict(c.first_forwarded), rewritten=set(dump.rewrites), summaries=len(dump.summaries),
                boundary=c.boundary, summary_id=c.summary_id, turns=len(dump.turns), marks=dict(c.marks),
                **c.description(),
            )
            if c.failures:
                self._index(key, raw["order"], FAILED_SCOPE + key.tenant, FAILED_SCOPE + ALL_TENANTS)
            for m in dump.messages:
                record = {"message": m.message, "hash": m.hash, "status": m.status, "created_at": m.created_at}
                self._cache.set(_msg_key(key, m.seq), record)
            for seq, content in dump.rewrites.items():
                self._cache.set(_rewrite_key(key, seq), content)
            raw.update(inbox=len(dump.inbox), inbox_open=[], inbox_at={})
            for m in dump.inbox:
                self._cache.set(_inbox_key(key, m.id), _inbox_record(m))
                if m.status != INBOX_DELIVERED:
                    raw["inbox_open"].append(m.id)
                if m.seq is not None:
                    raw["inbox_at"].setdefault(m.seq, []).append(m.id)
            for summary in dump.summaries:
                self._cache.set(_summary_key(key, summary.id), summary.to_record())
            for turn in dump.turns:
                self._cache.set(_turn_key(key, turn["turn"]), dict(turn))
            for response_id, seq in dump.responses.items():
                self._cache.set(_response_key(key.tenant, response_id), (key.id, seq))
            self._save(key, raw)
    # -- inbox ---------------------------------------------------------------------------------

    async def post_inbox(self, key: ConversationKey, content: str, note: str, max_pending: int) -> InboxMessage | None:
        return await self._write(self._post_inbox, key, content, note, max_pending)

    def _post_inbox(self, key: ConversationKey, content: str, note: str, max_pending: int) -> InboxMessage | None:
        with self._cache.transact():
            raw = self._load(key)
            if raw is None:
                return None
            _inbox_fields(raw)
            if len(raw["inbox_open"]) >= max_pending:
                raise InboxFull(str(key))
            raw["inbox"] += 1
            record = {"id": raw["inbox"], "content": content, "note": note, "created_at": now(),
                      "seq": None, "placement": None, "turn": None, "delivered_at": None}
            self._cache.set(_inbox_key(key, record["id"]), record)
            raw["inbox_open"].append(record["id"])
            self._save(key, raw)
            return InboxMessage(**record)

    async def inbox(self, key: ConversationKey, *, after: int = 0, limit: int | None = None) -> list[InboxMessage]:
        return await self._run(self._inbox, key, after, limit)

    def _inbox(self, key: ConversationKey, after: int, limit: int | None) -> list[InboxMessage]:
        raw = self._load(key)
        last = raw.get("inbox", 0) if raw else 0
        end = last if limit is None else min(last, after + limit)
        records = [self._cache.get(_inbox_key(key, i)) for i in range(after + 1, end + 1)]
        return [self._inbox_message(key, r) for r in records if r is not None]

    def _inbox_message(self, key: ConversationKey, record: dict[str, Any]) -> InboxMessage:
        """The stored record with its status, read off the status of the item it went with."""
        message = InboxMessage(**record)
        if message.seq is None:
            return message
        item = self._cache.get(_msg_key(key, message.seq))
        status = item["status"] if item else FAILED
        if status == FAILED:  # its turn failed: it waits for the next one
            return InboxMessage(message.id, message.content, message.note, message.created_at)
        message.status = INBOX_DELIVERING if status == PENDING else INBOX_DELIVERED
        return message

    async def deliver_inbox(
        self, key: ConversationKey, seq: int, placement: str, turn: int, stamp: float
    ) -> list[InboxMessage]:
        return await self._write(self._deliver_inbox, key, seq, placement, turn, stamp)

    def _deliver_inbox(
        self, key: ConversationKey, seq: int, placement: str, turn: int, stamp: float
    ) -> list[InboxMessage]:
        with self._cache.transact():
            raw = self._load(key)
            if raw is None:
                return []
            _inbox_fields(raw)
            anchor = self._cache.get(_msg_key(key, seq))
            anchor_pending = anchor is None or anchor["status"] == PENDING
            taken, still_open = [], []
            for message_id in raw["inbox_open"]:
                record = self._cache.get(_inbox_key(key, message_id))
                if record["seq"] is not None:
                    before = self._cache.get(_msg_key(key, record["seq"]))
                    if before is not None and before["status"] not in (FAILED, PENDING):
                        continue  # its item is live (or was, and moved on): delivered for good
                    _drop_anchor(raw["inbox_at"], record["seq"], message_id)
                record.update(seq=seq, placement=placement, turn=turn, delivered_at=stamp)
                self._cache.set(_inbox_key(key, message_id), record)
                raw["inbox_at"].setdefault(seq, []).append(message_id)
                taken.append(InboxMessage(**record, status=INBOX_DELIVERING if anchor_pending else INBOX_DELIVERED))
                if anchor_pending:
                    still_open.append(message_id)
            raw["inbox_open"] = still_open
            self._save(key, raw)
            return taken

    async def inbox_at(self, key: ConversationKey, seqs: Sequence[int]) -> dict[int, list[InboxMessage]]:
        return await self._run(self._inbox_at, key, list(seqs))

    def _inbox_at(self, key: ConversationKey, seqs: list[int]) -> dict[int, list[InboxMessage]]:
        raw = self._load(key)
        anchors = raw.get("inbox_at", {}) if raw else {}
        out = {}
        for seq in seqs:
            ids = anchors.get(seq)
            if ids:
                out[seq] = [self._inbox_message(key, self._cache.get(_inbox_key(key, i))) for i in ids]
        return out

    # -- long-term knowledge -------------------------------------------------------------------

    async def knowledge(self, tenant: str, namespace: str, version: int | None = None) -> KnowledgeVersion | None:
        return await self._run(self._knowledge, tenant, namespace, version)

    def _knowledge(self, tenant: str, namespace: str, version: int | None) -> KnowledgeVersion | None:
        if version is None:
            version = self._cache.get(_knowledge_index(tenant), {}).get(namespace, 0)
        raw = self._cache.get(_knowledge_key(tenant, namespace, version)) if version > 0 else None
        return None if raw is None else KnowledgeVersion(tenant, namespace, version, **raw)

    async def knowledge_at(self, tenant: str, namespace: str, cutoff: float) -> KnowledgeVersion | None:
        return await self._run(self._knowledge_at, tenant, namespace, cutoff)

    def _knowledge_at(self, tenant: str, namespace: str, cutoff: float) -> KnowledgeVersion | None:
        # Versions are written in order, so their times rise with their numbers: a binary search.
        low, high = 1, self._cache.get(_knowledge_index(tenant), {}).get(namespace, 0)
        if high == 0:
            return None
        found = 1
        while low <= high:
            middle = (low + high) // 2
            if self._cache.get(_knowledge_key(tenant, namespace, middle))["created_at"] <= cutoff:
                found, low = middle, middle + 1
            else:
                high = middle - 1
        return self._knowledge(tenant, namespace, found)

    async def knowledge_versions(
        self, tenant: str, namespace: str, *, before: int | None = None, limit: int = 20
    ) -> list[KnowledgeVersion]:
        return await self._run(self._knowledge_versions, tenant, namespace, before, limit)

    def _knowledge_versions(
        self, tenant: str, namespace: str, before: int | None, limit: int
    ) -> list[KnowledgeVersion]:
        newest = self._cache.get(_knowledge_index(tenant), {}).get(namespace, 0)
        top = newest if before is None else min(newest, before - 1)
        numbers = range(top, max(top - limit, 0), -1)
        return [v for n in numbers if (v := self._knowledge(tenant, namespace, n)) is not None]

    async def put_knowledge(
        self, tenant: str, namespace: str, text: str, source: str, base_version: int
    ) -> KnowledgeVersion | None:
        return await self._write(self._put_knowledge, tenant, namespace, text, source, base_version)

    def _put_knowledge(
        self, tenant: str, namespace: str, text: str, source: str, base_version: int
    ) -> KnowledgeVersion | None:
        with self._cache.transact():
            index = self._cache.get(_knowledge_index(tenant), {})
            if index.get(namespace, 0) != base_version:
                return None
            version = KnowledgeVersion(tenant, namespace, base_version + 1, text, now(), source)
            self._cache.set(_knowledge_key(tenant, namespace, version.version),
                            {"text": text, "created_at": version.created_at, "source": source})
            self._cache.set(_knowledge_index(tenant), {**index, namespace: version.version})
            tenants = self._cache.get(KNOWLEDGE_TENANTS, set())
            if tenant not in tenants:
                self._cache.set(KNOWLEDGE_TENANTS, tenants | {tenant})
            return version

    async def knowledge_documents(self, tenant: str | None) -> list[KnowledgeVersion]:
        return await self._run(self._knowledge_documents, tenant)

    def _knowledge_documents(self, tenant: str | None) -> list[KnowledgeVersion]:
        tenants = [tenant] if tenant is not None else sorted(self._cache.get(KNOWLEDGE_TENANTS, set()))
        out = []
        for t in tenants:
            for namespace in sorted(self._cache.get(_knowledge_index(t), {})):
                found = self._knowledge(t, namespace, None)
                if found is not None:
                    out.append(found)
        return out

    async def acquire_lease(self, name: str, ttl_s: float) -> str | None:
        # One process owns this store (diskcache is not shared between replicas): leases live here.
        now_ = time.monotonic()
        held = self._leases.get(name)
        if held is not None and held[1] > now_:
            return None
        token = secrets.token_hex(8)
        self._leases[name] = (token, now_ + ttl_s)
        return token

    async def release_lease(self, name: str, token: str) -> None:
        held = self._leases.get(name)
        if held is not None and held[0] == token:
            del self._leases[name]

    async def secret(self) -> bytes:
        return await self._write(self._secret)

    def _secret(self) -> bytes:
        value = self._cache.get(SECRET)
        if value is not None:  # read without a transaction: a store that can't write still starts
            return value
        with self._cache.transact():
            value = self._cache.get(SECRET)
            if value is None:
                value = secrets.token_bytes(32)
                self._cache.set(SECRET, value)
            return value

    async def fail_pending(self) -> int:
        # One process owns this store, so only its own locks can mean a turn is running.
        running = {key for key, lock in list(self._locks.items()) if lock.locked()}
        return await self._write(self._fail_pending, running)

    def _fail_pending(self, running: set[ConversationKey]) -> int:
        failed = 0
        if not self._cache.get(PENDING_SET):  # the common case, and no write: a full store starts too
            return 0
        with self._cache.transact():
            for tenant, conversation_id in sorted(self._cache.get(PENDING_SET, set())):
                key = ConversationKey(tenant, conversation_id)
                if key in running:
                    continue
                raw = self._load(key)
                if raw is None:
                    continue
                seqs = [
                    seq for seq in raw.get("pending", ())
                    if (stored := self._cache.get(_msg_key(key, seq))) is not None and stored["status"] == PENDING
                ]
                self._change_statuses(key, raw, dict.fromkeys(seqs, FAILED))
                raw["pending"] = []
                self._track_pending(key, False)
                self._save(key, raw)
                failed += len(seqs)
        return failed

    async def health(self) -> StoreHealth:
        try:
            if self._health.failure is None:  # right here: not queued behind a big write in the store thread
                return self._check_health()
            return await self._run(self._check_health)
        except (StoreError, OSError) as exc:
            return failed_health(exc if isinstance(exc, StoreError) else _store_error(exc, self._path))

    def _check_health(self) -> StoreHealth:
        if self._health.failure is not None:  # does a write work again (room made, remounted)?
            try:
                self._cache.set(PROBE, now())
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
        await self._run(self._cache.close)
        self._thread.shutdown(wait=True)


def _new_record(stamp: float) -> dict[str, Any]:
    return {
        "created_at": stamp, "updated_at": stamp, "next_seq": 1, "live": [],
        "llm_calls": 0, "first_forwarded": {}, "rewritten": set(),
        "summaries": 0, "boundary": 0, "summary_id": None, "turns": 0, "order": 0,
        "inbox": 0, "inbox_open": [], "inbox_at": {},
    }


def _inbox_record(m: InboxMessage) -> dict[str, Any]:
    """An inbox message as stored: its status is read off its item, never kept."""
    return {"id": m.id, "content": m.content, "note": m.note, "created_at": m.created_at,
            "seq": m.seq, "placement": m.placement, "turn": m.turn, "delivered_at": m.delivered_at}


def _inbox_fields(raw: dict[str, Any]) -> None:
    """A record written before the inbox existed gets its (empty) inbox fields."""
    raw.setdefault("inbox", 0)
    raw.setdefault("inbox_open", [])
    raw.setdefault("inbox_at", {})


def _drop_anchor(anchors: dict[int, list[int]], seq: int, message_id: int) -> None:
    ids = anchors.get(seq, [])
    if message_id in ids:
        ids.remove(message_id)
    if not ids:
        anchors.pop(seq, None)


def _index_entry(scope: str, entry: Any) -> ConversationKey:
    return ConversationKey(*entry) if scope == ALL_TENANTS else ConversationKey(scope, entry)


def _count_call(raw: dict[str, Any]) -> int:
    raw["llm_calls"] += 1
    return raw["llm_calls"]


def _conversation(key: ConversationKey, raw: dict[str, Any]) -> Conversation:
    # .get: records written before these fields existed have none of them
    return Conversation(
        key, raw["created_at"], raw["updated_at"], raw["next_seq"], list(map(tuple, raw["live"])),
        raw["llm_calls"], dict(raw["first_forwarded"]), frozenset(raw["rewritten"]),
        raw["boundary"], raw["summary_id"], dict(raw.get("marks") or {}),
        title=raw.get("title"), task=raw.get("task"), model=raw.get("model"), client=raw.get("client"),
        failures=raw.get("failures", 0), last_error=raw.get("last_error"), turns=raw["turns"],
        inbox_open=len(raw.get("inbox_open", ())), inbox_anchors=frozenset(raw.get("inbox_at", ())),
    )


def _store_error(exc: BaseException, folder: Path) -> StoreError:
    """sqlite3's, diskcache's and the OS's failures as the store's own (the cause stays chained,
    for the log; the client's message names no path). SQLite reports a write the OS refused as a
    bare "disk I/O error": a probe file then tells a full or read-only disk from a broken one."""
    text = str(exc).lower()
    code = getattr(exc, "errno", None)
    if isinstance(exc, sqlite3.Error) and "i/o error" in text:
        code = _write_refused(folder)
    if code in (errno.ENOSPC, errno.EDQUOT) or (isinstance(exc, sqlite3.Error) and "full" in text):
        return StoreFull("The conversation store's disk is full: nothing was stored. Free space, or delete "
                         "conversations, and retry.")
    if code in (errno.EROFS, errno.EACCES, errno.EPERM) or (isinstance(exc, sqlite3.Error) and "readonly" in text):
        return StoreReadOnly("The conversation store is read-only: nothing was stored.")
    return StoreUnavailable("The conversation store failed; try again shortly.")


def _write_refused(folder: Path) -> int | None:
    """The errno with which the OS refuses a small write in `folder` now, or None if it takes one."""
    probe = folder / f".write-probe-{os.getpid()}"
    try:
        with open(probe, "wb") as out:
            out.write(b"\0" * 4096)
            out.flush()
            os.fsync(out.fileno())
    except OSError as exc:
        return exc.errno
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return None


def _make_private(root: Path) -> None:
    """The store's folder tree 0700, its files 0600 (SQLite gives its -wal and -shm files the
    database file's mode; diskcache's value files are made so by _PrivateDisk)."""
    try:
        os.chmod(root, PRIVATE_DIR)
        for folder, dirs, files in os.walk(root):
            for name in dirs:
                os.chmod(os.path.join(folder, name), PRIVATE_DIR)
            for name in files:
                os.chmod(os.path.join(folder, name), PRIVATE_FILE)
    except OSError as exc:  # not the owner: say so, the store still works
        log.warning("cannot make the store private", extra={"path": str(root), "error": str(exc)})


class _Reserve:
    """A file of `size` bytes held so that there is room to delete when the disk is full."""

    def __init__(self, path: Path, size: int) -> None:
        self.path, self.size = path, size
        self.held = size == 0 or path.is_file() and path.stat().st_size >= size

    def make(self) -> None:
        """(Re)make the reserve if there is room for it and as much again; quietly not otherwise."""
        if self.held:
            return
        try:
            fs = os.statvfs(self.path.parent)
            if fs.f_bavail * fs.f_frsize < 2 * self.size:
                return
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, PRIVATE_FILE)
            try:
                os.posix_fallocate(fd, 0, self.size)  # allocated, not sparse: the room is really taken
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("cannot make the store's reserve", extra={"path": str(self.path), "error": str(exc)})
            with contextlib.suppress(OSError):
                self.path.unlink()
            return
        self.held = True

    def release(self) -> bool:
        """Free the reserve's room; False if there was none to free."""
        if not self.held or self.size == 0:
            return False
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.held = False
        return True
