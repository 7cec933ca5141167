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
(proxy/store/redis_records.py: the latest of recently read records, bounded) to one read script,
RECORD, which answers: the same; the meta hash and the changed seqs' state now; or the whole
record (another incarnation, more changes than a whole read, or a record written without a
commit: before versions existed, or by a replica of such a version — then nothing is kept).

Faults: an unreachable Redis is StoreUnavailable (503); one out of memory (maxmemory) refuses
writes as StoreFull (507), deletes still run (they need no memory); a read-only replica, or one
that cannot persist (MISCONF), is StoreReadOnly (503).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import random
import secrets
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import replace
from typing import Any, ParamSpec, TypeVar

import orjson
import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from ..identity import ConversationKey
from ..messages import Message
from . import redis_records
from .base import (
    FAILED,
    INBOX_DELIVERED,
    INBOX_DELIVERING,
    LIVE,
    PENDING,
    Conversation,
    ConversationDump,
    ConversationExists,
    InboxFull,
    InboxMessage,
    KnowledgeVersion,
    RequestPart,
    StoredMessage,
    StoreError,
    StoreFull,
    StoreHealth,
    StoreReadOnly,
    StoreUnavailable,
    Summary,
    TurnFacts,
    TurnRecord,
    WriteHealth,
    check_statuses,
    failed_health,
    now,
)
from .search import DEFAULT_HITS, HistoryIndexes, SearchHit

log = logging.getLogger("proxy.store.redis")

P = ParamSpec("P")
T = TypeVar("T")

MARK = redis_records.MARK
CONVERSATION_PARTS = (
    "meta", "body", "hash", "status", "live", "fwd", "rw", "sum", "turns", "resp", "pend",
    "inbox", "idel", "iopen", "iat", "chg",
)
REQUEST_PARTS = "rparts"  # the conversation's system prompts and tools lists: outside the scripts' KEYS
NO_CONVERSATION = "no such conversation"
NO_MESSAGE = "no such message"
CONVERSATION_EXISTS = "conversation exists"

__all__ = ["RedisStore", "StoreUnavailable"]  # the latter still importable from here


@contextmanager
def _available() -> Iterator[None]:
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


def _raise_if_cancelled(task: asyncio.Task[Any] | None) -> None:
    """Raise the cancellation a Redis call swallowed: a cancel that lands in redis-py's read can
    end as the call's reply (about one in a hundred short timeouts on a lock wait, measured), and
    a waiter whose cancellation is lost polls on, while its holder may be waiting for it."""
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _guarded(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Redis's failures as StoreErrors; a write's outcome (a method named in WRITES) is the store's health."""
    writes = fn.__name__ in WRITES

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        store = args[0]
        try:
            with _available():
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


# -- Lua -------------------------------------------------------------------------------------------
# Conversation scripts all take the same KEYS (see RedisStore._keys) and ARGV[1..3] = tenant, id,
# stamp; their own arguments start at ARGV[4].

PRELUDE = """
local meta, body, hashes, statuses, live, fwd, rw, sums, turns, resp, pend, inbox, idel, iopen, iat, chg,
      index, tenants, created, all, responses, pending, failed_index, failed_all = unpack(KEYS)
local tenant, id, stamp = ARGV[1], ARGV[2], ARGV[3]

-- A write touches the seqs whose part of the record (Conversation: live, first-forwarded, rewritten,
-- inbox anchor) it changes, then commits: the record's version moves on and those seqs are logged
-- under it in chg, so a replica holding an older snapshot reads only what changed (RECORD).
local touched, touched_set = {}, {}
local function touch(seq)
  seq = tostring(seq)
  if not touched_set[seq] then
    touched_set[seq] = true
    touched[#touched + 1] = seq
  end
end

-- What every write of a turn moves, also one by a replica of a version that keeps no versions:
-- a record whose signature is not the one its latest commit left was written without a commit.
local function signature()
  local f = redis.call('HMGET', meta, 'next_seq', 'updated_at', 'turns', 'llm_calls')
  return (f[1] or '') .. ':' .. (f[2] or '') .. ':' .. (f[3] or '') .. ':' .. (f[4] or '')
end

local function commit()
  if redis.call('EXISTS', meta) == 0 then return end
  local version = redis.call('HINCRBY', meta, 'version', 1)
  if version == 1 then
    -- A new record (or one written before versions): an incarnation no earlier record of this key
    -- had (a delete or a Redis restart empty starts the version over), from the server's clock.
    local t = redis.call('TIME')
    redis.call('HSET', meta, 'incarnation', t[1] .. '.' .. t[2] .. '.' .. (redis.call('HGET', meta, 'order') or ''))
  end
  for _, seq in ipairs(touched) do redis.call('ZADD', chg, version, seq) end
  redis.call('HSET', meta, 'signed', signature())
end

-- Create the conversation record if new, and list it (creation order from a counter, not a clock).
local function ensure()
  if redis.call('EXISTS', meta) == 1 then return end
  local order = redis.call('INCR', created)
  redis.call('HSET', meta, 'created_at', stamp, 'updated_at', stamp, 'next_seq', 1, 'llm_calls', 0,
             'summaries', 0, 'turns', 0, 'boundary', 0, 'order', order)
  redis.call('ZADD', index, order, id)
  redis.call('ZADD', all, order, tenant .. '/' .. id)
  redis.call('SADD', tenants, tenant)
end

-- Status changes are ARGV[from..] (seq, status) pairs. A script checks them all before it writes
-- anything (Lua does not roll back), so a bad seq leaves everything as it was.
local function check_statuses(from)
  if from > #ARGV then return nil end
  if redis.call('EXISTS', meta) == 0 then return redis.error_reply('""" + NO_CONVERSATION + """') end
  for i = from, #ARGV, 2 do
    if redis.call('HEXISTS', statuses, ARGV[i]) == 0 then
      return redis.error_reply('""" + NO_MESSAGE + """ ' .. ARGV[i])
    end
  end
  return nil
end

local function set_statuses(from)
  for i = from, #ARGV, 2 do
    local seq, status = ARGV[i], ARGV[i + 1]
    touch(seq)
    redis.call('HSET', statuses, seq, status)
    redis.call('ZREMRANGEBYSCORE', live, seq, seq)
    if status == '""" + LIVE + """' then redis.call('ZADD', live, seq, seq .. ':' .. redis.call('HGET', hashes, seq)) end
    if status ~= '""" + PENDING + """' then redis.call('SREM', pend, seq) end
  end
  if from <= #ARGV then
    redis.call('HSET', meta, 'updated_at', stamp)
    if redis.call('SCARD', pend) == 0 then redis.call('SREM', pending, tenant .. '/' .. id) end
  end
end

-- Append (body, hash) pairs ARGV[from..to]: seqs come from next_seq inside the script, never shared.
local function append(status, from, to)
  ensure()
  local first = tonumber(redis.call('HGET', meta, 'next_seq'))
  local n = (to - from + 1) / 2
  for i = 0, n - 1 do
    local seq, h = first + i, ARGV[from + 1 + 2 * i]
    redis.call('HSET', body, seq, ARGV[from + 2 * i])
    redis.call('HSET', hashes, seq, h)
    redis.call('HSET', statuses, seq, status)
    if status == '""" + LIVE + """' then
      redis.call('ZADD', live, seq, seq .. ':' .. h)
      touch(seq)
    end
    if status == '""" + PENDING + """' then redis.call('SADD', pend, seq) end
  end
  if status == '""" + PENDING + """' and n > 0 then redis.call('SADD', pending, tenant .. '/' .. id) end
  redis.call('HSET', meta, 'next_seq', first + n, 'updated_at', stamp)
  return first
end
"""

APPEND = PRELUDE + """
-- ARGV[4] = status, then (body, hash) pairs.
local first = append(ARGV[4], 5, #ARGV)
commit()
return first
"""

SET_STATUSES = PRELUDE + """
-- ARGV[4..] = (seq, status) pairs.
local refused = check_statuses(4)
if refused then return refused end
set_statuses(4)
commit()
return 1
"""

FINISH_TURN = PRELUDE + """
-- ARGV[4] = reply status, ARGV[5] = n, the number of reply items, ARGV[6 .. 5+2n] = their (body, hash)
-- pairs, then the reply's response id ('' = none), then the turn record's JSON ('' = none), then
-- what the record tells of the conversation (TurnFacts): m, m (field, value) pairs for the meta
-- hash, the task ('' = none), the failure's JSON ('' = the turn did not fail); then the turn's
-- upstream calls, f, f (seq, calls) first-forwarded marks, k, k (field, seq) named marks for the
-- meta hash; then (seq, status) changes. Returns the reply's first seq.
local n = tonumber(ARGV[5])
local record_at = 7 + 2 * n
local task_at = record_at + 2 + 2 * tonumber(ARGV[record_at + 1])
local calls_at = task_at + 2
local calls, f = tonumber(ARGV[calls_at]), tonumber(ARGV[calls_at + 1])
local marks_at = calls_at + 2 + 2 * f
local changes_at = marks_at + 1 + 2 * tonumber(ARGV[marks_at])
local refused = check_statuses(changes_at)
if refused then return refused end
if calls > 0 or changes_at > marks_at + 1 then ensure() end
if calls > 0 then redis.call('HINCRBY', meta, 'llm_calls', calls) end
for i = calls_at + 2, marks_at - 1, 2 do
  redis.call('HSET', fwd, ARGV[i], ARGV[i + 1])
  touch(ARGV[i])
end
for i = marks_at + 1, changes_at - 1, 2 do redis.call('HSET', meta, ARGV[i], ARGV[i + 1]) end
set_statuses(changes_at)
local seq = false
if n > 0 then seq = append(ARGV[4], 6, record_at - 2) end
local response_id = ARGV[record_at - 1]
if seq and response_id ~= '' then
  redis.call('HSET', responses, response_id, id .. '\0' .. (seq + n - 1))
  redis.call('SADD', resp, response_id)
end
local record = ARGV[record_at]
if record ~= '' then
  ensure()
  local turn = redis.call('HINCRBY', meta, 'turns', 1)
  local reply_seq = seq and tostring(seq) or 'null'
  -- Spliced, not re-encoded: cjson would turn the record's empty lists into objects.
  redis.call('HSET', turns, turn, '{"turn":' .. turn .. ',"reply_seq":' .. reply_seq .. ',"record":' .. record .. '}')
  for i = record_at + 2, task_at - 1, 2 do redis.call('HSET', meta, ARGV[i], ARGV[i + 1]) end
  if ARGV[task_at] ~= '' then redis.call('HSETNX', meta, 'task', ARGV[task_at]) end
  local failure = ARGV[task_at + 1]
  if failure ~= '' then
    if redis.call('HINCRBY', meta, 'failures', 1) == 1 then  -- its first: listed among the failed
      local order = redis.call('HGET', meta, 'order')
      redis.call('ZADD', failed_index, order, id)
      redis.call('ZADD', failed_all, order, tenant .. '/' .. id)
    end
    redis.call('HSET', meta, 'last_error', '{"turn":' .. turn .. ',' .. string.sub(failure, 2))
  end
end
commit()
return seq
"""

# ARGV[4] = the title ('' = none of its own). Returns 0 if there is no such conversation.
SET_TITLE = PRELUDE + """
if redis.call('EXISTS', meta) == 0 then return 0 end
if ARGV[4] == '' then redis.call('HDEL', meta, 'title') else redis.call('HSET', meta, 'title', ARGV[4]) end
commit()
return 1
"""

# ARGV[4]: the most calls to count (absent: no limit); -1 when that many are counted already.
COUNT_CALL = PRELUDE + """
ensure()
local limit = tonumber(ARGV[4])
if limit ~= nil and tonumber(redis.call('HGET', meta, 'llm_calls') or '0') >= limit then
  return -1
end
local calls = redis.call('HINCRBY', meta, 'llm_calls', 1)
commit()
return calls
"""

# ARGV[4] names the hash (fwd, rw or meta: the caller's choice of key), then (field, value) pairs.
SET_FIELDS = PRELUDE + """
ensure()
local target = ({fwd = fwd, rw = rw, meta = meta})[ARGV[4]]
for i = 5, #ARGV, 2 do
  redis.call('HSET', target, ARGV[i], ARGV[i + 1])
  if target ~= meta then touch(ARGV[i]) end
end
commit()
return 1
"""

ADD_SUMMARY = PRELUDE + """
-- ARGV[4] = summary JSON, ARGV[5] = its last_seq. The boundary never moves back.
ensure()
local sid = redis.call('HINCRBY', meta, 'summaries', 1)
redis.call('HSET', sums, sid, ARGV[4])
if tonumber(ARGV[5]) > tonumber(redis.call('HGET', meta, 'boundary')) then
  redis.call('HSET', meta, 'boundary', ARGV[5], 'summary_id', sid)
end
commit()
return sid
"""

# The conversation's lock is the last KEY: while a turn holds it (on any replica) its pending
# messages are that turn's. Returns how many were marked failed, -1 when locked.
FAIL_PENDING = PRELUDE + """
if redis.call('EXISTS', KEYS[#KEYS]) == 1 then return -1 end
local failed = 0
for _, seq in ipairs(redis.call('SMEMBERS', pend)) do
  if redis.call('HGET', statuses, seq) == '""" + PENDING + """' then
    redis.call('HSET', statuses, seq, '""" + FAILED + """')
    failed = failed + 1
  end
end
redis.call('DEL', pend)
redis.call('SREM', pending, tenant .. '/' .. id)
if failed > 0 then
  redis.call('HSET', meta, 'updated_at', stamp)
  commit()
end
return failed
"""

# The anchors index holds "id,id,..." per seq.
INBOX_ANCHORS = """
local function anchor_ids(seq)
  local ids = {}
  for mid in string.gmatch(redis.call('HGET', iat, seq) or '', '%d+') do ids[#ids + 1] = mid end
  return ids
end

local function drop_anchor(seq, mid)
  local kept = {}
  for _, other in ipairs(anchor_ids(seq)) do if other ~= mid then kept[#kept + 1] = other end end
  if #kept == 0 then redis.call('HDEL', iat, seq) else redis.call('HSET', iat, seq, table.concat(kept, ',')) end
  touch(seq)
end
"""

IMPORT = PRELUDE + INBOX_ANCHORS + """
-- ARGV[3] (the stamp) = created_at; ARGV[4] = replace (1/0); ARGV[5..11] = updated_at, next_seq,
-- llm_calls, boundary, summary_id ('' = none), summaries, turns; ARGV[12..17] = how many messages,
-- first-forwarded marks, rewrites, response ids, meta fields and inbox messages follow. Then (seq,
-- body, hash, status) per message, (seq, calls) per first-forwarded mark, (seq, content) per
-- rewrite, (id, JSON) per summary, (turn, JSON) per turn record, (meta field, value) per mark and
-- per field that describes the conversation (title, task, model, client, failures, last_error),
-- (response id, seq) per response id, (id, JSON, delivery or '', open 1/0) per inbox message,
-- then the request parts (below).
if redis.call('EXISTS', meta) == 1 then
  if ARGV[4] ~= '1' then return redis.error_reply('""" + CONVERSATION_EXISTS + """') end
  local known = redis.call('SMEMBERS', resp)
  if #known > 0 then redis.call('HDEL', responses, unpack(known)) end
  redis.call('UNLINK', meta, body, hashes, statuses, live, fwd, rw, sums, turns, resp, inbox, idel, iopen, iat, chg)
  redis.call('ZREM', index, id)
  redis.call('ZREM', all, tenant .. '/' .. id)
  redis.call('ZREM', failed_index, id)
  redis.call('ZREM', failed_all, tenant .. '/' .. id)
end
ensure()
redis.call('HSET', meta, 'updated_at', ARGV[5], 'next_seq', ARGV[6], 'llm_calls', ARGV[7], 'boundary', ARGV[8],
           'summaries', ARGV[10], 'turns', ARGV[11])
if ARGV[9] ~= '' then redis.call('HSET', meta, 'summary_id', ARGV[9]) end
local i = 18
for _ = 1, tonumber(ARGV[12]) do
  local seq, h, status = ARGV[i], ARGV[i + 2], ARGV[i + 3]
  redis.call('HSET', body, seq, ARGV[i + 1])
  redis.call('HSET', hashes, seq, h)
  redis.call('HSET', statuses, seq, status)
  if status == '""" + LIVE + """' then redis.call('ZADD', live, seq, seq .. ':' .. h) end
  i = i + 4
end
for _, part in ipairs({{fwd, ARGV[13]}, {rw, ARGV[14]}, {sums, ARGV[10]}, {turns, ARGV[11]}, {meta, ARGV[16]}}) do
  for _ = 1, tonumber(part[2]) do
    redis.call('HSET', part[1], ARGV[i], ARGV[i + 1])
    i = i + 2
  end
end
for _ = 1, tonumber(ARGV[15]) do
  redis.call('HSET', responses, ARGV[i], id .. '\0' .. ARGV[i + 1])
  redis.call('SADD', resp, ARGV[i])
  i = i + 2
end
if tonumber(redis.call('HGET', meta, 'failures') or '0') > 0 then
  local order = redis.call('HGET', meta, 'order')
  redis.call('ZADD', failed_index, order, id)
  redis.call('ZADD', failed_all, order, tenant .. '/' .. id)
end
for _ = 1, tonumber(ARGV[17]) do
  local mid, delivery = ARGV[i], ARGV[i + 2]
  redis.call('HSET', inbox, mid, ARGV[i + 1])
  if delivery ~= '' then
    redis.call('HSET', idel, mid, delivery)
    local seq = string.match(delivery, '^(%d+):')
    local ids = anchor_ids(seq)
    ids[#ids + 1] = mid
    redis.call('HSET', iat, seq, table.concat(ids, ','))
  end
  if ARGV[i + 3] == '1' then redis.call('SADD', iopen, mid) end
  i = i + 4
end
redis.call('HSET', meta, 'inbox', ARGV[17], 'inbox_open', redis.call('SCARD', iopen))
-- Then how many request parts, and (hash, row) per part, into the last KEY (rparts: not PRELUDE's).
local rparts = KEYS[#KEYS]
redis.call('DEL', rparts)
local nparts = tonumber(ARGV[i] or '0')
i = i + 1
for _ = 1, nparts do
  redis.call('HSET', rparts, ARGV[i], ARGV[i + 1])
  i = i + 2
end
commit()  -- a record of its own: version 1, a new incarnation
return 1
"""

# KEYS: meta, rparts; ARGV: the stamp, then (hash, JSON record without its number and stamp) per
# part. Keeps the parts not kept yet as "<n>:<stamp>:<JSON>" (n = 1, 2, ... in order kept), if the
# conversation is stored; returns the hashes newly kept. The record (meta) does not change.
ADD_REQUEST_PARTS = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
local added = {}
for i = 2, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[2], ARGV[i]) == 0 then
    local n = redis.call('HLEN', KEYS[2]) + 1
    redis.call('HSET', KEYS[2], ARGV[i], n .. ':' .. ARGV[1] .. ':' .. ARGV[i + 1])
    added[#added + 1] = ARGV[i]
  end
end
return added
"""

MESSAGES = PRELUDE + """
-- ARGV[4] = live only (1/0), ARGV[5] = after, ARGV[6] = limit (-1: none). Returns flat
-- (seq, body, hash, status) quadruples: one consistent read, one round trip.
local after, limit = tonumber(ARGV[5]), tonumber(ARGV[6])
local seqs = {}
if ARGV[4] == '1' then
  local members
  if limit >= 0 then
    members = redis.call('ZRANGEBYSCORE', live, '(' .. after, '+inf', 'LIMIT', 0, limit)
  else
    members = redis.call('ZRANGEBYSCORE', live, '(' .. after, '+inf')
  end
  for _, m in ipairs(members) do seqs[#seqs + 1] = tonumber(string.match(m, '^(%d+):')) end
else
  local last = tonumber(redis.call('HGET', meta, 'next_seq') or '1') - 1
  if limit >= 0 then last = math.min(last, after + limit) end
  for seq = after + 1, last do seqs[#seqs + 1] = seq end
end
local out = {}
for _, seq in ipairs(seqs) do
  out[#out + 1] = seq
  out[#out + 1] = redis.call('HGET', body, seq)
  out[#out + 1] = redis.call('HGET', hashes, seq)
  out[#out + 1] = redis.call('HGET', statuses, seq)
end
return out
"""

RECORD = PRELUDE + """
-- ARGV[4], ARGV[5] = the incarnation and version of the caller's snapshot of the record ('', 0:
-- none). Returns {} when there is no such conversation; {'same'} when the snapshot is current;
-- {'delta', incarnation, version, meta, changes} when the changes since are fewer than a whole
-- read, `changes` flat (seq, live member or '', first-forwarded calls or '', rewritten 1/0, inbox
-- anchor 1/0) per seq that changed; else {'whole', incarnation, version, meta, live, fwd, rw seqs,
-- anchor seqs}, incarnation '' when no snapshot of it can be trusted (it was written without a
-- commit). Meta and fwd as HGETALL's flat (field, value) lists.
local known = redis.call('HMGET', meta, 'incarnation', 'version', 'signed')
local incarnation, version = known[1] or '', known[2] or '0'
if incarnation == '' and redis.call('EXISTS', meta) == 0 then return {} end
if incarnation ~= '' and known[3] ~= signature() then incarnation = '' end
if incarnation ~= '' and incarnation == ARGV[4] then
  if version == ARGV[5] then return {'same'} end
  local since = '(' .. ARGV[5]
  if redis.call('ZCOUNT', chg, since, '+inf') * 2 <= redis.call('ZCARD', live) + 64 then
    local changes = {}
    for _, seq in ipairs(redis.call('ZRANGEBYSCORE', chg, since, '+inf')) do
      changes[#changes + 1] = seq
      changes[#changes + 1] = redis.call('ZRANGEBYSCORE', live, seq, seq)[1] or ''
      changes[#changes + 1] = redis.call('HGET', fwd, seq) or ''
      changes[#changes + 1] = redis.call('HEXISTS', rw, seq)
      changes[#changes + 1] = redis.call('HEXISTS', iat, seq)
    end
    return {'delta', incarnation, version, redis.call('HGETALL', meta), changes}
  end
end
return {'whole', incarnation, version, redis.call('HGETALL', meta), redis.call('ZRANGE', live, 0, -1),
        redis.call('HGETALL', fwd), redis.call('HKEYS', rw), redis.call('HKEYS', iat)}
"""

POST_INBOX = PRELUDE + """
-- ARGV[4] = the message's JSON, ARGV[5] = the most open messages allowed. Returns its id, 0 when
-- there is no such conversation, -1 when the inbox is full.
if redis.call('EXISTS', meta) == 0 then return 0 end
if redis.call('SCARD', iopen) >= tonumber(ARGV[5]) then return -1 end
local mid = redis.call('HINCRBY', meta, 'inbox', 1)
redis.call('HSET', inbox, mid, ARGV[4])
redis.call('SADD', iopen, mid)
redis.call('HSET', meta, 'inbox_open', redis.call('SCARD', iopen))
commit()
return mid
"""

DELIVER_INBOX = PRELUDE + INBOX_ANCHORS + """
-- ARGV[4] = seq, ARGV[5] = placement, ARGV[6] = turn. Returns the status of item seq, then flat
-- (id, body, delivery) triples.
local seq, placement, turn = ARGV[4], ARGV[5], ARGV[6]
local anchor_status = redis.call('HGET', statuses, seq) or '""" + PENDING + """'
local anchor_pending = anchor_status == '""" + PENDING + """'
local open = redis.call('SMEMBERS', iopen)
table.sort(open, function(a, b) return tonumber(a) < tonumber(b) end)
local out = {anchor_status}
for _, mid in ipairs(open) do
  local before = redis.call('HGET', idel, mid)
  local take = true
  if before then
    local before_seq = string.match(before, '^(%d+):')
    local status = redis.call('HGET', statuses, before_seq)
    if status and status ~= '""" + FAILED + """' and status ~= '""" + PENDING + """' then
      take = false  -- its item is live (or was, and moved on): delivered for good
      redis.call('SREM', iopen, mid)
    else
      drop_anchor(before_seq, mid)
    end
  end
  if take then
    local delivery = seq .. ':' .. placement .. ':' .. turn .. ':' .. stamp
    redis.call('HSET', idel, mid, delivery)
    local ids = anchor_ids(seq)
    ids[#ids + 1] = mid
    redis.call('HSET', iat, seq, table.concat(ids, ','))
    touch(seq)
    if not anchor_pending then redis.call('SREM', iopen, mid) end
    out[#out + 1] = mid
    out[#out + 1] = redis.call('HGET', inbox, mid)
    out[#out + 1] = delivery
  end
end
redis.call('HSET', meta, 'inbox_open', redis.call('SCARD', iopen))
commit()
return out
"""

INBOX = PRELUDE + INBOX_ANCHORS + """
-- ARGV[4] = 'ids' then the ids to read, or 'seqs' then the seqs whose messages to read. Returns
-- flat (id, body, delivery or '', status of the delivery's item or '') quadruples.
local ids = {}
if ARGV[4] == 'ids' then
  for i = 5, #ARGV do ids[#ids + 1] = ARGV[i] end
else
  for i = 5, #ARGV do for _, mid in ipairs(anchor_ids(ARGV[i])) do ids[#ids + 1] = mid end end
end
local out = {}
for _, mid in ipairs(ids) do
  local message = redis.call('HGET', inbox, mid)
  if message then
    local delivery = redis.call('HGET', idel, mid) or ''
    local status = ''
    if delivery ~= '' then status = redis.call('HGET', statuses, string.match(delivery, '^(%d+):')) or '' end
    out[#out + 1] = mid
    out[#out + 1] = message
    out[#out + 1] = delivery
    out[#out + 1] = status
  end
end
return out
"""

# KEYS = versions hash, versions by time, the tenant's index, the tenants set; ARGV = namespace,
# base version, tenant, the version's JSON, its created_at. Returns the new version, or 0.
PUT_KNOWLEDGE = """
local versions, times, index, tenants = unpack(KEYS)
local namespace, base = ARGV[1], tonumber(ARGV[2])
if tonumber(redis.call('HGET', index, namespace) or '0') ~= base then return 0 end
local version = base + 1
redis.call('HSET', versions, version, ARGV[4])
redis.call('ZADD', times, ARGV[5], version)
redis.call('HSET', index, namespace, version)
redis.call('SADD', tenants, ARGV[3])
return version
"""

# Locks and leases are token-checked: only the holder releases or extends one.
RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# A lock that vanished (expired while our event loop stalled, or Redis restarted empty) is taken
# back if nobody else took it meanwhile.
EXTEND = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 2
end
return 0
"""


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _request_part_row(n: int, part: RequestPart) -> str:
    """A request part as the rparts hash keeps it (see ADD_REQUEST_PARTS)."""
    return f"{n}:{part.created_at!r}:{_dumps({'kind': part.kind, 'value': part.value})}"


def _turn_dumps(value: Any) -> bytes:
    """`_dumps` for what a turn writes, ~10x faster (a first turn stores its whole transcript).
    orjson writes the same values; it spells NaN and infinities null, but none reach a turn: the
    requests and replies its items come from are parsed by orjson, which refuses them. json is the
    fallback for what orjson refuses (integers past 64 bits, keys that are not strings)."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return _dumps(value).encode()


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


class RedisStore:
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
        self._append, self._set_statuses, self._count_call = register(APPEND), register(SET_STATUSES), register(COUNT_CALL)
        self._finish_turn = register(FINISH_TURN)
        self._set_fields, self._add_summary = register(SET_FIELDS), register(ADD_SUMMARY)
        self._release, self._extend = register(RELEASE), register(EXTEND)
        self._import = register(IMPORT)
        self._fail_pending = register(FAIL_PENDING)
        self._messages_read = _ReadScript(self._redis, MESSAGES)
        self._record = _ReadScript(self._redis, RECORD)
        self._snapshots = redis_records.Snapshots()
        self._health = WriteHealth()
        self._set_title = register(SET_TITLE)
        self._post_inbox, self._deliver_inbox = register(POST_INBOX), register(DELIVER_INBOX)
        self._inbox, self._put_knowledge = register(INBOX), register(PUT_KNOWLEDGE)
        self._add_request_parts = register(ADD_REQUEST_PARTS)

    # -- keys ----------------------------------------------------------------------------------

    def _conv(self, key: ConversationKey, part: str) -> str:
        return f"{self._prefix}{{{key.tenant}/{key.id}}}:{part}"

    def _index(self, tenant: str) -> str:
        return f"{self._prefix}convs:{tenant}"

    def _global(self, name: str) -> str:
        return f"{self._prefix}{name}"

    def _keys(self, key: ConversationKey) -> list[str]:
        """The KEYS of every conversation script, in PRELUDE's order."""
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

    @_guarded
    async def _take_lock(self, name: str) -> str:
        token = secrets.token_hex(16)
        delay = 0.005
        task = asyncio.current_task()
        try:
            while not await self._redis.set(name, token, nx=True, px=self._lock_ttl_ms):
                _raise_if_cancelled(task)
                # Backoff with jitter, so waiting replicas neither hammer Redis nor poll in lockstep.
                await asyncio.sleep(delay * random.uniform(0.5, 1.0))
                delay = min(delay * 2, 0.05)
            _raise_if_cancelled(task)  # taken, but for a waiter that is gone
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
                with _available():
                    held = await self._extend(keys=[name], args=[token, self._lock_ttl_ms])
            except StoreUnavailable:
                log.warning("cannot renew a conversation lock: Redis unreachable", extra={"lock": name})
                continue
            if held == 0:
                log.error("lost a conversation lock to another holder", extra={"lock": name})
                return

    async def _drop_lock(self, name: str, token: str) -> None:
        try:
            with _available():
                await self._release(keys=[name], args=[token])
        except StoreUnavailable:
            # Not raised over the turn's own outcome: the lock expires by itself after its TTL.
            log.warning("cannot release a conversation lock: Redis unreachable", extra={"lock": name})

    # -- conversations -------------------------------------------------------------------------

    @_guarded
    async def get(self, key: ConversationKey) -> Conversation | None:
        return (await self._read_conversations([key], keep=True))[0]

    async def _read_conversations(
        self, keys: list[ConversationKey], *, keep: bool = False
    ) -> list[Conversation | None]:
        """Records in one round trip, each a consistent snapshot (one RECORD script each): only
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
        """The conversation a RECORD reply tells of, given the snapshot it was asked from."""
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

    @_guarded
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

    @_guarded
    async def find(self, conversation_id: str) -> list[Conversation]:
        tenants = sorted(await self._redis.smembers(self._global("tenants")))
        found = await self._read_conversations([ConversationKey(t, conversation_id) for t in tenants])
        return [c for c in found if c is not None]

    @_guarded
    async def delete(self, key: ConversationKey) -> bool:
        self._search.forget(key)
        # Deleting is how room is made, so it must work when Redis is out of memory. Then it
        # refuses scripts and MULTI, but not these commands (they free memory), and no other
        # writer can interleave: every write is refused.
        try:
            with _available():
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

    @_guarded
    async def set_title(self, key: ConversationKey, title: str | None) -> Conversation | None:
        if not await self._set_title(keys=self._keys(key), args=self._args(key, title or "")):
            return None
        return await self.get(key)

    # -- messages ------------------------------------------------------------------------------

    @_guarded
    async def append(self, key: ConversationKey, messages: list[Message], hashes: list[str], status: str) -> list[int]:
        check_statuses(status)
        stamp = now()
        pairs = [x for msg, h in zip(messages, hashes, strict=True) for x in (_turn_dumps({"t": stamp, "m": msg}), h)]
        first = await self._append(keys=self._keys(key), args=self._args(key, status, *pairs, stamp=stamp))
        return list(range(first, first + len(messages)))

    @_guarded
    async def set_statuses(self, key: ConversationKey, changes: Mapping[int, str]) -> None:
        check_statuses(*changes.values())
        if not changes:
            return
        pairs = [x for seq, status in changes.items() for x in (seq, status)]
        with _missing_as_key_error(key):
            await self._set_statuses(keys=self._keys(key), args=self._args(key, *pairs))

    @_guarded
    async def finish_turn(
        self,
        key: ConversationKey,
        changes: Mapping[int, str],
        reply: Sequence[tuple[Message, str]],
        reply_status: str,
        turn: TurnRecord | None,
        *,
        llm_calls: int = 0,
        forwarded: Mapping[int, int] | None = None,
        marks: Mapping[str, int] | None = None,
    ) -> int | None:
        check_statuses(*changes.values(), *([reply_status] if reply else []))
        record = turn.row() if turn is not None else None
        stamp = now()
        items = [x for message, h in reply for x in (_turn_dumps({"t": stamp, "m": message}), h)]
        pairs = [x for seq, st in changes.items() for x in (seq, st)]
        record_json = _turn_dumps(dict(record)) if record is not None else ""
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

    @_guarded
    async def response_owner(self, tenant: str, response_id: str) -> tuple[str, int] | None:
        found = await self._redis.hget(self._responses(tenant), response_id)
        if found is None:
            return None
        conversation_id, _, seq = (found.decode() if isinstance(found, bytes) else found).partition("\0")
        return conversation_id, int(seq)

    @_guarded
    async def turn_records(self, key: ConversationKey, *, after: int = 0, limit: int | None = None) -> list[dict[str, Any]]:
        last = int(await self._redis.hget(self._conv(key, "meta"), "turns") or 0)
        end = last if limit is None else min(last, after + limit)
        if end <= after:
            return []
        found = await self._redis.hmget(self._conv(key, "turns"), [str(t) for t in range(after + 1, end + 1)])
        return [_turn_record(raw) for raw in found if raw is not None]

    @_guarded
    async def messages(
        self, key: ConversationKey, *, live_only: bool, after: int | None = None, limit: int | None = None
    ) -> list[StoredMessage]:
        args = self._args(key, int(live_only), max(after or 0, 0), -1 if limit is None else max(limit, 0))
        flat = (await self._messages_read.run([(self._keys(key), args)]))[0]
        return [_stored(*flat[i : i + 4]) for i in range(0, len(flat), 4)]

    @_guarded
    async def message(self, key: ConversationKey, seq: int) -> StoredMessage | None:
        def fill(pipe: Any) -> None:
            for part in ("body", "hash", "status"):
                pipe.hget(self._conv(key, part), str(seq))

        body, h, status = await self._read(fill)
        return None if body is None else _stored(seq, body, h, status)

    @_guarded
    async def count_llm_call(self, key: ConversationKey, limit: int | None = None) -> int | None:
        extra = () if limit is None else (limit,)
        calls = int(await self._count_call(keys=self._keys(key), args=self._args(key, *extra)))
        return None if calls < 0 else calls

    @_guarded
    async def mark_forwarded(self, key: ConversationKey, marks: Mapping[int, int]) -> None:
        if marks:
            pairs = [x for seq, calls in marks.items() for x in (seq, calls)]
            await self._set_fields(keys=self._keys(key), args=self._args(key, "fwd", *pairs))

    @_guarded
    async def set_marks(self, key: ConversationKey, marks: Mapping[str, int]) -> None:
        if marks:
            pairs = [x for name, seq in marks.items() for x in (MARK + name, int(seq))]
            await self._set_fields(keys=self._keys(key), args=self._args(key, "meta", *pairs))

    @_guarded
    async def set_rewrites(self, key: ConversationKey, rewrites: Mapping[int, str]) -> None:
        if rewrites:
            pairs = [x for seq, content in rewrites.items() for x in (seq, content)]
            await self._set_fields(keys=self._keys(key), args=self._args(key, "rw", *pairs))

    @_guarded
    async def rewrites(self, key: ConversationKey, seqs: list[int]) -> dict[int, str]:
        if not seqs:
            return {}
        found = await self._redis.hmget(self._conv(key, "rw"), [str(s) for s in seqs])
        return {seq: content for seq, content in zip(seqs, found) if content is not None}

    # -- summaries -----------------------------------------------------------------------------

    @_guarded
    async def add_summary(self, key: ConversationKey, summary: Summary) -> Summary:
        data = summary.to_record()
        del data["id"]  # the store assigns it; it is the field name in the hash
        sid = await self._add_summary(keys=self._keys(key), args=self._args(key, _dumps(data), summary.last_seq))
        return replace(summary, id=int(sid))

    @_guarded
    async def summaries(self, key: ConversationKey) -> list[Summary]:
        raw = await self._redis.hgetall(self._conv(key, "sum"))
        return [Summary.from_record({**json.loads(raw[sid]), "id": int(sid)}) for sid in sorted(raw, key=int)]

    @_guarded
    async def summary(self, key: ConversationKey, summary_id: int) -> Summary | None:
        raw = await self._redis.hget(self._conv(key, "sum"), str(summary_id))
        return None if raw is None else Summary.from_record({**json.loads(raw), "id": summary_id})

    # -- import --------------------------------------------------------------------------------

    @_guarded
    async def search(self, key: ConversationKey, query: str, *, limit: int = DEFAULT_HITS) -> list[SearchHit]:
        return await self._search.search(self, key, query, limit)

    async def import_conversation(self, dump: ConversationDump, *, replace: bool = False) -> None:
        dump.check()
        self._search.forget(dump.conversation.key)
        c = dump.conversation
        meta = {MARK + name: seq for name, seq in c.marks.items()}
        for name, value in c.description().items():  # absent = unknown, as _conversation reads them
            if value is not None and value != 0:
                meta[name] = _dumps(value) if name == "last_error" else value
        args = self._args(
            c.key, int(replace), repr(c.updated_at), c.next_seq, c.llm_calls, c.boundary,
            "" if c.summary_id is None else c.summary_id, len(dump.summaries), len(dump.turns),
            len(dump.messages), len(c.first_forwarded), len(dump.rewrites), len(dump.responses), len(meta),
            len(dump.inbox), stamp=c.created_at,
        )
        for m in dump.messages:
            args += [m.seq, _dumps({"t": m.created_at, "m": m.message}), m.hash, m.status]
        for seq, calls in c.first_forwarded.items():
            args += [seq, calls]
        for seq, content in dump.rewrites.items():
            args += [seq, content]
        for summary in dump.summaries:
            data = summary.to_record()
            args += [data.pop("id"), _dumps(data)]
        for record in dump.turns:
            rest = {k: v for k, v in record.items() if k not in ("turn", "reply_seq")}
            stored = {"turn": record["turn"], "reply_seq": record.get("reply_seq"), "record": rest}
            args += [record["turn"], _dumps(stored)]
        for name, value in meta.items():
            args += [name, value]
        for response_id, seq in dump.responses.items():
            args += [response_id, seq]
        for m in dump.inbox:
            delivery = "" if m.seq is None else f"{m.seq}:{m.placement}:{m.turn}:{m.delivered_at!r}"
            body = _dumps({"content": m.content, "note": m.note, "created_at": m.created_at})
            args += [m.id, body, delivery, int(m.status != INBOX_DELIVERED)]
        args.append(len(dump.parts))
        for n, part in enumerate(dump.parts, 1):
            args += [part.hash, _request_part_row(n, part)]
        try:
            await self._import(keys=[*self._keys(c.key), self._conv(c.key, REQUEST_PARTS)], args=args)
        except ResponseError as exc:
            if CONVERSATION_EXISTS in str(exc):
                raise ConversationExists(str(c.key)) from None
            raise

    # -- inbox ---------------------------------------------------------------------------------

    @_guarded
    async def post_inbox(self, key: ConversationKey, content: str, note: str, max_pending: int) -> InboxMessage | None:
        stamp = now()
        body = _dumps({"content": content, "note": note, "created_at": stamp})
        mid = int(await self._post_inbox(keys=self._keys(key), args=self._args(key, body, max_pending, stamp=stamp)))
        if mid == -1:
            raise InboxFull(str(key))
        return None if mid == 0 else InboxMessage(mid, content, note, stamp)

    @_guarded
    async def inbox(self, key: ConversationKey, *, after: int = 0, limit: int | None = None) -> list[InboxMessage]:
        last = int(await self._redis.hget(self._conv(key, "meta"), "inbox") or 0)
        end = last if limit is None else min(last, after + limit)
        if end <= after:
            return []
        flat = await self._inbox(keys=self._keys(key), args=self._args(key, "ids", *range(after + 1, end + 1)))
        return [_inbox_message(*flat[i : i + 4]) for i in range(0, len(flat), 4)]

    @_guarded
    async def deliver_inbox(
        self, key: ConversationKey, seq: int, placement: str, turn: int, stamp: float
    ) -> list[InboxMessage]:
        args = self._args(key, seq, placement, turn, stamp=stamp)
        item_status, *flat = await self._deliver_inbox(keys=self._keys(key), args=args)
        return [_inbox_message(*flat[i : i + 3], item_status) for i in range(0, len(flat), 3)]

    @_guarded
    async def inbox_at(self, key: ConversationKey, seqs: Sequence[int]) -> dict[int, list[InboxMessage]]:
        if not seqs:
            return {}
        flat = await self._inbox(keys=self._keys(key), args=self._args(key, "seqs", *seqs))
        out: dict[int, list[InboxMessage]] = {}
        for i in range(0, len(flat), 4):
            message = _inbox_message(*flat[i : i + 4])
            if message.seq is not None:
                out.setdefault(message.seq, []).append(message)
        return out

    # -- request parts -------------------------------------------------------------------------

    @_guarded
    async def add_request_parts(self, key: ConversationKey, parts: Sequence[RequestPart]) -> list[str]:
        if not parts:
            return []
        args: list[Any] = [repr(now())]
        for part in parts:
            args += [part.hash, _dumps({"kind": part.kind, "value": part.value})]
        keys = [self._conv(key, "meta"), self._conv(key, REQUEST_PARTS)]
        return list(await self._add_request_parts(keys=keys, args=args))

    @_guarded
    async def request_parts(self, key: ConversationKey, *, after: int = 0) -> list[RequestPart]:
        rows = await self._redis.hgetall(self._conv(key, REQUEST_PARTS))  # few: a version per change
        found = []
        for part_hash, row in rows.items():
            n, stamp, data = row.split(":", 2)
            if int(n) > after:
                record = json.loads(data)
                found.append((int(n), RequestPart(record["kind"], part_hash, record["value"], float(stamp))))
        return [part for _, part in sorted(found, key=lambda pair: pair[0])]

    # -- long-term knowledge -------------------------------------------------------------------

    def _knowledge_keys(self, tenant: str, namespace: str) -> tuple[str, str]:
        tag = f"{self._prefix}kn:{{{tenant}/{namespace}}}"
        return tag + ":v", tag + ":t"

    def _knowledge_index(self, tenant: str) -> str:
        return f"{self._prefix}kn-index:{tenant}"

    @_guarded
    async def knowledge(self, tenant: str, namespace: str, version: int | None = None) -> KnowledgeVersion | None:
        if version is None:
            version = int(await self._redis.hget(self._knowledge_index(tenant), namespace) or 0)
        return await self._knowledge_version(tenant, namespace, version)

    async def _knowledge_version(self, tenant: str, namespace: str, version: int) -> KnowledgeVersion | None:
        if version <= 0:
            return None
        raw = await self._redis.hget(self._knowledge_keys(tenant, namespace)[0], str(version))
        return None if raw is None else KnowledgeVersion(tenant, namespace, version, **json.loads(raw))

    @_guarded
    async def knowledge_at(self, tenant: str, namespace: str, cutoff: float) -> KnowledgeVersion | None:
        times = self._knowledge_keys(tenant, namespace)[1]
        found = await self._redis.zrevrangebyscore(times, repr(cutoff), "-inf", start=0, num=1)
        return await self._knowledge_version(tenant, namespace, int(found[0]) if found else 1)

    @_guarded
    async def knowledge_versions(
        self, tenant: str, namespace: str, *, before: int | None = None, limit: int = 20
    ) -> list[KnowledgeVersion]:
        newest = int(await self._redis.hget(self._knowledge_index(tenant), namespace) or 0)
        top = newest if before is None else min(newest, before - 1)
        numbers = list(range(top, max(top - limit, 0), -1))
        if not numbers:
            return []
        found = await self._redis.hmget(self._knowledge_keys(tenant, namespace)[0], [str(n) for n in numbers])
        return [KnowledgeVersion(tenant, namespace, n, **json.loads(raw)) for n, raw in zip(numbers, found) if raw]

    @_guarded
    async def put_knowledge(
        self, tenant: str, namespace: str, text: str, source: str, base_version: int
    ) -> KnowledgeVersion | None:
        stamp = now()
        keys = [*self._knowledge_keys(tenant, namespace), self._knowledge_index(tenant), self._global("kn-tenants")]
        body = _dumps({"text": text, "created_at": stamp, "source": source})
        version = int(await self._put_knowledge(keys=keys, args=[namespace, base_version, tenant, body, repr(stamp)]))
        return KnowledgeVersion(tenant, namespace, version, text, stamp, source) if version else None

    @_guarded
    async def knowledge_documents(self, tenant: str | None) -> list[KnowledgeVersion]:
        tenants = [tenant] if tenant is not None else sorted(await self._redis.smembers(self._global("kn-tenants")))
        out = []
        for t in tenants:
            index = await self._redis.hgetall(self._knowledge_index(t))
            for namespace in sorted(index):
                found = await self._knowledge_version(t, namespace, int(index[namespace]))
                if found is not None:
                    out.append(found)
        return out

    # -- leases, secret ------------------------------------------------------------------------

    @_guarded
    async def acquire_lease(self, name: str, ttl_s: float) -> str | None:
        token = secrets.token_hex(8)
        ttl_ms = round(ttl_s * 1000)
        lease = self._global(f"lease:{name}")
        if ttl_ms <= 0:
            # Redis expiry has 1 ms resolution: a lease shorter than that is granted already expired.
            return None if await self._redis.exists(lease) else token
        return token if await self._redis.set(lease, token, nx=True, px=ttl_ms) else None

    @_guarded
    async def release_lease(self, name: str, token: str) -> None:
        await self._release(keys=[self._global(f"lease:{name}")], args=[token])

    @_guarded
    async def secret(self) -> bytes:
        # SET NX then GET in one transaction: the first replica's value wins and every one reads it.
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.set(self._global("secret"), secrets.token_hex(32), nx=True)
            pipe.get(self._global("secret"))
            _, value = await pipe.execute()
        return bytes.fromhex(value)

    @_guarded
    async def fail_pending(self) -> int:
        failed = 0
        for member in await self._redis.smembers(self._global("pending")):
            key = ConversationKey(*member.rsplit("/", 1))
            marked = await self._fail_pending(keys=[*self._keys(key), self._lock_name(key)], args=self._args(key))
            failed += max(int(marked), 0)
        return failed

    async def health(self) -> StoreHealth:
        try:
            with _available():
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


def _inbox_message(mid: str, body: str, delivery: str, item_status: str = "") -> InboxMessage:
    """A stored inbox message with its status, read off the status of the item it went with."""
    record = json.loads(body)
    message = InboxMessage(int(mid), record["content"], record["note"], record["created_at"])
    if not delivery or item_status == FAILED:  # never delivered, or its turn failed: waiting
        return message
    seq, placement, turn, stamp = delivery.split(":", 3)
    message.seq, message.placement, message.turn, message.delivered_at = int(seq), placement, int(turn), float(stamp)
    message.status = INBOX_DELIVERING if item_status in ("", PENDING) else INBOX_DELIVERED
    return message


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
    return {**stored["record"], "turn": stored["turn"], "reply_seq": stored["reply_seq"]}


def _stored(seq: int | str, body: str, h: str, status: str) -> StoredMessage:
    record = json.loads(body)
    return StoredMessage(int(seq), record["m"], h, status, record["t"])
