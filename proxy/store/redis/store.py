"""The shared store: Redis, for several proxy replicas behind one load balancer.

Layout (every key starts with `prefix`, "cp:" by default):

    {prefix}{<tenant>/<id>}:meta     hash: created_at, updated_at, next_seq, llm_calls, summaries,
                                     turns, boundary, summary_id (absent = None), order, version,
                                     incarnation, signed (below); and, absent until known: title,
                                     task, model, client, failures, last_error (JSON)
    {prefix}{<tenant>/<id>}:body     hash seq -> JSON {"t": created_at, "m": message}   (never changes)
    {prefix}{<tenant>/<id>}:hash     hash seq -> message hash                           (never changes)
    {prefix}{<tenant>/<id>}:status   hash seq -> status
    {prefix}{<tenant>/<id>}:live     sorted set of "seq:hash" scored by seq: the live transcript
    {prefix}{<tenant>/<id>}:fwd      hash seq -> llm_calls when first forwarded
    {prefix}{<tenant>/<id>}:rw       hash seq -> rewritten content
    {prefix}{<tenant>/<id>}:sum      hash summary id -> JSON summary
    {prefix}{<tenant>/<id>}:turns    hash turn -> JSON {"turn", "reply_seq", "record"}
    {prefix}{<tenant>/<id>}:resp     set of the response ids of the conversation's replies
    {prefix}{<tenant>/<id>}:pend     set of the seqs still pending (what a crash may leave)
    {prefix}{<tenant>/<id>}:inbox    hash inbox id -> JSON {"content", "note", "created_at"}  (never changes)
    {prefix}{<tenant>/<id>}:idel     hash inbox id -> "seq:placement:turn:stamp", its delivery
    {prefix}{<tenant>/<id>}:iopen    set of inbox ids not yet delivered for good
    {prefix}{<tenant>/<id>}:iat      hash seq -> "id,id,...": the inbox messages delivered with it
    {prefix}{<tenant>/<id>}:rparts   hash part hash -> "<n>:<created_at>:<JSON {kind, value}>" (never changes)
    {prefix}{<tenant>/<id>}:chg      sorted set of seqs scored by the version that last changed their
                                     part of the record (live, fwd, rw, iat)
    {prefix}convs:<tenant>           sorted set of conversation ids scored by creation order
    {prefix}all                      sorted set of "<tenant>/<id>" scored by creation order (admin)
    {prefix}failed:<tenant>, {prefix}failed-all   the same two, of conversations with a failed turn
    {prefix}tenants                  set of tenants
    {prefix}responses:<tenant>       hash response id -> "<id>\0<seq of the reply's last item>"
    {prefix}pending                  set of "<tenant>/<id>" with pending messages
    {prefix}created                  the creation counter
    {prefix}secret, {prefix}lease:<name>, {prefix}lock:<tenant>/<id>
    {prefix}kn:{<tenant>/<namespace>}:v   hash version -> JSON {"text", "created_at", "source"}
    {prefix}kn:{<tenant>/<namespace>}:t   sorted set of versions scored by created_at
    {prefix}kn-index:<tenant>             hash namespace -> its newest version
    {prefix}kn-tenants                    set of tenants with a knowledge document

A conversation's keys share the hash tag {<tenant>/<id>} ('/' and braces are in no id), which also
keeps two ids from ever producing the same key. Every write is one Lua script, so replicas sharing
one Redis never interleave inside an operation; the scripts also touch the global index keys, so
this targets one Redis server (or a primary with replicas), not Redis Cluster.

A turn reads what the turns since this replica's last read added, not the whole record (whose
live transcript and first-forwarded marks grow with the conversation). Every write script ends
with a commit: the record's `version` moves on (the first one also draws an `incarnation` from
the server's clock, so a record deleted, replaced by an import or lost to a restart starts over
under another), the seqs whose part of the record it changed are logged in chg under that
version, and `signed` keeps what every turn's write moves (next_seq, updated_at, turns,
llm_calls). `get` sends the incarnation and version of the snapshot this replica holds
(proxy/store/redis/records.py: the latest of recently read records, bounded) to one read script,
record.lua, which answers: the same; the meta hash and the changed seqs' state now; or the whole
record (another incarnation, more changes than a whole read, or a record written without a
commit: before versions existed, or by a replica of such a version — then nothing is kept).

Faults: an unreachable Redis is StoreUnavailable (503); one out of memory (maxmemory) refuses
writes as StoreFull (507), deletes still run (they need no memory); a read-only replica, or one
that cannot persist (MISCONF), is StoreReadOnly (503).
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry  # the asyncio one: redis-py 8 converts a sync Retry, warning each time
from redis.backoff import NoBackoff
from redis.exceptions import OutOfMemoryError, ResponseError

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
    StoreUnavailable,
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
from . import lua
from . import records as redis_records
from .calls import available, dumps, guarded, log, raise_if_cancelled
from .inbox import RedisInbox
from .knowledge import RedisKnowledge
from .request_parts import REQUEST_PARTS, RedisRequestParts, request_part_row

MARK = redis_records.MARK
CONVERSATION_PARTS = (
    "meta", "body", "hash", "status", "live", "fwd", "rw", "sum", "turns", "resp", "pend",
    "inbox", "idel", "iopen", "iat", "chg",
)
NO_CONVERSATION = "no such conversation"
NO_MESSAGE = "no such message"
CONVERSATION_EXISTS = "conversation exists"
RESPONSE_SEPARATOR = "\0"  # between the conversation id and the seq in the responses hash

__all__ = ["RedisStore", "StoreUnavailable"]  # the latter still importable from here


# -- Lua -------------------------------------------------------------------------------------------
# One .lua file per script (proxy/store/lua/: what each takes and returns), read once here. The
# Python constants the scripts spell out, filled in for their ${NAME} placeholders:
LUA_CONSTANTS = {
    "LIVE": LIVE, "PENDING": PENDING, "FAILED": FAILED, "NO_CONVERSATION": NO_CONVERSATION, "NO_MESSAGE": NO_MESSAGE,
    "CONVERSATION_EXISTS": CONVERSATION_EXISTS, "RESPONSE_SEPARATOR": RESPONSE_SEPARATOR,
}
SCRIPTS = lua.load(LUA_CONSTANTS)


def _turn_dumps(value: Any) -> bytes:
    """`_dumps` for what a turn writes, ~10x faster (a first turn stores its whole transcript).
    orjson writes the same values; it spells NaN and infinities null, but none reach a turn: the
    requests and replies its items come from are parsed by orjson, which refuses them. json is the
    fallback for what orjson refuses (integers past 64 bits, keys that are not strings)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return dumps(value).encode()


class _ReadScript:
    """A script that writes nothing. Out of memory, Redis 7 runs a script only if its shebang says
    it writes nothing (flags=no-writes); Redis 6 knows no shebang: so that form is the fallback."""

    def __init__(self, client: aioredis.Redis, source: str) -> None:
        self._client = client
        self._plain = client.register_script(source)
        self._read_only = client.register_script("#!lua flags=no-writes\n" + source)

    async def run(self, calls: list[tuple[list[str], list[Any]]]) -> list[Any]:
        """The replies to (keys, args) calls, in one round trip (a pipeline when there are several)."""
        try:
            return await self._run(self._plain, calls)
        except OutOfMemoryError:
            return await self._run(self._read_only, calls)

    async def _run(self, script: Any, calls: list[tuple[list[str], list[Any]]]) -> list[Any]:
        if len(calls) == 1:
            keys, args = calls[0]
            return [await script(keys=keys, args=args)]
        if not calls:
            return []
        async with self._client.pipeline(transaction=False) as pipe:
            for keys, args in calls:
                await script(keys=keys, args=args, client=pipe)
            return list(await pipe.execute())


class RedisStore(RedisInbox, RedisKnowledge, RedisRequestParts):
    """The shared backend: conversations and their items here; the inbox, knowledge and request
    parts in modules of their own (inbox.py, knowledge.py, request_parts.py)."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "cp:",
        lock_ttl_s: float = 30.0,
        socket_timeout_s: float = 2.0,
        connect_timeout_s: float = 1.0,
    ) -> None:
        # No automatic retries: a retried script could apply twice (an append, a call count) if only
        # the reply was lost. A failure surfaces as StoreUnavailable; the client retries the request.
        # Pooled connections the server closed (a Redis restart) are reconnected by the pool before
        # use; RESP2 because with RESP3 recent redis-py skips that check (maintenance notifications).
        self._redis: aioredis.Redis = aioredis.Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=socket_timeout_s,
            socket_connect_timeout=connect_timeout_s,
            retry=Retry(NoBackoff(), 0),
            protocol=2,
        )
        self._prefix = prefix
        self._lock_ttl_ms = max(1, round(lock_ttl_s * 1000))
        self._locks: weakref.WeakValueDictionary[ConversationKey, asyncio.Lock] = weakref.WeakValueDictionary()
        self._renewals: set[asyncio.Task[None]] = set()
        self._search = HistoryIndexes()  # history search: built from the shared log, see search.py
        register = self._redis.register_script
        self._append, self._set_statuses = register(SCRIPTS["append"]), register(SCRIPTS["set_statuses"])
        self._count_call = register(SCRIPTS["count_call"])
        self._finish_turn = register(SCRIPTS["finish_turn"])
        self._set_fields, self._add_summary = register(SCRIPTS["set_fields"]), register(SCRIPTS["add_summary"])
        self._release, self._extend = register(SCRIPTS["release"]), register(SCRIPTS["extend"])
        self._import = register(SCRIPTS["import"])
        self._fail_pending = register(SCRIPTS["fail_pending"])
        self._messages_read = _ReadScript(self._redis, SCRIPTS["messages"])
        self._record = _ReadScript(self._redis, SCRIPTS["record"])
        self._snapshots = redis_records.Snapshots()
        self._health = WriteHealth()
        self._set_title = register(SCRIPTS["set_title"])
        self._post_inbox, self._deliver_inbox = register(SCRIPTS["post_inbox"]), register(SCRIPTS["deliver_inbox"])
        self._inbox, self._put_knowledge = register(SCRIPTS["inbox"]), register(SCRIPTS["put_knowledge"])
        self._add_request_parts = register(SCRIPTS["add_request_parts"])

    # -- keys ----------------------------------------------------------------------------------

    def _conv(self, key: ConversationKey, part: str) -> str:
        return f"{self._prefix}{{{key.tenant}/{key.id}}}:{part}"

    def _index(self, tenant: str) -> str:
        return f"{self._prefix}convs:{tenant}"

    def _global(self, name: str) -> str:
        return f"{self._prefix}{name}"

    def _keys(self, key: ConversationKey) -> list[str]:
        """The KEYS of every conversation script, in lua/prelude.lua's order."""
        return [self._conv(key, part) for part in CONVERSATION_PARTS] + [
            self._index(key.tenant), self._global("tenants"), self._global("created"), self._global("all"),
            self._responses(key.tenant), self._global("pending"), self._failed_index(key.tenant), self._global("failed-all"),
        ]

    def _failed_index(self, tenant: str) -> str:
        return f"{self._prefix}failed:{tenant}"

    def _responses(self, tenant: str) -> str:
        return f"{self._prefix}responses:{tenant}"

    def _lock_name(self, key: ConversationKey) -> str:
        return self._global(f"lock:{key.tenant}/{key.id}")

    def _args(self, key: ConversationKey, *rest: Any, stamp: float | None = None) -> list[Any]:
        return [key.tenant, key.id, repr(now() if stamp is None else stamp), *rest]

    # -- lock ----------------------------------------------------------------------------------

    @asynccontextmanager
    async def lock(self, key: ConversationKey) -> AsyncIterator[None]:
        # The in-process lock first: only one task per replica polls Redis for a conversation.
        local = self._locks.get(key)
        if local is None:
            local = self._locks[key] = asyncio.Lock()
        async with local:
            name = self._lock_name(key)
            try:
                token = await self._take_lock(name)
            except StoreFull:
                # Out of memory, Redis refuses every write but deletes, so no other replica can
                # write this conversation meanwhile: the local lock is enough (DELETE frees room).
                log.warning("Redis is out of memory: conversation locked on this replica only", extra={"lock": name})
                yield
                return
            renewal = asyncio.create_task(self._keep_lock(name, token))
            self._renewals.add(renewal)
            renewal.add_done_callback(self._renewals.discard)
            try:
                yield
            finally:
                renewal.cancel()
                await self._drop_lock(name, token)

    @guarded
    async def _take_lock(self, name: str) -> str:
        token = secrets.token_hex(16)
        delay = 0.005
        task = asyncio.current_task()
        try:
            while not await self._redis.set(name, token, nx=True, px=self._lock_ttl_ms):
                raise_if_cancelled(task)
                # Backoff with jitter, so waiting replicas neither hammer Redis nor poll in lockstep.
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, 0.05)
            raise_if_cancelled(task)  # taken, but for a waiter that is gone
        except asyncio.CancelledError:
            # Cancelled mid-SET, the lock may be ours already: release it rather than block the
            # conversation for a whole TTL (a no-op if the SET did not land).
            await self._drop_lock(name, token)
            raise
        return token

    async def _keep_lock(self, name: str, token: str) -> None:
        """Extend the lock while it is held, so a long streamed turn does not outlive its TTL."""
        while True:
            await asyncio.sleep(self._lock_ttl_ms / 3000)
            try:
                with available():
                    held = await self._extend(keys=[name], args=[token, self._lock_ttl_ms])
            except StoreUnavailable:
                log.warning("cannot renew a conversation lock: Redis unreachable", extra={"lock": name})
                continue
            if held == 0:
                log.error("lost a conversation lock to another holder", extra={"lock": name})
                return

    async def _drop_lock(self, name: str, token: str) -> None:
        try:
            with available():
                await self._release(keys=[name], args=[token])
        except StoreUnavailable:
            # Not raised over the turn's own outcome: the lock expires by itself after its TTL.
            log.warning("cannot release a conversation lock: Redis unreachable", extra={"lock": name})

    # -- conversations -------------------------------------------------------------------------

    @guarded
    async def get(self, key: ConversationKey) -> Conversation | None:
        return (await self._read_conversations([key], keep=True))[0]

    async def _read_conversations(
        self, keys: list[ConversationKey], *, keep: bool = False
    ) -> list[Conversation | None]:
        """Records in one round trip, each a consistent snapshot (one record.lua script each): only
        what changed since the snapshot this replica holds, if it holds one. A record read is
        kept as the latest snapshot if `keep` (a turn's read) or one was held already."""
        bases = [self._snapshots.get(key) for key in keys]
        replies = await self._record.run([
            (self._keys(key), self._args(key, base.incarnation, base.version) if base else self._args(key, "", 0))
            for key, base in zip(keys, bases)
        ])
        return [self._snapshot(key, base, reply, keep) for key, base, reply in zip(keys, bases, replies)]

    def _snapshot(
        self, key: ConversationKey, base: redis_records.Snapshot | None, reply: list[Any], keep: bool
    ) -> Conversation | None:
        """The conversation a record.lua reply tells of, given the snapshot it was asked from."""
        if not reply:
            self._snapshots.drop(key)
            return None
        if reply[0] == "same" and base is not None:
            self._snapshots.touch(key)
            return base.conversation
        kind, incarnation, version, meta, *parts = reply
        if kind == "delta" and base is not None:
            conversation = redis_records.updated(base.conversation, meta, parts[0])
        else:
            conversation = redis_records.whole(key, meta, *parts)
        if not incarnation:  # written without versions (by a replica that keeps none): nothing kept
            self._snapshots.drop(key)
        elif keep or base is not None:
            self._snapshots.keep(key, redis_records.Snapshot(incarnation, int(version), conversation))
        return conversation

    async def _read(self, fill: Callable[[Any], None]) -> list[Any]:
        """The commands `fill` queues, read in one consistent step (MULTI). Out of memory, Redis
        refuses MULTI: then they are sent as a plain pipeline, as no write can interleave then."""
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                fill(pipe)
                return await pipe.execute()
        except OutOfMemoryError:
            async with self._redis.pipeline(transaction=False) as pipe:
                fill(pipe)
                return await pipe.execute()

    @guarded
    async def list_conversations(
        self, tenant: str | None, *, after: str | None = None, limit: int = 20, failed: bool = False
    ) -> tuple[list[Conversation], bool]:
        if failed:
            index = self._failed_index(tenant) if tenant is not None else self._global("failed-all")
        else:
            index = self._index(tenant) if tenant is not None else self._global("all")
        top = "+inf"
        if after is not None:
            order = await self._order_of(after, tenant)
            if order is None:
                return [], False
            top = f"({order}"
        members = await self._redis.zrevrangebyscore(index, top, "-inf", start=0, num=limit + 1)
        if tenant is not None:
            keys = [ConversationKey(tenant, cid) for cid in members[:limit]]
        else:
            keys = [ConversationKey(*m.rsplit("/", 1)) for m in members[:limit]]
        page = [c for c in await self._read_conversations(keys) if c is not None]
        return page, len(members) > limit

    async def _order_of(self, conversation_id: str, tenant: str | None) -> int | None:
        """The creation order of the cursor: across tenants, the newest conversation with that id."""
        tenants = [tenant] if tenant is not None else list(await self._redis.smembers(self._global("tenants")))
        async with self._redis.pipeline(transaction=False) as pipe:
            for t in tenants:
                pipe.zscore(self._index(t), conversation_id)
            scores = [s for s in await pipe.execute() if s is not None]
        return int(max(scores)) if scores else None

    @guarded
    async def find(self, conversation_id: str) -> list[Conversation]:
        tenants = sorted(await self._redis.smembers(self._global("tenants")))
        found = await self._read_conversations([ConversationKey(t, conversation_id) for t in tenants])
        return [c for c in found if c is not None]

    @guarded
    async def delete(self, key: ConversationKey) -> bool:
        self._search.forget(key)
        # Deleting is how room is made, so it must work when Redis is out of memory. Then it
        # refuses scripts and MULTI, but not these commands (they free memory), and no other
        # writer can interleave: every write is refused.
        try:
            with available():
                return await self._delete_keys(key, atomic=True)
        except StoreFull:
            log.warning("Redis is out of memory: deleting without MULTI", extra={"conversation": str(key)})
            return await self._delete_keys(key, atomic=False)

    async def _delete_keys(self, key: ConversationKey, *, atomic: bool) -> bool:
        # The caller holds the conversation's lock: no turn adds a response id meanwhile.
        self._snapshots.drop(key)
        member = f"{key.tenant}/{key.id}"
        response_ids = await self._redis.smembers(self._conv(key, "resp"))
        async with self._redis.pipeline(transaction=atomic) as pipe:
            pipe.exists(self._conv(key, "meta"))
            pipe.zrem(self._index(key.tenant), key.id)  # out of the lists first: never listed, half gone
            pipe.zrem(self._global("all"), member)
            pipe.zrem(self._failed_index(key.tenant), key.id)
            pipe.zrem(self._global("failed-all"), member)
            pipe.srem(self._global("pending"), member)
            if response_ids:
                pipe.hdel(self._responses(key.tenant), *response_ids)
            pipe.unlink(*(self._conv(key, part) for part in CONVERSATION_PARTS), self._conv(key, REQUEST_PARTS))
            existed, *_ = await pipe.execute()
        return bool(existed)

    @guarded
    async def set_title(self, key: ConversationKey, title: str | None) -> Conversation | None:
        if not await self._set_title(keys=self._keys(key), args=self._args(key, title or "")):
            return None
        return await self.get(key)

    # -- messages ------------------------------------------------------------------------------

    @guarded
    async def append(self, key: ConversationKey, items: list[Raw], hashes: list[str], status: str) -> list[int]:
        check_statuses(status)
        stamp = now()
        pairs = [x for item, h in zip(items, hashes, strict=True) for x in (_turn_dumps({"t": stamp, "m": item}), h)]
        first = await self._append(keys=self._keys(key), args=self._args(key, status, *pairs, stamp=stamp))
        return list(range(first, first + len(items)))

    async def stage(self, key: ConversationKey, items: list[Raw], hashes: list[str], status: str) -> list[int]:
        # Written at once: replicas share the conversation, so nothing waits in one's memory (one
        # round trip, as a turn's end is).
        return await self.append(key, items, hashes, status)

    async def flush(self, key: ConversationKey) -> None:
        return None  # `stage` wrote it

    @guarded
    async def set_statuses(self, key: ConversationKey, changes: Mapping[int, str]) -> None:
        check_statuses(*changes.values())
        if not changes:
            return
        pairs = [x for seq, status in changes.items() for x in (seq, status)]
        with _missing_as_key_error(key):
            await self._set_statuses(keys=self._keys(key), args=self._args(key, *pairs))

    @guarded
    async def finish_turn(
        self,
        key: ConversationKey,
        changes: Mapping[int, str],
        reply: Sequence[tuple[Raw, str]],
        reply_status: str,
        turn: TurnRecord | None,
        *,
        llm_calls: int = 0,
        forwarded: Mapping[int, int] | None = None,
        marks: Mapping[str, int] | None = None,
    ) -> int | None:
        check_statuses(*changes.values(), *([reply_status] if reply else []))
        record = turn.stored_row() if turn is not None else None
        stamp = now()
        items = [x for message, h in reply for x in (_turn_dumps({"t": stamp, "m": message}), h)]
        pairs = [x for seq, st in changes.items() for x in (seq, st)]
        record_json = _turn_dumps(record) if record is not None else ""
        response_id = str((record or {}).get("response_id") or "")
        facts = TurnFacts.of(record or {})
        fields = [x for name, value in facts.latest.items() for x in (name, value)]
        failure = _turn_dumps({"created_at": (record or {}).get("created_at"), **facts.error}) if facts.error else ""
        first = [x for seq, calls in (forwarded or {}).items() for x in (seq, calls)]
        named = [x for name, seq in (marks or {}).items() for x in (MARK + name, int(seq))]
        args = self._args(
            key, reply_status, len(reply), *items, response_id, record_json, len(facts.latest), *fields,
            facts.task or "", failure, llm_calls, len(first) // 2, *first, len(named) // 2, *named, *pairs,
            stamp=stamp,
        )
        with _missing_as_key_error(key):
            seq = await self._finish_turn(keys=self._keys(key), args=args)
        return None if seq is None else int(seq)

    @guarded
    async def response_owner(self, tenant: str, response_id: str) -> tuple[str, int] | None:
        found = await self._redis.hget(self._responses(tenant), response_id)
        if found is None:
            return None
        conversation_id, _, seq = (found.decode() if isinstance(found, bytes) else found).partition(RESPONSE_SEPARATOR)
        return conversation_id, int(seq)

    @guarded
    async def turn_records(self, key: ConversationKey, *, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        last = int(await self._redis.hget(self._conv(key, "meta"), "turns") or 0)
        end = last if limit is None else min(last, after + limit)
        if end <= after:
            return []
        found = await self._redis.hmget(self._conv(key, "turns"), [str(t) for t in range(after + 1, end + 1)])
        return [_turn_record(raw) for raw in found if raw is not None]

    @guarded
    async def messages(
        self, key: ConversationKey, *, live_only: bool, after: int | None = None, limit: int | None = None
    ) -> list[StoredMessage]:
        args = self._args(key, int(live_only), max(after or 0, 0), -1 if limit is None else max(limit, 0))
        flat = (await self._messages_read.run([(self._keys(key), args)]))[0]
        return [_stored(*flat[i : i + 4]) for i in range(0, len(flat), 4)]

    @guarded
    async def message(self, key: ConversationKey, seq: int) -> StoredMessage | None:
        def fill(pipe: Any) -> None:
            for part in ("body", "hash", "status"):
                pipe.hget(self._conv(key, part), str(seq))

        body, h, status = await self._read(fill)
        return None if body is None else _stored(seq, body, h, status)

    @guarded
    async def count_llm_call(self, key: ConversationKey, limit: int | None = None) -> int | None:
        extra = () if limit is None else (limit,)
        calls = int(await self._count_call(keys=self._keys(key), args=self._args(key, *extra)))
        return None if calls < 0 else calls

    @guarded
    async def mark_forwarded(self, key: ConversationKey, marks: Mapping[int, int]) -> None:
        if marks:
            pairs = [x for seq, calls in marks.items() for x in (seq, calls)]
            await self._set_fields(keys=self._keys(key), args=self._args(key, "fwd", *pairs))

    @guarded
    async def set_marks(self, key: ConversationKey, marks: Mapping[str, int]) -> None:
        if marks:
            pairs = [x for name, seq in marks.items() for x in (MARK + name, int(seq))]
            await self._set_fields(keys=self._keys(key), args=self._args(key, "meta", *pairs))

    @guarded
    async def set_rewrites(self, key: ConversationKey, rewrites: Mapping[int, str]) -> None:
        if rewrites:
            pairs = [x for seq, content in rewrites.items() for x in (seq, content)]
            await self._set_fields(keys=self._keys(key), args=self._args(key, "rw", *pairs))

    @guarded
    async def rewrites(self, key: ConversationKey, seqs: list[int]) -> dict[int, str]:
        if not seqs:
            return {}
        found = await self._redis.hmget(self._conv(key, "rw"), [str(s) for s in seqs])
        return {seq: content for seq, content in zip(seqs, found) if content is not None}

    # -- summaries -----------------------------------------------------------------------------

    @guarded
    async def add_summary(self, key: ConversationKey, summary: Summary) -> Summary:
        data = summary.to_record()
        del data["id"]  # the store assigns it; it is the field name in the hash
        sid = await self._add_summary(keys=self._keys(key), args=self._args(key, dumps(data), summary.last_seq))
        return replace(summary, id=int(sid))

    @guarded
    async def summaries(self, key: ConversationKey) -> list[Summary]:
        raw = await self._redis.hgetall(self._conv(key, "sum"))
        return [Summary.from_record({**json.loads(raw[sid]), "id": int(sid)}) for sid in sorted(raw, key=int)]

    @guarded
    async def summary(self, key: ConversationKey, summary_id: int) -> Summary | None:
        raw = await self._redis.hget(self._conv(key, "sum"), str(summary_id))
        return None if raw is None else Summary.from_record({**json.loads(raw), "id": summary_id})

    # -- import --------------------------------------------------------------------------------

    @guarded
    async def search(self, key: ConversationKey, query: str, *, limit: int = DEFAULT_HITS) -> list[SearchHit]:
        return await self._search.search(self, key, query, limit)

    async def import_conversation(self, dump: ConversationDump, *, replace: bool = False) -> None:
        dump.check()
        self._search.forget(dump.conversation.key)
        c = dump.conversation
        meta = {MARK + name: seq for name, seq in c.marks.items()}
        for name, value in c.description().items():  # absent = unknown, as _conversation reads them
            if value is not None and value != 0:
                meta[name] = dumps(value) if name == "last_error" else value
        args = self._args(
            c.key, int(replace), repr(c.updated_at), c.next_seq, c.llm_calls, c.boundary,
            "" if c.summary_id is None else c.summary_id, len(dump.summaries), len(dump.turns),
            len(dump.messages), len(c.first_forwarded), len(dump.rewrites), len(dump.responses), len(meta),
            len(dump.inbox), stamp=c.created_at,
        )
        for m in dump.messages:
            args += [m.seq, dumps({"t": m.created_at, "m": m.message}), m.hash, m.status]
        for seq, calls in c.first_forwarded.items():
            args += [seq, calls]
        for seq, content in dump.rewrites.items():
            args += [seq, content]
        for summary in dump.summaries:
            data = summary.to_record()
            args += [data.pop("id"), dumps(data)]
        for record in dump.turns:
            rest = imported_turn_row({k: v for k, v in record.items() if k not in ("turn", "reply_seq")})
            stored = {"turn": record["turn"], "reply_seq": record.get("reply_seq"), "record": rest}
            args += [record["turn"], dumps(stored)]
        for name, value in meta.items():
            args += [name, value]
        for response_id, seq in dump.responses.items():
            args += [response_id, seq]
        for m in dump.inbox:
            delivery = "" if m.seq is None else f"{m.seq}:{m.placement}:{m.turn}:{m.delivered_at!r}"
            body = dumps({"content": m.content, "note": m.note, "created_at": m.created_at})
            args += [m.id, body, delivery, int(m.status != INBOX_DELIVERED)]
        args.append(len(dump.parts))
        for n, part in enumerate(dump.parts, 1):
            args += [part.hash, request_part_row(n, part)]
        try:
            await self._import(keys=[*self._keys(c.key), self._conv(c.key, REQUEST_PARTS)], args=args)
        except ResponseError as exc:
            if CONVERSATION_EXISTS in str(exc):
                raise ConversationExists(str(c.key)) from None
            raise

    # -- leases, secret ------------------------------------------------------------------------

    @guarded
    async def acquire_lease(self, name: str, ttl_s: float) -> str | None:
        token = secrets.token_hex(8)
        ttl_ms = round(ttl_s * 1000)
        lease = self._global(f"lease:{name}")
        if ttl_ms <= 0:
            # Redis expiry has 1 ms resolution: a lease shorter than that is granted already expired.
            return None if await self._redis.exists(lease) else token
        return token if await self._redis.set(lease, token, nx=True, px=ttl_ms) else None

    @guarded
    async def release_lease(self, name: str, token: str) -> None:
        await self._release(keys=[self._global(f"lease:{name}")], args=[token])

    @guarded
    async def secret(self) -> bytes:
        # SET NX then GET in one transaction: the first replica's value wins and every one reads it.
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(self._global("secret"), secrets.token_hex(32), nx=True)
            pipe.get(self._global("secret"))
            _, value = await pipe.execute()
        return bytes.fromhex(value)

    @guarded
    async def fail_pending(self) -> int:
        failed = 0
        for member in await self._redis.smembers(self._global("pending")):
            key = ConversationKey(*member.rsplit("/", 1))
            marked = await self._fail_pending(keys=[*self._keys(key), self._lock_name(key)], args=self._args(key))
            failed += max(int(marked), 0)
        return failed

    async def health(self) -> StoreHealth:
        try:
            with available():
                await self._redis.ping()
                if self._health.failure is not None:  # does a write work again?
                    await self._redis.set(self._global("health-probe"), repr(now()), px=60_000)
                    self._health.succeeded()
        except StoreError as exc:
            if not isinstance(exc, StoreUnavailable):  # a failed probe: still full / read-only
                return self._health.health()
            return failed_health(exc)
        return self._health.health()

    async def close(self) -> None:
        # Renewals stop with the store: a lock still held then expires after its TTL.
        for task in list(self._renewals):
            task.cancel()
        await self._redis.aclose()


@contextmanager
def _missing_as_key_error(key: ConversationKey) -> Iterator[None]:
    """A status change naming an unknown conversation or seq fails as KeyError, as DiskStore's does."""
    try:
        yield
    except ResponseError as exc:
        if NO_CONVERSATION in str(exc) or NO_MESSAGE in str(exc):
            raise KeyError(f"{key}: {exc}") from exc
        raise


def _turn_record(raw: str) -> dict[str, Any]:
    stored = json.loads(raw)
    return {**turn_row_read(stored["record"]), "turn": stored["turn"], "reply_seq": stored["reply_seq"]}


def _stored(seq: int | str, body: str, h: str, status: str) -> StoredMessage:
    record = json.loads(body)
    return StoredMessage(int(seq), record["m"], h, status, record["t"])
