"""Two turns of one conversation in flight at once (proxy/turns.py): the second never waits on the
first's upstream call; nothing is lost or stored twice; the live transcript is the request of the
newest turn that ended well, the other attempt kept in the trajectory."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.conftest import live_messages, openai_client, trajectory
from tests.fakes.fake_upstream import Reply

CONVERSATION = {"X-Conversation-ID": "in-flight"}
SYSTEM = {"role": "system", "content": "You are terse."}


def ask(client, messages: list[dict], stream: bool = False) -> str:
    if not stream:
        return client.chat.completions.create(model="m", messages=messages).choices[0].message.content
    return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="m", messages=messages, stream=True) if c.choices)


def shape(messages: list[dict]) -> list[tuple]:
    return [(m["role"], m["content"], m.get("status")) for m in messages]


@pytest.fixture
def started(proxy, upstream):
    """A conversation with one turn done, and the client that made it."""
    client = openai_client(proxy, headers=CONVERSATION)
    upstream.enqueue(Reply.text("first answer"))
    first = [SYSTEM, {"role": "user", "content": "one"}]
    history = [*first, {"role": "assistant", "content": ask(client, first)}]
    return client, history


@pytest.mark.parametrize("stream", [False, True])
def test_a_retry_while_the_first_attempt_hangs_answers_at_once_and_stores_its_items_once(
    started, upstream, http, stream
) -> None:
    client, history = started
    request = [*history, {"role": "user", "content": "two"}]
    slow = Reply.text("slow answer", pause_after_chunks=1 if stream else 0)
    upstream.enqueue(slow, Reply.text("fast answer"))
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(ask, client, request, stream)
        assert slow.reached.wait(10)  # the first attempt's upstream call is under way, and held there
        assert ask(client, request, stream) == "fast answer"  # the retry did not wait for it
        assert not first.done()
        slow.release()
        assert first.result(timeout=30) == "slow answer"
    # The retry is the newer request: its reply is the live one; its items were the first
    # attempt's, written once; the first attempt's reply is kept aside.
    assert shape(live_messages(http, "in-flight"))[-2:] == [("user", "two", None), ("assistant", "fast answer", None)]
    kept = shape(trajectory(http, "in-flight"))
    assert kept.count(("user", "two", "live")) == 1 and ("assistant", "slow answer", "superseded") in kept
    assert len(kept) == 6  # system, one, its answer, two, and both answers
    # The client goes on from the reply it got: no divergence.
    upstream.enqueue(Reply.text("third answer"))
    ask(client, [*request, {"role": "assistant", "content": "fast answer"}, {"role": "user", "content": "three"}])
    assert [m["status"] for m in trajectory(http, "in-flight")].count("superseded") == 1


def test_an_edit_sent_while_the_first_attempt_hangs_becomes_the_live_branch(started, upstream, http) -> None:
    client, history = started
    slow = Reply.text("answer to the old question", pause_after_chunks=0)
    upstream.enqueue(slow, Reply.text("answer to the edit"))
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(ask, client, [*history, {"role": "user", "content": "old question"}])
        assert slow.reached.wait(10)
        assert ask(client, [*history, {"role": "user", "content": "edited question"}]) == "answer to the edit"
        slow.release()
        assert first.result(timeout=30) == "answer to the old question"
    live = shape(live_messages(http, "in-flight"))
    assert live[-2:] == [("user", "edited question", None), ("assistant", "answer to the edit", None)]
    assert len(live) == 5
    kept = shape(trajectory(http, "in-flight"))
    assert ("user", "old question", "superseded") in kept and ("assistant", "answer to the old question", "superseded") in kept


def test_a_newer_turn_ending_last_takes_the_live_transcript_from_an_older_one_that_ended(started, upstream, http) -> None:
    client, history = started
    request = [*history, {"role": "user", "content": "two"}]
    older, newer = Reply.text("older answer", pause_after_chunks=0), Reply.text("newer answer", pause_after_chunks=0)
    upstream.enqueue(older, newer)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(ask, client, request)
        assert older.reached.wait(10)
        second = pool.submit(ask, client, request)
        assert newer.reached.wait(10)  # both upstream calls under way at once
        older.release()
        assert first.result(timeout=30) == "older answer"
        assert shape(live_messages(http, "in-flight"))[-1] == ("assistant", "older answer", None)
        newer.release()
        assert second.result(timeout=30) == "newer answer"
    assert shape(live_messages(http, "in-flight"))[-2:] == [("user", "two", None), ("assistant", "newer answer", None)]
    kept = shape(trajectory(http, "in-flight"))
    assert kept.count(("user", "two", "live")) == 1 and ("assistant", "older answer", "superseded") in kept
    assert len(kept) == 6
