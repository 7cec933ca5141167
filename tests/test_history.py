"""History modes: full-history dedupe and divergence, proxy history, and failed turns."""

from __future__ import annotations

import pytest

from tests.conftest import ALICE, live_messages, openai_client, trajectory
from tests.fakes.fake_upstream import Reply

SYSTEM = {"role": "system", "content": "You are terse."}


def ask(http, cid: str, messages: list[dict], mode: str = "full", stream: bool = False):
    headers = {"Authorization": f"Bearer {ALICE}", "X-Conversation-ID": cid, "X-History": mode}
    body = {"model": "gpt-4o-mini", "messages": messages}
    if stream:
        body["stream"] = True
    return http.post("/v1/chat/completions", json=body, headers=headers)


def test_full_history_client_resending_its_transcript_stores_each_message_once(proxy, upstream, http):
    client = openai_client(proxy, headers={"X-Conversation-ID": "dedupe"})
    messages = [SYSTEM]
    for turn in range(5):
        messages.append({"role": "user", "content": f"question {turn}"})
        answer = client.chat.completions.create(model="m", messages=messages).choices[0].message
        # Echoed back with fields the stored copy lacks: they must not make it look new.
        messages.append({"role": "assistant", "content": answer.content, "refusal": None})
    stored = live_messages(http, "dedupe")
    assert len(stored) == 11 and len(trajectory(http, "dedupe")) == 11
    assert [m["content"] for m in stored[1::2]] == [f"question {i}" for i in range(5)]
    assert [m["content"] for m in stored[2::2]] == [f"reply to: question {i}" for i in range(5)]


def test_divergence_supersedes_the_old_tail_and_keeps_it(proxy, upstream, http):
    history = [SYSTEM, {"role": "user", "content": "a"}]
    assert ask(http, "branch", history).status_code == 200
    history += [{"role": "assistant", "content": "reply to: a"}, {"role": "user", "content": "b"}]
    assert ask(http, "branch", history).status_code == 200
    # The user edits their second message: the old "b" and its reply are superseded, not deleted.
    edited = history[:3] + [{"role": "user", "content": "b, edited"}]
    assert ask(http, "branch", edited).status_code == 200
    assert [m["content"] for m in live_messages(http, "branch")] == [
        "You are terse.", "a", "reply to: a", "b, edited", "reply to: b, edited",
    ]
    statuses = {m["content"]: m["status"] for m in trajectory(http, "branch")}
    assert statuses["b"] == "superseded" and statuses["reply to: b"] == "superseded"
    assert statuses["b, edited"] == "live"


def test_regenerate_supersedes_only_the_last_reply(proxy, upstream, http):
    history = [SYSTEM, {"role": "user", "content": "a"}]
    ask(http, "regen", history)
    upstream.enqueue(Reply.text("another take"))
    ask(http, "regen", history)  # same request again: the client asks for a new answer
    assert [m["content"] for m in live_messages(http, "regen")] == ["You are terse.", "a", "another take"]
    assert [m["status"] for m in trajectory(http, "regen")] == ["live", "live", "superseded", "live"]


def test_proxy_history_prepends_the_stored_transcript(proxy, upstream, http):
    assert ask(http, "ph", [SYSTEM, {"role": "user", "content": "one"}], mode="proxy").status_code == 200
    assert ask(http, "ph", [SYSTEM, {"role": "user", "content": "two"}], mode="proxy", stream=True).status_code == 200
    sent = upstream.chat_requests()[-1]["messages"]
    assert sent == [
        SYSTEM,
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "reply to: one"},
        {"role": "user", "content": "two"},
    ]
    assert [m["content"] for m in live_messages(http, "ph")] == [
        "You are terse.", "one", "reply to: one", "two", "reply to: two",
    ]


def test_proxy_history_needs_a_conversation_id(proxy, http):
    response = http.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        headers={"Authorization": f"Bearer {ALICE}", "X-History": "proxy"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "conversation_id_required"


def _upstream_failure(upstream, kind: str) -> None:
    if kind == "refused":
        upstream.enqueue(Reply.error(429, {"error": {"message": "slow down", "type": "rate_limit", "code": None}}))
    elif kind == "server_error":
        upstream.enqueue(Reply.error(500, {"error": {"message": "boom", "type": "server_error", "code": None}}))


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("kind", ["refused", "server_error", "invalid_for_upstream"])
@pytest.mark.parametrize("mode", ["full", "proxy"])
def test_a_failed_turn_leaves_the_live_transcript_as_it_was(proxy, upstream, http, mode, kind, stream):
    cid = f"fail-{mode}-{kind}-{stream}"
    first = [SYSTEM, {"role": "user", "content": "first"}]
    assert ask(http, cid, first, mode).status_code == 200
    before = live_messages(http, cid)

    _upstream_failure(upstream, kind)
    bad_turn = {"role": "user", "content": "this one fails"}
    if kind == "invalid_for_upstream":  # passes our checks, refused by the strict upstream
        bad_turn = {"role": "user", "content": "this one fails", "seq": 3}
    failed_history = first + [{"role": "assistant", "content": "reply to: first"}, bad_turn] if mode == "full" else [SYSTEM, bad_turn]
    failed = ask(http, cid, failed_history, mode, stream)
    assert failed.status_code >= 400
    assert "error" in failed.json()
    assert live_messages(http, cid) == before
    assert [m["status"] for m in trajectory(http, cid)][-1] == "failed"

    # The next turn carries nothing of the failed one upstream.
    retry = first + [{"role": "assistant", "content": "reply to: first"}, {"role": "user", "content": "again"}]
    assert ask(http, cid, retry if mode == "full" else [SYSTEM, {"role": "user", "content": "again"}], mode).status_code == 200
    assert upstream.chat_requests()[-1]["messages"] == retry
    assert [m["content"] for m in live_messages(http, cid)] == [
        "You are terse.", "first", "reply to: first", "again", "reply to: again",
    ]


def _canonical_as_first_written(msg: dict) -> dict:
    """The dedupe view stored hashes were made of: a copy of the first code, kept to hold
    today's to it."""
    out = {}
    for key in ("role", "content", "name", "tool_calls", "tool_call_id"):
        value = msg.get(key)
        if value in (None, "", []):
            continue
        if key == "tool_calls":
            value = [
                {"id": c.get("id"), "name": (c.get("function") or {}).get("name"),
                 "arguments": (c.get("function") or {}).get("arguments")}
                for c in value
            ]
        out[key] = value
    return out


def test_the_canonical_hash_is_the_same_bytes_as_before_orjson():
    """Stored conversations keep deduping across the switch to orjson and the shortcuts since:
    the same sha256 as json.dumps(sort_keys, compact, ensure_ascii=False) of the dedupe view as
    first written, including non-ASCII, escapes, floats, integers past 64 bits, empty and falsy
    values, keys that are not hashed, and a message that is its own canonical view."""
    import hashlib
    import json

    import orjson

    from bench.workload import base_parts
    from proxy.messages import message_hash

    messages = [
        {"role": "user", "content": "é ünicode ✓ \u2028 \u0000 \x7f 😀 \\ \" /"},
        {"role": "user", "content": [{"type": "text", "text": "x", "n": 2.5, "big": 2**70, "z": None}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function"}, {"function": None}]},
        {"role": "assistant", "content": "ok", "tool_calls": [], "refusal": None, "annotations": []},
        {"role": "tool", "tool_call_id": "c", "content": "0", "name": ""},
        {"role": "user", "content": [], "name": "bob"},
        {"role": "user", "content": 0},  # falsy, not empty: hashed (validation refuses it first)
        {"role": "user", "content": {}},
        {"content": "no role"},
        {"role": "user", "content": "big", "n": 2**70},  # a key not hashed, orjson would refuse
        {"role": "developer", "content": "rules", "name": "x"},
        *(orjson.loads(part) for part in base_parts("agent200")),
    ]
    for message in messages:
        blob = json.dumps(_canonical_as_first_written(message), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert message_hash(message) == hashlib.sha256(blob.encode()).hexdigest()[:32], message


def test_a_fresh_start_is_system_items_then_one_user_item_read_no_further():
    from proxy.dialects.chat import ChatDialect
    from proxy.dialects.messages import MessagesDialect
    from proxy.history import is_fresh_start

    chat = ChatDialect().codec
    task = {"role": "user", "content": "fix issue 7"}
    assert is_fresh_start(chat, [SYSTEM, task])
    assert is_fresh_start(chat, [SYSTEM, {"role": "developer", "content": "and be brief"}, task])
    assert is_fresh_start(chat, [task])
    assert not is_fresh_start(chat, [SYSTEM])
    assert not is_fresh_start(chat, [])
    assert not is_fresh_start(chat, [SYSTEM, {"role": "assistant", "content": "hi"}])
    # Asked of every request with a derived id: it stops at the first item that is no system
    # prompt, so what comes after it is never read (an item there that no codec could read is
    # not even looked at: a long transcript costs what its first items cost).
    assert not is_fresh_start(chat, [SYSTEM, task, {"role": "assistant", "content": "on it"}, 42])
    messages = MessagesDialect().codec  # a tool result's user message is no task
    result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}
    assert not is_fresh_start(messages, [result])
    assert is_fresh_start(messages, [{"role": "user", "content": "fix issue 7"}])
