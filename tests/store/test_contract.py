"""The contract every store backend passes: diskcache and Redis (a real redis-server, see tests/support/redis_server.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from proxy.config import StorageSettings
from proxy.identity import ConversationKey
from proxy.messages import message_hash
from proxy.store import (
    APPEND,
    BEFORE,
    FAILED,
    INBOX_DELIVERED,
    INBOX_DELIVERING,
    INBOX_PENDING,
    LIVE,
    PENDING,
    SUPERSEDED,
    SYSTEM_PART,
    TOOLS_PART,
    ConversationDump,
    ConversationExists,
    InboxFull,
    KeyFact,
    QuotedMessage,
    RequestPart,
    Store,
    Summary,
    TurnRecord,
    open_store,
    part_hash,
)
from proxy.store.redis import RedisStore
from proxy.transfer import read_dump

A = ConversationKey("tenant-a", "conv")
B = ConversationKey("tenant-b", "conv")


def msgs(*texts: str) -> list[dict]:
    return [{"role": "user", "content": t} for t in texts]


async def add(store: Store, key: ConversationKey, texts: list[str], status: str = LIVE) -> list[int]:
    batch = msgs(*texts)
    return await store.append(key, batch, [message_hash(m) for m in batch], status)


@pytest.fixture(params=["diskcache", "redis"])
async def store(request, tmp_path: Path) -> AsyncIterator[Store]:
    if request.param == "redis":
        # One server for the session; a key prefix of its own keeps each test's data apart.
        server = request.getfixturevalue("redis_server")
        s: Store = RedisStore(server.url, prefix=f"cp-test-{uuid.uuid4().hex[:8]}:")
    else:
        s = open_store(StorageSettings(backend=request.param, path=tmp_path / "store"))
    yield s
    await s.close()


async def test_append_assigns_increasing_seqs_and_keeps_order(store):
    assert await add(store, A, ["a", "b"]) == [1, 2]
    assert await add(store, A, ["c"]) == [3]
    live = await store.messages(A, live_only=True)
    assert [(m.seq, m.message["content"], m.status) for m in live] == [(1, "a", LIVE), (2, "b", LIVE), (3, "c", LIVE)]
    conv = await store.get(A)
    assert conv is not None and conv.live_hashes == [message_hash(m) for m in msgs("a", "b", "c")]


async def test_status_changes_move_messages_in_and_out_of_the_live_transcript(store):
    await add(store, A, ["a", "b"])
    pending = await add(store, A, ["c", "d"], PENDING)
    assert [m.seq for m in await store.messages(A, live_only=True)] == [1, 2]
    await store.set_statuses(A, {2: SUPERSEDED, pending[0]: LIVE, pending[1]: FAILED})
    assert [m.message["content"] for m in await store.messages(A, live_only=True)] == ["a", "c"]
    everything = await store.messages(A, live_only=False)
    assert [(m.message["content"], m.status) for m in everything] == [
        ("a", LIVE), ("b", SUPERSEDED), ("c", LIVE), ("d", FAILED),
    ]
    assert [seq for seq, _ in (await store.get(A)).live] == [1, 3]


async def test_messages_after_and_limit(store):
    await add(store, A, [str(i) for i in range(10)])
    page = await store.messages(A, live_only=True, after=3, limit=4)
    assert [m.seq for m in page] == [4, 5, 6, 7]
    assert await store.messages(A, live_only=False, after=10) == []


async def test_tenants_are_separate_namespaces(store):
    await add(store, A, ["alice's"])
    await add(store, B, ["bob's"])
    assert [m.message["content"] for m in await store.messages(A, live_only=True)] == ["alice's"]
    assert [m.message["content"] for m in await store.messages(B, live_only=True)] == ["bob's"]
    page, _ = await store.list_conversations("tenant-a")
    assert [c.key for c in page] == [A]
    assert {c.key for c in await store.find("conv")} == {A, B}
    everyone, _ = await store.list_conversations(None)
    assert {c.key for c in everyone} == {A, B}


async def test_list_is_newest_first_with_a_cursor(store):
    keys = [ConversationKey("t", f"c{i}") for i in range(5)]
    for key in keys:
        await add(store, key, ["x"])
    page, more = await store.list_conversations("t", limit=3)
    assert [c.key.id for c in page] == ["c4", "c3", "c2"] and more
    page, more = await store.list_conversations("t", after="c2", limit=3)
    assert [c.key.id for c in page] == ["c1", "c0"] and not more


async def test_delete_removes_everything_of_one_conversation_only(store):
    await add(store, A, ["a"])
    await add(store, B, ["b"])
    assert await store.delete(A) is True
    assert await store.get(A) is None
    assert await store.messages(A, live_only=False) == []
    assert await store.delete(A) is False
    assert (await store.get(B)) is not None
    page, _ = await store.list_conversations("tenant-a")
    assert page == []


async def test_lock_serializes_one_conversation_but_not_others(store):
    order: list[str] = []
    inside = asyncio.Event()
    release = asyncio.Event()

    async def holder() -> None:
        async with store.lock(A):
            order.append("first in")
            inside.set()
            await release.wait()
            order.append("first out")

    async def waiter() -> None:
        await inside.wait()
        async with store.lock(A):
            order.append("second in")

    async def other() -> None:
        await inside.wait()
        async with store.lock(B):
            order.append("other conversation")
        release.set()

    await asyncio.gather(holder(), waiter(), other())
    assert order == ["first in", "other conversation", "first out", "second in"]


async def test_unknown_status_is_refused(store):
    await add(store, A, ["a"])
    with pytest.raises(ValueError):
        await store.set_statuses(A, {1: "bogus"})


async def test_data_survives_reopening(tmp_path):
    settings = StorageSettings(backend="diskcache", path=tmp_path / "persist")
    first = open_store(settings)
    await add(first, A, ["kept"])
    await first.close()
    second = open_store(settings)
    assert [m.message["content"] for m in await second.messages(A, live_only=True)] == ["kept"]
    assert await add(second, A, ["next"]) == [2]
    await second.close()


def summary(first: int, last: int, text: str = "s") -> Summary:
    return Summary(text=text, first_seq=first, last_seq=last, strategy="turns", model="m", tokens_in=10, tokens_out=2)


async def test_summaries_are_all_kept_and_the_boundary_only_moves_forward(store):
    await add(store, A, [str(i) for i in range(10)])
    first = await store.add_summary(A, summary(1, 4, "first"))
    assert first.id == 1
    conv = await store.get(A)
    assert (conv.boundary, conv.summary_id) == (4, 1)
    second = await store.add_summary(A, summary(1, 8, "second"))
    stale = await store.add_summary(A, summary(1, 6, "late and stale"))
    conv = await store.get(A)
    assert (conv.boundary, conv.summary_id) == (8, second.id)
    assert [s.text for s in await store.summaries(A)] == ["first", "second", "late and stale"]
    assert (await store.summary(A, stale.id)).last_seq == 6
    assert await store.summaries(B) == []


async def test_a_summary_keeps_its_parts_as_data(store):
    await add(store, A, ["task", "keep src/a.py", "x"])
    made = Summary(
        text="the summarizer's text", first_seq=1, last_seq=3, strategy="turns", model="m", tokens_in=5, tokens_out=1,
        facts=[KeyFact("src/a.py", 2, 1, 2), KeyFact("PROJ-9", 1, 0, 3)],
        user_messages=[QuotedMessage(2, "keep src/a.py", 13), QuotedMessage(3, "x" * 10, 900, ref="out_3_" + "0" * 24)],
        user_messages_omitted=4,
    )
    stored = await store.add_summary(A, made)
    for read in (await store.summary(A, stored.id), (await store.summaries(A))[0]):
        assert read == stored and read.facts[0] == KeyFact("src/a.py", 2, 1, 2) and read.user_messages[1].shortened


async def test_leases_are_exclusive_until_released_or_expired(store):
    token = await store.acquire_lease("compact:a", ttl_s=60)
    assert token is not None
    assert await store.acquire_lease("compact:a", ttl_s=60) is None
    assert await store.acquire_lease("compact:b", ttl_s=60) is not None
    await store.release_lease("compact:a", "not-the-token")
    assert await store.acquire_lease("compact:a", ttl_s=60) is None
    await store.release_lease("compact:a", token)
    assert await store.acquire_lease("compact:a", ttl_s=0.000001) is not None
    # An expired lease is free again: ttl above is ~0, so the next acquire takes it over.
    assert await store.acquire_lease("compact:a", ttl_s=60) is not None


async def test_single_message_counters_marks_and_rewrites(store):
    await add(store, A, ["a", "b"])
    assert (await store.message(A, 2)).message["content"] == "b"
    assert await store.message(A, 3) is None
    assert [await store.count_llm_call(A) for _ in range(3)] == [1, 2, 3]
    assert (await store.get(A)).llm_calls == 3
    # With a limit, counted only below it, in one step: turns at once never pass it.
    assert sorted(map(str, await asyncio.gather(*(store.count_llm_call(A, limit=5) for _ in range(4))))) == ["4", "5", "None", "None"]
    assert (await store.get(A)).llm_calls == 5
    await store.mark_forwarded(A, {1: 1, 2: 3})
    await store.mark_forwarded(A, {})
    assert (await store.get(A)).first_forwarded == {1: 1, 2: 3}
    await store.set_rewrites(A, {2: "short form"})
    assert await store.rewrites(A, [1, 2]) == {2: "short form"}
    assert (await store.get(A)).rewritten == frozenset({2})
    assert await store.rewrites(B, [2]) == {}


async def test_secret_is_made_once_and_kept(store):
    first = await store.secret()
    assert len(first) >= 16 and await store.secret() == first


async def test_concurrent_appends_to_one_conversation_never_share_a_seq(store):
    seqs = await asyncio.gather(*(add(store, A, [f"m{i}"]) for i in range(20)))
    assert sorted(s for batch in seqs for s in batch) == list(range(1, 21))


async def test_finish_turn_is_one_step_and_keeps_the_turn_record(store):
    pending = await add(store, A, ["question"], PENDING)
    reply = {"role": "assistant", "content": "answer"}
    seq = await store.finish_turn(A, {pending[0]: LIVE}, [(reply, message_hash(reply))], LIVE, TurnRecord(tokens_sent=12))
    assert seq == 2
    assert [m.message["content"] for m in await store.messages(A, live_only=True)] == ["question", "answer"]
    await store.finish_turn(A, {}, [], LIVE, TurnRecord(tokens_sent=30))
    records = await store.turn_records(A)
    assert [(r["turn"], r["tokens_sent"], r["reply_seq"]) for r in records] == [(1, 12, 2), (2, 30, None)]
    assert [r["turn"] for r in await store.turn_records(A, after=1)] == [2]
    assert await store.turn_records(B) == []


async def test_a_turn_records_seq_lists_come_back_as_given(store):
    sent = [1, *range(57, 2041), 3, 3, 2045]  # a window's prompt: the system prompt, the kept run, odd ones
    await store.finish_turn(A, {}, [], LIVE, TurnRecord(sent_seqs=sent, new_seqs=[2041, 2042], tokens_sent=9))
    await store.finish_turn(A, {}, [], LIVE, TurnRecord())
    first, second = await store.turn_records(A)
    assert (first["sent_seqs"], first["new_seqs"], first["tokens_sent"]) == (sent, [2041, 2042], 9)
    assert (second["sent_seqs"], second["new_seqs"]) == ([], [])
    assert list(first) == [*TurnRecord().row(), "turn", "reply_seq"]  # the row's own fields, in its order


async def test_finish_turn_also_counts_the_turns_calls_and_keeps_its_first_forwarded_marks(store):
    """A turn's end is its second and last write: its upstream calls and forwarded marks go with it."""
    pending = await add(store, A, ["question", "tool output"], PENDING)
    assert await store.count_llm_call(A) == 1  # an earlier call, counted on its own
    reply = {"role": "assistant", "content": "answer"}
    await store.finish_turn(A, {s: LIVE for s in pending}, [(reply, message_hash(reply))], LIVE, TurnRecord(tokens_sent=5),
                            llm_calls=3, forwarded={pending[1]: 2})
    conversation = await store.get(A)
    assert conversation is not None and conversation.llm_calls == 4 and conversation.first_forwarded == {pending[1]: 2}
    assert [m.status for m in await store.messages(A, live_only=False)] == [LIVE, LIVE, LIVE]
    # A refused turn still counts the calls it made; no calls, no marks: nothing changes.
    refused = await add(store, A, ["again"], PENDING)
    await store.finish_turn(A, {refused[0]: FAILED}, [], FAILED, None, llm_calls=1)
    await store.finish_turn(A, {}, [], LIVE, None)
    conversation = await store.get(A)
    assert conversation is not None and conversation.llm_calls == 5 and conversation.first_forwarded == {pending[1]: 2}
    # A bad seq changes nothing: not the count, not the marks.
    with pytest.raises(KeyError):
        await store.finish_turn(A, {999: LIVE}, [], LIVE, None, llm_calls=7, forwarded={refused[0]: 9})
    conversation = await store.get(A)
    assert conversation is not None and conversation.llm_calls == 5 and conversation.first_forwarded == {pending[1]: 2}


async def test_a_reply_of_several_items_is_named_by_its_response_id_until_deleted(store):
    pending = await add(store, A, ["question"], PENDING)
    reply = [({"type": "reasoning", "id": "rs_1"}, "h1"), ({"type": "message", "role": "assistant"}, "h2")]
    first = await store.finish_turn(A, {pending[0]: LIVE}, reply, LIVE, TurnRecord(response_id="resp_1"))
    assert first == 2 and [m.seq for m in await store.messages(A, live_only=True)] == [1, 2, 3]
    assert await store.response_owner(A.tenant, "resp_1") == (A.id, 3)  # the reply's last item
    assert await store.response_owner(B.tenant, "resp_1") is None  # another tenant knows nothing of it
    assert await store.response_owner(A.tenant, "resp_unknown") is None
    await store.delete(A)
    assert await store.response_owner(A.tenant, "resp_1") is None


# One transcript item of each wire format the dialects read, as a client or upstream sends it:
# the store holds them whatever their shape (transcript.Raw), never a chat message's fields only.
WIRE_ITEMS = [
    {"role": "assistant", "content": None, "refusal": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": "{\"path\": \"a.py\"}"}}]},
    {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB" + "x" * 64},
    {"type": "function_call_output", "call_id": "call_1", "output": "42 rows \u00e9t\u00e9 \u2713"},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "plan", "signature": "EqQB"},
                                      {"type": "tool_use", "id": "toolu_1", "name": "grep", "input": {"pattern": "a|b", "n": 3.5}}]},
    {"role": "model", "parts": [{"functionCall": {"name": "ls", "args": {"dir": "/", "depth": [1, None, True]}}},
                                {"thoughtSignature": "c2ln", "text": ""}]},
]


async def test_items_of_every_wire_format_come_back_exactly_as_written(store):
    staged = await store.stage(A, WIRE_ITEMS[:3], ["h1", "h2", "h3"], PENDING)
    reply = [(WIRE_ITEMS[3], "h4"), (WIRE_ITEMS[4], "h5")]
    await store.finish_turn(A, dict.fromkeys(staged, LIVE), reply, LIVE, TurnRecord(tokens_sent=5))
    got = await store.messages(A, live_only=True)
    assert [m.message for m in got] == WIRE_ITEMS and [m.hash for m in got] == ["h1", "h2", "h3", "h4", "h5"]
    # Byte for byte, key order included: what goes upstream again is what was sent (prompt caches).
    assert [json.dumps(m.message) for m in got] == [json.dumps(item) for item in WIRE_ITEMS]


async def test_marks_are_kept_on_the_conversation_and_set_one_by_one(store):
    await add(store, A, ["m"])
    assert (await store.get(A)).marks == {}
    await store.set_marks(A, {"window_start": 5})
    await store.set_marks(A, {"mask_through": 3})
    await store.set_marks(A, {"window_start": 9})
    assert (await store.get(A)).marks == {"window_start": 9, "mask_through": 3}
    assert (await store.get(B)) is None


async def test_a_turns_end_keeps_the_marks_its_stages_moved_in_the_same_step(store):
    """A window's new cut goes with the turn's end (no third write), failed turn or not; a bad
    seq keeps neither the end nor the marks."""
    pending = await add(store, A, ["question"], PENDING)
    reply = {"role": "assistant", "content": "answer"}
    await store.set_marks(A, {"mask_through": 1})
    await store.finish_turn(A, {pending[0]: LIVE}, [(reply, message_hash(reply))], LIVE, TurnRecord(tokens_sent=5),
                            marks={"window_start": 2})
    assert (await store.get(A)).marks == {"mask_through": 1, "window_start": 2}
    refused = await add(store, A, ["again"], PENDING)
    with pytest.raises(KeyError):
        await store.finish_turn(A, {999: LIVE}, [], LIVE, None, marks={"window_start": 7})
    assert (await store.get(A)).marks == {"mask_through": 1, "window_start": 2}
    await store.finish_turn(A, {refused[0]: FAILED}, [], FAILED, None, marks={"window_start": 3})
    conversation = await store.get(A)
    assert conversation.marks == {"mask_through": 1, "window_start": 3}
    assert [m.status for m in await store.messages(A, live_only=False)] == [LIVE, LIVE, FAILED]


# -- import_conversation: what `context-proxy import` writes ---------------------------------------

C = ConversationKey("tenant-c", "copy")  # another tenant: a copy may keep the original's response ids


async def a_conversation_with_everything(store: Store, key: ConversationKey) -> None:
    """Every part a store holds: each status, turn records, quota marks, a rewrite, marks, summaries."""
    await add(store, key, ["system", "task"])
    system, tools = part(SYSTEM_PART, [{"type": "text", "text": "be brief ✓"}]), part(TOOLS_PART, [{"name": "ls"}])
    await store.add_request_parts(key, [system, tools])
    pending = await add(store, key, ["q1"], PENDING)
    reply = {"role": "assistant", "content": "a1", "tool_calls": [], "unknown_field": {"kept": [1, 2.5, None]}}
    reasoning = {"type": "reasoning", "id": "rs_1"}  # a reply of two items, named by a response id
    record = TurnRecord(sent_seqs=[1, 2, 3], llm_calls=1, response_id="resp_1", model="m", client="curl 8", task="task",
                        system_hash=system.hash, tools_hash=tools.hash)
    await store.finish_turn(key, {pending[0]: LIVE}, [(reasoning, "h"), (reply, message_hash(reply))], LIVE, record)
    refused = await add(store, key, ["q2"], PENDING)
    error = {"status": 500, "message": "upstream broke", "source": "upstream"}
    await store.finish_turn(key, {refused[0]: FAILED}, [], FAILED, TurnRecord(sent_seqs=[], status="failed", error=error))
    await store.set_title(key, "everything")
    await add(store, key, ["edited away"])
    await store.set_statuses(key, {7: SUPERSEDED})
    await add(store, key, ["branch", "é ünicode ✓"])
    await store.count_llm_call(key)
    await store.count_llm_call(key)
    await store.mark_forwarded(key, {1: 1, 3: 2})
    await store.set_rewrites(key, {3: "the short form"})
    await store.set_marks(key, {"window_start": 5, "mask_through": 3})
    await store.add_summary(key, summary(1, 4, "first"))
    await store.add_summary(key, summary(1, 2, "stale"))
    await store.post_inbox(key, "delivered before the task", "note 1", max_pending=5)
    await store.deliver_inbox(key, 2, BEFORE, turn=1, stamp=12.25)
    await store.post_inbox(key, "still waiting", "note 2", max_pending=5)


def moved(dump: ConversationDump, key: ConversationKey) -> ConversationDump:
    return dataclasses.replace(dump, conversation=dataclasses.replace(dump.conversation, key=key))


async def test_import_writes_exactly_what_was_exported_and_the_conversation_goes_on(store):
    await a_conversation_with_everything(store, A)
    dump = await read_dump(store, A)
    statuses = [LIVE, LIVE, LIVE, LIVE, LIVE, FAILED, SUPERSEDED, LIVE, LIVE]
    assert dump is not None and [m.status for m in dump.messages] == statuses and dump.responses == {"resp_1": 5}
    assert [(m.status, m.seq) for m in dump.inbox] == [(INBOX_DELIVERED, 2), (INBOX_PENDING, None)]
    await store.import_conversation(moved(dump, C))
    assert await read_dump(store, C) == moved(dump, C)
    assert await read_dump(store, A) == dump  # the original untouched
    assert await store.response_owner(C.tenant, "resp_1") == ("copy", 5)
    copied = await store.get(C)
    assert (copied.inbox_open, copied.inbox_anchors) == (1, frozenset({2}))  # the waiting one is still due
    everyone, _ = await store.list_conversations(None)
    assert [c.key for c in everyone] == [C, A]  # an import lists as the newest
    failed, _ = await store.list_conversations(C.tenant, failed=True)
    assert [c.key for c in failed] == [C] and failed[0].title == "everything" and failed[0].failures == 1
    assert [c.key for c in await store.find("copy")] == [C]

    # It continues where it was: seqs, summary ids, turn numbers and the call count go on.
    assert await add(store, C, ["next"]) == [10]
    assert (await store.add_summary(C, summary(1, 9, "third"))).id == 3
    await store.finish_turn(C, {}, [], LIVE, TurnRecord(sent_seqs=[10]))
    assert [r["turn"] for r in await store.turn_records(C)] == [1, 2, 3]
    assert await store.count_llm_call(C) == 3
    assert (await store.get(C)).boundary == 9


async def test_import_refuses_a_taken_key_unless_told_to_replace(store):
    await a_conversation_with_everything(store, A)
    dump = await read_dump(store, A)
    await add(store, C, ["already here", "and more", "and more still"])
    await store.set_rewrites(C, {3: "a rewrite of the old conversation"})
    with pytest.raises(ConversationExists):
        await store.import_conversation(moved(dump, C))
    assert [m.message["content"] for m in await store.messages(C, live_only=False)] == ["already here", "and more", "and more still"]
    await store.import_conversation(moved(dump, C), replace=True)
    assert await read_dump(store, C) == moved(dump, C)
    first = dataclasses.replace(
        dump.conversation, key=C, next_seq=2, live=dump.conversation.live[:1], first_forwarded={},
        rewritten=frozenset(), boundary=0, summary_id=None, marks={}, turns=0, failures=0, last_error=None,
    )
    small = ConversationDump(first, dump.messages[:1], {}, [], [])
    await store.import_conversation(small, replace=True)
    assert await read_dump(store, C) == small
    assert await store.rewrites(C, [3]) == {} and await store.message(C, 3) is None
    assert await store.response_owner(C.tenant, "resp_1") is None  # what was there is gone, all of it
    page, _ = await store.list_conversations(C.tenant)
    assert [c.key for c in page] == [C]  # listed once
    assert (await store.list_conversations(C.tenant, failed=True))[0] == []  # its failures went with it


@pytest.mark.parametrize(
    "spoil",
    [
        lambda d: d.messages.pop(1),  # a gap in the seqs
        lambda d: setattr(d.messages[0], "status", "bogus"),
        lambda d: d.summaries.pop(0),  # summary ids must start at 1
        lambda d: setattr(d, "rewrites", {99: "no such message"}),
        lambda d: d.turns.reverse(),
        lambda d: setattr(d, "responses", {"resp_x": 99}),
        lambda d: d.conversation.marks.update(window_start=99),
        lambda d: setattr(d.inbox[0], "seq", 99),
        lambda d: d.parts.__setitem__(0, dataclasses.replace(d.parts[0], value="not what was hashed")),
        lambda d: d.parts.pop(1),  # a turn names tools no longer there
        lambda d: d.parts.append(d.parts[0]),
        lambda d: d.parts.__setitem__(1, part(TOOLS_PART, "tools are a list")),
    ],
    ids=["seq-gap", "status", "summary-ids", "rewrite-seq", "turn-order", "response-seq", "mark-seq", "inbox-seq",
         "part-hash", "part-missing", "part-twice", "part-shape"],
)
async def test_import_refuses_a_dump_whose_parts_disagree_and_writes_nothing(store, spoil):
    await a_conversation_with_everything(store, A)
    dump = moved(await read_dump(store, A), C)
    spoil(dump)
    with pytest.raises(ValueError):
        await store.import_conversation(dump)
    assert await store.get(C) is None and await store.messages(C, live_only=False) == []


# -- request parts: the system prompts and tools lists a conversation's turns sent ---------------


def part(kind: str, value) -> RequestPart:
    return RequestPart(kind, part_hash(value), value)


async def test_request_parts_are_kept_once_by_hash_in_the_order_first_sent(store):
    first, tools = part(SYSTEM_PART, "You are terse."), part(TOOLS_PART, [{"name": "ls", "input_schema": {}}])
    assert await store.add_request_parts(A, [first, tools]) == []  # no such conversation: nothing kept
    assert await store.request_parts(A) == []
    await add(store, A, ["task"])
    assert await store.add_request_parts(A, [first, tools]) == [first.hash, tools.hash]
    assert await store.add_request_parts(A, [first, tools]) == []  # the same again: nothing written
    second = part(SYSTEM_PART, [{"type": "text", "text": "You are verbose ✓"}])
    assert await store.add_request_parts(A, [second, tools]) == [second.hash]
    kept = await store.request_parts(A)
    assert [(p.kind, p.hash, p.value) for p in kept] == [
        (SYSTEM_PART, first.hash, "You are terse."), (TOOLS_PART, tools.hash, tools.value), (SYSTEM_PART, second.hash, second.value)
    ]
    assert all(p.created_at > 0 for p in kept) and kept[0].created_at <= kept[2].created_at
    assert await store.request_parts(A, after=2) == kept[2:] and await store.request_parts(A, after=3) == []
    await add(store, B, ["task"])
    assert await store.request_parts(B) == []  # another tenant's conversation of the same id
    assert await store.delete(A)
    await add(store, A, ["task"])
    assert await store.request_parts(A) == []  # they went with the conversation


# -- inbox -------------------------------------------------------------------------------------


async def test_inbox_messages_wait_for_an_existing_conversation_only(store):
    assert await store.post_inbox(A, "hello", "note: hello", max_pending=5) is None  # no such conversation
    await add(store, A, ["task"])
    first = await store.post_inbox(A, "look at b.py", "note 1", max_pending=2)
    second = await store.post_inbox(A, "and c.py", "note 2", max_pending=2)
    assert (first.id, second.id) == (1, 2)
    with pytest.raises(InboxFull):
        await store.post_inbox(A, "one too many", "note 3", max_pending=2)
    listed = await store.inbox(A)
    assert [(m.id, m.content, m.note, m.status, m.seq) for m in listed] == [
        (1, "look at b.py", "note 1", INBOX_PENDING, None), (2, "and c.py", "note 2", INBOX_PENDING, None),
    ]
    assert [m.id for m in await store.inbox(A, after=1)] == [2]
    assert (await store.get(A)).inbox_open == 2
    assert await store.inbox(B) == []


async def test_delivery_takes_every_waiting_message_once_and_follows_its_item(store):
    await add(store, A, ["task"])
    await store.post_inbox(A, "first", "n1", max_pending=5)
    await store.post_inbox(A, "second", "n2", max_pending=5)
    [item] = await add(store, A, ["tool result"], PENDING)
    delivered = await store.deliver_inbox(A, item, APPEND, turn=3, stamp=123.5)
    assert [(m.id, m.status, m.seq, m.placement, m.turn, m.delivered_at) for m in delivered] == [
        (1, INBOX_DELIVERING, item, APPEND, 3, 123.5), (2, INBOX_DELIVERING, item, APPEND, 3, 123.5),
    ]
    assert (await store.get(A)).inbox_anchors == frozenset({item})
    assert [m.id for m in (await store.inbox_at(A, [item, 1]))[item]] == [1, 2]
    assert await store.inbox_at(A, [1]) == {}
    await store.finish_turn(A, {item: LIVE}, [], LIVE, None)
    assert [m.status for m in await store.inbox(A)] == [INBOX_DELIVERED, INBOX_DELIVERED]
    # The next turn's delivery finds them delivered for good: nothing is open any more.
    [later] = await add(store, A, ["next"], PENDING)
    assert await store.deliver_inbox(A, later, BEFORE, turn=4, stamp=130.0) == []
    assert (await store.get(A)).inbox_open == 0


async def test_a_message_delivered_in_a_failed_turn_is_delivered_again(store):
    await add(store, A, ["task"])
    await store.post_inbox(A, "steer", "n", max_pending=5)
    [failed] = await add(store, A, ["attempt"], PENDING)
    await store.deliver_inbox(A, failed, BEFORE, turn=2, stamp=1.0)
    await store.finish_turn(A, {failed: FAILED}, [], LIVE, None)
    [waiting] = await store.inbox(A)
    assert (waiting.status, waiting.seq, waiting.turn) == (INBOX_PENDING, None, None)
    # A turn that never ended (its replica died) leaves its item pending: delivered again too.
    [abandoned] = await add(store, A, ["attempt 2"], PENDING)
    assert [m.id for m in await store.deliver_inbox(A, abandoned, BEFORE, turn=3, stamp=2.0)] == [1]
    [retry] = await add(store, A, ["attempt 3"], PENDING)
    [again] = await store.deliver_inbox(A, retry, APPEND, turn=3, stamp=3.0)
    assert (again.id, again.seq, again.placement) == (1, retry, APPEND)
    assert await store.inbox_at(A, [failed, abandoned]) == {}
    assert (await store.get(A)).inbox_anchors == frozenset({retry})


async def test_delivery_with_a_live_item_is_final_at_once(store):
    [live] = await add(store, A, ["task"])
    await store.post_inbox(A, "steer", "n", max_pending=5)
    [message] = await store.deliver_inbox(A, live, BEFORE, turn=1, stamp=1.0)
    assert message.status == INBOX_DELIVERED
    assert (await store.get(A)).inbox_open == 0


async def test_concurrent_turns_deliver_each_message_once(store):
    """Turns deliver under the conversation's lock, as the engine's do: whichever turn comes first
    takes what is waiting, the others find it delivered (for Redis: across replicas as well)."""
    await add(store, A, ["task"])
    posted = [await store.post_inbox(A, f"m{i}", f"n{i}", max_pending=10) for i in range(5)]

    async def turn(n: int) -> list[int]:
        async with store.lock(A):
            [item] = await add(store, A, [f"turn {n}"], PENDING)
            delivered = await store.deliver_inbox(A, item, BEFORE, n, float(n))
            await store.finish_turn(A, {item: LIVE}, [], LIVE, None)
            return [m.id for m in delivered]

    batches = await asyncio.gather(*(turn(n) for n in range(4)))
    assert sorted(i for batch in batches for i in batch) == [m.id for m in posted]
    assert sum(1 for batch in batches if batch) == 1
    assert {m.status for m in await store.inbox(A)} == {INBOX_DELIVERED}


async def test_deleting_a_conversation_deletes_its_inbox(store):
    await add(store, A, ["task"])
    await store.post_inbox(A, "steer", "n", max_pending=5)
    await store.delete(A)
    await add(store, A, ["again"])
    assert await store.inbox(A) == []
    assert (await store.get(A)).inbox_open == 0


# -- long-term knowledge -----------------------------------------------------------------------


async def test_knowledge_versions_are_all_kept_per_tenant_and_namespace(store):
    assert await store.knowledge("t1", "") is None
    assert await store.knowledge_at("t1", "", cutoff=1e12) is None
    first = await store.put_knowledge("t1", "", "# Notes\n", "seed", base_version=0)
    assert (first.version, first.text, first.source) == (1, "# Notes\n", "seed")
    assert await store.put_knowledge("t1", "", "lost race", "agent:c", base_version=0) is None
    second = await store.put_knowledge("t1", "", "# Notes\nmore\n", "agent:c", base_version=1)
    await store.put_knowledge("t1", "ops", "ops notes", "admin", base_version=0)
    assert (await store.knowledge("t1", "")).version == 2
    assert (await store.knowledge("t1", "", version=1)).text == "# Notes\n"
    assert await store.knowledge("t1", "", version=3) is None
    assert [v.version for v in await store.knowledge_versions("t1", "")] == [2, 1]
    assert [v.version for v in await store.knowledge_versions("t1", "", before=2, limit=5)] == [1]
    assert await store.knowledge("t2", "") is None and await store.knowledge("t1", "dev") is None
    assert [(d.namespace, d.version) for d in await store.knowledge_documents("t1")] == [("", 2), ("ops", 1)]
    await store.put_knowledge("t2", "", "bob", "api", base_version=0)
    assert {(d.tenant, d.namespace) for d in await store.knowledge_documents(None)} == {("t1", ""), ("t1", "ops"), ("t2", "")}
    # A conversation sees the newest version written by its cutoff, else the first one.
    assert (await store.knowledge_at("t1", "", cutoff=second.created_at)).version == 2
    assert (await store.knowledge_at("t1", "", cutoff=(first.created_at + second.created_at) / 2)).version in (1, 2)
    assert (await store.knowledge_at("t1", "", cutoff=first.created_at - 100)).version == 1


async def test_concurrent_knowledge_writes_on_one_base_let_one_win(store):
    results = await asyncio.gather(*(store.put_knowledge("t", "", f"v{i}", "agent", base_version=0) for i in range(6)))
    assert sum(r is not None for r in results) == 1
    assert (await store.knowledge("t", "")).version == 1


async def test_pending_messages_a_crash_left_are_marked_failed_once(store):
    await add(store, A, ["live"])
    await add(store, A, ["cut", "short"], PENDING)  # a turn that never ended
    finished = await add(store, B, ["done"], PENDING)
    await store.finish_turn(B, {finished[0]: LIVE}, [], LIVE, None)  # one that did
    assert await store.fail_pending() == 2
    assert [(m.message["content"], m.status) for m in await store.messages(A, live_only=False)] == [
        ("live", LIVE), ("cut", FAILED), ("short", FAILED),
    ]
    assert [m.status for m in await store.messages(B, live_only=False)] == [LIVE]
    assert [m.message["content"] for m in await store.messages(A, live_only=True)] == ["live"]
    assert await store.fail_pending() == 0  # nothing is marked twice


async def test_pending_messages_of_a_turn_still_running_are_left_alone(store):
    seqs = await add(store, A, ["in flight"], PENDING)
    async with store.lock(A):  # the turn that wrote them holds its conversation's lock
        assert await store.fail_pending() == 0
        assert (await store.message(A, seqs[0])).status == PENDING
    assert await store.fail_pending() == 1


async def test_staged_items_are_read_at_once_and_end_with_the_turn(store):
    await add(store, A, ["task"])  # a later turn: the conversation exists
    new = msgs("observation")
    seqs = await store.stage(A, new, [message_hash(m) for m in new], PENDING)
    assert seqs == [2]
    # Every read sees them as the turn goes on (a second turn plans after them, /ui shows them).
    assert (await store.get(A)).next_seq == 3
    assert [(m.message["content"], m.status) for m in await store.messages(A, live_only=False)] == [
        ("task", LIVE), ("observation", PENDING),
    ]
    reply = {"role": "assistant", "content": "done"}
    assert await store.finish_turn(A, {2: LIVE}, [(reply, message_hash(reply))], LIVE, TurnRecord(tokens_sent=7)) == 3
    assert [m.message["content"] for m in await store.messages(A, live_only=True)] == ["task", "observation", "done"]
    await store.flush(A)  # nothing left to write: a no-op
    more = msgs("next")
    await store.stage(A, more, [message_hash(m) for m in more], PENDING)
    await store.flush(A)  # durable before a reply's first byte: a crash now leaves it pending
    assert await store.fail_pending() == 1
    assert [(m.message["content"], m.status) for m in await store.messages(A, live_only=False)][-1] == ("next", FAILED)


async def test_a_deleted_conversation_leaves_nothing_pending(store):
    await add(store, A, ["cut"], PENDING)
    assert await store.delete(A)
    assert await store.fail_pending() == 0


async def test_a_working_store_reports_itself_healthy(store):
    await add(store, A, ["a"])
    health = await store.health()
    assert health.ok and health.to_api()["status"] == "ok"


# -- what people read in the list: title, task, model, client, turns, failures ---------------------


async def finish(store: Store, key: ConversationKey, text: str, record: dict) -> None:
    """One turn: a pending message, then ended live or failed as the record's status says."""
    pending = await add(store, key, [text], PENDING)
    status = record.get("status", LIVE)
    await store.finish_turn(key, {pending[0]: status}, [], LIVE, TurnRecord(**{"status": status, "created_at": 1.5, **record}))


async def test_turn_records_describe_their_conversation(store):
    await finish(store, A, "q1", {"model": "gpt-4o", "client": "Codex 0.1", "task": "fix the ledger"})
    await finish(store, A, "q2", {"model": "gpt-4o-mini", "task": "a later task never replaces the first"})
    conversation = await store.get(A)
    assert (conversation.model, conversation.client, conversation.task) == ("gpt-4o-mini", "Codex 0.1", "fix the ledger")
    assert (conversation.turns, conversation.failures, conversation.last_error, conversation.title) == (2, 0, None, None)
    assert conversation.to_api()["title"] == "fix the ledger"  # no title of its own: the task's words
    await finish(store, A, "q3", {"title": "Ledger run"})
    assert (await store.get(A)).to_api()["title"] == "Ledger run"


async def test_set_title_names_a_conversation_and_creates_none(store):
    await finish(store, A, "q", {"task": "the task"})
    assert (await store.set_title(A, "My run")).title == "My run"
    assert (await store.get(A)).title == "My run"
    assert (await store.set_title(A, None)).to_api()["title"] == "the task"
    assert await store.set_title(B, "nobody") is None
    assert await store.get(B) is None


async def test_failed_turns_are_counted_and_listed_apart(store):
    keys = [ConversationKey("t", f"c{i}") for i in range(5)]
    for i, key in enumerate(keys):
        await finish(store, key, "q", {})
        if i % 2 == 0:
            error = {"status": 500, "message": f"upstream broke {i}", "source": "upstream"}
            await finish(store, key, "q", {"status": FAILED, "error": error})
    await finish(store, keys[4], "q", {"status": FAILED, "error": {"status": 429, "message": "quota", "source": "proxy"}})
    page, more = await store.list_conversations("t", failed=True, limit=2)
    assert [c.key.id for c in page] == ["c4", "c2"] and more
    page, more = await store.list_conversations("t", failed=True, after="c2", limit=2)
    assert [c.key.id for c in page] == ["c0"] and not more
    c4 = await store.get(keys[4])
    assert c4.failures == 2 and c4.last_error == {"turn": 3, "created_at": 1.5, "status": 429, "message": "quota", "source": "proxy"}
    assert (await store.get(keys[1])).failures == 0
    assert [c.key.id for c in (await store.list_conversations(None, failed=True))[0]] == ["c4", "c2", "c0"]
    assert (await store.list_conversations("other", failed=True))[0] == []  # per tenant
    await store.delete(keys[2])
    assert [c.key.id for c in (await store.list_conversations("t", failed=True))[0]] == ["c4", "c0"]
    assert [c.key.id for c in (await store.list_conversations(None, failed=True))[0]] == ["c4", "c0"]


# -- history search ----------------------------------------------------------------------------


async def append_raw(store: Store, key: ConversationKey, batch: list[dict], status: str = LIVE) -> list[int]:
    return await store.append(key, batch, [message_hash(m) for m in batch], status)


LOG = "\n".join(f"2024-05-01T10:{i % 60:02d}:00Z INFO order {10000 + i} processed in {i % 90} ms" for i in range(400))


async def test_search_finds_the_passage_that_says_it_with_where_to_read_it(store):
    lines = LOG.splitlines()
    lines.insert(250, "2024-05-01T10:10:00Z WARN ledger drift of 4711 cents in services/ledger/drift.py")
    seqs = await append_raw(store, A, [
        {"role": "user", "content": "Find out why the ledger is off."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "tail_log", "arguments": "{\"service\": \"ledger\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "\n".join(lines)},
        {"role": "assistant", "content": "The root cause is in the drift module."},
    ])
    hits = await store.search(A, "ledger drift cents")
    assert hits and hits[0].seq == seqs[2] and hits[0].role == "tool"
    assert "WARN ledger drift of 4711 cents" in hits[0].text
    whole = "\n".join(lines)
    assert whole[hits[0].offset:].startswith(hits[0].text) and hits[0].length == len(whole)
    assert hits[0].created_at > 0 and len(hits[0].text) < 1500  # a passage with a little context, not the output
    assert [h.seq for h in await store.search(A, "root cause")][0] == seqs[3]
    assert await store.search(A, "services/ledger/drift.py") and (await store.search(A, "services/ledger/drift.py"))[0].seq == seqs[2]


async def test_search_matches_identifiers_whole_and_bounds_its_hits(store):
    await add(store, A, ["tracked as PAY-12345 for now", "tracked as PAY-1234 since Monday", *[f"note {i} on tracking" for i in range(30)]])
    hits = await store.search(A, "PAY-1234")
    assert hits[0].text == "tracked as PAY-1234 since Monday"
    assert len(await store.search(A, "tracking note")) == 5  # the default
    assert len(await store.search(A, "tracking note", limit=100)) == 20  # at most
    assert len(await store.search(A, "tracking note", limit=2)) == 2
    assert await store.search(A, "   ") == [] and await store.search(A, "absent-word") == []


async def test_search_sees_only_the_live_transcript_of_its_own_conversation(store):
    await add(store, A, ["the staging database is db-stage-42"])
    superseded = await add(store, A, ["the staging database is db-stage-77"])
    await add(store, A, ["the staging database is db-stage-99"], status=FAILED)
    assert {h.text for h in await store.search(A, "staging database")} == {
        "the staging database is db-stage-42", "the staging database is db-stage-77"}
    await store.set_statuses(A, {superseded[0]: SUPERSEDED})  # after it was indexed: gone at once
    assert [h.text for h in await store.search(A, "staging database")] == ["the staging database is db-stage-42"]
    assert await store.search(B, "staging database") == []  # another tenant's conversation of the same id
    assert await store.search(ConversationKey("tenant-a", "other"), "staging database") == []


async def test_search_keeps_up_with_appends_and_forgets_a_deleted_conversation(store):
    await add(store, A, ["first words about rounding"])
    assert len(await store.search(A, "rounding")) == 1
    later = await add(store, A, ["later words about rounding half-even"])
    hits = await store.search(A, "rounding half-even")
    assert hits[0].seq == later[0] and len(hits) == 2
    await store.delete(A)
    assert await store.search(A, "rounding") == []
    await add(store, A, ["a new conversation of the same id, about invoices"])
    assert await store.search(A, "rounding") == [] and len(await store.search(A, "invoices")) == 1


async def test_search_reads_every_wire_format(store):
    await append_raw(store, A, [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "use the sepa exporter"}]},
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{\"path\": \"src/exports/sepa_42.py\"}"},
        {"type": "function_call_output", "call_id": "c1", "output": "# NOTE: sepa batches are capped at 999 rows"},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "dunning level three reached"}]}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "secret plan", "signature": "sig"},
                                          {"type": "text", "text": "the vat table is stale"}]},
    ])
    assert [(h.seq, h.role) for h in await store.search(A, "sepa exporter")][:1] == [(1, "user")]
    assert (await store.search(A, "src/exports/sepa_42.py"))[0].role == "assistant"
    assert (await store.search(A, "capped rows"))[0].role == "tool"
    assert (await store.search(A, "dunning level"))[0].role == "tool"
    assert (await store.search(A, "vat table"))[0].text == "the vat table is stale"
    assert await store.search(A, "secret plan") == []  # reasoning is not searched


async def test_concurrent_first_searches_build_one_index(store):
    await add(store, A, [f"passage {i} about the sepa export" for i in range(50)])
    results = await asyncio.gather(*(store.search(A, "sepa export") for _ in range(5)))
    assert all(r == results[0] for r in results) and len(results[0]) == 5
    again = await store.search(A, "sepa export")
    assert [h.score for h in again] == [h.score for h in results[0]]  # nothing indexed twice


async def test_search_finds_a_field_of_a_long_one_line_result_whole(store):
    records = [{"id": 10000 + i, "status": "paid", "amount": 100 + i} for i in range(60)]
    records[31]["comment"] = "the ledger drift totals 808064 cents since the March import"
    await append_raw(store, A, [{"role": "tool", "tool_call_id": "c", "content": json.dumps({"data": records})}])
    (hit,) = await store.search(A, "comment the ledger drift totals cents since the March import")
    assert "the ledger drift totals 808064 cents since the March import" in hit.text
