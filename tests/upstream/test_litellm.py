"""litellm-routed upstreams: litellm's real provider code against fake providers on loopback.

The LiteLLMUpstream, the router and the /v1/models handler are exercised directly (real objects,
real litellm, real HTTP): an Anthropic Messages API fake (tests/fakes/fake_providers.py) and the strict
OpenAI-compatible FakeUpstream. Everything runs on the session's server loop (tests/support/harness.py),
so litellm's cached HTTP sessions live on one loop, as they would in the proxy.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from proxy.api import models as models_api
from proxy.api.passthrough import passthrough
from proxy.config import ConfigError, ModelSettings, load_settings
from proxy.errors import ProxyError
from proxy.state import SETTINGS, UPSTREAM
from proxy.upstream import HttpUpstream
from proxy.upstream.litellm import LiteLLMReply, LiteLLMUpstream, ProviderError, ProviderStreamBroken
from proxy.upstream.router import UpstreamRouter, counting_aliases, window_overrides
from proxy.upstream.sse import ReplyAssembler, SSEParser
from tests.fakes.fake_providers import FakeAnthropic, FakeGemini, FakeOllama, ProviderReply, ToolUse
from tests.fakes.fake_upstream import FakeUpstream, Reply
from tests.support.harness import ROOT, LoopThread

pytestmark = pytest.mark.filterwarnings("ignore:.*using the `ReadOnly` qualifier")

CLAUDE = "anthropic/claude-3-5-sonnet-20241022"
KEY_ENV = "CP_TEST_PROVIDER_KEY"
GOOD_KEY = "sk-ant-test-good-5f1d2c3b4a"
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}},
}


@pytest.fixture(scope="module")
def _anthropic(servers: LoopThread) -> Iterator[FakeAnthropic]:
    fake = FakeAnthropic(keys={GOOD_KEY})
    servers.run(fake.start())
    yield fake
    servers.run(fake.close())


@pytest.fixture
def anthropic(_anthropic: FakeAnthropic) -> FakeAnthropic:
    _anthropic.reset()
    return _anthropic


@pytest.fixture(scope="module")
def _gemini(servers: LoopThread) -> Iterator[FakeGemini]:
    fake = FakeGemini(keys={GOOD_KEY})
    servers.run(fake.start())
    yield fake
    servers.run(fake.close())


@pytest.fixture
def gemini(_gemini: FakeGemini) -> FakeGemini:
    _gemini.reset()
    return _gemini


@pytest.fixture(scope="module")
def _ollama(servers: LoopThread) -> Iterator[FakeOllama]:
    fake = FakeOllama()
    servers.run(fake.start())
    yield fake
    servers.run(fake.close())


@pytest.fixture
def ollama(_ollama: FakeOllama) -> FakeOllama:
    _ollama.reset()
    return _ollama


@pytest.fixture(autouse=True)
def provider_key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(KEY_ENV, GOOD_KEY)
    return GOOD_KEY


def claude(anthropic: FakeAnthropic, **entry: Any) -> LiteLLMUpstream:
    settings = {"litellm_model": CLAUDE, "api_base": anthropic.base_url, "api_key_env": KEY_ENV, **entry}
    return LiteLLMUpstream("claude", ModelSettings(**settings), timeout_s=30)


def openai_compatible(upstream: FakeUpstream, model: str = "openai/gpt-4o-mini", **entry: Any) -> LiteLLMUpstream:
    settings = {"litellm_model": model, "api_base": upstream.base_url, "api_key_env": KEY_ENV, **entry}
    return LiteLLMUpstream("house-model", ModelSettings(**settings), timeout_s=30)


def chat_body(text: str = "hello", **extra: Any) -> dict[str, Any]:
    return {
        "model": "claude",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}],
        **extra,
    }


def call(
    servers: LoopThread, upstream: LiteLLMUpstream, body: dict[str, Any], headers: dict[str, str] | None = None
) -> LiteLLMReply:
    return servers.run(upstream.chat(body, headers or {}))


def read_json(servers: LoopThread, reply: LiteLLMReply) -> dict[str, Any]:
    assert reply.status == 200 and not reply.is_event_stream
    assert reply.headers["Content-Type"] == "application/json"
    return json.loads(servers.run(reply.read()))


def read_stream(servers: LoopThread, reply: LiteLLMReply) -> tuple[list[bytes], ReplyAssembler]:
    """The SSE payloads, parsed and assembled the way exchange.py watches a stream go by."""
    assert reply.status == 200 and reply.is_event_stream
    assert reply.headers["Content-Type"].startswith("text/event-stream")

    async def collect() -> list[bytes]:
        out = []
        try:
            async for chunk in reply.chunks():
                out.append(chunk)
        finally:
            reply.close()
        return out

    parser, assembler, payloads = SSEParser(), ReplyAssembler(), []
    for chunk in servers.run(collect()):
        for payload in parser.feed(chunk):
            payloads.append(payload)
            assembler.feed(payload)
    return payloads, assembler


def chunk_objects(payloads: list[bytes]) -> list[dict[str, Any]]:
    assert payloads[-1] == b"[DONE]" and b"[DONE]" not in payloads[:-1]
    return [json.loads(p) for p in payloads[:-1]]


def raises(servers: LoopThread, coro: Any) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        servers.run(coro)
    return info.value


# -- Anthropic: text, streaming, tools ------------------------------------------------------------


def test_anthropic_text_comes_back_as_an_openai_completion(servers, anthropic, provider_key):
    data = read_json(
        servers, call(servers, claude(anthropic), chat_body("hello"), {"Authorization": "Bearer sk-client"})
    )
    assert data["object"] == "chat.completion" and data["model"] == "claude"
    choice = data["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"] == "reply to: hello"
    assert choice["finish_reason"] == "stop"
    assert data["usage"]["prompt_tokens"] > 0 and data["usage"]["completion_tokens"] > 0
    seen = anthropic.requests[-1]
    assert seen.path == "/v1/messages"
    assert seen.headers["x-api-key"] == provider_key  # the env var's value, not the client's key
    assert "authorization" not in seen.headers
    assert seen.body["model"] == "claude-3-5-sonnet-20241022"
    assert seen.body["system"] in ("Be brief.", [{"type": "text", "text": "Be brief."}])
    assert [m["role"] for m in seen.body["messages"]] == ["user"]


def test_the_key_is_read_from_the_env_var_at_each_call(servers, anthropic, monkeypatch):
    upstream = claude(anthropic)
    monkeypatch.setenv(KEY_ENV, "sk-ant-rotated-77aa")
    anthropic.keys.add("sk-ant-rotated-77aa")
    try:
        read_json(servers, call(servers, upstream, chat_body()))
    finally:
        anthropic.keys.discard("sk-ant-rotated-77aa")
    assert anthropic.requests[-1].headers["x-api-key"] == "sk-ant-rotated-77aa"


def test_anthropic_streaming_text_comes_back_as_openai_sse(servers, anthropic):
    anthropic.enqueue(ProviderReply.message("The quick brown fox jumps over the lazy dog.", chunk_size=4))
    reply = call(servers, claude(anthropic), chat_body(stream=True, stream_options={"include_usage": True}))
    payloads, assembled = read_stream(servers, reply)
    chunks = chunk_objects(payloads)
    assert len(chunks) > 5  # streamed piece by piece, not in one block
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert {c["model"] for c in chunks} == {"claude"}
    assert assembled.message() == {"role": "assistant", "content": "The quick brown fox jumps over the lazy dog."}
    assert assembled.finish_reason == "stop" and assembled.done
    assert assembled.usage and assembled.usage["completion_tokens"] > 0
    assert anthropic.requests[-1].body["stream"] is True


def test_anthropic_tool_calls_come_back_in_openai_format(servers, anthropic):
    anthropic.enqueue(
        ProviderReply.message("Let me look.", [ToolUse("get_weather", {"city": "Paris"}, id="toolu_01A")])
    )
    data = read_json(
        servers, call(servers, claude(anthropic), chat_body("weather?", tools=[WEATHER_TOOL], tool_choice="auto"))
    )
    message = data["choices"][0]["message"]
    assert data["choices"][0]["finish_reason"] == "tool_calls"
    assert message["content"] == "Let me look."
    assert message["tool_calls"] == [
        {"id": "toolu_01A", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    ]
    sent = anthropic.requests[-1].body
    assert sent["tools"][0]["name"] == "get_weather"
    assert sent["tools"][0]["input_schema"] == WEATHER_TOOL["function"]["parameters"]
    assert sent["tool_choice"] == {"type": "auto"}


def test_anthropic_streamed_tool_calls_assemble_into_openai_calls(servers, anthropic):
    calls = [
        ToolUse("get_weather", {"city": "Paris"}, id="toolu_01A"),
        ToolUse("get_time", {"tz": "Europe/Paris"}, id="toolu_01B"),
    ]
    anthropic.enqueue(ProviderReply.message("Checking both.", calls, chunk_size=3))
    reply = call(
        servers, claude(anthropic), chat_body("weather and time?", tools=[WEATHER_TOOL, TIME_TOOL], stream=True)
    )
    payloads, assembled = read_stream(servers, reply)
    chunks = chunk_objects(payloads)
    deltas = [d for c in chunks for ch in c["choices"] for d in ch["delta"].get("tool_calls") or ()]
    assert len(deltas) > 4  # arguments arrive in fragments, as OpenAI streams them
    assert {d["index"] for d in deltas} == {0, 1}
    message = assembled.message()
    assert message["content"] == "Checking both."
    assert [
        (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]
    ] == [
        ("toolu_01A", "get_weather", {"city": "Paris"}),
        ("toolu_01B", "get_time", {"tz": "Europe/Paris"}),
    ]
    assert assembled.finish_reason == "tool_calls"


def test_a_tool_loop_transcript_is_accepted_by_the_strict_provider(servers, anthropic):
    body = chat_body(tools=[WEATHER_TOOL])
    body["messages"] += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "toolu_01A",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_01A", "content": '{"temp_c": 21}'},
    ]
    original = json.loads(json.dumps(body))
    data = read_json(servers, call(servers, claude(anthropic), body))
    assert data["choices"][0]["message"]["content"] == 'reply to: {"temp_c": 21}'
    sent = anthropic.requests[-1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]
    assert sent[1]["content"][-1]["type"] == "tool_use" and sent[1]["content"][-1]["id"] == "toolu_01A"
    assert sent[2]["content"][0]["type"] == "tool_result" and sent[2]["content"][0]["tool_use_id"] == "toolu_01A"
    assert body == original  # litellm worked on a copy: our messages are reused on later turns


def test_a_window_starting_on_an_assistant_message_gets_a_user_turn_first(servers, anthropic):
    body = chat_body()
    body["messages"][1:] = [
        {"role": "assistant", "content": "Earlier answer."},
        {"role": "user", "content": "and now?"},
    ]
    assert (
        read_json(servers, call(servers, claude(anthropic), body))["choices"][0]["message"]["content"]
        == "reply to: and now?"
    )
    sent = anthropic.requests[-1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]  # the strict fake refuses anything else
    assert "not shown" in json.dumps(sent[0])


# -- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize(
    "reply, status, code",
    [
        (
            ProviderReply.error(429, "Number of request tokens has exceeded your per-minute rate limit"),
            429,
            "rate_limit_exceeded",
        ),
        (ProviderReply.error(400, "messages.0: bad block"), 400, "bad_request"),
        (ProviderReply.error(404, "model: claude-3-5-sonnet-20241022"), 404, "model_not_found"),
        (ProviderReply.error(403, "Your key has no access"), 403, "permission_denied"),
        (ProviderReply.error(529, "Overloaded"), 503, "upstream_unavailable"),
        (ProviderReply.error(500, "Internal server error"), 502, "upstream_error"),
    ],
    ids=["429", "400", "404", "403", "529", "500"],
)
def test_provider_errors_map_to_openai_errors_with_the_right_status(
    servers, anthropic, provider_key, caplog, reply, status, code, stream
):
    anthropic.enqueue(reply)
    with caplog.at_level(logging.DEBUG):
        error = raises(
            servers, claude(anthropic).chat(chat_body(stream=stream), {"Authorization": "Bearer sk-client-zz99"})
        )
    assert (error.status, error.code) == (status, code)
    body = error.body()["error"]
    assert set(body) >= {"message", "type", "code"} and body["code"] == code
    assert "claude" in body["message"] and "anthropic" in body["message"]  # which upstream failed
    assert reply.error_message in body["message"]  # and in the provider's own words
    assert len(anthropic.requests) == 1  # no retries behind the client's back
    logged = caplog.text + "".join(str(getattr(r, "detail", "")) for r in caplog.records)
    for secret in (provider_key, "sk-client-zz99"):
        assert secret not in body["message"] and secret not in logged


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_rejected_key_is_a_401_without_the_key(servers, anthropic, monkeypatch, stream):
    monkeypatch.setenv(KEY_ENV, "sk-ant-wrong-0000aaaa")
    error = raises(servers, claude(anthropic).chat(chat_body(stream=stream), {}))
    assert (error.status, error.code, error.type) == (401, "invalid_api_key", "authentication_error")
    assert "invalid x-api-key" in error.message and "sk-ant-wrong-0000aaaa" not in error.message


def test_a_key_echoed_by_the_provider_is_scrubbed(servers, anthropic, provider_key):
    anthropic.enqueue(ProviderReply.error(400, f"key {provider_key} is not allowed here"))
    error = raises(servers, claude(anthropic).chat(chat_body(), {}))
    assert provider_key not in error.message and ("***" in error.message or "REDACTED" in error.message)


def test_a_key_variable_emptied_after_start_up_is_a_clear_500(servers, anthropic, monkeypatch):
    upstream = claude(anthropic)
    monkeypatch.delenv(KEY_ENV)
    error = raises(servers, upstream.chat(chat_body(), {}))
    assert (error.status, error.code) == (500, "provider_key_missing") and KEY_ENV in error.message
    assert anthropic.requests == []


def test_a_silent_provider_is_a_504(servers, anthropic):
    anthropic.enqueue(ProviderReply.message("late", delay_s=3))
    error = raises(servers, claude(anthropic, timeout_s=0.5).chat(chat_body(), {}))
    assert (error.status, error.code) == (504, "upstream_timeout")


def test_an_unreachable_provider_is_a_502(servers):
    entry = ModelSettings(litellm_model=CLAUDE, api_base="http://127.0.0.1:9", api_key_env=KEY_ENV)
    error = raises(servers, LiteLLMUpstream("claude", entry, 5).chat(chat_body(), {}))
    assert (error.status, error.code) == (502, "upstream_unreachable")


def test_a_failure_mid_stream_raises_from_chunks(servers, anthropic):
    anthropic.enqueue(ProviderReply.message("abcdefghijklmnopqrstuvwxyz", chunk_size=5, error_after_events=5))
    reply = call(servers, claude(anthropic), chat_body(stream=True))  # the stream started: a 200

    async def drain() -> list[bytes]:
        got = []
        async for chunk in reply.chunks():
            got.append(chunk)
        return got

    with pytest.raises(ProviderStreamBroken) as info:
        servers.run(drain())
    assert isinstance(info.value, ProxyError)  # exchange.py turns it into an SSE error event
    assert info.value.status >= 500 and "claude" in info.value.message and "mid-stream" in info.value.message


def test_a_stream_cut_short_is_not_passed_off_as_complete(servers, anthropic):
    anthropic.enqueue(ProviderReply.message("abcdefghijklmnopqrstuvwxyz", chunk_size=5, cut_after_events=6))
    reply = call(servers, claude(anthropic), chat_body(stream=True))

    async def drain() -> list[bytes]:
        return [chunk async for chunk in reply.chunks()]

    with pytest.raises(ProviderStreamBroken):
        servers.run(drain())


def test_a_stream_left_early_is_released(servers, anthropic):
    anthropic.enqueue(ProviderReply.message("x" * 400, chunk_size=2))
    upstream = claude(anthropic)
    reply = call(servers, upstream, chat_body(stream=True))

    async def first_then_leave() -> bytes:
        chunks = reply.chunks()
        first = await chunks.__anext__()
        reply.close()
        await chunks.aclose()
        return first

    assert servers.run(first_then_leave()).startswith(b"data: ")
    assert (
        read_json(servers, call(servers, upstream, chat_body("again")))["choices"][0]["message"]["content"]
        == "reply to: again"
    )


# -- what goes to the provider ---------------------------------------------------------------------


def test_clients_cannot_set_litellm_arguments(servers, anthropic, provider_key):
    body = chat_body(
        api_base="http://127.0.0.1:9",
        api_key="sk-evil",
        extra_headers={"x-evil": "1"},
        metadata={"a": "b"},
        base_url="x",
    )
    read_json(servers, call(servers, claude(anthropic), body))
    seen = anthropic.requests[-1]
    assert seen.headers["x-api-key"] == provider_key and "x-evil" not in seen.headers


def test_params_extra_headers_and_request_parameters_reach_the_provider(servers, anthropic):
    upstream = claude(anthropic, extra_headers={"X-Team": "infra"}, params={"temperature": 0.25, "top_k": 5})
    read_json(servers, call(servers, upstream, chat_body(max_tokens=321, temperature=0.9, stop=["END"])))
    seen = anthropic.requests[-1]
    assert seen.headers["x-team"] == "infra"
    assert seen.body["max_tokens"] == 321 and seen.body["stop_sequences"] == ["END"]
    assert seen.body["temperature"] == 0.25 and seen.body["top_k"] == 5  # the entry's params win


def test_forward_client_key_sends_the_clients_own_key(servers, anthropic):
    entry = ModelSettings(litellm_model=CLAUDE, api_base=anthropic.base_url, forward_client_key=True)
    read_json(
        servers,
        call(servers, LiteLLMUpstream("claude", entry, 30), chat_body(), {"Authorization": f"Bearer {GOOD_KEY}"}),
    )
    assert anthropic.requests[-1].headers["x-api-key"] == GOOD_KEY


# -- OpenAI-compatible providers (openai/, hosted_vllm/) against the strict fake upstream -----------


def test_openai_compatible_text_and_key(servers, upstream, provider_key):
    data = read_json(
        servers,
        call(
            servers,
            openai_compatible(upstream),
            chat_body("hi there", max_tokens=50),
            {"Authorization": "Bearer sk-client"},
        ),
    )
    assert data["model"] == "house-model"
    assert data["choices"][0]["message"]["content"] == "reply to: hi there"
    seen = upstream.requests[-1]
    assert seen.path == "/v1/chat/completions"
    assert seen.headers["authorization"] == f"Bearer {provider_key}"
    assert upstream.chat_requests()[-1]["model"] == "gpt-4o-mini"  # passed the strict checks


def test_openai_compatible_streamed_tool_calls(servers, upstream):
    upstream.enqueue(Reply.tool_calls([("get_weather", '{"city": "Oslo"}')], content="One moment.", chunk_size=3))
    reply = call(servers, openai_compatible(upstream), chat_body(tools=[WEATHER_TOOL], stream=True))
    payloads, assembled = read_stream(servers, reply)
    assert {c["model"] for c in chunk_objects(payloads)} == {"house-model"}
    message = assembled.message()
    assert message["content"] == "One moment."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("get_weather", {"city": "Oslo"})
    ]
    assert assembled.finish_reason == "tool_calls"


def test_hosted_vllm_tool_calls_without_streaming(servers, upstream):
    upstream.enqueue(Reply.tool_calls([("get_time", '{"tz": "UTC"}')]))
    data = read_json(
        servers,
        call(
            servers, openai_compatible(upstream, "hosted_vllm/Qwen/Qwen2.5-7B-Instruct"), chat_body(tools=[TIME_TOOL])
        ),
    )
    call_ = data["choices"][0]["message"]["tool_calls"][0]
    assert call_["type"] == "function" and call_["function"] == {"name": "get_time", "arguments": '{"tz": "UTC"}'}
    assert upstream.chat_requests()[-1]["model"] == "Qwen/Qwen2.5-7B-Instruct"


def test_openai_compatible_errors_keep_their_status(servers, upstream):
    upstream.enqueue(
        Reply.error(
            429, {"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}}
        )
    )
    error = raises(servers, openai_compatible(upstream).chat(chat_body(), {}))
    assert (error.status, error.code) == (429, "rate_limit_exceeded")
    assert "Rate limit reached" in error.message and "house-model" in error.message
    assert len(upstream.requests) == 1  # the OpenAI SDK inside litellm does not retry either


# -- Gemini and Ollama: their own formats, the same OpenAI replies ----------------------------------


def gemini_model(gemini: FakeGemini) -> LiteLLMUpstream:
    entry = ModelSettings(litellm_model="gemini/gemini-2.0-flash", api_base=gemini.base_url, api_key_env=KEY_ENV)
    return LiteLLMUpstream("gemini", entry, 30)


def test_gemini_tool_calls_and_key(servers, gemini, provider_key):
    gemini.enqueue(ProviderReply.message("Looking.", [ToolUse("get_weather", {"city": "Rome"})]))
    data = read_json(servers, call(servers, gemini_model(gemini), chat_body(tools=[WEATHER_TOOL])))
    assert data["model"] == "gemini" and data["choices"][0]["finish_reason"] == "tool_calls"
    call_ = data["choices"][0]["message"]["tool_calls"][0]
    assert call_["function"]["name"] == "get_weather" and json.loads(call_["function"]["arguments"]) == {"city": "Rome"}
    seen = gemini.requests[-1]
    assert seen.path.startswith("/models/gemini-2.0-flash:generateContent")
    assert seen.headers["x-goog-api-key"] == provider_key
    assert seen.body["tools"][0]["function_declarations"][0]["name"] == "get_weather"


def test_gemini_streaming_text_and_errors(servers, gemini):
    gemini.enqueue(ProviderReply.message("Ciao from Gemini, streamed.", chunk_size=6))
    payloads, assembled = read_stream(servers, call(servers, gemini_model(gemini), chat_body(stream=True)))
    assert len(chunk_objects(payloads)) > 3 and assembled.message()["content"] == "Ciao from Gemini, streamed."
    assert assembled.finish_reason == "stop"
    gemini.enqueue(ProviderReply.error(429, "Resource has been exhausted (e.g. check quota)."))
    error = raises(servers, gemini_model(gemini).chat(chat_body(), {}))
    assert (error.status, error.code) == (429, "rate_limit_exceeded") and "gemini" in error.message


def ollama_model(ollama: FakeOllama, model: str = "llama3.1") -> LiteLLMUpstream:
    return LiteLLMUpstream("local", ModelSettings(litellm_model=f"ollama_chat/{model}", api_base=ollama.base_url), 30)


def test_ollama_streaming_text_and_tool_calls(servers, ollama):
    ollama.enqueue(ProviderReply.message("Hello from a local model.", chunk_size=4))
    payloads, assembled = read_stream(servers, call(servers, ollama_model(ollama), chat_body(stream=True)))
    assert {c["model"] for c in chunk_objects(payloads)} == {"local"}
    assert assembled.message()["content"] == "Hello from a local model." and assembled.finish_reason == "stop"
    ollama.enqueue(ProviderReply.message(None, [ToolUse("get_time", {"tz": "UTC"})]))
    data = read_json(servers, call(servers, ollama_model(ollama), chat_body(tools=[TIME_TOOL])))
    call_ = data["choices"][0]["message"]["tool_calls"][0]
    assert call_["function"]["name"] == "get_time" and json.loads(call_["function"]["arguments"]) == {"tz": "UTC"}
    assert ollama.requests[-1].body["model"] == "llama3.1" and "authorization" not in ollama.requests[-1].headers


def test_ollama_unknown_model_is_a_404(servers, ollama):
    error = raises(servers, ollama_model(ollama, "not-pulled").chat(chat_body(), {}))
    assert error.status == 404 and "not-pulled" in error.message


# -- settings ---------------------------------------------------------------------------------------


def test_a_missing_key_variable_stops_start_up_naming_the_setting(monkeypatch):
    monkeypatch.delenv("CP_TEST_MISSING_KEY", raising=False)
    with pytest.raises(ConfigError) as info:
        load_settings(None, models={"claude": {"litellm_model": CLAUDE, "api_key_env": "CP_TEST_MISSING_KEY"}})
    assert "models.claude.api_key_env" in str(info.value) and "CP_TEST_MISSING_KEY" in str(info.value)


@pytest.mark.parametrize(
    "entry, named",
    [
        ({"api_base": "http://x"}, "api_base"),  # litellm settings on a passthrough entry
        ({"litellm_model": CLAUDE, "params": {"api_key": "sk-x"}}, "api_key"),
        ({"litellm_model": CLAUDE, "surprise": 1}, "surprise"),
        ({"litellm_model": CLAUDE, "context_window": 10}, "context_window"),
    ],
)
def test_bad_model_entries_stop_start_up(entry, named):
    with pytest.raises(ConfigError) as info:
        load_settings(None, models={"m": entry})
    assert "models.m" in str(info.value) and named in str(info.value)


def test_the_shipped_cli_names_a_missing_key_variable(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(f"models:\n  claude:\n    litellm_model: {CLAUDE}\n    api_key_env: CP_TEST_UNSET_KEY\n")
    env = {k: v for k, v in os.environ.items() if k != "CP_TEST_UNSET_KEY"}
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--config", str(config)],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "models.claude.api_key_env" in result.stderr and "CP_TEST_UNSET_KEY" in result.stderr


# -- the router ---------------------------------------------------------------------------------------


def test_the_router_sends_litellm_models_to_litellm_and_the_rest_to_the_passthrough(anthropic):
    settings = load_settings(
        None,
        models={
            "claude": {
                "litellm_model": CLAUDE,
                "api_base": anthropic.base_url,
                "api_key_env": KEY_ENV,
                "context_window": 200000,
            },
            "gpt-4o": {"profile": None, "history_token_limit": 5000},
        },
    )
    http = HttpUpstream(settings.upstream)
    router = UpstreamRouter.from_settings(settings, http)
    assert isinstance(router.for_model("claude"), LiteLLMUpstream)
    assert router.for_model("gpt-4o") is http and router.for_model("anything-else") is http
    assert router.for_entry("sum", ModelSettings(litellm_model=CLAUDE)) is router.for_entry(
        "sum", ModelSettings(litellm_model=CLAUDE)
    )
    assert counting_aliases(settings.models) == {"claude": CLAUDE}
    assert window_overrides(settings.models) == {"claude": 200000} and router.context_window("claude") == 200000


def test_litellm_is_never_imported_for_passthrough_requests():
    """A fresh interpreter: build the router (with and without litellm routes), route passthrough
    models, list models: litellm stays out of sys.modules."""
    script = textwrap.dedent(
        """
        import os, sys
        os.environ["CP_KEY"] = "x"
        import proxy.app, proxy.api.models
        from proxy.config import load_settings
        from proxy.upstream import HttpUpstream
        from proxy.upstream.router import UpstreamRouter
        for models in ({}, {"fast": {"history_token_limit": 2000}},
                       {"claude": {"litellm_model": "anthropic/claude-3-5-sonnet-20241022", "api_key_env": "CP_KEY"}}):
            settings = load_settings(None, models=models)
            http = HttpUpstream(settings.upstream)
            router = UpstreamRouter.from_settings(settings, http)
            assert router.for_model("gpt-4o-mini") is http and router.for_model("fast") is http
            app = proxy.app.build_app(settings)
        print("litellm" in sys.modules, sorted(m for m in sys.modules if m.startswith("litellm"))[:3])
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], check=False, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False []"


# -- /v1/models -------------------------------------------------------------------------------------


class ModelsApp:
    """The /v1/models routes in front of a passthrough upstream, served on the loop thread."""

    def __init__(self, servers: LoopThread, upstream_url: str, models: dict[str, Any]) -> None:
        self.servers = servers
        self.settings = load_settings(None, upstream={"base_url": upstream_url, "timeout_s": 5}, models=models)
        self.runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application()
        app[SETTINGS] = self.settings
        app[UPSTREAM] = HttpUpstream(self.settings.upstream)
        await app[UPSTREAM].start()
        models_api.add_routes(app)
        app.router.add_route("*", "/c/{conversation_id}/{tail:.*}", passthrough)
        app.router.add_route("*", "/{tail:.*}", passthrough)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.app = app
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        await self.app[UPSTREAM].close()
        assert self.runner is not None
        await self.runner.cleanup()


@pytest.fixture
def models_app(servers: LoopThread) -> Iterator[Any]:
    started: list[ModelsApp] = []

    def start(upstream_url: str, models: dict[str, Any]) -> httpx.Client:
        app = ModelsApp(servers, upstream_url, models)
        url = servers.run(app.start())
        started.append(app)
        return httpx.Client(base_url=url, timeout=30, headers={"Authorization": "Bearer sk-client"})

    yield start
    for app in started:
        servers.run(app.stop())


MODELS = {
    "claude": {"litellm_model": CLAUDE, "api_key_env": KEY_ENV},
    "gpt-4o": {"history_token_limit": 4000},  # a passthrough model the upstream lists too
    "house": {"history_token_limit": 4000},  # one it does not list
}


def ids(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list" and all(m["object"] == "model" for m in body["data"])
    return [m["id"] for m in body["data"]]


def test_models_lists_ours_merged_with_the_upstreams(models_app, upstream):
    client = models_app(upstream.base_url, MODELS)
    listed = client.get("/v1/models")
    assert ids(listed) == ["claude", "gpt-4o", "house", "gpt-4o-mini", "gpt-4.1-mini"]
    by_id = {m["id"]: m for m in listed.json()["data"]}
    assert by_id["claude"]["owned_by"] == "anthropic" and by_id["gpt-4o"]["owned_by"] == "fake"
    assert upstream.requests[-1].headers["authorization"] == "Bearer sk-client"
    assert ids(client.get("/c/run-1/v1/models")) == ids(listed)


def test_models_lists_just_ours_when_the_upstream_refuses_or_is_down(models_app, upstream):
    refused = models_app(upstream.base_url, MODELS)
    assert ids(refused.get("/v1/models", headers={"Authorization": ""})) == [
        "claude",
        "gpt-4o",
        "house",
    ]  # upstream 401
    down = models_app("http://127.0.0.1:9/v1", MODELS)
    assert ids(down.get("/v1/models")) == ["claude", "gpt-4o", "house"]


def test_one_model_is_ours_or_the_upstreams(models_app, upstream):
    client = models_app(upstream.base_url, MODELS)
    ours = client.get("/v1/models/claude")
    assert ours.status_code == 200 and ours.json() == {
        "id": "claude",
        "object": "model",
        "created": 0,
        "owned_by": "anthropic",
    }
    assert client.get("/c/run-1/v1/models/claude").json()["id"] == "claude"
    theirs = client.get("/v1/models/gpt-4o-mini")  # passed through: the fake echoes other paths
    assert theirs.json()["path"] == "/v1/models/gpt-4o-mini"


def test_without_a_models_table_models_is_plain_passthrough(models_app, upstream):
    client = models_app(upstream.base_url, {})
    assert ids(client.get("/v1/models")) == ["gpt-4o-mini", "gpt-4o", "gpt-4.1-mini"]
    assert client.get("/v1/models", headers={"Authorization": ""}).status_code == 401  # the upstream's own answer
    assert ids(client.get("/c/run-1/v1/models")) == ["gpt-4o-mini", "gpt-4o", "gpt-4.1-mini"]
