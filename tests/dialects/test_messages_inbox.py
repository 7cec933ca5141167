"""The inbox and long-term knowledge in Anthropic Messages, driven by the official `anthropic`
client against the strict Anthropic fake: an inbox message goes into the newest `tool_result`
when the prompt ends in tool results (Claude Code's text after them stays where it was), else
as a user message right before the client's newest; once, and in the same bytes on every later
turn; count_tokens counts it without delivering it. The knowledge document goes into `system`
after the client's blocks, and its tools are Anthropic tools the proxy answers out of sight."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import ALICE, MakeProxy, live_messages, trajectory
from tests.fakes.fake_upstream import FakeUpstream, Reply
from tests.support.harness import ProxyServer
from tests.support.messages_helpers import (
    BUILD,
    MODEL,
    THINKING,
    as_params,
    claude_client,
    messages_proxy,
    results,
    sse_events,
)

AUTH = {"Authorization": f"Bearer {ALICE}"}
STEER = "Stop: the failing step is the linker, not the compiler."
REMINDER = {"type": "text", "text": "<system-reminder>Keep going.</system-reminder>", "cache_control": {"type": "ephemeral"}}


@pytest.fixture
def proxy(make_proxy: MakeProxy, upstream: FakeUpstream) -> ProxyServer:  # the `http` fixture's proxy too
    return messages_proxy(make_proxy, upstream)


def post(http: httpx.Client, cid: str, content: str) -> dict[str, Any]:
    response = http.post(f"/v1/conversations/{cid}/inbox", json={"content": content}, headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()


def inbox(http: httpx.Client, cid: str) -> list[dict[str, Any]]:
    response = http.get(f"/v1/conversations/{cid}/inbox", headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def occurrences(body: dict[str, Any], text: str) -> int:
    return json.dumps(body, ensure_ascii=False).count(text)


def create(client: anthropic.Anthropic, stream: bool, **params: Any) -> anthropic.types.Message:
    if not stream:
        return client.messages.create(model=MODEL, max_tokens=4096, **params)
    with client.messages.stream(model=MODEL, max_tokens=4096, **params) as events:
        return events.get_final_message()


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_message_posted_during_a_tool_loop_goes_into_the_newest_tool_result_and_stays_put(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client, stream: bool
) -> None:
    cid = f"steer-{stream}"
    client = claude_client(proxy, headers={"X-Claude-Code-Session-Id": cid})
    upstream.enqueue(
        Reply.tool_calls([("run_build", "{}")], reasoning="Build first."),
        Reply.text("The linker fails.", reasoning="The user says linker."),
        Reply.text("You're welcome."),
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Why does the build fail?"}]
    first = create(client, stream, messages=messages, tools=[BUILD], thinking=THINKING)
    assert post(http, cid, STEER)["status"] == "pending"  # while the agent runs its tool
    # Claude Code's shape: the results, then a reminder of its own in the same user message.
    messages += [as_params(first), results(first, "compile ok; link failed", REMINDER)]
    second = create(client, stream, messages=messages, tools=[BUILD], thinking=THINKING)
    messages += [as_params(second), {"role": "user", "content": "Thanks."}]
    create(client, stream, messages=messages, tools=[BUILD], thinking=THINKING)

    asked, delivered, later = upstream.messages_requests()  # each one valid at the strict fake
    assert occurrences(asked, STEER) == 0
    result, reminder = delivered["messages"][-1]["content"]
    assert result["content"].startswith("compile ok; link failed\n\n[context-proxy: a message from the user")
    assert result["content"].endswith(STEER) and reminder == REMINDER  # the client's text after it: untouched
    assert occurrences(delivered, STEER) == occurrences(later, STEER) == 1
    assert later["messages"][: len(delivered["messages"])] == delivered["messages"]  # the same bytes, in place

    [message] = inbox(http, cid)
    assert (message["status"], message["placement"], message["turn"]) == ("delivered", "append", 2)
    stored = live_messages(http, cid)
    assert stored[2]["content"] == [{"type": "tool_result", "tool_use_id": first.content[1].id, "content": "compile ok; link failed"}]
    assert {m["status"] for m in trajectory(http, cid)} == {"live"}  # the client's resent history is no divergence


def test_without_tool_results_it_goes_as_a_user_message_before_the_newest(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client
) -> None:
    client = claude_client(proxy, headers={"X-Conversation-ID": "chatty-1"})
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Plan the release."}]
    messages.append(as_params(client.messages.create(model=MODEL, max_tokens=100, messages=messages)))
    post(http, "chatty-1", "Ship on Friday, not Monday.")
    post(http, "chatty-1", "And tag it v2.")
    for text in ("What next?", "And then?"):
        messages.append({"role": "user", "content": [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]})
        messages.append(as_params(client.messages.create(model=MODEL, max_tokens=100, messages=messages)))
        messages[-2] = {"role": "user", "content": text}  # Claude Code moves its breakpoint on, resends a string

    _, second, third = upstream.messages_requests()
    note, newest = second["messages"][2:]
    assert note["role"] == "user" and newest == {"role": "user", "content": [
        {"type": "text", "text": "What next?", "cache_control": {"type": "ephemeral"}}
    ]}
    assert note["content"].index("Ship on Friday") < note["content"].index("And tag it v2.")  # both, one message
    assert third["messages"][2] == note and third["messages"][3]["content"] == "What next?"
    assert [m["status"] for m in inbox(http, "chatty-1")] == ["delivered", "delivered"]
    assert {m["status"] for m in trajectory(http, "chatty-1")} == {"live"}


def test_count_tokens_counts_a_waiting_message_and_delivers_nothing(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client
) -> None:
    client = claude_client(proxy, headers={"X-Conversation-ID": "count-inbox"})
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Hello."}]
    messages.append(as_params(client.messages.create(model=MODEL, max_tokens=100, messages=messages)))
    messages.append({"role": "user", "content": "Go on."})
    without = client.messages.count_tokens(model=MODEL, messages=messages).input_tokens
    post(http, "count-inbox", STEER)
    counted = client.messages.count_tokens(model=MODEL, messages=messages)
    assert counted.input_tokens > without
    assert occurrences(upstream.anthropic.count_tokens_requests()[-1], STEER) == 1
    assert inbox(http, "count-inbox")[0]["status"] == "pending"  # a count is not a delivery
    client.messages.create(model=MODEL, max_tokens=100, messages=messages)
    sent = upstream.messages_requests()[-1]
    assert sent["messages"] == upstream.anthropic.count_tokens_requests()[-1]["messages"]  # what was counted went
    assert inbox(http, "count-inbox")[0]["status"] == "delivered"


# -- long-term knowledge --------------------------------------------------------------------------

OURS = ["knowledge_read", "knowledge_replace_section", "knowledge_append_section"]
PITFALL = "Run make install before make test."


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_knowledge_goes_into_system_and_its_tools_are_answered_out_of_the_clients_sight(
    make_proxy: MakeProxy, upstream: FakeUpstream, http: httpx.Client, stream: bool
) -> None:
    proxy = messages_proxy(make_proxy, upstream, knowledge={"enabled": True, "editable": True})
    append = ("knowledge_append_section", json.dumps({"heading": "Setup pitfalls", "content": PITFALL}))
    upstream.enqueue(Reply.tool_calls([append], reasoning="Worth keeping."), Reply.text("Noted.", reasoning="Done."))
    system = [{"type": "text", "text": "You are a build agent.", "cache_control": {"type": "ephemeral"}}]
    body = {
        "model": MODEL, "max_tokens": 4096, "system": system, "tools": [BUILD], "thinking": THINKING, "stream": stream,
        "messages": [{"role": "user", "content": "Set up the project."}],
    }
    headers = {"x-api-key": ALICE, "anthropic-version": "2023-06-01", "X-Conversation-ID": f"notes-{stream}"}
    response = httpx.post(proxy.url + "/v1/messages", json=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    if stream:
        events = sse_events(response.text)
        starts = [data for name, data in events if name == "content_block_start"]
        assert [(s["index"], s["content_block"]["type"]) for s in starts] == [(0, "thinking"), (1, "text")]
        assert "knowledge_append_section" not in response.text and "Worth keeping" not in response.text
    else:
        assert [b["type"] for b in response.json()["content"]] == ["thinking", "text"]
        assert response.json()["stop_reason"] == "end_turn"

    asked, answered = upstream.messages_requests()  # both valid at the strict fake
    assert asked["system"][0] == system[0] and "Long-term knowledge" in asked["system"][1]["text"]
    assert [t["name"] for t in asked["tools"]] == ["run_build", *OURS]
    assert all("input_schema" in t for t in asked["tools"])
    call, answer = answered["messages"][-2:]
    assert [b["type"] for b in call["content"]] == ["thinking", "tool_use"]
    assert answer["content"][0]["content"].startswith("Done: section 'Setup pitfalls' added")
    document = http.get("/v1/knowledge", headers=AUTH).json()
    assert PITFALL in document["text"] and document["source"] == f"agent:notes-{stream} turn 1"
    assert [m["role"] for m in live_messages(http, f"notes-{stream}")] == ["user", "assistant"]
