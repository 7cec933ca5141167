"""Tests of the fake's Responses API: the clients users run (the openai SDK, the Agents SDK on its
default model, Codex's recorded requests) must work against it, and it must refuse what the real
API refuses (RESPONSES-RULES.md), or the proxy's Responses tests prove nothing."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool
from openai import AsyncOpenAI

from tests.fakes.fake_responses import SEAL_PREFIX
from tests.fakes.fake_upstream import FakeUpstream, Reply, last_user_text
from tests.fakes.test_fake_upstream import AUTH, WAIT, wait_for_event
from tests.fakes.test_fake_upstream import WEATHER_TOOL as CHAT_WEATHER_TOOL

SHARED_SAMPLE = Path("/work/shared/samples/codex-request.json")
RECORDED = Path(__file__).resolve().parents[1] / "samples" / "codex-session.json"

# The chat tests' tool in the Responses form: flat, no "function" wrapper.
WEATHER_TOOL = {"type": "function", **CHAT_WEATHER_TOOL["function"]}


# --------------------------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------------------------


async def post(session: aiohttp.ClientSession, fake: FakeUpstream, body: Any) -> tuple[int, Any]:
    async with session.post(f"{fake.base_url}/responses", json=body, headers=AUTH) as resp:
        return resp.status, await resp.json()


async def read_events(response: aiohttp.ClientResponse) -> list[tuple[str, dict]]:
    """Every (event line, data) pair of an SSE response, checking the framing as it goes."""
    events = []
    while True:
        line = await asyncio.wait_for(response.content.readline(), WAIT)
        if not line:
            return events
        data = await asyncio.wait_for(response.content.readline(), WAIT)
        blank = await asyncio.wait_for(response.content.readline(), WAIT)
        assert line.startswith(b"event: ") and data.startswith(b"data: ") and blank == b"\n"
        events.append((line[len(b"event: ") : -1].decode(), json.loads(data[len(b"data: ") :])))


async def stream_events(session: aiohttp.ClientSession, fake: FakeUpstream, body: dict) -> list[dict]:
    async with session.post(f"{fake.base_url}/responses", json={**body, "stream": True}, headers=AUTH) as resp:
        assert resp.status == 200, await resp.text()
        pairs = await read_events(resp)
    assert all(name == data["type"] for name, data in pairs)
    return [data for _, data in pairs]


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def output_of(response: Any) -> list[dict]:
    """A response's output items as a client replays them (the SDK's model_dump, or raw dicts)."""
    items = response["output"] if isinstance(response, dict) else response.output
    return [item if isinstance(item, dict) else item.model_dump(exclude_none=True) for item in items]


def output_for(call: dict, text: str) -> dict:
    return {"type": "function_call_output", "call_id": call["call_id"], "output": text}


# --------------------------------------------------------------------------------------------
# The openai SDK
# --------------------------------------------------------------------------------------------


async def test_non_streaming_text(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    fake.enqueue(Reply.text("Hello there"))

    response = await sdk.responses.create(model="gpt-4o-mini", input="Say hi", instructions="Be brief.")

    assert response.object == "response" and response.status == "completed"
    assert response.id.startswith("resp_") and response.model == "gpt-4o-mini"
    assert response.output_text == "Hello there"
    [message] = response.output
    assert message.type == "message" and message.id.startswith("msg_") and message.role == "assistant"
    usage = response.usage
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 0
    assert fake.responses_requests()[0]["instructions"] == "Be brief."


async def test_the_default_responder_answers_the_last_user_text(sdk: AsyncOpenAI) -> None:
    response = await sdk.responses.create(model="m", input=[user("first"), user("second")])
    assert response.output_text == "reply to: second"


async def test_streaming_text_through_the_sdk(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    fake.enqueue(Reply.text("abcdefghij", chunk_size=3))

    stream = await sdk.responses.create(model="m", input="hi", stream=True)
    events = [event async for event in stream]

    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert deltas == ["abc", "def", "ghi", "j"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert events[-1].response.output_text == "abcdefghij"


async def test_stream_is_real_sse_in_the_real_order(fake: FakeUpstream, session: aiohttp.ClientSession) -> None:
    fake.enqueue(Reply.tool_calls([("get_weather", '{"city": "Paris"}')], "Let me check.", reasoning="Think."))

    events = await stream_events(session, fake, {"model": "m", "input": "weather?", "tools": [WEATHER_TOOL]})

    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    kinds = [e["type"] for e in events]
    reasoning_done, message_done, call_done = [i for i, k in enumerate(kinds) if k == "response.output_item.done"]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert "response.reasoning_summary_text.delta" in kinds[:reasoning_done]
    assert kinds[reasoning_done + 1 : reasoning_done + 3] == [
        "response.output_item.added", "response.content_part.added"
    ]
    assert kinds[message_done - 3 : message_done] == [
        "response.output_text.delta", "response.output_text.done", "response.content_part.done"
    ]
    assert kinds[message_done + 2 : call_done - 1] == ["response.function_call_arguments.delta"] * 5
    assert kinds[call_done - 1 :] == [
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"
    ]
    completed = events[-1]["response"]
    assert [item["type"] for item in completed["output"]] == ["reasoning", "message", "function_call"]
    assert [e["output_index"] for e in events if e["type"] == "response.output_item.added"] == [0, 1, 2]
    added_call = events[message_done + 1]["item"]
    assert added_call["status"] == "in_progress" and added_call["arguments"] == ""
    arguments = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    assert arguments == '{"city": "Paris"}' == completed["output"][2]["arguments"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []


async def test_stream_helper_assembles_a_tool_call(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    fake.enqueue(Reply.tool_calls([("get_weather", '{"city": "Rome"}'), ("get_weather", '{"city": "Oslo"}')]))

    async with sdk.responses.stream(model="m", input="weather?", tools=[WEATHER_TOOL]) as stream:
        done = [event.arguments async for event in stream if event.type == "response.function_call_arguments.done"]
        final = await stream.get_final_response()

    calls = [item for item in final.output if item.type == "function_call"]
    assert done == [c.arguments for c in calls] == ['{"city": "Rome"}', '{"city": "Oslo"}']
    assert all(c.id.startswith("fc") and c.call_id.startswith("call_") and c.status == "completed" for c in calls)


async def test_reasoning_comes_first_and_encrypted_only_when_included(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    fake.enqueue(Reply.text("42", reasoning="Six times seven."), Reply.text("42", reasoning="Again."))

    plain = await sdk.responses.create(model="m", input="?")
    included = await sdk.responses.create(model="m", input="?", include=["reasoning.encrypted_content"])

    for response in (plain, included):
        reasoning, message = response.output
        assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_")
        assert message.type == "message"
    assert plain.output[0].summary[0].text == "Six times seven."
    assert plain.output[0].encrypted_content is None
    assert included.output[0].encrypted_content.startswith(SEAL_PREFIX)
    assert included.usage.output_tokens_details.reasoning_tokens > 0


async def test_tool_loop_with_full_history_and_store_false(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    """As Codex does: nothing stored, everything resent, reasoning with its encrypted content."""
    fake.enqueue(Reply.tool_calls([("get_weather", '{"city": "Paris"}')], reasoning="Look it up."), Reply.text("Sunny."))
    settings: dict[str, Any] = {"model": "m", "tools": [WEATHER_TOOL], "store": False,
                                "include": ["reasoning.encrypted_content"]}
    history = [user("Weather in Paris?")]

    first = await sdk.responses.create(input=history, **settings)
    history += output_of(first)
    history.append(output_for(history[-1], "sunny, 21 C"))
    second = await sdk.responses.create(input=history, **settings)

    assert second.output_text == "Sunny."
    assert [item.get("type") for item in fake.responses_requests()[1]["input"]] == [
        "message", "reasoning", "function_call", "function_call_output"
    ]
    with pytest.raises(openai.BadRequestError, match="not found"):  # store: false kept nothing
        await sdk.responses.create(model="m", previous_response_id=first.id, input="and?")


async def test_tool_loop_with_previous_response_id(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    fake.enqueue(Reply.tool_calls([("get_weather", '{"city": "Paris"}')], reasoning="Look it up."), Reply.text("Sunny."))

    first = await sdk.responses.create(model="m", input="Weather in Paris?", tools=[WEATHER_TOOL])
    call = output_of(first)[-1]
    second = await sdk.responses.create(
        model="m", previous_response_id=first.id, input=[output_for(call, "sunny")], tools=[WEATHER_TOOL]
    )

    assert second.output_text == "Sunny." and second.previous_response_id == first.id
    # The server holds the chain: the new request named only the output, the model saw it all.
    assert [item.get("type", "message") for item in fake.responses.stored(second.id)] == [
        "message", "reasoning", "function_call", "function_call_output", "message"
    ]
    assert second.usage.input_tokens > first.usage.input_tokens


async def test_previous_response_id_and_item_reference_resolve(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    first = await sdk.responses.create(model="m", input="one")
    second = await sdk.responses.create(model="m", previous_response_id=first.id, input="two")
    third = await sdk.responses.create(model="m", input=[{"type": "item_reference", "id": second.output[0].id}, user("three")])

    chain = fake.responses.stored(second.id)
    assert [last_user_text({"input": chain[: i + 1]}) for i in (0, 2)] == ["one", "two"]
    assert chain[1]["content"][0]["text"] == "reply to: one"
    referenced = fake.responses.stored(third.id)[0]  # the reference, resolved to the item
    assert referenced["id"] == second.output[0].id and referenced["content"][0]["text"] == "reply to: two"


async def test_cached_tokens_count_the_prefix_shared_with_the_previous_prompt(sdk: AsyncOpenAI) -> None:
    history = [user("A long task description " * 20)]
    first = await sdk.responses.create(model="m", input=history, prompt_cache_key="s1", tools=[WEATHER_TOOL])
    history += output_of(first) + [user("next")]
    extended = await sdk.responses.create(model="m", input=history, prompt_cache_key="s1", tools=[WEATHER_TOOL])
    changed = await sdk.responses.create(model="m", input=[user("other")] + history[1:], prompt_cache_key="s1",
                                         tools=[WEATHER_TOOL])

    assert extended.usage.input_tokens_details.cached_tokens == first.usage.input_tokens
    # The tools and instructions come first: only they are still shared.
    assert 0 < changed.usage.input_tokens_details.cached_tokens < first.usage.input_tokens


async def test_input_tokens_count_tools_and_every_item(sdk: AsyncOpenAI) -> None:
    bare = await sdk.responses.create(model="m", input="hi")
    with_tools = await sdk.responses.create(model="m", input="hi", tools=[WEATHER_TOOL])
    longer = await sdk.responses.create(model="m", input=[user("hi"), user("x" * 400)])

    assert with_tools.usage.input_tokens > bare.usage.input_tokens
    assert longer.usage.input_tokens >= bare.usage.input_tokens + 100


async def test_one_queue_serves_every_format(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    fake.enqueue(Reply.text("first"), Reply.text("second"))

    chat = await sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
    response = await sdk.responses.create(model="m", input="b")

    assert chat.choices[0].message.content == "first" and response.output_text == "second"
    assert len(fake.chat_requests()) == len(fake.responses_requests()) == 1


def test_last_user_text_reads_every_format() -> None:
    chat = {"messages": [{"role": "user", "content": "chat"}, {"role": "assistant", "content": "x"}]}
    responses = {"input": [user("responses"), {"type": "function_call_output", "call_id": "c", "output": "o"}]}
    messages = {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "messages"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"}]},
    ]}
    assert [last_user_text(b) for b in (chat, responses, messages)] == ["chat", "responses", "messages"]
    assert last_user_text({"input": "plain"}) == "plain" and last_user_text({"input": []}) == ""


# --------------------------------------------------------------------------------------------
# The Agents SDK on its default model
# --------------------------------------------------------------------------------------------


async def test_agents_sdk_completes_a_function_tool_loop(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    seen: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather of a city."""
        seen.append(city)
        return f"sunny in {city}"

    fake.enqueue(
        Reply.tool_calls([("get_weather", '{"city": "Paris"}')], reasoning="I should look it up."),
        Reply.text("It is sunny in Paris."),
    )
    model = OpenAIResponsesModel("gpt-4o-mini", openai_client=sdk)
    agent = Agent(name="weather", instructions="Answer with the tool.", tools=[get_weather], model=model)

    result = await Runner.run(agent, "Weather in Paris?", run_config=RunConfig(tracing_disabled=True))

    assert result.final_output == "It is sunny in Paris." and seen == ["Paris"]
    first, second = fake.responses_requests()
    assert first["tools"][0]["name"] == "get_weather" and first["instructions"] == "Answer with the tool."
    replayed = second["input"]
    assert [item.get("type", "message") for item in replayed] == [
        "message", "reasoning", "function_call", "function_call_output"
    ]
    assert replayed[-1]["output"] == "sunny in Paris" and replayed[-1]["call_id"] == replayed[2]["call_id"]


async def test_agents_sdk_continues_with_previous_response_id(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    @function_tool
    def get_weather(city: str) -> str:
        """Current weather of a city."""
        return "rainy"

    fake.enqueue(Reply.tool_calls([("get_weather", '{"city": "Oslo"}')]), Reply.text("Rainy."))
    agent = Agent(name="w", tools=[get_weather], model=OpenAIResponsesModel("gpt-4o-mini", openai_client=sdk))

    result = await Runner.run(agent, "Oslo?", auto_previous_response_id=True, run_config=RunConfig(tracing_disabled=True))

    assert result.final_output == "Rainy."
    second = fake.responses_requests()[1]
    assert second["previous_response_id"] and [i["type"] for i in second["input"]] == ["function_call_output"]


# --------------------------------------------------------------------------------------------
# Codex's requests
# --------------------------------------------------------------------------------------------


def codex_first_body() -> dict:
    return copy.deepcopy(json.loads(SHARED_SAMPLE.read_text())["first_request"]["body"])


def item_kinds(items: list[dict]) -> list[str]:
    """Items named as the shared sample lists them: 'message:<role>' or the type."""
    return [f"message:{i['role']}" if i.get("type", "message") == "message" else i["type"] for i in items]


async def test_codex_sample_requests_pass_unchanged(fake: FakeUpstream, session: aiohttp.ClientSession) -> None:
    """The first request as Codex sent it, then its later requests in the shapes the sample
    lists, built as Codex builds them: everything resent, reasoning echoed with content null."""
    sample = json.loads(SHARED_SAMPLE.read_text())
    body = codex_first_body()
    fake.enqueue(
        Reply.tool_calls([("exec_command", '{"cmd": "echo hi"}')], reasoning="Run it."),
        Reply.text("Done.", reasoning="It printed hi."),
        Reply.text("Bye."),
    )

    first = (await stream_events(session, fake, body))[-1]["response"]
    body["input"] += [{**item, "content": None} if item["type"] == "reasoning" else item for item in first["output"]]
    body["input"].append({"type": "function_call_output", "id": "fco_1", "call_id": first["output"][1]["call_id"],
                          "output": "Process exited with code 0\nOutput:\nhi\n"})
    second = (await stream_events(session, fake, body))[-1]["response"]
    later = copy.deepcopy(body)
    later["input"] += [{**item, "content": None} if item["type"] == "reasoning" else item for item in second["output"]]
    later["input"].append(user("thanks"))
    third = (await stream_events(session, fake, later))[-1]["response"]

    assert [first["status"], second["status"], third["status"]] == ["completed"] * 3
    received = fake.responses_requests()
    assert received[0] == sample["first_request"]["body"]
    assert [item_kinds(r["input"]) for r in received[1:]] == [r["input_item_types"] for r in sample["later_requests"]]


@pytest.mark.parametrize("turn", ["turn_1", "tool_continuation", "resumed_turn"])
async def test_recorded_codex_session_replays_unchanged(
    fake: FakeUpstream, session: aiohttp.ClientSession, turn: str
) -> None:
    """What Codex CLI really sent (tests/samples/codex-session.json): accepted by a fresh fake,
    because the reasoning it echoes is sealed by the fake's fixed key."""
    body = json.loads(RECORDED.read_text())[turn]["body"]
    status, answer = await post(session, fake, {**body, "stream": False})
    assert status == 200, answer


async def test_a_recorded_reasoning_item_with_changed_content_is_refused(
    fake: FakeUpstream, session: aiohttp.ClientSession
) -> None:
    body = json.loads(RECORDED.read_text())["tool_continuation"]["body"]
    reasoning = next(item for item in body["input"] if item["type"] == "reasoning")
    reasoning["encrypted_content"] = reasoning["encrypted_content"][:-4] + "AAAA"

    status, answer = await post(session, fake, {**body, "stream": False})

    assert status == 400 and answer["error"]["code"] == "invalid_encrypted_content"


# --------------------------------------------------------------------------------------------
# Misbehaviour on demand
# --------------------------------------------------------------------------------------------


async def test_a_stream_that_never_ends(fake: FakeUpstream) -> None:
    reply = Reply.text("abcd", chunk_size=2).never_ending()
    fake.enqueue(reply)

    async with aiohttp.ClientSession() as client:
        resp = await client.post(f"{fake.base_url}/responses", json={"model": "m", "input": "x", "stream": True},
                                 headers=AUTH)
        assert await wait_for_event(reply.reached)
        events = []
        while len(events) < 9:  # everything but the end: 2 deltas, 7 around them
            line = await asyncio.wait_for(resp.content.readline(), WAIT)
            if line.startswith(b"data: "):
                events.append(json.loads(line[len(b"data: ") :])["type"])
                assert await asyncio.wait_for(resp.content.readline(), WAIT) == b"\n"
        assert events[-1] == "response.output_item.done" and events.count("response.output_text.delta") == 2
        pending = asyncio.ensure_future(resp.content.readline())
        with pytest.raises(asyncio.TimeoutError):  # a bounded check that nothing else comes
            await asyncio.wait_for(asyncio.shield(pending), 0.2)
        resp.close()
    assert await wait_for_event(reply.client_gone)


async def test_releasing_a_never_ending_stream_drops_it(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    reply = Reply.text("abc").never_ending()
    fake.enqueue(reply)

    async def consume() -> list[str]:
        stream = await sdk.responses.create(model="m", input="x", stream=True)
        return [event.type async for event in stream]

    pending = asyncio.ensure_future(consume())
    assert await wait_for_event(reply.reached)
    reply.release()
    with pytest.raises(openai.APIError):
        await asyncio.wait_for(pending, WAIT)


@pytest.mark.parametrize("failure", ["response.failed", "error"])
async def test_an_error_event_mid_stream(fake: FakeUpstream, session: aiohttp.ClientSession, failure: str) -> None:
    fake.enqueue(Reply.text("abcdefgh", chunk_size=2, reasoning="hm").failing_after(9, failure))

    events = await stream_events(session, fake, {"model": "m", "input": "x"})

    assert [e["sequence_number"] for e in events] == list(range(10))
    last = events[-1]
    assert last["type"] == failure
    if failure == "error":
        assert last["code"] == "server_error" and last["message"]
    else:
        assert last["response"]["status"] == "failed" and last["response"]["error"]["code"] == "server_error"
        assert [item["type"] for item in last["response"]["output"]] == ["reasoning"]  # finished before it


async def test_the_sdk_sees_the_error_events(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    fake.enqueue(Reply.text("abcdefgh").failing_after(5, "error"), Reply.text("abcdefgh").failing_after(5))

    bare = [event async for event in await sdk.responses.create(model="m", input="x", stream=True)]
    failed = [event async for event in await sdk.responses.create(model="m", input="x", stream=True)]

    assert [e.type for e in bare[-2:]] == ["response.output_text.delta", "error"]
    assert "server had an error" in bare[-1].message
    assert failed[-1].type == "response.failed" and failed[-1].response.error.code == "server_error"


async def test_non_streaming_failure_is_a_500(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    fake.enqueue(Reply.text("x").failing_after(3))
    with pytest.raises(openai.InternalServerError):
        await sdk.responses.create(model="m", input="x")


async def test_a_failed_response_is_not_stored(fake: FakeUpstream, session: aiohttp.ClientSession) -> None:
    fake.enqueue(Reply.text("abc").failing_after(5))
    events = await stream_events(session, fake, {"model": "m", "input": "x"})
    failed_id = events[-1]["response"]["id"]

    status, answer = await post(session, fake, {"model": "m", "input": "y", "previous_response_id": failed_id})
    assert status == 400 and answer["error"]["code"] == "previous_response_not_found"


async def test_pause_mid_stream_until_released(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    reply = Reply.text("abcdef", chunk_size=2, pause_after_chunks=5)
    fake.enqueue(reply)
    stream = await sdk.responses.create(model="m", input="x", stream=True)
    seen: list[str] = []

    async def consume() -> None:
        async for event in stream:
            seen.append(event.type)

    pending = asyncio.ensure_future(consume())
    assert await wait_for_event(reply.reached)
    assert not pending.done()
    reply.release()
    await asyncio.wait_for(pending, WAIT)
    assert seen[-1] == "response.completed" and seen.count("response.output_text.delta") == 3


async def test_hang_until_the_client_leaves(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    reply = Reply.hang()
    fake.enqueue(reply)
    pending = asyncio.ensure_future(sdk.responses.create(model="m", input="x"))
    assert await wait_for_event(reply.reached)
    assert fake.requests[-1].status_sent == 0
    pending.cancel()
    assert await wait_for_event(reply.client_gone)


async def test_error_reply(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    fake.enqueue(Reply.error(429, {"error": {"message": "Slow down", "type": "requests", "param": None,
                                             "code": "rate_limit_exceeded"}}))
    with pytest.raises(openai.RateLimitError, match="Slow down"):
        await sdk.responses.create(model="m", input="x")


# --------------------------------------------------------------------------------------------
# Refusals: one per rule of RESPONSES-RULES.md
# --------------------------------------------------------------------------------------------


def valid_body() -> dict:
    """A valid request using most rules at once; each refusal case breaks exactly one."""
    return {
        "model": "gpt-4o-mini",
        "instructions": "Be brief.",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Rules."}]},
            user("Weather in Paris?"),
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
             "arguments": '{"city": "Paris"}', "status": "completed"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "Sunny.", "annotations": []}]},
            {"role": "user", "content": "Thanks"},
        ],
        "tools": [copy.deepcopy(WEATHER_TOOL), {"type": "web_search"}],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "include": ["reasoning.encrypted_content"],
        "store": False,
        "stream": True,
        "stream_options": {"include_obfuscation": False},
        "prompt_cache_key": "s1",
        "reasoning": {"summary": "auto"},
    }


Mutation = Callable[[dict], Any]


def setting(path: str, value: Any) -> Mutation:
    def mutate(body: dict) -> dict:
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node: Any = body
        for key in parents:
            node = node[key]
        if value is DELETE:
            del node[last]
        else:
            node[last] = value
        return body

    return mutate


DELETE = object()


def appending(path: str, value: Any) -> Mutation:
    def mutate(body: dict) -> dict:
        node: Any = body
        for key in [int(p) if p.isdigit() else p for p in path.split(".")]:
            node = node[key]
        node.append(copy.deepcopy(value))
        return body

    return mutate


CHAT_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}

REFUSALS = [
    pytest.param(setting("conversation_id", "c1"), "Unknown parameter: 'conversation_id'.", id="unknown-param"),
    pytest.param(setting("model", DELETE), "Missing required parameter: 'model'.", id="model-missing"),
    pytest.param(setting("input.1.type", "note"), "Invalid value: 'note'.", id="unknown-item-type"),
    pytest.param(setting("input.2._ref", "r1"), "Unknown parameter: 'input[2]._ref'.", id="unknown-item-key"),
    pytest.param(setting("input.1.content.0.cache", True), "Unknown parameter: 'input[1].content[0].cache'.",
                 id="unknown-part-key"),
    pytest.param(setting("input.4.content.0.type", "input_text"),
                 "Invalid value: 'input_text'. Supported values are: 'output_text' and 'refusal'.",
                 id="input-text-in-assistant"),
    pytest.param(setting("input.1.content.0", {"type": "output_text", "text": "hi"}),
                 "Invalid value: 'output_text'.", id="output-text-in-user"),
    pytest.param(setting("input.3", user("no output")), "No tool output found for function call call_1.",
                 id="call-without-output"),
    pytest.param(setting("input.3.call_id", "call_9"),
                 "No tool call found for function call output with call_id call_9.", id="output-without-call"),
    pytest.param(setting("input.2.arguments", {"city": "Paris"}),
                 "Invalid type for 'input[2].arguments': expected a string, but got an object instead.",
                 id="arguments-not-string"),
    pytest.param(setting("input.2.id", "call_1"), "Expected an ID that begins with 'fc'.", id="call-id-prefix"),
    pytest.param(setting("input.1.id", "msg_1"), "Duplicate item found with id msg_1.", id="duplicate-item-id"),
    pytest.param(appending("tools", WEATHER_TOOL), "duplicate function name 'get_weather'", id="duplicate-tool"),
    pytest.param(setting("tools.0.name", "get weather"), "string does not match pattern", id="tool-name-pattern"),
    pytest.param(setting("tools.0.name", "f" * 65), "string too long", id="tool-name-too-long"),
    pytest.param(setting("tools.0", CHAT_TOOL), "Missing required parameter: 'tools[0].name'.",
                 id="chat-shaped-tool"),
    pytest.param(setting("tools.0.parameters.additionalProperties", DELETE),
                 "'additionalProperties' is required to be supplied and to be false.", id="strict-schema"),
    pytest.param(setting("include.0", "reasoning.everything"), "Invalid value: 'reasoning.everything'.",
                 id="unknown-include"),
    pytest.param(setting("stream", DELETE),
                 "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                 id="stream-options-without-stream"),
    pytest.param(setting("previous_response_id", "resp_unknown"),
                 "Previous response with id 'resp_unknown' not found.", id="previous-response-unknown"),
]


def test_the_base_of_every_refusal_case_is_valid(fake: FakeUpstream) -> None:
    assert fake.responses.check(valid_body()) is None


@pytest.mark.parametrize(("mutate", "expected"), REFUSALS)
async def test_refusals(fake: FakeUpstream, session: aiohttp.ClientSession, mutate: Mutation, expected: str) -> None:
    status, answer = await post(session, fake, mutate(valid_body()))

    assert status == 400, answer
    assert expected in answer["error"]["message"]
    assert answer["error"]["type"] == "invalid_request_error"
    assert fake.responses_requests() == []  # refused: the model never saw it


async def test_refused_requests_do_not_consume_the_queue(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    fake.enqueue(Reply.text("kept"))
    with pytest.raises(openai.BadRequestError):
        await sdk.responses.create(model="m", input="x", tools=[CHAT_TOOL])  # type: ignore[list-item]
    response = await sdk.responses.create(model="m", input="x")
    assert response.output_text == "kept"


async def test_missing_bearer_is_401(fake: FakeUpstream, session: aiohttp.ClientSession) -> None:
    async with session.post(f"{fake.base_url}/responses", json={"model": "m", "input": "x"}) as resp:
        assert resp.status == 401
        assert "API key" in (await resp.json())["error"]["message"]


async def reasoning_turn(sdk: AsyncOpenAI, fake: FakeUpstream, **settings: Any) -> list[dict]:
    """A first turn that answered reasoning + a call; its items as a client replays them."""
    fake.enqueue(Reply.tool_calls([("get_weather", '{"city": "Paris"}')], reasoning="Look it up."))
    first = await sdk.responses.create(model="m", input=[user("Weather?")], tools=[WEATHER_TOOL], **settings)
    return [user("Weather?"), *output_of(first)]


async def test_reasoning_without_its_following_item_is_refused(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    reasoning, call = (await reasoning_turn(sdk, fake, store=False, include=["reasoning.encrypted_content"]))[1:]

    with pytest.raises(openai.BadRequestError, match="was provided without its required following item"):
        await sdk.responses.create(model="m", input=[user("Weather?"), reasoning, user("go on")], store=False)
    # the reasoning, its call and the call's output kept together are fine
    ok = await sdk.responses.create(
        model="m", input=[user("Weather?"), reasoning, call, output_for(call, "sunny")], store=False
    )
    assert ok.status == "completed"


@pytest.mark.parametrize("change", ["edited", "swapped", "dropped"])
async def test_reasoning_must_come_back_as_issued(fake: FakeUpstream, sdk: AsyncOpenAI, change: str) -> None:
    history = await reasoning_turn(sdk, fake, store=False, include=["reasoning.encrypted_content"])
    reasoning = history[1]
    if change == "edited":
        reasoning["encrypted_content"] = reasoning["encrypted_content"][:-2] + "xx"
    elif change == "swapped":  # another reasoning item's content
        other = (await reasoning_turn(sdk, fake, store=False, include=["reasoning.encrypted_content"]))[1]
        reasoning["encrypted_content"] = other["encrypted_content"]
    else:  # not stored (store: false), so without its content it is unknown
        del reasoning["encrypted_content"]
    history.append(output_for(history[2], "sunny"))

    with pytest.raises(openai.BadRequestError, match="could not be verified|not found"):
        await sdk.responses.create(model="m", input=history, store=False)


async def test_stored_reasoning_may_come_back_by_id(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    history = await reasoning_turn(sdk, fake)  # stored, and no encrypted content asked for
    history.append(output_for(history[2], "sunny"))
    response = await sdk.responses.create(model="m", input=history)
    assert response.status == "completed"


async def test_pairing_is_checked_over_the_resolved_chain(fake: FakeUpstream, sdk: AsyncOpenAI) -> None:
    fake.enqueue(Reply.tool_calls([("get_weather", '{"city": "Paris"}')]))
    first = await sdk.responses.create(model="m", input="Weather?", tools=[WEATHER_TOOL])

    with pytest.raises(openai.BadRequestError, match="No tool output found for function call"):
        await sdk.responses.create(model="m", previous_response_id=first.id, input="never mind")
    with pytest.raises(openai.BadRequestError, match="No tool call found for function call output"):
        await sdk.responses.create(model="m", input=[output_for(output_of(first)[0], "sunny")])


async def test_unknown_item_reference_is_refused(sdk: AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="Item with id 'msg_nowhere' not found"):
        await sdk.responses.create(model="m", input=[{"type": "item_reference", "id": "msg_nowhere"}])
