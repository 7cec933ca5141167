"""The official SDK through the proxy gets exactly what the upstream returned, and every message is kept."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.conftest import ALICE, async_openai_client, leave_mid_stream, live_messages, openai_client, trajectory
from tests.fakes.fake_upstream import Reply

SYSTEM = {"role": "system", "content": "You are a careful agent."}


def conversation_id(response: httpx.Response) -> str:
    return response.headers["X-Conversation-ID"]


def test_non_streaming_reply_is_the_upstreams_bytes(proxy, upstream, http):
    upstream.enqueue(Reply.text("Bonjour!"))
    body = {"model": "gpt-4o-mini", "messages": [SYSTEM, {"role": "user", "content": "hi"}]}
    via_proxy = http.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {ALICE}"})
    assert via_proxy.status_code == 200
    reply = via_proxy.json()
    assert reply["choices"][0]["message"]["content"] == "Bonjour!"
    # What the upstream received is what the client sent: nothing of ours added.
    assert upstream.chat_requests()[-1] == body
    assert upstream.requests[-1].headers["authorization"] == f"Bearer {ALICE}"
    assert live_messages(http, conversation_id(via_proxy)) == [
        SYSTEM,
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Bonjour!"},
    ]


def test_sync_sdk_streaming_forwards_chunks_and_persists_the_assembled_reply(proxy, upstream, http):
    upstream.enqueue(Reply.text("The quick brown fox jumps.", chunk_size=3))
    client = openai_client(proxy)
    stream = client.chat.completions.with_raw_response.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "tell me"}], stream=True
    )
    cid = stream.headers["X-Conversation-ID"]
    pieces = [c.choices[0].delta.content for c in stream.parse() if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 5  # delivered as many chunks, not one buffered blob
    assert "".join(pieces) == "The quick brown fox jumps."
    assert live_messages(http, cid)[-1] == {"role": "assistant", "content": "The quick brown fox jumps."}


async def test_async_sdk_tool_loop_with_parallel_calls_is_persisted_in_order(proxy, upstream, http):
    calls = [("get_weather", '{"city": "Paris"}'), ("get_time", '{"tz": "CET"}')]
    upstream.enqueue(Reply.tool_calls(calls), Reply.text("Sunny, 14:00."))
    tools = [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
        for n, _ in calls
    ]
    client = async_openai_client(proxy, headers={"X-Conversation-ID": "tool-loop"})
    messages: list[dict] = [SYSTEM, {"role": "user", "content": "weather and time?"}]
    first = await client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=tools, stream=True)
    call_deltas: dict[int, dict] = {}
    async for chunk in first:
        for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            slot = call_deltas.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
            slot["id"] += d.id or ""
            slot["name"] += (d.function.name or "") if d.function else ""
            slot["arguments"] += (d.function.arguments or "") if d.function else ""
    assistant = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in (call_deltas[i] for i in sorted(call_deltas))
        ],
    }
    assert [c["function"]["name"] for c in assistant["tool_calls"]] == ["get_weather", "get_time"]
    results = [
        {"role": "tool", "tool_call_id": c["id"], "content": f"result of {c['function']['name']}"}
        for c in assistant["tool_calls"]
    ]
    messages += [assistant, *results]
    second = await client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=tools)
    assert second.choices[0].message.content == "Sunny, 14:00."

    stored = live_messages(http, "tool-loop")
    assert [m["role"] for m in stored] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert stored[2]["tool_calls"] == assistant["tool_calls"]
    assert [m["tool_call_id"] for m in stored[3:5]] == [c["id"] for c in assistant["tool_calls"]]
    assert stored[5]["content"] == "Sunny, 14:00."
    # The second request's prefix matched what was stored: nothing was written twice.
    assert len(trajectory(http, "tool-loop")) == 6


def test_stream_reaches_the_client_before_the_upstream_finishes(proxy, upstream, http):
    """Chunks are forwarded as they arrive: the client reads the first ones while the upstream is paused."""
    reply = Reply.text("first part, then the rest", chunk_size=5, pause_after_chunks=3)
    upstream.enqueue(reply)
    body = {"model": "m", "messages": [{"role": "user", "content": "go"}], "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {ALICE}"}) as r:
        lines = r.iter_lines()
        received = []
        while len(received) < 3:
            line = next(lines)
            if line.startswith("data: "):
                received.append(json.loads(line[6:]))
        assert reply.reached.wait(10)  # the upstream is held at its pause point right now
        reply.release()
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    assert live_messages(http, r.headers["X-Conversation-ID"])[-1]["content"] == "first part, then the rest"


def test_client_leaving_mid_stream_leaves_the_partial_reply_incomplete(proxy, upstream, http):
    text = "a long answer that the client will never read to the end"
    reply, first_three = leave_mid_stream(http, upstream, "walked-away", text, lines=3)
    headers = {"Authorization": f"Bearer {ALICE}", "X-Conversation-ID": "walked-away"}
    assert "".join(json.loads(x[6:])["choices"][0]["delta"].get("content") or "" for x in first_three)
    # The client's connection is closed now. The next turn waits for the first one to end (one
    # turn at a time per conversation), so by then the partial reply is stored.
    upstream.enqueue(Reply.text("ok"))
    second = http.post(
        "/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "go"}]}, headers=headers
    )
    assert second.status_code == 200
    statuses = [(m["role"], m["status"]) for m in trajectory(http, "walked-away")]
    reply.release()
    assert statuses == [("user", "live"), ("assistant", "incomplete"), ("assistant", "live")]
    partial = trajectory(http, "walked-away")[1]["content"]
    assert partial and "a long answer that the client will never read to the end".startswith(partial)
    assert partial != "a long answer that the client will never read to the end"


def test_on_redis_a_client_leaving_mid_stream_still_has_its_partial_reply_stored(make_proxy, upstream, redis):
    """The turn's last writes run on after aiohttp cancelled the handler: with the Redis store they
    wait on the network, and its lock checks whether the task it runs in is being cancelled (the
    write's own task, never the cancelled handler's)."""
    proxy = make_proxy(storage={"backend": "redis", "redis_url": redis.url})
    with httpx.Client(base_url=proxy.url, timeout=30, auth=proxy.admin_auth) as http:
        reply, _ = leave_mid_stream(http, upstream, "walked-away-redis", "an answer cut short by the client", lines=2)
        upstream.enqueue(Reply.text("ok"))
        headers = {"Authorization": f"Bearer {ALICE}", "X-Conversation-ID": "walked-away-redis"}
        body = {"model": "m", "messages": [{"role": "user", "content": "go"}]}
        assert http.post("/v1/chat/completions", json=body, headers=headers).status_code == 200
        reply.release()
        statuses = [(m["role"], m["status"]) for m in trajectory(http, "walked-away-redis")]
    assert statuses == [("user", "live"), ("assistant", "incomplete"), ("assistant", "live")]


@pytest.mark.parametrize("stream", [False, True])
def test_every_message_type_is_persisted(proxy, upstream, http, stream):
    upstream.enqueue(Reply.text("done"))
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "developer", "content": "dev note"},
        {"role": "user", "content": [{"type": "text", "text": "look"}], "name": "alice"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_a", "type": "function", "function": {"name": "ls", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "file.txt"},
    ]
    client = openai_client(proxy, headers={"X-Conversation-ID": f"types-{stream}"})
    result = client.chat.completions.create(model="m", messages=messages, stream=stream)
    if stream:
        list(result)
    assert live_messages(http, f"types-{stream}") == [*messages, {"role": "assistant", "content": "done"}]


def test_the_items_of_a_chat_transcript():
    """What the stages read off each message: its role, the calls it makes, the call it answers,
    and whether it goes in or out with the item before it (a call's results do)."""
    from proxy.dialects.chat import CHAT
    from proxy.transcript import Call, Item, Role

    call = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": '{"p": 1}'}}
    raws = [
        SYSTEM,
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call, {"id": "c2", "function": {"name": "ls"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
        {"role": "assistant", "content": "done"},
        {"role": "tool", "tool_call_id": "c9", "content": "an orphan"},
        {"role": "function", "name": "legacy", "content": "x"},
    ]
    items = CHAT.codec.items(raws, list(range(1, 10)), [f"h{i}" for i in range(9)])
    calls = (Call("c1", "read", '{"p": 1}'), Call("c2", "ls", ""))
    assert items == [
        Item(raws[0], Role.SYSTEM, 1, "h0"),
        Item(raws[1], Role.SYSTEM, 2, "h1"),
        Item(raws[2], Role.USER, 3, "h2"),
        Item(raws[3], Role.ASSISTANT, 4, "h3", calls=calls),
        Item(raws[4], Role.TOOL, 5, "h4", answers="c1", joins=True),
        Item(raws[5], Role.TOOL, 6, "h5", answers="c2", joins=True),
        Item(raws[6], Role.ASSISTANT, 7, "h6"),
        Item(raws[7], Role.TOOL, 8, "h7", answers="c9"),
        Item(raws[8], Role.OTHER, 9, "h8"),
    ]
