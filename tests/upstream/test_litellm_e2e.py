"""End to end through the proxy: a litellm-routed model (the Anthropic fake) next to passthrough models."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.conftest import ALICE, live_messages, openai_client
from tests.fakes.fake_providers import FakeAnthropic, ProviderReply, ToolUse

KEY = "sk-ant-e2e-key-123456"


@pytest.fixture(scope="module")
def anthropic(servers):
    fake = FakeAnthropic(keys={KEY})
    servers.run(fake.start())
    yield fake
    servers.run(fake.close())


@pytest.fixture
def routed(make_proxy, anthropic, monkeypatch):
    monkeypatch.setenv("E2E_KEY", KEY)
    anthropic.reset()
    return make_proxy(
        models={
            "claude": {
                "litellm_model": "anthropic/claude-3-5-sonnet-20241022",
                "api_base": anthropic.base_url,
                "api_key_env": "E2E_KEY",
                "context_window": 5000,
            },
            "fast": {"history_token_limit": 1000},
        }
    )


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def test_litellm_model_through_the_proxy_with_tools_errors_models_and_window(routed, anthropic, upstream):
    client = openai_client(routed, headers={"X-Conversation-ID": "e2e-1"})
    r = client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "hi"}])
    assert r.choices[0].message.content == "reply to: hi" and r.model == "claude"
    assert anthropic.requests[-1].headers["x-api-key"] == KEY
    anthropic.enqueue(ProviderReply.message("ok", [ToolUse("get_weather", {"city": "Paris"}, id="toolu_1")]))
    msgs = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "reply to: hi"},
        {"role": "user", "content": "weather?"},
    ]
    stream = client.chat.completions.create(model="claude", messages=msgs, tools=TOOLS, stream=True)
    calls = {}
    content = ""
    for chunk in stream:
        for c in chunk.choices:
            content += c.delta.content or ""
            for tc in c.delta.tool_calls or ():
                slot = calls.setdefault(tc.index, {"id": None, "name": "", "args": ""})
                slot["id"] = tc.id or slot["id"]
                slot["name"] += tc.function.name or ""
                slot["args"] += tc.function.arguments or ""
    assert content == "ok" and calls[0]["id"] == "toolu_1" and json.loads(calls[0]["args"]) == {"city": "Paris"}
    msgs += [
        {
            "role": "assistant",
            "content": "ok",
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
    ]
    r = client.chat.completions.create(model="claude", messages=msgs, tools=TOOLS)
    assert r.choices[0].message.content == "reply to: sunny"
    with httpx.Client(base_url=routed.url) as http:
        live = live_messages(http, "e2e-1", ALICE)
    assert [m["role"] for m in live] == ["user", "assistant", "user", "assistant", "tool", "assistant"]
    assert live[3]["tool_calls"][0]["id"] == "toolu_1"
    # errors: status and OpenAI shape
    anthropic.enqueue(ProviderReply.error(429, "slow down"))
    with pytest.raises(openai.RateLimitError) as info:
        client.chat.completions.create(model="claude", messages=[{"role": "user", "content": "x"}])
    assert "slow down" in str(info.value) and KEY not in str(info.value)
    anthropic.enqueue(ProviderReply.message("abcdefghijklmnop", error_after_events=4))
    got = []
    with pytest.raises(openai.APIError):
        for chunk in client.chat.completions.create(
            model="claude", messages=[{"role": "user", "content": "y"}], stream=True
        ):
            got.append(chunk)
    # passthrough models still go to the fake OpenAI upstream
    r = client.chat.completions.create(model="fast", messages=[{"role": "user", "content": "p"}])
    assert r.choices[0].message.content == "reply to: p" and upstream.chat_requests()[-1]["model"] == "fast"
    ids = [m.id for m in client.models.list().data]
    assert ids[:2] == ["claude", "fast"] and "gpt-4o-mini" in ids
    # token window: the configured window caps the history
    with httpx.Client(base_url=routed.url) as http:
        resp = http.post(
            "/v1/chat/completions",
            headers={"Authorization": f"Bearer {ALICE}", "X-Conversation-ID": "e2e-2"},
            json={
                "model": "claude",
                "max_tokens": 4900,
                "messages": [
                    {"role": "user", "content": "w " * 300},
                    {"role": "assistant", "content": "a"},
                    {"role": "user", "content": "last"},
                ],
            },
        )
        assert resp.status_code == 200, resp.text
        assert int(resp.headers["X-Context-Messages-Left-Out"]) >= 1, dict(resp.headers)
