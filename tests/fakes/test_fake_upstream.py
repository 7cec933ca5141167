"""Tests of the scripted upstream itself: the OpenAI SDK must accept its answers, and it must
refuse what the real API refuses (OPENAI-RULES.md), or the proxy tests prove nothing."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from tests.fakes.fake_upstream import FakeUpstream, Reply, validate_chat_request

AUTH = {"Authorization": "Bearer sk-test"}
WAIT = 5.0  # seconds: an upper bound for events that should happen at once, never a sleep


# --------------------------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------------------------


async def wait_for_event(event: Any) -> bool:
    """Wait on a threading.Event without blocking this test's event loop."""
    return await asyncio.to_thread(event.wait, WAIT)


async def read_sse_event(response: aiohttp.ClientResponse) -> str:
    """The payload of the next ``data: ...`` event of an SSE response."""
    line = await asyncio.wait_for(response.content.readline(), WAIT)
    blank = await asyncio.wait_for(response.content.readline(), WAIT)
    assert line.startswith(b"data: ") and blank == b"\n", (line, blank)
    return line[len(b"data: ") : -1].decode()


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def valid_body() -> dict:
    """A valid request using most rules at once; each refusal case breaks exactly one rule."""
    return {
        "model": "gpt-4o-mini",
        "messages": [
            {"role": "system", "content": "Be brief."},
            user("Weather in Paris and Rome?"),
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    call("call_a", "get_weather", '{"city": "Paris"}'),
                    call("call_b", "get_weather", '{"city": "Rome"}'),
                ],
            },
            {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
            {"role": "tool", "tool_call_id": "call_b", "content": "rainy"},
            {"role": "assistant", "content": "Sunny in Paris, rainy in Rome."},
            user("Thanks"),
        ],
        "tools": [copy.deepcopy(WEATHER_TOOL)],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


# Mutations of valid_body(), addressed by dotted paths ("messages.2.tool_calls.0.id").

Mutation = Callable[[dict], Any]


def _walk(body: dict, path: str) -> tuple[Any, str | int]:
    *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
    node: Any = body
    for key in parents:
        node = node[key]
    return node, last


def setting(path: str, value: Any) -> Mutation:
    def mutate(body: dict) -> dict:
        node, key = _walk(body, path)
        node[key] = value
        return body

    return mutate


def deleting(path: str) -> Mutation:
    def mutate(body: dict) -> dict:
        node, key = _walk(body, path)
        del node[key]
        return body

    return mutate


def inserting(path: str, value: Any) -> Mutation:
    def mutate(body: dict) -> dict:
        node, index = _walk(body, path)
        node.insert(index, value)
        return body

    return mutate


def both(*mutations: Mutation) -> Mutation:
    def mutate(body: dict) -> Any:
        for mutation in mutations:
            body = mutation(body)
        return body

    return mutate


NESTED_OBJECT = {"type": "object", "properties": {"day": {"type": "string"}}, "required": ["day"]}
IMAGE_PART = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}

REFUSALS = [
    # request body
    pytest.param(lambda b: [b], "expected an object, but got an array", id="body-not-object"),
    pytest.param(deleting("model"), "you must provide a model parameter", id="model-missing"),
    pytest.param(setting("model", ""), "you must provide a model parameter", id="model-empty"),
    pytest.param(deleting("messages"), "Missing required parameter: 'messages'.",
                 id="messages-missing"),
    pytest.param(setting("messages", "hi"), "Invalid type for 'messages': expected an array",
                 id="messages-not-array"),
    pytest.param(setting("messages", []), "Invalid 'messages': empty array.",
                 id="messages-empty"),
    pytest.param(setting("_meta", {"turn": 1}), "Unrecognized request argument supplied: _meta",
                 id="unknown-param-meta"),
    pytest.param(setting("conversation_id", "c1"),
                 "Unrecognized request argument supplied: conversation_id",
                 id="unknown-param-id"),
    pytest.param(setting("stream", "true"), "Invalid type for 'stream': expected a boolean",
                 id="stream-not-bool"),
    pytest.param(deleting("stream"),
                 "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                 id="stream-options-without-stream"),
    pytest.param(setting("stream", False), "only allowed when 'stream' is enabled",
                 id="stream-options-with-stream-false"),
    # tools
    pytest.param(setting("tools", WEATHER_TOOL), "Invalid type for 'tools': expected an array",
                 id="tools-not-array"),
    pytest.param(setting("tools", []), "Invalid 'tools': empty array.", id="tools-empty"),
    pytest.param(setting("tools.0.type", "retrieval"),
                 "Invalid value: 'retrieval'. Supported values are: 'function'.",
                 id="tool-type-not-function"),
    pytest.param(deleting("tools.0.function.name"),
                 "Missing required parameter: 'tools[0].function.name'.", id="function-no-name"),
    pytest.param(setting("tools.0.function.name", "get weather"),
                 "Invalid 'tools[0].function.name': string does not match pattern.",
                 id="function-name-pattern"),
    pytest.param(setting("tools.0.function.name", "f" * 65),
                 "Invalid 'tools[0].function.name': string too long.",
                 id="function-name-too-long"),
    pytest.param(inserting("tools.1", copy.deepcopy(WEATHER_TOOL)),
                 "duplicate function name 'get_weather'", id="function-name-duplicate"),
    pytest.param(setting("tools.0.function.parameters", {"type": "string"}),
                 "Invalid schema for function 'get_weather': schema must be a JSON Schema of "
                 "'type: \"object\"'", id="parameters-not-object-schema"),
    pytest.param(setting("tools.0.function.parameters", "city: str"),
                 "schema must be a JSON Schema of 'type: \"object\"'", id="parameters-not-dict"),
    pytest.param(deleting("tools.0.function.parameters.additionalProperties"),
                 "In context=(), 'additionalProperties' is required to be supplied and to be "
                 "false.", id="strict-additional-properties-missing"),
    pytest.param(setting("tools.0.function.parameters.additionalProperties", True),
                 "'additionalProperties' is required to be supplied and to be false",
                 id="strict-additional-properties-true"),
    pytest.param(setting("tools.0.function.parameters.required", []),
                 "array including every key in properties. Missing 'city'.",
                 id="strict-required-incomplete"),
    pytest.param(deleting("tools.0.function.parameters.required"), "Missing 'city'.",
                 id="strict-required-missing"),
    pytest.param(both(setting("tools.0.function.parameters.properties.when", NESTED_OBJECT),
                      setting("tools.0.function.parameters.required", ["city", "when"])),
                 "In context=('properties', 'when'), 'additionalProperties' is required",
                 id="strict-nested-object"),
    pytest.param(both(deleting("tools"), deleting("tool_choice")),
                 "'parallel_tool_calls' is only allowed when 'tools' are specified",
                 id="parallel-tool-calls-without-tools"),
    pytest.param(both(deleting("tools"), deleting("parallel_tool_calls")),
                 "'tool_choice' is only allowed when 'tools' are specified",
                 id="tool-choice-without-tools"),
    pytest.param(setting("tool_choice", {"type": "function", "function": {"name": "get_time"}}),
                 "function 'get_time' not found in 'tools'", id="tool-choice-absent-function"),
    pytest.param(setting("tool_choice", "always"), "Invalid value: 'always'.",
                 id="tool-choice-bad-string"),
    # message roles and keys
    pytest.param(setting("messages.0.role", "robot"),
                 "Invalid value: 'robot'. Supported values are: 'system', 'assistant', 'user', "
                 "'function', 'tool', and 'developer'.", id="role-unknown"),
    pytest.param(deleting("messages.1.role"), "Missing required parameter: 'messages[1].role'.",
                 id="role-missing"),
    pytest.param(setting("messages.1.seq", 7),
                 "Additional properties are not allowed ('seq' was unexpected)",
                 id="message-key-seq"),
    pytest.param(setting("messages.3.status", "done"), "('status' was unexpected)",
                 id="tool-message-key-status"),
    pytest.param(setting("messages.2.ref", "r1"), "('ref' was unexpected)",
                 id="assistant-message-key-ref"),
    pytest.param(setting("messages.3.name", "get_weather"), "('name' was unexpected)",
                 id="tool-message-name"),
    pytest.param(setting("messages.1.tool_calls", []), "('tool_calls' was unexpected)",
                 id="user-message-tool-calls"),
    pytest.param(setting("messages.1.name", "Jean Dupont"),
                 "Invalid 'messages[1].name': string does not match pattern.",
                 id="message-name-pattern"),
    # content
    pytest.param(setting("messages.1.content", 42),
                 "Invalid type for 'messages[1].content': expected one of a string or array of "
                 "objects, but got an integer instead.", id="content-integer"),
    pytest.param(setting("messages.1.content", {"text": "hi"}),
                 "Invalid type for 'messages[1].content'", id="content-object"),
    pytest.param(setting("messages.1.content", None), "Invalid type for 'messages[1].content'",
                 id="user-content-null"),
    pytest.param(deleting("messages.1.content"),
                 "Missing required parameter: 'messages[1].content'.", id="user-content-missing"),
    pytest.param(setting("messages.1.content", []), "Invalid 'messages[1].content': empty array.",
                 id="content-empty-array"),
    pytest.param(setting("messages.1.content", ["hi"]),
                 "Invalid type for 'messages[1].content[0]': expected an object",
                 id="content-part-not-object"),
    pytest.param(setting("messages.1.content", [{"text": "hi"}]),
                 "Missing required parameter: 'messages[1].content[0].type'.",
                 id="content-part-untyped"),
    pytest.param(setting("messages.1.content", [{"type": "text", "text": "hi", "ref": "x"}]),
                 "('ref' was unexpected)", id="content-part-extra-key"),
    pytest.param(setting("messages.0.content", [IMAGE_PART]),
                 "Invalid value: 'image_url'. Supported values are: 'text'.",
                 id="system-content-image"),
    pytest.param(setting("messages.5.content", None),
                 "Invalid value for 'content': expected a string, got null.",
                 id="assistant-null-content-without-tool-calls"),
    pytest.param(deleting("messages.5.content"), "expected a string, got null",
                 id="assistant-no-content-without-tool-calls"),
    pytest.param(setting("messages.3.content", [IMAGE_PART]),
                 "Invalid value: 'image_url'. Supported values are: 'text'.",
                 id="tool-content-image"),
    pytest.param(setting("messages.3.content", {"weather": "sunny"}),
                 "Invalid type for 'messages[3].content'", id="tool-content-object"),
    # assistant tool_calls entries
    pytest.param(deleting("messages.2.tool_calls.0.id"),
                 "Missing required parameter: 'messages[2].tool_calls[0].id'.",
                 id="tool-call-no-id"),
    pytest.param(deleting("messages.2.tool_calls.0.type"),
                 "Missing required parameter: 'messages[2].tool_calls[0].type'.",
                 id="tool-call-no-type"),
    pytest.param(setting("messages.2.tool_calls.0.type", "custom"),
                 "Invalid value: 'custom'. Supported values are: 'function'.",
                 id="tool-call-type-not-function"),
    pytest.param(deleting("messages.2.tool_calls.0.function.name"),
                 "Missing required parameter: 'messages[2].tool_calls[0].function.name'.",
                 id="tool-call-no-function-name"),
    pytest.param(setting("messages.2.tool_calls.0.function.arguments", {"city": "Paris"}),
                 "Invalid type for 'messages[2].tool_calls[0].function.arguments': expected a "
                 "string, but got an object instead.", id="tool-call-arguments-object"),
    pytest.param(setting("messages.2.tool_calls.0.index", 0), "('index' was unexpected)",
                 id="tool-call-stream-index-left-in"),
    pytest.param(setting("messages.2.tool_calls", []),
                 "Invalid 'messages[2].tool_calls': empty array.", id="tool-calls-empty"),
    pytest.param(both(setting("messages.2.tool_calls.1.id", "call_a"), deleting("messages.4")),
                 "duplicate tool call id 'call_a'", id="tool-call-duplicate-id"),
    # tool messages and the call/response protocol
    pytest.param(deleting("messages.3.tool_call_id"),
                 "Missing required parameter: 'messages[3].tool_call_id'.",
                 id="tool-message-no-call-id"),
    pytest.param(setting("messages.2", {"role": "assistant", "content": "Let me check."}),
                 "messages with role 'tool' must be a response to a preceding message with "
                 "'tool_calls'", id="tool-after-plain-assistant"),
    pytest.param(inserting("messages.2", {"role": "tool", "tool_call_id": "call_a",
                                          "content": "x"}),
                 "must be a response to a preceding message with 'tool_calls'",
                 id="tool-after-user"),
    pytest.param(inserting("messages.7", {"role": "tool", "tool_call_id": "call_a",
                                          "content": "again"}),
                 "must be a response to a preceding message with 'tool_calls'",
                 id="tool-answering-an-earlier-turn"),
    pytest.param(setting("messages.4.tool_call_id", "call_zzz"),
                 "'tool_call_id' of 'call_zzz' not found in 'tool_calls' of previous message",
                 id="tool-answering-unknown-call"),
    pytest.param(deleting("messages.4"),
                 "An assistant message with 'tool_calls' must be followed by tool messages "
                 "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                 "response messages: call_b", id="tool-response-missing"),
    pytest.param(inserting("messages.3", user("wait")),
                 "did not have response messages: call_a, call_b",
                 id="user-between-call-and-responses"),
    pytest.param(lambda b: {**b, "messages": b["messages"][:3]},
                 "did not have response messages: call_a, call_b",
                 id="tool-responses-missing-at-end"),
]

VALID_BODIES = [
    pytest.param({"model": "gpt-4o-mini", "messages": [user("hi")]}, id="minimal"),
    pytest.param(valid_body(), id="full-tool-round"),
    pytest.param(
        {"model": "m", "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "rules"}], "name": "ops"},
            {"role": "user", "content": [{"type": "text", "text": "look"}, IMAGE_PART],
             "name": "jean-dupont_2"},
        ], "temperature": None, "stop": None, "stream": None, "stream_options": None,
         "tool_choice": None, "parallel_tool_calls": None, "n": 1, "seed": 3,
         "max_completion_tokens": 50, "response_format": {"type": "json_object"},
         "metadata": {"k": "v"}, "store": False, "user": "u1", "prompt_cache_key": "k"},
        id="parts-and-null-optional-params",
    ),
    pytest.param(
        both(
            setting("messages.2.content", ""),
            setting("messages.2.refusal", None),
            setting("messages.3", {"role": "tool", "tool_call_id": "call_b",
                                   "content": [{"type": "text", "text": "rainy"}]}),
            setting("messages.4.tool_call_id", "call_a"),
            setting("tool_choice", {"type": "function", "function": {"name": "get_weather"}}),
        )(valid_body()),
        id="responses-out-of-order-and-named-tool-choice",
    ),
    pytest.param(
        {"model": "m", "tools": [
            {"type": "function", "function": {"name": "noop"}},
            {"type": "function", "function": {"name": "empty", "parameters": {}}},
            {"type": "function", "function": {"name": "loose", "parameters": {
                "type": "object", "properties": {"q": {"type": "string"}}}}},
        ], "tool_choice": "required", "messages": [
            user("go"),
            {"role": "assistant", "tool_calls": [call("c1", "noop", "{}")]},
            {"role": "tool", "tool_call_id": "c1", "content": "done"},
            {"role": "assistant", "content": None, "tool_calls": [call("c2", "loose", "{}")]},
            {"role": "tool", "tool_call_id": "c2", "content": "done too"},
        ]},
        id="non-strict-schemas-and-two-tool-rounds",
    ),
    pytest.param(
        {"model": "m", "messages": [
            user("hi"),
            {"role": "assistant", "content": None,
             "function_call": {"name": "f", "arguments": "{}"}},
            {"role": "function", "name": "f", "content": "result"},
        ]},
        id="legacy-function-call",
    ),
]


# --------------------------------------------------------------------------------------------
# The official SDK accepts what the fake answers
# --------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_non_streaming_completion(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    completion = await sdk.chat.completions.create(
        model="gpt-4o-mini", messages=[user("hello")]
    )

    assert completion.id.startswith("chatcmpl-")
    assert completion.object == "chat.completion"
    assert completion.model == "gpt-4o-mini"
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "reply to: hello"
    assert choice.message.tool_calls is None
    assert choice.finish_reason == "stop"
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens > 0 and usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert fake.chat_requests() == [{"model": "gpt-4o-mini", "messages": [user("hello")]}]


@pytest.mark.asyncio
async def test_streaming_text(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    fake.enqueue(Reply.text("Hello, world!", chunk_size=4))

    stream = await sdk.chat.completions.create(
        model="gpt-4o-mini", messages=[user("hi")], stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]

    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    first = chunks[0].choices[0].delta
    assert (first.role, first.content) == ("assistant", "")
    pieces = [c.choices[0].delta.content for c in chunks[1:] if c.choices and c.choices[0].delta.content]
    assert pieces == ["Hell", "o, w", "orld", "!"]
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens > 0


@pytest.mark.asyncio
async def test_streaming_is_real_sse(fake: FakeUpstream, session: aiohttp.ClientSession) -> None:
    body = {"model": "gpt-4o-mini", "messages": [user("hi")], "stream": True}
    async with session.post(f"{fake.base_url}/chat/completions", json=body, headers=AUTH) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        raw = await resp.text()

    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    assert all(event.startswith("data: ") for event in events[:-1])
    chunks = [json.loads(event[len("data: "):]) for event in events[:-2]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all("usage" not in chunk for chunk in chunks)  # no include_usage, no usage chunk
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == "reply to: hi"


@pytest.mark.asyncio
async def test_streaming_parallel_tool_calls_reassemble(
    fake: FakeUpstream, sdk: AsyncOpenAI
) -> None:
    reply = Reply.tool_calls(
        [("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Rome"}')]
    )
    fake.enqueue(reply)

    stream = await sdk.chat.completions.create(
        model="gpt-4o-mini", messages=[user("weather?")], tools=[WEATHER_TOOL], stream=True
    )
    calls: dict[int, dict[str, Any]] = {}
    fragments = 0
    finish_reason = None
    async for chunk in stream:
        choice = chunk.choices[0]
        finish_reason = choice.finish_reason or finish_reason
        for delta in choice.delta.tool_calls or []:
            if delta.id:  # the first delta of a call names it
                assert delta.index not in calls and delta.function.arguments == ""
                calls[delta.index] = {"id": delta.id, "name": delta.function.name, "args": ""}
            else:
                fragments += 1
                calls[delta.index]["args"] += delta.function.arguments

    assert finish_reason == "tool_calls"
    assert sorted(calls) == [0, 1]
    assert [(c["id"], c["name"], c["args"]) for c in calls.values()] == [
        (c.id, c.name, c.arguments) for c in reply.calls
    ]
    assert all(c["id"].startswith("call_") for c in calls.values())
    assert fragments > 2  # arguments really arrive in pieces


@pytest.mark.asyncio
async def test_tool_loop(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    fake.enqueue(
        Reply.tool_calls([("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Rome"}')]),
        Reply.text("Sunny in Paris, rainy in Rome."),
    )
    messages: list[Any] = [user("Weather in Paris and Rome?")]

    first = await sdk.chat.completions.create(
        model="gpt-4o-mini", messages=messages, tools=[WEATHER_TOOL]
    )
    assistant = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    assert assistant.content is None and assistant.tool_calls is not None
    messages.append(assistant)  # the SDK object itself, as client code commonly does
    for tool_call in assistant.tool_calls:
        city = json.loads(tool_call.function.arguments)["city"]
        messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": f"{city}: ok"})
    second = await sdk.chat.completions.create(
        model="gpt-4o-mini", messages=messages, tools=[WEATHER_TOOL]
    )

    assert second.choices[0].message.content == "Sunny in Paris, rainy in Rome."
    assert len(fake.chat_requests()) == 2
    assert [m["role"] for m in fake.chat_requests()[1]["messages"]] == [
        "user", "assistant", "tool", "tool"
    ]


@pytest.mark.asyncio
async def test_sdk_sees_refusals_as_bad_request(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        await sdk.chat.completions.create(
            model="gpt-4o-mini", messages=[user("hi")], extra_body={"_meta": {"turn": 1}}
        )
    assert refused.value.status_code == 400
    assert refused.value.type == "invalid_request_error"
    assert "Unrecognized request argument supplied: _meta" in refused.value.message


@pytest.mark.asyncio
async def test_models_list(sdk: AsyncOpenAI) -> None:
    models = [model async for model in sdk.models.list()]
    assert "gpt-4o-mini" in [m.id for m in models]
    assert all(m.object == "model" and m.owned_by == "fake" for m in models)


# --------------------------------------------------------------------------------------------
# Strictness
# --------------------------------------------------------------------------------------------


def test_the_base_of_every_refusal_case_is_valid() -> None:
    # Without this, a validator refusing everything would pass every refusal test.
    assert validate_chat_request(valid_body()) is None


@pytest.mark.parametrize("body", VALID_BODIES)
def test_valid_bodies_are_accepted(body: dict) -> None:
    assert validate_chat_request(body) is None


@pytest.mark.parametrize("mutate, expected", REFUSALS)
def test_validator_refuses(mutate: Mutation, expected: str) -> None:
    message = validate_chat_request(mutate(valid_body()))
    assert message is not None and expected in message


@pytest.mark.asyncio
@pytest.mark.parametrize("mutate, expected", REFUSALS)
async def test_http_refuses_with_openai_error(
    fake: FakeUpstream, session: aiohttp.ClientSession, mutate: Mutation, expected: str
) -> None:
    async with session.post(
        f"{fake.base_url}/chat/completions", json=mutate(valid_body()), headers=AUTH
    ) as resp:
        status, payload = resp.status, await resp.json()

    assert status == 400
    assert set(payload) == {"error"}
    error = payload["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert expected in error["message"]
    assert fake.chat_requests() == []
    assert [r.status_sent for r in fake.requests] == [400]


@pytest.mark.asyncio
async def test_unparsable_json_is_refused(fake: FakeUpstream, session: aiohttp.ClientSession) -> None:
    async with session.post(
        f"{fake.base_url}/chat/completions", data=b"{not json", headers=AUTH
    ) as resp:
        assert resp.status == 400
        assert "could not parse the JSON body" in (await resp.json())["error"]["message"]
    assert fake.requests[0].body == b"{not json"


@pytest.mark.asyncio
async def test_refused_requests_do_not_consume_the_queue(
    fake: FakeUpstream, sdk: AsyncOpenAI
) -> None:
    fake.enqueue(Reply.text("scripted"))
    with pytest.raises(openai.BadRequestError):
        await sdk.chat.completions.create(model="m", messages=[user("x")], extra_body={"seq": 1})

    completion = await sdk.chat.completions.create(model="m", messages=[user("x")])

    assert completion.choices[0].message.content == "scripted"
    assert len(fake.chat_requests()) == 1


@pytest.mark.asyncio
@pytest.mark.parametrize("authorization", [None, "Basic c2stdGVzdA==", "Bearer ", "sk-test"])
@pytest.mark.parametrize(
    "method, path",
    [("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("POST", "/v1/embeddings")],
)
async def test_missing_bearer_is_401(
    fake: FakeUpstream, session: aiohttp.ClientSession, authorization: str | None, method: str,
    path: str,
) -> None:
    headers = {"Authorization": authorization} if authorization is not None else {}
    url = f"http://127.0.0.1:{fake.port}{path}"
    async with session.request(method, url, json={"model": "m", "messages": [user("hi")]},
                            headers=headers) as resp:
        status, payload = resp.status, await resp.json()

    assert status == 401
    assert payload["error"]["type"] == "invalid_request_error"
    assert payload["error"]["code"] == "invalid_api_key"
    assert fake.chat_requests() == []
    assert fake.requests[0].status_sent == 401


# --------------------------------------------------------------------------------------------
# Other endpoints
# --------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_other_paths_are_echoed(fake: FakeUpstream, session: aiohttp.ClientSession) -> None:
    sent = '{"model": "text-embedding-3-small", "input": "hi"}'
    async with session.post(
        f"{fake.base_url}/embeddings?dims=8", data=sent,
        headers={**AUTH, "Content-Type": "application/json", "X-Trace": "t-1"},
    ) as resp:
        assert resp.status == 200
        echo = await resp.json()

    assert echo["path"] == "/v1/embeddings"
    assert echo["method"] == "POST"
    assert echo["query"] == {"dims": "8"}
    assert echo["body"] == sent
    assert echo["headers_seen"]["authorization"] is True
    assert echo["headers_seen"]["x-trace"] == "t-1"


@pytest.mark.asyncio
async def test_requests_are_recorded(fake: FakeUpstream, session: aiohttp.ClientSession) -> None:
    await session.get(f"{fake.base_url}/anything/deeper?a=1", headers=AUTH)
    await session.post(f"{fake.base_url}/chat/completions", json={"model": "m"}, headers=AUTH)
    await session.post(f"{fake.base_url}/chat/completions",
                    json={"model": "m", "messages": [user("hi")]}, headers=AUTH)

    first, refused, served = fake.requests
    assert (first.method, first.path, first.query, first.body) == (
        "GET", "/v1/anything/deeper", {"a": "1"}, None
    )
    assert first.headers["authorization"] == "Bearer sk-test"  # names are lower-cased
    assert (refused.body, refused.status_sent) == ({"model": "m"}, 400)
    assert served.status_sent == 200
    assert fake.chat_requests() == [served.body]


# --------------------------------------------------------------------------------------------
# Scripting
# --------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_queue_is_fifo_then_responder(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    fake.enqueue(Reply.text("one"), Reply.text("two"))
    fake.responder = lambda body: Reply.text(f"model was {body['model']}")

    answers = [
        (await sdk.chat.completions.create(model="m1", messages=[user("x")]))
        .choices[0].message.content
        for _ in range(3)
    ]

    assert answers == ["one", "two", "model was m1"]


@pytest.mark.asyncio
async def test_reset(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    fake.enqueue(Reply.text("stale"))
    fake.responder = lambda body: Reply.text("custom")
    await sdk.chat.completions.create(model="m", messages=[user("x")])

    fake.reset()
    completion = await sdk.chat.completions.create(model="m", messages=[user("fresh")])

    assert completion.choices[0].message.content == "reply to: fresh"
    assert len(fake.requests) == 1 and len(fake.chat_requests()) == 1


@pytest.mark.asyncio
async def test_error_reply(fake: FakeUpstream, session: aiohttp.ClientSession) -> None:
    error = {"error": {"message": "Rate limit reached", "type": "requests", "param": None,
                       "code": "rate_limit_exceeded"}}
    fake.enqueue(Reply.error(429, error))

    body = {"model": "m", "messages": [user("hi")], "stream": True}
    async with session.post(f"{fake.base_url}/chat/completions", json=body, headers=AUTH) as resp:
        assert resp.status == 429
        assert await resp.json() == error


@pytest.mark.asyncio
async def test_stream_pauses_until_released(
    fake: FakeUpstream, session: aiohttp.ClientSession
) -> None:
    reply = Reply.text("abcdefgh", chunk_size=2, pause_after_chunks=3)
    fake.enqueue(reply)
    body = {"model": "m", "messages": [user("hi")], "stream": True}

    async with session.post(f"{fake.base_url}/chat/completions", json=body, headers=AUTH) as resp:
        assert await wait_for_event(reply.reached)
        before = [json.loads(await read_sse_event(resp)) for _ in range(3)]
        held = asyncio.ensure_future(read_sse_event(resp))
        with pytest.raises(asyncio.TimeoutError):  # a bounded check that nothing else comes
            await asyncio.wait_for(asyncio.shield(held), 0.2)
        reply.release()  # from this thread, not the server's
        after = [await held] + [await read_sse_event(resp) for _ in range(3)]

    assert [c["choices"][0]["delta"].get("content") for c in before] == ["", "ab", "cd"]
    assert [json.loads(e)["choices"][0]["delta"].get("content") for e in after[:2]] == ["ef", "gh"]
    assert json.loads(after[2])["choices"][0]["finish_reason"] == "stop"
    assert after[3] == "[DONE]"
    assert not reply.client_gone.is_set()


@pytest.mark.asyncio
async def test_released_before_the_pause_point_does_not_pause(
    fake: FakeUpstream, sdk: AsyncOpenAI
) -> None:
    reply = Reply.text("done", pause_after_chunks=1)
    reply.release()
    fake.enqueue(reply)

    stream = await sdk.chat.completions.create(model="m", messages=[user("x")], stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    assert text == "done" and reply.reached.is_set()


@pytest.mark.asyncio
async def test_non_streaming_pause(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    reply = Reply.text("late", pause_after_chunks=0)
    fake.enqueue(reply)

    pending = asyncio.ensure_future(
        sdk.chat.completions.create(model="m", messages=[user("x")])
    )
    assert await wait_for_event(reply.reached)
    assert not pending.done()
    reply.release()

    completion = await asyncio.wait_for(pending, WAIT)
    assert completion.choices[0].message.content == "late"


@pytest.mark.asyncio
async def test_client_disconnecting_mid_stream_is_noticed(fake: FakeUpstream) -> None:
    reply = Reply.text("abcdefgh", chunk_size=2, pause_after_chunks=2)
    fake.enqueue(reply)
    body = {"model": "m", "messages": [user("hi")], "stream": True}

    async with aiohttp.ClientSession() as session:
        resp = await session.post(f"{fake.base_url}/chat/completions", json=body, headers=AUTH)
        assert await wait_for_event(reply.reached)
        resp.close()  # drops the connection mid-stream

    assert await wait_for_event(reply.client_gone)
    reply.release()  # harmless once the client is gone


@pytest.mark.asyncio
async def test_hang_until_client_leaves(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    reply = Reply.hang()
    fake.enqueue(reply)

    pending = asyncio.ensure_future(
        sdk.chat.completions.create(model="m", messages=[user("x")])
    )
    assert await wait_for_event(reply.reached)
    assert fake.requests[-1].status_sent == 0  # nothing was answered
    assert len(fake.chat_requests()) == 1  # but it was a valid request
    pending.cancel()

    assert await wait_for_event(reply.client_gone)
    completion = await sdk.chat.completions.create(model="m", messages=[user("next")])
    assert completion.choices[0].message.content == "reply to: next"


@pytest.mark.asyncio
async def test_releasing_a_hang_drops_the_connection(
    fake: FakeUpstream, session: aiohttp.ClientSession
) -> None:
    hang = Reply.hang()
    fake.enqueue(hang)
    body = {"model": "m", "messages": [user("x")]}

    pending = asyncio.ensure_future(
        session.post(f"{fake.base_url}/chat/completions", json=body, headers=AUTH)
    )
    assert await wait_for_event(hang.reached)
    hang.release()

    with pytest.raises(aiohttp.ServerDisconnectedError):
        await asyncio.wait_for(pending, WAIT)
    assert [r.status_sent for r in fake.requests] == [0]  # no answer, and no retry
    assert not hang.client_gone.is_set()


@pytest.mark.asyncio
async def test_close_ends_hangs_and_pauses_promptly() -> None:
    fake = FakeUpstream()
    await fake.start()  # on this test's loop, as a conftest may do as well
    hang, paused = Reply.hang(), Reply.text("abc", pause_after_chunks=1)
    fake.enqueue(hang, paused)
    stream_body = {"model": "m", "messages": [user("x")], "stream": True}

    async with aiohttp.ClientSession() as session:
        url = f"{fake.base_url}/chat/completions"
        hanging = asyncio.ensure_future(session.post(url, json=stream_body, headers=AUTH))
        assert await wait_for_event(hang.reached)
        streaming = await session.post(url, json=stream_body, headers=AUTH)
        assert await wait_for_event(paused.reached)

        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.wait_for(fake.close(), WAIT)
        assert loop.time() - started < 1.0  # not the 2 s shutdown timeout

        with pytest.raises(aiohttp.ClientError):
            await asyncio.wait_for(hanging, WAIT)
        with pytest.raises(aiohttp.ClientError):
            await asyncio.wait_for(streaming.read(), WAIT)
    assert not hang.client_gone.is_set() and not paused.client_gone.is_set()


@pytest.mark.asyncio
@pytest.mark.parametrize("include_usage", [False, True])
async def test_a_chat_stream_that_never_ends(fake: FakeUpstream, include_usage: bool) -> None:
    reply = Reply.text("abcd", chunk_size=2).never_ending()
    fake.enqueue(reply)
    body = {"model": "m", "messages": [user("hi")], "stream": True,
            "stream_options": {"include_usage": include_usage}}

    async with aiohttp.ClientSession() as session:
        resp = await session.post(f"{fake.base_url}/chat/completions", json=body, headers=AUTH)
        assert await wait_for_event(reply.reached)
        chunks = [json.loads(await read_sse_event(resp)) for _ in range(3)]  # role, "ab", "cd"
        held = asyncio.ensure_future(read_sse_event(resp))
        with pytest.raises(asyncio.TimeoutError):  # no finish_reason, usage or [DONE]
            await asyncio.wait_for(asyncio.shield(held), 0.2)
        resp.close()

    assert [c["choices"][0]["delta"].get("content") for c in chunks] == ["", "ab", "cd"]
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks)
    assert await wait_for_event(reply.client_gone)


@pytest.mark.asyncio
async def test_a_chat_stream_held_open_after_its_end(fake: FakeUpstream) -> None:
    reply = Reply.text("ab").held_open()
    fake.enqueue(reply)
    body = {"model": "m", "messages": [user("hi")], "stream": True}

    async with aiohttp.ClientSession() as session:
        resp = await session.post(f"{fake.base_url}/chat/completions", json=body, headers=AUTH)
        assert await wait_for_event(reply.reached)
        events = [await read_sse_event(resp) for _ in range(4)]  # role, "ab", the finish, [DONE]
        held = asyncio.ensure_future(resp.content.read(1))
        with pytest.raises(asyncio.TimeoutError):  # the body never ends
            await asyncio.wait_for(asyncio.shield(held), 0.2)
        resp.close()

    assert events[-1] == "[DONE]" and json.loads(events[2])["choices"][0]["finish_reason"] == "stop"
    assert await wait_for_event(reply.client_gone)


@pytest.mark.asyncio
async def test_releasing_a_never_ending_chat_stream_drops_it(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    reply = Reply.text("abc").never_ending()
    fake.enqueue(reply)

    async def consume() -> str:
        stream = await sdk.chat.completions.create(model="m", messages=[user("x")], stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    pending = asyncio.ensure_future(consume())
    assert await wait_for_event(reply.reached)
    reply.release()
    with pytest.raises(openai.APIError):
        await asyncio.wait_for(pending, WAIT)


@pytest.mark.asyncio
async def test_an_error_event_mid_chat_stream(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    fake.enqueue(Reply.text("abcdefgh", chunk_size=2).failing_after(2))
    stream = await sdk.chat.completions.create(model="m", messages=[user("x")], stream=True)
    seen: list[str] = []

    with pytest.raises(openai.APIError, match="server had an error"):
        async for chunk in stream:
            seen.append(chunk.choices[0].delta.content or "")
    assert seen == ["", "ab"]


@pytest.mark.asyncio
async def test_a_failing_non_streaming_chat_reply_is_a_500(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    fake.enqueue(Reply.text("x").failing_after(1))
    with pytest.raises(openai.InternalServerError):
        await sdk.chat.completions.create(model="m", messages=[user("x")])
