"""What only the diskcache store's layout must do (the contract both backends pass is in
tests/store/test_contract.py): a turn writes rows of its own, not the conversation's; stores
written before batches and index chunks read and go on; crash recovery finds every pending turn."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import pickle
import secrets
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.identity import ConversationKey
from proxy.messages import message_hash
from proxy.store import FAILED, LIVE, PENDING, SUPERSEDED, StoreError, Summary, TurnRecord
from proxy.store.disk import BATCH_MAX, INDEX_CHUNK, SETTLED_FLAGS, DiskStore, open_cache
from proxy.store.disk.store import INLINE_BESIDE
from proxy.store.disk.checkpoints import BACKSTOP_PAGES, EVERY_WRITES
from proxy.store.disk.records import CHUNK_BEFORE
from proxy.store.disk.rows import PER_STATEMENT, TABLE, Rows
from proxy.transfer import read_dump
from tests.support.harness import wait_until

A = ConversationKey("a" * 24, "conv-a")
B = ConversationKey("b" * 24, "conv-b")

# The rows of a store written before batches, index chunks and pending buckets, as that code named
# them: stores out there hold these.
OLD_CONV, OLD_MSG, OLD_REWRITE = "conv\0{t}\0{c}", "msg\0{t}\0{c}\0{seq:012d}", "rewrite\0{t}\0{c}\0{seq:012d}"
OLD_INDEX_PAGE, OLD_TENANTS, OLD_CREATED, OLD_PENDING, OLD_ALL = "index\0{scope}\0{page:012d}", "tenants", "created-counter", "pending", "\x01all"


def msg(text: str, role: str = "user") -> dict[str, Any]:
    return {"role": role, "content": text}


def write_old_layout(
    path: Path, key: ConversationKey, messages: list[tuple[dict[str, Any], str]], *,
    forwarded: dict[int, int] | None = None, rewrites: dict[int, str] | None = None, llm_calls: int = 0,
) -> None:
    """A conversation as the store wrote it before batches: a row per message, the record holding
    the whole live index, first-forwarded marks and rewritten seqs, pending ones in one set."""
    cache = open_cache(str(path))
    with cache.transact():
        order = cache.incr(OLD_CREATED, default=0)
        for scope, entry in ((key.tenant, key.id), (OLD_ALL, (key.tenant, key.id))):
            page_key = OLD_INDEX_PAGE.format(scope=scope, page=order // 1000)
            cache.set(page_key, {**cache.get(page_key, {}), order: entry})
        cache.set(OLD_TENANTS, cache.get(OLD_TENANTS, set()) | {key.tenant})
        live, pending = [], []
        for seq, (message, status) in enumerate(messages, start=1):
            digest = message_hash(message)
            cache.set(OLD_MSG.format(t=key.tenant, c=key.id, seq=seq),
                      {"message": message, "hash": digest, "status": status, "created_at": 1000.0 + seq})
            if status == LIVE:
                live.append((seq, digest))
            if status == PENDING:
                pending.append(seq)
        for seq, content in (rewrites or {}).items():
            cache.set(OLD_REWRITE.format(t=key.tenant, c=key.id, seq=seq), content)
        cache.set(OLD_CONV.format(t=key.tenant, c=key.id), {
            "created_at": 1000.0, "updated_at": 1000.0 + len(messages), "next_seq": len(messages) + 1, "live": live,
            "llm_calls": llm_calls, "first_forwarded": dict(forwarded or {}), "rewritten": set(rewrites or {}),
            "summaries": 0, "boundary": 0, "summary_id": None, "turns": 0, "order": order,
            "inbox": 0, "inbox_open": [], "inbox_at": {}, "pending": pending,
        })
        if pending:
            cache.set(OLD_PENDING, cache.get(OLD_PENDING, set()) | {(key.tenant, key.id)})
    cache.close()


@pytest.fixture
async def reopen(tmp_path: Path) -> AsyncIterator[Callable[[], Any]]:
    """`await reopen()`: the store in tmp_path/store, the one opened before closed first."""
    opened: list[DiskStore] = []

    async def open_again() -> DiskStore:
        if opened:
            await opened[-1].close()
        opened.append(DiskStore(tmp_path / "store"))
        return opened[-1]

    yield open_again
    await opened[-1].close()


def rows(store: DiskStore, kind: str, key: ConversationKey | None = None) -> list[str]:
    """The keys of one kind of row (of one conversation's, if given)."""
    prefix = kind + "\0" + (f"{key.tenant}\0{key.id}\0" if key else "")
    return [k for k in store._rows.iterkeys() if isinstance(k, str) and (k.startswith(prefix) or k == prefix.rstrip("\0"))]


def rows_of(store: DiskStore, key: ConversationKey) -> list[str]:
    return [k for k in store._rows.iterkeys() if isinstance(k, str) and f"\0{key.tenant}\0{key.id}" in k]


def flagged(store: DiskStore) -> set[tuple[str, str]]:
    """The conversations the pending buckets (and a set written before them) name."""
    return {m for k in rows(store, "pending") for m in store._rows.get(k)} | set(store._rows.get(OLD_PENDING, set()))


async def turn(store: DiskStore, key: ConversationKey, texts: list[str], reply: str = "ok") -> list[int]:
    new = [msg(t) for t in texts]
    seqs = await store.append(key, new, [message_hash(m) for m in new], PENDING)
    answer = msg(reply, "assistant")
    await store.finish_turn(key, dict.fromkeys(seqs, LIVE), [(answer, message_hash(answer))], LIVE,
                            TurnRecord(created_at=1.0, sent_seqs=seqs), llm_calls=1, forwarded=dict.fromkeys(seqs, 1))
    return seqs


# -- a turn writes what it adds -----------------------------------------------------------------------


async def test_a_first_turn_is_one_batch_and_each_later_turn_one_more(reopen):
    store = await reopen()
    await turn(store, A, [f"output {i} " + "x" * 100 for i in range(200)])
    assert len(rows(store, "batch", A)) == 1 and rows(store, "msg", A) == []  # not a row per message
    assert len(rows(store, "part", A)) == 1  # its 200 messages in a row of their own, written once
    for i in range(3):
        await turn(store, A, [f"later {i}"])
    assert len(rows(store, "batch", A)) == 4  # each turn's item and reply together
    stored = await store.messages(A, live_only=False)
    assert [m.seq for m in stored] == list(range(1, 208)) and {m.status for m in stored} == {LIVE}
    assert stored[200].message == msg("ok", "assistant") and stored[201].message == msg("later 0")


async def test_a_later_turn_whose_items_wait_for_its_end_is_one_commit(reopen):
    store = await reopen()
    await turn(store, A, ["task"])
    new, answer = msg("observation"), msg("done", "assistant")
    commits = store._rows.commits
    seqs = await store.stage(A, [new], [message_hash(new)], PENDING)
    assert store._rows.commits == commits  # nothing written yet...
    assert [m.status for m in await store.messages(A, live_only=False)][-1] == PENDING  # ... but read
    await store.finish_turn(A, dict.fromkeys(seqs, LIVE), [(answer, message_hash(answer))], LIVE,
                            TurnRecord(created_at=1.0, sent_seqs=seqs), llm_calls=1, forwarded=dict.fromkeys(seqs, 1))
    assert store._rows.commits == commits + 1  # the items, the reply, the record and the turn: at once
    assert len(rows(store, "batch", A)) == 2  # the reply joined its items' batch: written once
    reopened = await reopen()
    assert [(m.message, m.status) for m in await reopened.messages(A, live_only=False)][2:] == [(new, LIVE), (answer, LIVE)]


async def test_staged_items_a_crash_cut_short_are_gone_and_flushed_ones_marked_failed(tmp_path: Path):
    store = DiskStore(tmp_path / "store")
    await turn(store, A, ["task"])
    await turn(store, B, ["task"])
    cut = msg("forwarded, no byte of its reply sent")
    await store.stage(A, [cut], [message_hash(cut)], PENDING)
    streaming = msg("its reply's first byte sent")
    await store.stage(B, [streaming], [message_hash(streaming)], PENDING)
    await store.flush(B)
    # The process dies here (the store is never closed): what was durable is what a new one reads.
    after = DiskStore(tmp_path / "store")
    assert await after.fail_pending() == 1
    assert [m.message for m in await after.messages(A, live_only=False)] == [msg("task"), msg("ok", "assistant")]
    assert [(m.message, m.status) for m in await after.messages(B, live_only=False)][-1] == (streaming, FAILED)
    await after.close()
    await store.close()  # its threads end (what it held is written then: too late to matter here)


async def test_a_store_failure_drops_what_waited_and_the_turns_end_says_so(reopen):
    store = await reopen()
    await turn(store, A, ["task"])
    waiting = msg("observation")
    seqs = await store.stage(A, [waiting], [message_hash(waiting)], PENDING)
    with pytest.raises(KeyError):  # another write fails (here: a seq that is not there)
        await store.set_statuses(B, {99: LIVE})
    with pytest.raises(KeyError):  # the staged items went with what the failed write held
        await store.finish_turn(A, dict.fromkeys(seqs, LIVE), [], LIVE, None)
    assert [m.message for m in await store.messages(A, live_only=False)] == [msg("task"), msg("ok", "assistant")]


@pytest.mark.parametrize("chunk", [INDEX_CHUNK, CHUNK_BEFORE])
async def test_the_record_holds_the_newest_index_chunk_and_older_ones_have_rows(reopen, chunk):
    store = await reopen()
    await turn(store, A, ["step 0"])
    if chunk == CHUNK_BEFORE:  # a record as written before its chunk size was kept in it: read and go on so
        held = store._records.get(A)
        del held.fields["chunk"]
        held.chunk = CHUNK_BEFORE
    for i in range(1, chunk * 2):  # two items a turn: four chunks' worth
        await turn(store, A, [f"step {i}"])
    await store.set_statuses(A, {3: SUPERSEDED, 4: SUPERSEDED})  # an old chunk changes too
    before = await store.get(A)
    row = store._rows.get(f"conv\0{A.tenant}\0{A.id}")
    tail = row["tail"]
    assert row.get("chunk", CHUNK_BEFORE) == chunk
    assert tail == (before.next_seq - 1) // chunk
    assert all(seq // chunk == tail for seq, _ in row["index"]["live"])  # the tail alone, not the index
    assert len(rows(store, "chunk", A)) == tail
    # Bounded by the chunk, whatever the conversation holds (a new record's: a turn rewrites ~1 KB).
    assert len(pickle.dumps(row)) < (2_000 if chunk == INDEX_CHUNK else 20_000)
    store = await reopen()  # read back from the chunks
    after = await store.get(A)
    assert after == before and after.live[:3] == [(1, before.live[0][1]), (2, before.live[1][1]), (5, before.live[2][1])]
    assert after.first_forwarded == {seq: 1 for seq in range(1, before.next_seq, 2)}
    await turn(store, A, ["and on"])  # goes on in the chunks it was written in
    store = await reopen()
    live = await store.messages(A, live_only=True)
    assert len(live) == len(after.live) + 2 and [m.message for m in live[-2:]] == [msg("and on"), msg("ok", "assistant")]


async def test_a_write_bigger_than_a_batch_is_split_and_read_back_in_order(reopen):
    store = await reopen()
    texts = [f"m{i}" for i in range(BATCH_MAX * 2 + 10)]
    seqs = await store.append(A, [msg(t) for t in texts], [message_hash(msg(t)) for t in texts], LIVE)
    assert len(rows(store, "batch", A)) == 3
    changed = range(BATCH_MAX - 5, BATCH_MAX + 5)  # across two batches
    await store.set_statuses(A, dict.fromkeys(changed, SUPERSEDED))
    async def check(store: DiskStore) -> None:
        assert [m.message["content"] for m in await store.messages(A, live_only=False)] == texts
        live = await store.messages(A, live_only=True, after=BATCH_MAX - 10, limit=10)
        assert [m.seq for m in live] == [*range(BATCH_MAX - 9, BATCH_MAX - 5), *range(BATCH_MAX + 5, BATCH_MAX + 11)]
        assert (await store.message(A, seqs[-1])).message == msg(texts[-1])
        assert (await store.message(A, BATCH_MAX)).status == SUPERSEDED

    await check(store)
    await check(await reopen())  # read back from disk


async def test_what_the_caller_changes_after_a_write_is_not_stored(reopen):
    store = await reopen()
    sent = msg("as sent")
    [seq] = await store.append(A, [sent], [message_hash(sent)], PENDING)
    sent["content"] = "changed by the caller afterwards"  # the batch is held in memory until the turn ends
    reply = msg("as answered", "assistant")
    await store.finish_turn(A, {seq: LIVE}, [(reply, message_hash(reply))], LIVE, None)
    reply["content"] = "changed too"
    assert [m.message["content"] for m in await store.messages(A, live_only=False)] == ["as sent", "as answered"]
    store = await reopen()
    assert [m.message["content"] for m in await store.messages(A, live_only=False)] == ["as sent", "as answered"]


async def test_a_failed_write_leaves_nothing_of_it_held_in_memory(reopen):
    store = await reopen()
    [seq] = await store.append(A, [msg("q")], [message_hash(msg("q"))], PENDING)
    with pytest.raises(KeyError):  # a seq that is not there: the whole turn's end is refused
        await store.finish_turn(A, {seq: LIVE, 99: LIVE}, [(msg("r"), "h")], LIVE, None, llm_calls=1)
    conversation = await store.get(A)
    assert (conversation.live, conversation.next_seq, conversation.llm_calls) == ([], 2, 0)
    assert [m.status for m in await store.messages(A, live_only=False)] == [PENDING]
    await store.finish_turn(A, {seq: LIVE}, [(msg("r", "assistant"), "h")], LIVE, None)
    assert [(m.seq, m.status) for m in await store.messages(A, live_only=False)] == [(1, LIVE), (2, LIVE)]
    store = await reopen()
    assert [(m.seq, m.status) for m in await store.messages(A, live_only=False)] == [(1, LIVE), (2, LIVE)]


async def test_the_index_pages_held_in_memory_are_the_stored_ones_even_after_a_failed_write(reopen):
    store = await reopen()
    keys = [ConversationKey("t" * 24, f"listed-{i}") for i in range(5)]
    for key in keys[:3]:
        await turn(store, key, ["hello"])
    with pytest.raises(ValueError):  # refused after the conversation was registered: the write rolls back
        await store.append(keys[3], [msg("a"), msg("b")], [message_hash(msg("a"))], PENDING)
    assert all(store._rows.get(page_key) == page for page_key, page in store._pages.items())
    await turn(store, keys[4], ["hello"])
    await store.delete(keys[1])
    expected = [keys[4].id, keys[2].id, keys[0].id]  # newest first; the failed one and the deleted one not there
    listed, _ = await store.list_conversations(tenant=keys[0].tenant, after=None, limit=10)
    assert [c.key.id for c in listed] == expected
    store = await reopen()  # what was written, read back
    listed, _ = await store.list_conversations(tenant=keys[0].tenant, after=None, limit=10)
    assert [c.key.id for c in listed] == expected
    assert [c.key.id for c in await store.find(keys[4].id)] == [keys[4].id]


async def test_delete_leaves_no_row_of_the_conversation(reopen):
    store = await reopen()
    for i in range(INDEX_CHUNK):
        await turn(store, A, [f"step {i}", "big " + "y" * 10_000])  # parts of their own too
    await store.set_rewrites(A, {2: "short"})
    await store.add_summary(A, Summary("s", 1, 10, "turns", "m", 1, 1))
    await store.post_inbox(A, "note", "note", 5)
    await turn(store, B, ["other"])
    assert rows(store, "chunk", A) and rows(store, "part", A) and rows(store, "pending")
    assert await store.delete(A)
    assert rows_of(store, A) == []
    assert (A.tenant, A.id) not in flagged(store) and (await store.get(B)).next_seq == 3


# -- SQLite checkpoints: never inside a turn's write ------------------------------------------------


async def test_a_thread_of_its_own_copies_the_writes_into_the_database(reopen, tmp_path: Path):
    store = await reopen()
    database = tmp_path / "store" / "cache.db"
    empty = database.stat().st_size
    turns = 3 * EVERY_WRITES // 2  # two writes each
    for i in range(turns):
        await turn(store, A, [secrets.token_hex(5_000)])  # 10 KB that no page can share
    # The store thread's connection checkpoints only past the backstop, far above what was written
    # (by itself, the WAL would hold it all and the database file stay as it was)...
    written = turns * 10_000
    assert written < BACKSTOP_PAGES * 4096 // 4
    autocheckpoint = await store._run(lambda: store._rows.connection.execute("PRAGMA wal_autocheckpoint").fetchone()[0])
    assert autocheckpoint == BACKSTOP_PAGES
    # ... while the checkpoint thread, asked every EVERY_WRITES writes, copied it all there (asks
    # that come while it checkpoints make one more run, not one each: so its runs are not counted).
    await asyncio.to_thread(wait_until, lambda: database.stat().st_size - empty > written, 30, what="the checkpoint")
    assert store._checkpoints.runs >= 1
    reopened = await reopen()  # closes it first: its checkpoint thread ends with it
    assert not store._checkpoints._thread.is_alive()
    assert [m.message["role"] for m in await reopened.messages(A, live_only=True)] == ["user", "assistant"] * turns


# -- crash recovery: pending flags ----------------------------------------------------------------------


async def test_a_crash_after_many_turns_leaves_few_flags_and_every_pending_turn_is_failed(tmp_path: Path):
    store = DiskStore(tmp_path / "store")
    keys = [ConversationKey("t" * 24, f"c{i}") for i in range(SETTLED_FLAGS + 40)]
    for key in keys:
        await turn(store, key, ["finished"])
    cut = keys[:3]
    for key in cut:  # turns a crash cuts short: written pending, never ended
        await store.append(key, [msg("cut")], [message_hash(msg("cut"))], PENDING)
    assert flagged(store) >= {(k.tenant, k.id) for k in cut}
    assert len(flagged(store)) <= SETTLED_FLAGS + len(cut)  # settled flags are cleared as they pile up
    # The crash: no close. The next process opens the same store.
    restarted = DiskStore(tmp_path / "store")
    assert await restarted.fail_pending() == 3
    for key in cut:
        assert [m.status for m in await restarted.messages(key, live_only=False)] == [LIVE, LIVE, FAILED]
    assert flagged(restarted) == set()  # the write that failed them cleared every flag it looked at
    assert await restarted.fail_pending() == 0
    await restarted.close()
    store._thread.shutdown()  # the crashed one's thread, without a close (no sweep)


async def test_a_clean_stop_leaves_flags_only_where_messages_are_pending(reopen):
    store = await reopen()
    for i in range(5):
        await turn(store, ConversationKey("t" * 24, f"c{i}"), ["done"])
    [seq] = await store.append(A, [msg("in flight")], [message_hash(msg("in flight"))], PENDING)
    assert len(flagged(store)) == 6  # flagged while in use: a turn's writes flag nothing more
    store = await reopen()
    assert flagged(store) == {(A.tenant, A.id)}
    assert await store.fail_pending() == 1 and (await store.message(A, seq)).status == FAILED


# -- stores written before batches and index chunks -----------------------------------------------------

OLD = [
    (msg("task"), LIVE), (msg("answer", "assistant"), LIVE), (msg("edited away"), SUPERSEDED),
    (msg("task, again"), LIVE), (msg("answer again", "assistant"), LIVE), (msg("refused"), FAILED),
]


async def test_a_conversation_written_before_batches_reads_and_goes_on(tmp_path: Path, reopen):
    write_old_layout(tmp_path / "store", A, OLD, forwarded={1: 1, 4: 2}, rewrites={4: "short task"}, llm_calls=2)
    store = await reopen()
    conversation = await store.get(A)
    assert conversation.live == [(s, message_hash(OLD[s - 1][0])) for s in (1, 2, 4, 5)] and conversation.next_seq == 7
    assert (conversation.first_forwarded, conversation.rewritten, conversation.llm_calls) == ({1: 1, 4: 2}, {4}, 2)
    assert [(m.message, m.status, m.created_at) for m in await store.messages(A, live_only=False)] == [
        (m, s, 1000.0 + seq) for seq, (m, s) in enumerate(OLD, start=1)
    ]
    assert (await store.message(A, 3)).status == SUPERSEDED and await store.rewrites(A, [4]) == {4: "short task"}
    assert [c.key for c in (await store.list_conversations(A.tenant))[0]] == [A]
    # It goes on: a turn that edits the last answer away (an old row changed in place), in a batch.
    new = await store.append(A, [msg("edit")], [message_hash(msg("edit"))], PENDING)
    assert new == [7]
    reply = msg("new answer", "assistant")
    await store.finish_turn(A, {7: LIVE, 5: SUPERSEDED}, [(reply, message_hash(reply))], LIVE, None, forwarded={7: 3})
    expected = [m.message["content"] for m in await store.messages(A, live_only=True)]
    assert expected == ["task", "answer", "task, again", "edit", "new answer"]
    dump = await read_dump(store, A)
    store = await reopen()  # mixed, read back: old rows below seq 7, a batch from it on
    assert await read_dump(store, A) == dump and dump.conversation.first_forwarded == {1: 1, 4: 2, 7: 3}
    assert [m.status for m in dump.messages] == [LIVE, LIVE, SUPERSEDED, LIVE, SUPERSEDED, FAILED, LIVE, LIVE]
    assert store._rows.get(f"conv\0{A.tenant}\0{A.id}")["legacy"] == 7
    # It moves like any other, and goes away whole.
    await store.import_conversation(dataclasses.replace(dump, conversation=dataclasses.replace(dump.conversation, key=B)))
    moved = await read_dump(store, B)
    assert moved.messages == dump.messages and moved.conversation.live == dump.conversation.live
    assert await store.delete(A) and rows_of(store, A) == []


async def test_pending_turns_a_crash_left_in_a_store_written_before_are_marked_failed(tmp_path: Path, reopen):
    write_old_layout(tmp_path / "store", A, [(msg("done"), LIVE), (msg("cut"), PENDING), (msg("short"), PENDING)])
    write_old_layout(tmp_path / "store", B, [(msg("done"), LIVE)])
    store = await reopen()
    assert await store.fail_pending() == 2
    assert [m.status for m in await store.messages(A, live_only=False)] == [LIVE, FAILED, FAILED]
    assert store._rows.get(OLD_PENDING) is None  # the old set is drained as its conversations are seen
    assert await store.fail_pending() == 0
    await turn(store, A, ["next"])  # and the conversation goes on after its failed turn
    assert [m.seq for m in await store.messages(A, live_only=True)] == [1, 4, 5]


# -- the rows table (disk/rows.py) -------------------------------------------------------------


def test_a_write_is_held_until_it_ends_and_nothing_of_one_that_raises_is_stored(tmp_path: Path):
    table = Rows(open_cache(str(tmp_path / "db")))
    table.set("kept", {"a": 1})
    with pytest.raises(RuntimeError), table.transact():
        table.set("kept", "changed")
        table.set("new", b"raw bytes")
        table.delete("kept")
        assert table.get("kept", "gone") == "gone" and table.get("new") == b"raw bytes"  # the write sees itself
        raise RuntimeError("the write fails")
    assert table.get("kept") == {"a": 1} and table.get("new") is None
    many = {f"row-{i:04d}": i for i in range(3 * PER_STATEMENT + 7)}  # more rows than one statement takes, and a delete
    with table.transact():
        for name, value in many.items():
            table.set(name, value)
        table.delete("kept")
        with table.transact():  # nested: written by the outermost
            table.set("inner", [1, 2])
        with pytest.raises(KeyError), table.transact():  # nested, raising: the outer write goes on without it
            table.set("inner", "changed by a write that fails")
            table.set("never", 1)
            table.delete(next(iter(many)))
            raise KeyError("this write alone fails")
    assert list(table.iterkeys()) == sorted([*many, "inner"]) and table.get("inner") == [1, 2]
    assert [table.get(name) for name in many] == list(many.values()) and table.incr("inner-counter") == 1
    table.close()


def test_a_row_written_again_is_updated_where_it_stands(tmp_path: Path):
    """A turn rewrites its conversation's record: in place (its rowid kept), not deleted and
    inserted anew at the table's end, which touched two leaves, the key index and the freelist."""
    table = Rows(open_cache(str(tmp_path / "db")))
    con = table.connection

    def rowid(key: str) -> int:
        return con.execute(f"SELECT rowid FROM {TABLE} WHERE key = ?", (key,)).fetchone()[0]

    table.set("record", {"turn": 1})
    table.set("other", b"x" * 5000)
    first = rowid("record")
    with table.transact():
        table.set("record", {"turn": 2, "more": "y" * 5000})  # bigger now: overflow pages of its own
        table.set("new", [1])
    assert rowid("record") == first and table.get("record") == {"turn": 2, "more": "y" * 5000}
    table.set("record", b"raw bytes")
    assert rowid("record") == first and table.get("record") == b"raw bytes" and table.get("new") == [1]
    table.close()


async def test_a_store_whose_rows_diskcache_kept_moves_them_into_the_table_and_reads_on(tmp_path: Path, reopen):
    """Stores written before the rows table kept every row through diskcache's Cache.set."""
    store = DiskStore(tmp_path / "store")
    seqs = await turn(store, A, ["q1", "q2"])
    before = [(m.seq, m.message, m.status) for m in await store.messages(A, live_only=False)]
    await store.close()
    cache = open_cache(str(tmp_path / "store"))  # the same rows, as diskcache held them, and no table
    con = cache._con
    for key, value, raw in con.execute(f"SELECT key, value, raw FROM {TABLE}").fetchall():
        cache.set(key, bytes(value) if raw else pickle.loads(value))
    con.execute(f"DROP TABLE {TABLE}")
    cache.close()
    store = await reopen()
    assert [(m.seq, m.message, m.status) for m in await store.messages(A, live_only=False)] == before
    assert len(open_cache(str(tmp_path / "store"))) == 0  # diskcache's table emptied
    await turn(store, A, ["q3"])
    store = await reopen()
    assert [m.seq for m in await store.messages(A, live_only=True)] == [*seqs, 3, 4, 5]


async def test_a_turns_small_writes_run_in_place_and_big_ones_on_the_store_thread(reopen):
    store = await reopen()
    asked = lambda: store._thread._asked  # noqa: E731  # calls handed to the store thread
    first = [msg(f"tool output {i}: " + "x" * 1000) for i in range(50)]
    await store.append(A, first, [message_hash(m) for m in first], LIVE)  # a first turn: its record unknown
    before = asked()
    seqs = await turn(store, A, ["a new observation"])  # a later turn: append, end, both small
    assert asked() == before and seqs == [51]
    big = [msg("y" * 40_000)]
    await store.append(A, big, [message_hash(m) for m in big], PENDING)
    assert asked() == before + 1  # 40 KB: on the store thread
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 40_000}}]}
    await store.append(A, [image], [message_hash(image)], LIVE)
    assert asked() == before + 2  # its bytes two levels down count too
    # Claude Code's and Gemini CLI's later turns are small too, though their text sits deeper: a
    # tool result's five levels down, a call's arguments four.
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "cache_control": {"type": "ephemeral"},
                                           "content": [{"type": "text", "text": "x" * 1500}]}]}
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_2", "name": "bash", "input": {"command": "ls -la"}}]}
    gemini = {"role": "model", "parts": [{"functionCall": {"name": "ls", "args": {"dir": "/", "depth": [1, {"deep": "er"}]}}}]}
    staged = await store.stage(A, [result], ["h-result"], PENDING)
    await store.finish_turn(A, dict.fromkeys(staged, LIVE), [(call, "h-call"), (gemini, "h-gemini")], LIVE, TurnRecord(sent_seqs=staged))
    assert asked() == before + 2
    # Deeper than any wire format nests, or many small parts: judged big, never walked whole.
    deep: Any = "x"
    for _ in range(12):
        deep = [deep]
    await store.append(A, [{"role": "user", "content": deep}], ["h-deep"], LIVE)
    assert asked() == before + 3
    await store.append(A, [{"role": "user", "content": [{"type": "text", "text": ""}] * 5000}], ["h-many"], LIVE)
    assert asked() == before + 4
    # Turns of several other conversations under way (their items staged, their ends to come):
    # the writes go to the thread, one after another behind the loop; in place again once they end.
    others = [ConversationKey(A.tenant, f"other-{i}") for i in range(INLINE_BESIDE)]
    for other in others:
        await store.append(other, [msg("task")], ["h-task"], LIVE)
    under_way = [await store.stage(other, [msg("observation")], ["h-obs"], PENDING) for other in others]
    handed, commits = asked(), store._rows.commits
    seqs = await turn(store, A, ["while the others wait"])
    assert asked() == handed + 2  # its items and its end
    held = await store.stage(A, [msg("staged while the others wait")], ["h-held"], PENDING)
    assert asked() == handed + 3 and store._rows.commits == commits + 2  # on the thread, and still held for its end
    await store.finish_turn(A, dict.fromkeys(held, LIVE), [], LIVE, TurnRecord(sent_seqs=held))
    for other, staged in zip(others, under_way, strict=True):
        await store.finish_turn(other, dict.fromkeys(staged, LIVE), [], LIVE, TurnRecord(sent_seqs=staged))
    handed = asked()
    await turn(store, A, ["alone again"])
    assert asked() == handed
    # In place or not, the writes are the same: on disk, in order, the loop's connection set up as
    # the store thread's (automatic checkpoints only past the backstop).
    assert store._rows.connection.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == BACKSTOP_PAGES
    store = await reopen()
    assert [m.seq for m in await store.messages(A, live_only=False)] == list(range(1, 65))


async def test_writes_that_wait_while_the_store_thread_is_busy_are_written_together(reopen):
    """Group commit: the calls queued behind a busy store thread are one write; one of them that
    raises leaves nothing of its own in it and the others land; and if the write of them all
    fails, each fails with it, nothing of any is stored, and the store reads on from its rows."""
    store = await reopen()
    others = [ConversationKey(A.tenant, f"together-{i}") for i in range(3)]
    for key in (A, *others):
        await turn(store, key, ["task"])
    thread = store._thread

    async def queued_behind(hold: Callable[[], Any], calls: list[Any]) -> list[Any]:
        """`calls` (coroutines of store calls) made while the store thread runs `hold`."""
        started = threading.Event()
        busy = thread.run(lambda: (started.set(), hold()))
        await asyncio.to_thread(started.wait, 10)  # running alone: the calls queue behind it
        tasks = [asyncio.ensure_future(call) for call in calls]
        while thread._asked < thread._done + 1 + len(calls):  # each has reached the thread's queue
            await asyncio.sleep(0)
        release.set()
        await busy
        return await asyncio.gather(*tasks, return_exceptions=True)

    release = threading.Event()
    commits, calls = store._rows.commits, (await store.get(A)).llm_calls
    outcomes = await queued_behind(lambda: release.wait(10), [
        store.append(key, [msg(f"observation of {key.id}")], [f"h-{key.id}"], LIVE) for key in others
    ] + [store.finish_turn(A, {2: LIVE, 99: LIVE}, [(msg("never stored"), "h")], LIVE, None, llm_calls=1)])  # 99: not there
    assert [len(o) for o in outcomes[:3]] == [1, 1, 1] and isinstance(outcomes[3], KeyError)
    assert store._rows.commits == commits + 1  # three turns' rows, one write
    store = await reopen()
    for key in others:
        assert [m.message for m in await store.messages(key, live_only=False)][-1] == msg(f"observation of {key.id}")
    assert [m.seq for m in await store.messages(A, live_only=False)] == [1, 2] and (await store.get(A)).llm_calls == calls

    thread, release = store._thread, threading.Event()

    def hold_then_refuse_writes() -> None:
        release.wait(10)
        store._rows.connection.execute("PRAGMA query_only = 1")  # the store thread's connection: its writes fail

    outcomes = await queued_behind(hold_then_refuse_writes, [
        store.append(key, [msg("never stored")], ["h-never"], LIVE) for key in others
    ])
    assert all(isinstance(o, StoreError) for o in outcomes), outcomes
    await thread.run(lambda: store._rows.connection.execute("PRAGMA query_only = 0"))
    for key in others:  # memory was let go with the write: what is read is what the rows hold
        assert [m.message for m in await store.messages(key, live_only=False)][-1] == msg(f"observation of {key.id}")
    await turn(store, others[0], ["the store writes again"])
    store = await reopen()
    assert [m.message for m in await store.messages(others[0], live_only=False)][-2:] == [
        msg("the store writes again"), msg("ok", "assistant")]


async def test_a_conversation_that_does_not_exist_is_told_without_waiting_for_the_store_thread(reopen):
    """A derived-id agent's first turn asks whether its conversation exists before its turn: a
    busy store thread (other turns' writes) must not hold it, with its parsed body, for a "no".
    One that exists but is no longer held in memory is still read in turn, whole."""
    store = await reopen()
    await turn(store, A, ["task"])
    store = await reopen()  # nothing held in memory: A is read from its rows
    started, release = threading.Event(), threading.Event()
    busy = store._thread.run(lambda: (started.set(), release.wait(10)))
    await asyncio.to_thread(started.wait, 10)
    missing = asyncio.ensure_future(store.get(ConversationKey(A.tenant, "never-made")))
    await asyncio.sleep(0)  # one step of the loop: answered while the thread is held
    assert missing.done() and missing.result() is None
    existing = asyncio.ensure_future(store.get(A))
    while store._thread._asked < store._thread._done + 2:  # it queued behind the busy call
        await asyncio.sleep(0)
    assert not existing.done()
    release.set()
    await busy
    assert [h for _, h in (await existing).live] == [message_hash(msg("task")), message_hash(msg("ok", "assistant"))]


# -- turn records ------------------------------------------------------------------------------------


async def test_a_turn_record_is_the_size_of_what_its_prompt_left_out_not_of_the_conversation(reopen):
    store = await reopen()
    for sent in ([1, 2], [1, *range(40, 2041)]):  # a short conversation's prompt; a long one's, windowed
        await store.finish_turn(A, {}, [], LIVE, TurnRecord(created_at=1.0, sent_seqs=sent))
    short, long = (len(pickle.dumps(store._rows.get(k))) for k in sorted(rows(store, "turn", A)))
    assert long - short < 16  # two more ints, not two thousand
    assert [len(r["sent_seqs"]) for r in await (await reopen()).turn_records(A)] == [2, 2002]


async def test_turn_records_written_with_their_seq_lists_still_read(reopen):
    store = await reopen()
    await store.finish_turn(A, {}, [], LIVE, TurnRecord(created_at=1.0, sent_seqs=[1]))
    (key,) = rows(store, "turn", A)
    old = {**TurnRecord(created_at=1.0, sent_seqs=[1, 2, 5], new_seqs=[5]).row(), "turn": 1, "reply_seq": None}
    with store._rows.transact():
        store._rows.set(key, old)  # as a store wrote it before runs
    assert await (await reopen()).turn_records(A) == [old]
