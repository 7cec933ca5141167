"""Any model behind the Messages API: a `models:` entry with `litellm_model` serves Anthropic-format
requests through litellm (here to the strict OpenAI chat fake), the reply in Anthropic format,
streaming and tool use included, so an Anthropic client (Claude Code) runs on an OpenAI model."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import ALICE, MakeProxy, live_messages
from tests.fakes.fake_upstream import FakeUpstream, Reply
from tests.fakes.responders import by_kind, fixed_summary, is_summary_request
from tests.support.harness import ProxyServer
from tests.support.messages_helpers import (
    BUILD,
    THINKING,
    WEATHER,
    as_params,
    claude_client,
    messages_proxy,
    results,
    sse_events,
)

KEY = "sk-openai-routed-0123456789"
MODEL = "claude-on-gpt"
LOG = "".join(f"line {i:05d}: all good\n" for i in range(1200))


@pytest.fixture
def routed(make_proxy: MakeProxy, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch) -> ProxyServer:
    monkeypatch.setenv("ROUTED_OPENAI_KEY", KEY)
    entry = {"litellm_model": "openai/gpt-4o-mini", "api_base": upstream.base_url, "api_key_env": "ROUTED_OPENAI_KEY"}
    return messages_proxy(make_proxy, upstream, models={MODEL: entry})


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_tool_loop_on_an_openai_model_in_anthropic_format(
    routed: ProxyServer, upstream: FakeUpstream, stream: bool
) -> None:
    client = claude_client(routed, headers={"X-Conversation-ID": f"routed-{stream}"})
    upstream.enqueue(
        Reply.tool_calls([("get_weather", json.dumps({"city": "Paris"}))], content="Let me check."),
        Reply.text("Sunny in Paris."),
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    params: dict[str, Any] = {"model": MODEL, "max_tokens": 128000, "tools": [WEATHER], "thinking": THINKING}
    first = _create(client, stream, messages=messages, **params)
    assert [b.type for b in first.content] == ["text", "tool_use"] and first.stop_reason == "tool_use"
    assert (first.content[1].name, first.content[1].input, first.model) == ("get_weather", {"city": "Paris"}, MODEL)
    messages += [as_params(first), results(first, "sunny, 22 C")]
    second = _create(client, stream, messages=messages, **params)
    assert (second.content[-1].text, second.stop_reason) == ("Sunny in Paris.", "end_turn")

    # What reached the chat fake: a valid chat request (it refuses anything else), the key of the
    # entry, max_tokens within the model's limit, the tool loop as tool_calls and a tool message.
    records = [r for r in upstream.requests if r.path == "/v1/chat/completions"]
    assert [r.status_sent for r in records] == [200, 200]
    assert records[-1].headers["authorization"] == f"Bearer {KEY}"
    chat = upstream.chat_requests()[-1]
    assert chat["model"] == "gpt-4o-mini" and chat["max_tokens"] <= 16384
    assert [m["role"] for m in chat["messages"]] == ["user", "assistant", "tool"]
    assert chat["messages"][2] == {"role": "tool", "tool_call_id": first.content[1].id, "content": "sunny, 22 C"}
    assert upstream.messages_requests() == []  # nothing went to the Anthropic API


def _create(client: anthropic.Anthropic, stream: bool, **params: Any) -> anthropic.types.Message:
    if not stream:
        return client.messages.create(**params)
    with client.messages.stream(**params) as events:
        return events.get_final_message()


def test_the_stream_is_anthropics_event_by_event(routed: ProxyServer, upstream: FakeUpstream) -> None:
    upstream.enqueue(Reply.text("Hello from GPT."))
    body = {"model": MODEL, "max_tokens": 100, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    headers = {"x-api-key": ALICE, "anthropic-version": "2023-06-01"}
    response = httpx.post(routed.url + "/v1/messages", json=body, headers=headers, timeout=30)
    names = [name for name, _ in sse_events(response.text)]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop") == 1
    (delta,) = [data for name, data in sse_events(response.text) if name == "message_delta"]
    assert delta["usage"]["output_tokens"] > 0  # the chat stream's usage made it across


def test_truncation_read_back_and_count_tokens_on_a_routed_model(
    routed: ProxyServer, upstream: FakeUpstream, http: httpx.Client
) -> None:
    def model(body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]
        if last["role"] == "tool" and "read_tool_output" in str(last["content"]) and "[out_" not in str(last["content"]):
            ref = str(last["content"]).split('ref "', 1)[1].split('"', 1)[0]
            return Reply.tool_calls([("read_tool_output", json.dumps({"ref": ref, "offset": 20000, "length": 500}))])
        if last["role"] == "tool":
            return Reply.text("All lines are good.")
        return Reply.tool_calls([("run_build", "{}")])

    upstream.responder = model
    client = claude_client(routed, headers={"X-Conversation-ID": "routed-read"})
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Check the log."}]
    first = client.messages.create(model=MODEL, max_tokens=100, tools=[BUILD], messages=messages)
    messages += [as_params(first), results(first, LOG)]
    count = client.messages.with_raw_response.count_tokens(model=MODEL, tools=[BUILD], messages=messages)
    with client.messages.stream(model=MODEL, max_tokens=100, tools=[BUILD], messages=messages) as events:
        final = events.get_final_message()
    assert [b.type for b in final.content] == ["text"] and final.content[0].text == "All lines are good."
    chats = upstream.chat_requests()
    assert len(chats) == 3 and chats[2]["messages"][-1]["content"].startswith("[out_")
    assert len(chats[1]["messages"][-1]["content"]) < 3000  # shortened on the way to the routed model
    # Counted locally for a routed model: the window's own count of that same prompt.
    assert count.parse().input_tokens == int(count.headers["X-Context-Tokens-Sent"])
    assert count.parse().input_tokens < len(LOG) // 8
    stored = live_messages(http, "routed-read")
    assert stored[2]["content"][0]["content"] == LOG


def test_summaries_of_a_routed_conversation_go_to_its_model_too(
    make_proxy: MakeProxy, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The summarizer of a Messages conversation on a routed model is that model, through the
    same route: the summary request reaches the chat fake as chat, with the entry's key."""
    monkeypatch.setenv("ROUTED_OPENAI_KEY", KEY)
    entry = {"litellm_model": "openai/gpt-4o-mini", "api_base": upstream.base_url, "api_key_env": "ROUTED_OPENAI_KEY"}
    proxy = messages_proxy(
        make_proxy, upstream, models={MODEL: entry},
        compaction={"strategy": "budget", "background": False, "max_history_summary_length": 1000},
    )
    upstream.responder = by_kind(lambda body: Reply.tool_calls([("run_build", "{}")]), fixed_summary("Builds ran; all good."))
    client = claude_client(proxy, headers={"X-Conversation-ID": "routed-summary"})
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Build it three times."}]
    for _ in range(3):
        reply = client.messages.create(model=MODEL, max_tokens=100, tools=[BUILD], messages=messages)
        messages += [as_params(reply), results(reply, "build ok " * 60)]
    client.messages.create(model=MODEL, max_tokens=100, tools=[BUILD], messages=messages)
    summaries = [b for b in upstream.chat_requests() if is_summary_request(b)]
    assert summaries and all(b["model"] == "gpt-4o-mini" for b in summaries)
    agent = [b for b in upstream.chat_requests() if not is_summary_request(b)][-1]
    assert "Builds ran; all good." in json.dumps(agent["messages"][0])  # the summary, in the routed model's system
    assert upstream.messages_requests() == []
