"""The Redis store's snapshots (proxy/store/redis/records.py): a replica's `get` reads only what
changed since its last read, and always equals a whole read by a store that holds nothing, with
other replicas writing the same Redis in between."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import random
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis.asyncio as aioredis

from proxy.identity import ConversationKey
from proxy.messages import message_hash
from proxy.store import APPEND, BEFORE, FAILED, INTERNAL, LIVE, PENDING, SUPERSEDED, Conversation, Summary, TurnRecord
from proxy.store.redis import RedisStore
from proxy.store.redis.records import Snapshot, Snapshots
from proxy.transfer import read_dump
from tests.support.redis_server import RedisServer

A = ConversationKey("tenant-a", "conv")
OTHER = ConversationKey("tenant-a", "other")


def items(*texts: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": t} for t in texts]


async def add(store: RedisStore, key: ConversationKey, texts: list[str], status: str = LIVE) -> list[int]:
    batch = items(*texts)
    return await store.append(key, batch, [message_hash(m) for m in batch], status)


def fields(conversation: Conversation | None) -> dict[str, Any] | None:
    """Every field, also those equality leaves out (turns, inbox_open, inbox_anchors)."""
    if conversation is None:
        return None
    return {f.name: getattr(conversation, f.name) for f in dataclasses.fields(conversation)}


class Replicas:
    """RedisStore instances on one Redis under one prefix, and a whole read to check them against."""

    def __init__(self, url: str) -> None:
        self.url, self.prefix = url, f"cp-test-{uuid.uuid4().hex[:8]}:"
        self.made: list[RedisStore] = []
        self._reader: RedisStore | None = None

    def __call__(self) -> RedisStore:
        store = RedisStore(self.url, prefix=self.prefix)
        self.made.append(store)
        return store

    async def whole(self, key: ConversationKey) -> Conversation | None:
        """The record as a replica that holds no snapshot reads it (one reader, its snapshot let
        go before each read: a new client per read made hundreds of connections, and one of them
        could time out on a loaded machine)."""
        if self._reader is None:
            self._reader = self()
        self._reader._snapshots.drop(key)
        return await self._reader.get(key)

    async def check(self, store: RedisStore, key: ConversationKey = A) -> Conversation | None:
        got = await store.get(key)
        assert fields(got) == fields(await self.whole(key))
        return got

    def raw(self) -> aioredis.Redis:
        return aioredis.Redis.from_url(self.url, decode_responses=True)

    def part(self, key: ConversationKey, name: str) -> str:
        return f"{self.prefix}{{{key.tenant}/{key.id}}}:{name}"


@pytest.fixture
async def replicas(redis_server: RedisServer) -> AsyncIterator[Replicas]:
    made = Replicas(redis_server.url)
    yield made
    for store in made.made:
        await store.close()


Step = Callable[[RedisStore, random.Random], Any]


async def random_writes(replicas: Replicas, seed: int, steps: int) -> None:
    """Two replicas write one conversation in a random order, by every write the store has; after
    each write, each replica (most of the time: deltas also pile up) reads it and gets what a whole
    read gets. Every snapshot handed out stays as it was when handed out."""
    rng = random.Random(seed)
    one, two = replicas(), replicas()
    handed_out: list[tuple[Conversation, Conversation]] = []
    counter = 0

    def texts(n: int) -> list[str]:
        nonlocal counter
        counter += n
        return [f"m{counter - i}" for i in range(n)]

    async def live_seqs(store: RedisStore) -> list[int]:
        c = await replicas.whole(A)
        return [seq for seq, _ in c.live] if c else []

    async def turn(store: RedisStore, r: random.Random) -> None:
        new = await add(store, A, texts(r.randint(1, 3)), PENDING)
        old = await live_seqs(store)
        outcome = r.choice([LIVE, LIVE, LIVE, FAILED])
        changes = dict.fromkeys(new, outcome)
        if outcome == LIVE and old and r.random() < 0.3:  # the client edited its history: a cut
            changes |= dict.fromkeys(old[r.randrange(len(old)) :], SUPERSEDED)
        reply = items(*texts(r.randint(0, 2)))
        record = TurnRecord(sent_seqs=old + new, status=outcome, response_id=f"resp-{uuid.uuid4().hex[:8]}",
                            model=r.choice(["m1", "m2"]), error={"message": "refused"} if outcome == FAILED else None)
        calls = r.randint(0, 2)
        # First forwarded now: the new items, and older ones a cut had kept out until now.
        marks = dict.fromkeys(new + r.sample(old, min(len(old), r.randint(0, 2))), r.randint(1, 9))
        await store.finish_turn(
            A, changes, [(m, message_hash(m)) for m in reply], LIVE if outcome == LIVE else FAILED, record,
            llm_calls=calls, forwarded=marks if calls else None,
        )

    async def statuses(store: RedisStore, r: random.Random) -> None:
        c = await replicas.whole(A)
        if c is not None and c.next_seq > 1:
            seqs = r.sample(range(1, c.next_seq), min(3, c.next_seq - 1))
            await store.set_statuses(A, {seq: r.choice([LIVE, SUPERSEDED, FAILED]) for seq in seqs})

    async def rewrites(store: RedisStore, r: random.Random) -> None:
        seqs = await live_seqs(store)
        if seqs:
            await store.set_rewrites(A, {r.choice(seqs): "shortened"})

    async def forwarded(store: RedisStore, r: random.Random) -> None:
        seqs = await live_seqs(store)
        if seqs:
            await store.mark_forwarded(A, {r.choice(seqs): r.randint(1, 50)})

    async def inbox(store: RedisStore, r: random.Random) -> None:
        await store.post_inbox(A, "note", "[note]", max_pending=50)
        c = await replicas.whole(A)
        if c is not None and c.next_seq > 1 and r.random() < 0.7:
            # With any item: one that fails or stays pending has its messages delivered again elsewhere.
            seq = r.randrange(1, c.next_seq)
            await store.deliver_inbox(A, seq, r.choice([APPEND, BEFORE]), turn=counter, stamp=float(counter))

    async def replaced(store: RedisStore, r: random.Random) -> None:
        await add(store, OTHER, texts(r.randint(1, 4)))
        dump = await read_dump(store, OTHER)
        dump.conversation = dataclasses.replace(dump.conversation, key=A)
        await store.import_conversation(dump, replace=True)

    async def deleted(store: RedisStore, r: random.Random) -> None:
        await store.delete(A)

    writes: list[Step] = [
        turn, turn, turn, statuses, rewrites, forwarded, inbox,
        lambda s, r: add(s, A, texts(r.randint(1, 4))),
        lambda s, r: add(s, A, texts(1), INTERNAL),
        lambda s, r: add(s, A, texts(r.randint(1, 2)), PENDING),  # a turn a crash cut short
        lambda s, r: s.count_llm_call(A),
        lambda s, r: s.set_marks(A, {r.choice(["window", "mask"]): r.randint(0, 5)}),
        lambda s, r: s.set_title(A, r.choice([None, "a title"])),
        lambda s, r: s.add_summary(A, Summary("s", 1, r.randint(1, 5), "turns", "m", 1, 1)),
        lambda s, r: s.fail_pending(),
    ]
    rare: list[Step] = [replaced, deleted]
    for _ in range(steps):
        step = rng.choice(rare) if rng.random() < 0.04 else rng.choice(writes)
        await step(rng.choice([one, two]), rng)
        for store in (one, two):
            if rng.random() < 0.6:
                got = await replicas.check(store)
                if got is not None:
                    handed_out.append((got, copy.deepcopy(got)))
    for store in (one, two):
        await replicas.check(store)
    assert all(fields(given) == fields(as_given) for given, as_given in handed_out)


async def test_two_replicas_writing_in_turn_always_read_what_a_whole_read_reads(replicas: Replicas):
    for seed in range(3):
        await random_writes(replicas, seed, steps=120)
        await replicas().delete(A)


async def test_a_read_after_a_turn_keeps_what_did_not_change(replicas: Replicas):
    one, two = replicas(), replicas()
    await add(one, A, [f"m{i}" for i in range(50)])
    await one.mark_forwarded(A, {seq: 1 for seq in range(1, 51)})
    before = await replicas.check(one)
    new = await add(two, A, ["tool result"], PENDING)
    await two.finish_turn(A, {new[0]: LIVE}, [(items("reply")[0], message_hash(items("reply")[0]))], LIVE,
                          TurnRecord(sent_seqs=list(range(1, 52))), llm_calls=1, forwarded={new[0]: 2})
    after = await replicas.check(one)
    assert len(after.live) == 52 and after.first_forwarded[51] == 2
    # The other replica's turn came as a delta: the entries before it are the snapshot's own objects.
    assert all(a is b for a, b in zip(after.live[:50], before.live))
    assert await one.get(A) is after  # nothing written since: the snapshot itself


async def test_an_inbox_message_delivered_again_moves_its_anchor_in_every_snapshot(replicas: Replicas):
    one, two = replicas(), replicas()
    await add(one, A, ["task"])
    await two.post_inbox(A, "stop", "[stop]", max_pending=5)
    (crashed,) = await add(two, A, ["tool result"], PENDING)
    await two.deliver_inbox(A, crashed, APPEND, turn=2, stamp=1.0)
    assert (await replicas.check(one)).inbox_anchors == {crashed}
    assert await two.fail_pending() == 1  # its turn never ended: the message waits again
    (retried,) = await add(two, A, ["tool result"], PENDING)
    await two.deliver_inbox(A, retried, APPEND, turn=2, stamp=2.0)
    assert (await replicas.check(one)).inbox_anchors == {retried}


async def test_a_record_deleted_and_made_again_is_read_whole(replicas: Replicas):
    one, two = replicas(), replicas()
    await add(one, A, ["first life"])
    await replicas.check(one)
    await two.delete(A)
    assert await one.get(A) is None
    await add(one, A, ["between"])
    await replicas.check(one)
    await two.delete(A)
    await add(two, A, ["second life"])  # version 1 again, as the snapshot one holds
    got = await replicas.check(one)
    assert [seq for seq, _ in got.live] == [1] and got.live_hashes == [message_hash(items("second life")[0])]


async def test_no_snapshot_outlives_a_redis_restarted_empty(redis: RedisServer):  # a server of its own
    store = RedisStore(redis.url)
    try:
        await add(store, A, ["before the restart"])
        assert (await store.get(A)).live_hashes == [message_hash(items("before the restart")[0])]
        # In threads, so the event loop sees the server close the pooled connection.
        await asyncio.to_thread(redis.stop)
        await asyncio.to_thread(redis.start)  # no persistence: empty
        await add(store, A, ["after the restart"])  # the same key at the same version, a new record
        assert (await store.get(A)).live_hashes == [message_hash(items("after the restart")[0])]
    finally:
        await store.close()


async def test_a_write_without_a_commit_is_read_whole(replicas: Replicas):
    """What a replica of an older version writes (it keeps no versions): its turns move the
    record's signature, so no snapshot taken before is trusted."""
    one, two = replicas(), replicas()
    await add(one, A, ["a", "b", "c"])
    await replicas.check(one)
    raw = replicas.raw()
    try:
        # An older replica's set_statuses: 2 superseded, nothing logged, no version.
        await raw.hset(replicas.part(A, "status"), "2", SUPERSEDED)
        await raw.zremrangebyscore(replicas.part(A, "live"), 2, 2)
        await raw.hset(replicas.part(A, "meta"), "updated_at", "123.5")
        got = await replicas.check(one)
        assert [seq for seq, _ in got.live] == [1, 3]
        await add(two, A, ["d"])  # a commit again: snapshots resume
        got = await replicas.check(one)
        assert [seq for seq, _ in got.live] == [1, 3, 4]
        # A record from before versions: no incarnation, version, signature or log.
        await raw.hdel(replicas.part(A, "meta"), "incarnation", "version", "signed")
        await raw.delete(replicas.part(A, "chg"))
        await replicas.check(one)
        await add(two, A, ["e"])
        await replicas.check(one)
        await two.set_statuses(A, {1: SUPERSEDED})
        got = await replicas.check(one)
        assert [seq for seq, _ in got.live] == [3, 4, 5]
    finally:
        await raw.aclose()


async def test_many_changes_since_a_snapshot_read_whole_and_agree(replicas: Replicas):
    one, two = replicas(), replicas()
    await add(one, A, [f"m{i}" for i in range(10)])
    await replicas.check(one)
    for i in range(100):  # far more changed seqs than a whole read holds
        await add(two, A, [f"n{i}"])
    await two.set_statuses(A, dict.fromkeys(range(1, 60), SUPERSEDED))
    got = await replicas.check(one)
    assert [seq for seq, _ in got.live] == list(range(60, 111))


def conversation(key: ConversationKey, live: int) -> Conversation:
    return Conversation(key, 0.0, 0.0, live + 1, [(seq, "h") for seq in range(1, live + 1)])


def test_snapshots_keep_the_most_recently_read_within_their_bounds():
    keys = [ConversationKey("t", f"c{i}") for i in range(5)]
    kept = Snapshots(max_snapshots=3, max_entries=100)
    for key in keys[:3]:
        kept.keep(key, Snapshot("i", 1, conversation(key, 10)))
    kept.touch(keys[0])  # read again: the least recently read is now keys[1]
    kept.keep(keys[3], Snapshot("i", 1, conversation(keys[3], 10)))
    assert [k for k in keys if kept.get(k)] == [keys[0], keys[2], keys[3]]
    kept.keep(keys[4], Snapshot("i", 1, conversation(keys[4], 85)))  # 115 entries: the oldest go
    assert [k for k in keys if kept.get(k)] == [keys[3], keys[4]]
    kept.keep(keys[0], Snapshot("i", 1, conversation(keys[0], 101)))  # past the budget on its own
    assert kept.get(keys[0]) is None and len(kept) == 2
    kept.keep(keys[4], Snapshot("i", 2, conversation(keys[4], 5)))
    kept.keep(keys[4], Snapshot("i", 1, conversation(keys[4], 85)))  # an older read landing late
    assert kept.get(keys[4]).version == 2
    kept.drop(keys[4])
    kept.drop(keys[3])
    assert len(kept) == 0
    for key in keys[:3]:  # what was dropped no longer counts against the budget
        kept.keep(key, Snapshot("i", 1, conversation(key, 33)))
    assert len(kept) == 3
