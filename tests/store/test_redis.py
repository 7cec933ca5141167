"""What only a shared store must do: two RedisStore instances on one redis-server are two replicas."""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator

import pytest
import redis.asyncio as aioredis

from proxy.identity import ConversationKey
from proxy.messages import message_hash
from proxy.store import LIVE, PENDING, SUPERSEDED, StoreUnavailable, Summary, TurnRecord
from proxy.store.redis import RedisStore
from tests.support.redis_server import RedisServer

A = ConversationKey("tenant-a", "conv")

MakeReplica = Callable[..., RedisStore]


async def add(store: RedisStore, key: ConversationKey, texts: list[str], status: str = LIVE) -> list[int]:
    batch = [{"role": "user", "content": t} for t in texts]
    return await store.append(key, batch, [message_hash(m) for m in batch], status)


@pytest.fixture
async def replica(redis_server: RedisServer) -> AsyncIterator[MakeReplica]:
    """`replica(**kwargs)`: another RedisStore sharing this test's prefix, as another proxy replica would."""
    prefix = f"cp-test-{uuid.uuid4().hex[:8]}:"
    made: list[RedisStore] = []

    def make(**kwargs: object) -> RedisStore:
        kwargs.setdefault("prefix", prefix)
        store = RedisStore(redis_server.url, **kwargs)  # type: ignore[arg-type]
        made.append(store)
        return store

    yield make
    for store in made:
        await store.close()


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A server of this test's own, free to stop and restart."""
    server = RedisServer().start()
    yield server
    server.remove()


async def test_lock_excludes_across_replicas(replica: MakeReplica):
    one, two = replica(), replica()
    async with one.lock(A):
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                async with two.lock(A):
                    pytest.fail("two replicas held one conversation's lock at once")
        async with two.lock(ConversationKey("tenant-a", "other")):
            pass  # another conversation is not held up
    async with asyncio.timeout(2):
        async with two.lock(A):
            pass


async def test_lock_is_renewed_while_a_long_turn_holds_it(replica: MakeReplica):
    # Renewed every third of the TTL: the loop may stall for two thirds of it (0.4 s on a loaded
    # machine) and the lock still holds (a TTL of 0.3 s let a 0.2 s stall lose it under load).
    one, two = replica(lock_ttl_s=0.6), replica(lock_ttl_s=0.6)
    async with one.lock(A):
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(2.0):  # over three TTLs
                async with two.lock(A):
                    pytest.fail("the lock expired while its holder was alive")


async def test_a_lock_waiters_cancellation_is_never_lost_wherever_it_lands(replica: MakeReplica):
    # A cancel landing inside redis-py's read could end as the SET's reply: the waiter polled on,
    # and here, its holder waiting for it, forever (a full-suite run hung on the test above).
    one, two = replica(), replica()
    shuffle = random.Random(0)
    async with one.lock(A):
        for attempt in range(300):
            try:
                async with asyncio.timeout(2.0):  # fires only if the waiter's own cancellation was lost
                    with pytest.raises(TimeoutError):
                        async with asyncio.timeout(shuffle.uniform(0.0005, 0.02)):
                            async with two.lock(A):
                                pytest.fail("two replicas held one conversation's lock at once")
            except TimeoutError:
                pytest.fail(f"attempt {attempt}: the waiter went on polling after it was cancelled")
    async with asyncio.timeout(2):
        async with two.lock(A):
            pass  # and nothing a cancelled waiter took is left held


async def test_a_dead_holders_lock_frees_after_its_ttl_and_its_late_release_is_ignored(replica: MakeReplica):
    one, two = replica(lock_ttl_s=0.4), replica(lock_ttl_s=0.4)
    zombie = one.lock(A)
    await zombie.__aenter__()
    started = time.monotonic()
    await one.close()  # the replica dies holding the lock: no renewal, no release
    async with asyncio.timeout(3):
        async with two.lock(A):
            waited = time.monotonic() - started
            # The dead holder wakes up and releases: its token no longer holds, so nothing happens.
            await zombie.__aexit__(None, None, None)
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    async with replica().lock(A):
                        pass
    assert 0.2 < waited < 2


async def test_lock_is_released_when_the_turn_fails_or_is_cancelled(replica: MakeReplica):
    one, two = replica(), replica()
    with pytest.raises(RuntimeError):
        async with one.lock(A):
            raise RuntimeError("the turn failed")
    holding = asyncio.Event()

    async def turn() -> None:
        async with one.lock(A):
            holding.set()
            await asyncio.sleep(60)

    task = asyncio.create_task(turn())
    await holding.wait()
    task.cancel()  # the client went away
    async with asyncio.timeout(1):
        async with two.lock(A):
            pass


async def test_concurrent_appends_from_two_replicas_never_share_a_seq(replica: MakeReplica):
    one, two = replica(), replica()
    batches = await asyncio.gather(*(add((one, two)[i % 2], A, [f"m{i}", f"n{i}"]) for i in range(30)))
    assert sorted(s for batch in batches for s in batch) == list(range(1, 61))
    assert all(b == [b[0], b[0] + 1] for b in batches)  # one append's messages stay together
    assert [m.seq for m in await one.messages(A, live_only=True)] == list(range(1, 61))


async def test_llm_call_counts_from_two_replicas_are_exact(replica: MakeReplica):
    # 100 calls at once open up to 100 connections: a loaded machine may take over the default
    # 1 s to accept them all, which is not what this test is about.
    one, two = (replica(connect_timeout_s=10, socket_timeout_s=10) for _ in range(2))
    totals = await asyncio.gather(*(s.count_llm_call(A) for _ in range(50) for s in (one, two)))
    assert sorted(totals) == list(range(1, 101))
    assert (await two.get(A)).llm_calls == 100


async def test_replicas_share_leases_secret_summaries_and_statuses(replica: MakeReplica):
    one, two = replica(), replica()
    token = await one.acquire_lease("compact:a", ttl_s=60)
    assert token is not None and await two.acquire_lease("compact:a", ttl_s=60) is None
    await two.release_lease("compact:a", "not-the-token")
    assert await two.acquire_lease("compact:a", ttl_s=60) is None
    await two.release_lease("compact:a", token)
    assert await two.acquire_lease("compact:a", ttl_s=60) is not None

    assert await one.secret() == await two.secret()

    await add(one, A, [str(i) for i in range(6)])
    ids = await asyncio.gather(*(s.add_summary(A, summary(1, last)) for s, last in ((one, 4), (two, 5), (one, 3))))
    assert sorted(s.id for s in ids) == [1, 2, 3]
    conv = await two.get(A)
    assert conv.boundary == 5 and (await one.summary(A, conv.summary_id)).last_seq == 5


async def test_a_failed_status_change_changes_nothing(replica: MakeReplica):
    store = replica()
    await add(store, A, ["a"])
    await add(store, A, ["b"], PENDING)
    with pytest.raises(KeyError):
        await store.set_statuses(A, {1: SUPERSEDED, 2: LIVE, 99: LIVE})
    reply = {"role": "assistant", "content": "answer"}
    with pytest.raises(KeyError):
        await store.finish_turn(A, {2: LIVE, 99: LIVE}, [(reply, message_hash(reply))], LIVE, TurnRecord(tokens_sent=1))
    assert [(m.seq, m.status) for m in await store.messages(A, live_only=False)] == [(1, LIVE), (2, PENDING)]
    assert await store.turn_records(A) == []
    with pytest.raises(KeyError):
        await store.set_statuses(ConversationKey("tenant-a", "never"), {1: LIVE})


async def test_turn_records_keep_their_json_as_sent(replica: MakeReplica):
    store = replica()
    record = TurnRecord(sent_seqs=[], knowledge={}, summary_id=None, title="é \"quoted\" }")
    assert await store.finish_turn(A, {}, [], LIVE, record) is None
    assert await store.turn_records(A) == [{**record.row(), "turn": 1, "reply_seq": None}]


async def test_ids_that_look_like_key_suffixes_do_not_collide(replica: MakeReplica):
    store = replica()
    plain, tricky = ConversationKey("t", "a"), ConversationKey("t", "a}:live")
    colon = ConversationKey("t", "a:live")
    await add(store, plain, ["plain"])
    await add(store, colon, ["colon"])
    await add(store, tricky, ["tricky"])
    for key, text in ((plain, "plain"), (colon, "colon"), (tricky, "tricky")):
        assert [m.message["content"] for m in await store.messages(key, live_only=True)] == [text]
    page, _ = await store.list_conversations("t")
    assert [c.key.id for c in page] == ["a}:live", "a:live", "a"]


async def test_every_key_is_under_the_prefix_and_delete_leaves_no_conversation_data(
    replica: MakeReplica, redis_server: RedisServer
):
    prefix = f"cp-layout-{uuid.uuid4().hex[:8]}:"
    store = replica(prefix=prefix)
    await add(store, A, ["a", "b"])
    await store.set_rewrites(A, {1: "short"})
    await store.mark_forwarded(A, {1: 1})
    await store.add_summary(A, summary(1, 2))
    await store.finish_turn(A, {2: SUPERSEDED}, [], LIVE, TurnRecord(tokens_sent=3))
    async with store.lock(A):
        pass
    raw = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        keys = [k async for k in raw.scan_iter(match=f"{prefix}*")]
        assert keys and all("{tenant-a/conv}" in k for k in keys if "{" in k)
        assert await store.delete(A)
        left = sorted([k async for k in raw.scan_iter(match=f"{prefix}*")])
        assert left == [f"{prefix}created", f"{prefix}tenants"]  # the counter and tenant set remain
    finally:
        await raw.aclose()


async def test_data_outlives_a_replica(replica: MakeReplica):
    first = replica()
    await add(first, A, ["kept"])
    await first.close()
    second = replica()
    assert [m.message["content"] for m in await second.messages(A, live_only=True)] == ["kept"]
    assert await add(second, A, ["next"]) == [2]


async def test_redis_down_fails_fast_with_503_and_recovers_when_it_is_back(own_server: RedisServer):
    store = RedisStore(own_server.url)
    try:
        await add(store, A, ["before"])
        holding = store.lock(A)
        await holding.__aenter__()
        own_server.stop()

        operations = {
            "get": lambda: store.get(A),
            "append": lambda: add(store, A, ["during"]),
            "count_llm_call": lambda: store.count_llm_call(A),
            "messages": lambda: store.messages(A, live_only=True),
            "list": lambda: store.list_conversations(None),
            "secret": lambda: store.secret(),
            "lease": lambda: store.acquire_lease("x", 10),
            "lock": lambda: store.lock(ConversationKey("t", "other")).__aenter__(),
        }
        for name, operation in operations.items():
            started = time.monotonic()
            with pytest.raises(StoreUnavailable) as failure:
                await operation()
            assert time.monotonic() - started < 2, name
        assert (failure.value.status, failure.value.code, failure.value.type) == (503, "store_unavailable", "server_error")
        await holding.__aexit__(None, None, None)  # a release that cannot reach Redis does not raise

        own_server.start()  # same port, empty (no persistence): the store reconnects by itself
        assert await add(store, A, ["after"]) == [1]
        assert await store.count_llm_call(A) == 1
        async with asyncio.timeout(2):
            async with store.lock(A):
                pass
    finally:
        await store.close()


async def test_a_redis_restart_while_idle_costs_no_request(own_server: RedisServer):
    store = RedisStore(own_server.url)
    try:
        await asyncio.gather(*(store.count_llm_call(A) for _ in range(5)))  # several pooled connections
        # In threads, so the event loop runs meanwhile and sees the server close those connections.
        await asyncio.to_thread(own_server.stop)
        await asyncio.to_thread(own_server.start)
        assert sorted(await asyncio.gather(*(store.count_llm_call(A) for _ in range(5)))) == [1, 2, 3, 4, 5]
    finally:
        await store.close()


def summary(first: int, last: int) -> Summary:
    return Summary(text="s", first_seq=first, last_seq=last, strategy="turns", model="m", tokens_in=1, tokens_out=1)


async def test_a_turn_record_is_kept_as_runs_of_seqs(replica: MakeReplica, redis_server: RedisServer):
    prefix = f"cp-runs-{uuid.uuid4().hex[:8]}:"
    store = replica(prefix=prefix)
    await store.finish_turn(A, {}, [], LIVE, TurnRecord(sent_seqs=[1, *range(40, 2041)]))
    raw = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        stored = json.loads(await raw.hget(f"{prefix}{{tenant-a/conv}}:turns", "1"))
    finally:
        await raw.aclose()
    assert stored["record"]["sent_seqs"] == {"runs": [1, 1, 40, 2001]}
    assert (await store.turn_records(A))[0]["sent_seqs"] == [1, *range(40, 2041)]
