"""Tests of the fake Anthropic Messages upstream itself, with the official `anthropic` client: it
must answer as the real API does (JSON, SSE, thinking, caching, count_tokens), accept what real
clients send (Claude Code's recorded requests), and refuse what the real API refuses
(ANTHROPIC-RULES.md) -- or the proxy's Messages tests prove nothing."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from tests.fakes.fake_anthropic import (
    REDACTED_THINKING_TRIGGER,
    endless_stream,
    error_mid_stream,
    overloaded,
    tool_use_id,
)
from tests.fakes.fake_upstream import FakeUpstream, Reply

KEY = "sk-ant-test-0123456789"
HEADERS = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
WAIT = 5.0  # seconds: an upper bound for what should happen at once, never a sleep
SAMPLES = Path(__file__).resolve().parents[1] / "samples"
CLAUDE_CODE_SAMPLE = Path("/work/shared/samples/claude-code-request.json")
MODEL = "claude-test-1"
WEATHER = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
THINKING = {"type": "enabled", "budget_tokens": 1024}


@pytest.fixture
def claude(upstream: FakeUpstream) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=upstream.anthropic.base_url, api_key=KEY, max_retries=0) as client:
        yield client


@pytest.fixture
def raw(upstream: FakeUpstream) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=upstream.anthropic.base_url, timeout=WAIT) as client:
        yield client


def ask(text: str = "What is the weather in Paris?") -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def as_params(message: anthropic.types.Message) -> dict[str, Any]:
    """An answer passed back as the next request's assistant message, as clients do."""
    return {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in message.content]}


def tool_result(message: anthropic.types.Message, output: str) -> dict[str, Any]:
    ids = [block.id for block in message.content if block.type == "tool_use"]
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": i, "content": output} for i in ids]}


def sse_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for chunk in text.strip().split("\n\n"):
        name, data = chunk.split("\n")
        assert name.startswith("event: ") and data.startswith("data: "), chunk
        events.append((name[len("event: "):], json.loads(data[len("data: "):])))
    return events


# --------------------------------------------------------------------------------------------
# Replies: JSON, SSE, tool loops
# --------------------------------------------------------------------------------------------


def test_a_tool_loop_round_trips_tool_use_and_its_result(upstream: FakeUpstream, claude: anthropic.Anthropic) -> None:
    call = Reply.tool_calls([("get_weather", '{"city": "Paris"}')])
    upstream.enqueue(call, Reply.text("Sunny in Paris."))
    first = claude.messages.create(model=MODEL, max_tokens=512, messages=ask(), tools=[WEATHER])
    assert first.stop_reason == "tool_use"
    assert first.id.startswith("msg_") and first.role == "assistant" and first.model == MODEL
    (use,) = first.content
    assert (use.type, use.id, use.name, use.input) == ("tool_use", tool_use_id(call.calls[0]), "get_weather", {"city": "Paris"})

    history = ask() + [as_params(first), tool_result(first, "18C, sunny")]
    second = claude.messages.create(model=MODEL, max_tokens=512, messages=history, tools=[WEATHER])
    assert (second.stop_reason, second.content[0].text) == ("end_turn", "Sunny in Paris.")
    assert upstream.messages_requests()[1]["messages"] == history
    assert upstream.chat_requests() == []  # one log per format


def test_text_and_several_tool_calls_in_one_message(claude: anthropic.Anthropic, upstream: FakeUpstream) -> None:
    upstream.enqueue(Reply.tool_calls([("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Oslo"}')], "Checking both."))
    message = claude.messages.create(model=MODEL, max_tokens=512, messages=ask("Paris and Oslo?"), tools=[WEATHER])
    assert [b.type for b in message.content] == ["text", "tool_use", "tool_use"]
    assert [b.input for b in message.content[1:]] == [{"city": "Paris"}, {"city": "Oslo"}]


def test_streaming_is_the_real_event_sequence(upstream: FakeUpstream, raw: httpx.Client) -> None:
    upstream.enqueue(Reply.tool_calls([("get_weather", '{"city": "Paris"}')], "Let me check.", reasoning="Paris weather."))
    body = {"model": MODEL, "max_tokens": 2048, "messages": ask(), "tools": [WEATHER], "thinking": THINKING, "stream": True}
    response = raw.post("/v1/messages?beta=true", headers=HEADERS, json=body)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    names = [name for name, _ in events]
    assert [name for name, data in events] == [data["type"] for _, data in events]  # event names match types
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    starts = [data for name, data in events if name == "content_block_start"]
    assert [s["index"] for s in starts] == [0, 1, 2]  # contiguous from 0
    assert [s["content_block"]["type"] for s in starts] == ["thinking", "text", "tool_use"]
    deltas = [(d["index"], d["delta"]["type"]) for name, d in events if name == "content_block_delta"]
    assert {t for i, t in deltas if i == 0} == {"thinking_delta", "signature_delta"}
    assert deltas[[i for i, _ in deltas].index(1) - 1] == (0, "signature_delta")  # the signature closes the thinking
    assert {t for i, t in deltas if i == 2} == {"input_json_delta"}
    arguments = "".join(d["delta"]["partial_json"] for name, d in events if name == "content_block_delta" and d["index"] == 2)
    assert json.loads(arguments) == {"city": "Paris"}
    stops = [data["index"] for name, data in events if name == "content_block_stop"]
    assert stops == [0, 1, 2]
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == "tool_use" and delta["usage"]["output_tokens"] > 0


def test_the_sdk_stream_assembles_the_same_message(upstream: FakeUpstream, claude: anthropic.Anthropic) -> None:
    upstream.enqueue(Reply.text("Sunny and warm.", reasoning="It is summer.", chunk_size=3))
    with claude.messages.stream(model=MODEL, max_tokens=2048, messages=ask(), thinking=THINKING) as stream:
        texts = list(stream.text_stream)
        message = stream.get_final_message()
    assert "".join(texts) == "Sunny and warm." and len(texts) > 1
    thinking, text = message.content
    assert (thinking.type, thinking.thinking, text.text) == ("thinking", "It is summer.", "Sunny and warm.")
    assert message.stop_reason == "end_turn" and message.usage.output_tokens > 0


def test_the_same_queue_serves_every_format(upstream: FakeUpstream, claude: anthropic.Anthropic) -> None:
    upstream.enqueue(Reply.text("for the chat client"), Reply.text("for the messages client"))
    chat = httpx.post(upstream.base_url + "/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": "gpt-4o-mini", "messages": ask()}, timeout=WAIT)
    assert chat.json()["choices"][0]["message"]["content"] == "for the chat client"
    message = claude.messages.create(model=MODEL, max_tokens=64, messages=ask())
    assert message.content[0].text == "for the messages client"
    answer = claude.messages.create(model=MODEL, max_tokens=64, messages=ask("hello there"))
    assert answer.content[0].text == "reply to: hello there"  # then the default responder


# --------------------------------------------------------------------------------------------
# Thinking
# --------------------------------------------------------------------------------------------


def test_thinking_round_trips_with_its_signature(upstream: FakeUpstream, claude: anthropic.Anthropic) -> None:
    upstream.enqueue(Reply.tool_calls([("get_weather", '{"city": "Paris"}')], reasoning="I need the weather tool."),
                     Reply.text("Sunny.", reasoning="The tool said sunny."))
    with claude.messages.stream(model=MODEL, max_tokens=2048, messages=ask(), tools=[WEATHER], thinking=THINKING) as stream:
        first = stream.get_final_message()
    thinking, use = first.content
    assert (thinking.type, thinking.thinking, use.type) == ("thinking", "I need the weather tool.", "tool_use")
    assert thinking.signature
    history = ask() + [as_params(first), tool_result(first, "sunny")]
    second = claude.messages.create(model=MODEL, max_tokens=2048, messages=history, tools=[WEATHER], thinking=THINKING)
    assert [b.type for b in second.content] == ["thinking", "text"]
    assert upstream.messages_requests()[1]["messages"][1]["content"][0] == thinking.model_dump()


def test_no_thinking_block_unless_the_request_turns_thinking_on(upstream: FakeUpstream, claude: anthropic.Anthropic) -> None:
    upstream.enqueue(Reply.text("Sunny.", reasoning="unseen"), Reply.text("Sunny.", reasoning="unseen"))
    assert [b.type for b in claude.messages.create(model=MODEL, max_tokens=64, messages=ask()).content] == ["text"]
    disabled = claude.messages.create(model=MODEL, max_tokens=64, messages=ask(), thinking={"type": "disabled"})
    assert [b.type for b in disabled.content] == ["text"]


def test_omitted_display_keeps_the_signature_and_hides_the_text(upstream: FakeUpstream, claude: anthropic.Anthropic) -> None:
    """Claude Code asks for `display: omitted`: the block comes with empty text, still signed."""
    upstream.enqueue(Reply.tool_calls([("get_weather", '{"city": "Paris"}')], reasoning="secret plan"), Reply.text("Done."))
    adaptive = {"type": "adaptive", "display": "omitted"}
    first = claude.messages.create(model=MODEL, max_tokens=2048, messages=ask(), tools=[WEATHER], thinking=adaptive)
    assert (first.content[0].type, first.content[0].thinking) == ("thinking", "")
    history = ask() + [as_params(first), tool_result(first, "sunny")]
    assert claude.messages.create(model=MODEL, max_tokens=2048, messages=history, tools=[WEATHER], thinking=adaptive)


def test_redacted_thinking_passes_back_unchanged(upstream: FakeUpstream, claude: anthropic.Anthropic) -> None:
    upstream.enqueue(Reply.tool_calls([("get_weather", '{"city": "Paris"}')], reasoning=REDACTED_THINKING_TRIGGER),
                     Reply.text("Done."))
    with claude.messages.stream(model=MODEL, max_tokens=2048, messages=ask(), tools=[WEATHER], thinking=THINKING) as stream:
        first = stream.get_final_message()
    assert [b.type for b in first.content] == ["redacted_thinking", "tool_use"] and first.content[0].data
    history = ask() + [as_params(first), tool_result(first, "sunny")]
    assert claude.messages.create(model=MODEL, max_tokens=2048, messages=history, tools=[WEATHER], thinking=THINKING)
    history[1]["content"][0]["data"] = history[1]["content"][0]["data"][::-1]
    with pytest.raises(anthropic.BadRequestError, match="Invalid `data` in `redacted_thinking` block"):
        claude.messages.create(model=MODEL, max_tokens=2048, messages=history, tools=[WEATHER], thinking=THINKING)


def test_the_real_trigger_in_the_prompt_redacts_too(upstream: FakeUpstream, claude: anthropic.Anthropic) -> None:
    upstream.enqueue(Reply.text("Done.", reasoning="plain"))
    message = claude.messages.create(model=MODEL, max_tokens=2048, messages=ask(REDACTED_THINKING_TRIGGER), thinking=THINKING)
    assert [b.type for b in message.content] == ["redacted_thinking", "text"]


@pytest.fixture
def thought_tool_call(upstream: FakeUpstream, claude: anthropic.Anthropic) -> list[dict[str, Any]]:
    """A tool-use continuation with thinking on: the history to send next, unchanged."""
    upstream.enqueue(Reply.tool_calls([("get_weather", '{"city": "Paris"}')], reasoning="I need the weather tool."))
    first = claude.messages.create(model=MODEL, max_tokens=2048, messages=ask(), tools=[WEATHER], thinking=THINKING)
    return ask() + [as_params(first), tool_result(first, "sunny")]


def continue_with(claude: anthropic.Anthropic, history: list[dict[str, Any]], **extra: Any) -> anthropic.types.Message:
    return claude.messages.create(model=MODEL, max_tokens=2048, messages=history, tools=[WEATHER], **{"thinking": THINKING, **extra})


def test_a_changed_thinking_block_is_refused(claude: anthropic.Anthropic, thought_tool_call: list[dict[str, Any]], upstream: FakeUpstream) -> None:
    thought_tool_call[1]["content"][0]["thinking"] += " (edited)"
    with pytest.raises(anthropic.BadRequestError, match=r"messages\.1\.content\.0: Invalid `signature` in `thinking` block"):
        continue_with(claude, thought_tool_call)
    assert len(upstream.messages_requests()) == 1  # refused: never reached the script


def test_a_continuation_without_its_thinking_block_is_refused(claude: anthropic.Anthropic, thought_tool_call: list[dict[str, Any]]) -> None:
    del thought_tool_call[1]["content"][0]
    with pytest.raises(anthropic.BadRequestError, match="must start with a thinking block"):
        continue_with(claude, thought_tool_call)


def test_another_valid_thinking_block_does_not_stand_in_for_its_own(
    claude: anthropic.Anthropic, thought_tool_call: list[dict[str, Any]], upstream: FakeUpstream
) -> None:
    upstream.enqueue(Reply.text("Hi.", reasoning="a different thought"))
    other = claude.messages.create(model=MODEL, max_tokens=2048, messages=ask("hi"), thinking=THINKING)
    thought_tool_call[1]["content"][0] = other.content[0].model_dump()
    with pytest.raises(anthropic.BadRequestError, match="does not belong"):
        continue_with(claude, thought_tool_call)


def test_adaptive_thinking_that_did_not_think_needs_no_thinking_block(upstream: FakeUpstream, claude: anthropic.Anthropic) -> None:
    upstream.enqueue(Reply.tool_calls([("get_weather", '{"city": "Paris"}')]))  # no reasoning: the model skipped it
    adaptive = {"type": "adaptive"}
    first = claude.messages.create(model=MODEL, max_tokens=2048, messages=ask(), tools=[WEATHER], thinking=adaptive)
    history = ask() + [as_params(first), tool_result(first, "sunny")]
    assert continue_with(claude, history, thinking=adaptive)
    with pytest.raises(anthropic.BadRequestError, match="must start with a thinking block"):
        continue_with(claude, history)  # budgeted thinking always thinks first


# --------------------------------------------------------------------------------------------
# Prompt caching and count_tokens
# --------------------------------------------------------------------------------------------


def cached_system(text: str = "You are a careful assistant. " * 40) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}]


def test_cache_reads_the_prefix_an_earlier_request_wrote(claude: anthropic.Anthropic) -> None:
    first = claude.messages.create(model=MODEL, max_tokens=64, system=cached_system(), messages=ask())
    assert first.usage.cache_read_input_tokens == 0 and first.usage.cache_creation_input_tokens > 0
    written = first.usage.cache_creation_input_tokens
    again = claude.messages.create(model=MODEL, max_tokens=64, system=cached_system(), messages=ask("another question"))
    assert (again.usage.cache_read_input_tokens, again.usage.cache_creation_input_tokens) == (written, 0)
    changed = claude.messages.create(model=MODEL, max_tokens=64, system=cached_system("Another system prompt. " * 40), messages=ask())
    assert changed.usage.cache_read_input_tokens == 0  # a different prefix misses
    other_key = anthropic.Anthropic(base_url=str(claude.base_url), api_key="sk-ant-someone-else", max_retries=0)
    assert other_key.messages.create(model=MODEL, max_tokens=64, system=cached_system(), messages=ask()).usage.cache_read_input_tokens == 0


def test_a_moved_breakpoint_reads_the_previous_turn_and_shapes_do_not_matter(claude: anthropic.Anthropic) -> None:
    """Claude Code's way: the breakpoint sits on the newest message, and a message first sent as
    blocks comes back as a string. The cache is about content, not markers or shapes."""
    turn = [{"role": "user", "content": [{"type": "text", "text": "Summarise the plan. " * 30, "cache_control": {"type": "ephemeral"}}]}]
    first = claude.messages.create(model=MODEL, max_tokens=64, system="Be brief.", messages=turn)
    written = first.usage.cache_creation_input_tokens
    later = [
        {"role": "user", "content": "Summarise the plan. " * 30},
        {"role": "assistant", "content": "The plan is short."},
        {"role": "user", "content": [{"type": "text", "text": "Thanks.", "cache_control": {"type": "ephemeral"}}]},
    ]
    second = claude.messages.create(model=MODEL, max_tokens=64, system="Be brief.", messages=later)
    assert second.usage.cache_read_input_tokens == written > 0
    assert second.usage.cache_creation_input_tokens > 0  # the new tail is written
    counted = claude.messages.count_tokens(model=MODEL, system="Be brief.", messages=later).input_tokens
    usage = second.usage
    assert usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens == counted


def test_no_breakpoint_no_cache(claude: anthropic.Anthropic) -> None:
    for _ in range(2):
        usage = claude.messages.create(model=MODEL, max_tokens=64, system="Be brief.", messages=ask()).usage
        assert (usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (0, 0) and usage.input_tokens > 0


def test_count_tokens_estimates_system_messages_and_tools(upstream: FakeUpstream, claude: anthropic.Anthropic) -> None:
    bare = claude.messages.count_tokens(model=MODEL, messages=ask()).input_tokens
    with_system = claude.messages.count_tokens(model=MODEL, system="You are terse. " * 20, messages=ask()).input_tokens
    with_tools = claude.messages.count_tokens(model=MODEL, messages=ask(), tools=[WEATHER]).input_tokens
    assert 0 < bare < with_system and bare < with_tools
    assert len(upstream.anthropic.count_tokens_requests()) == 3 and upstream.messages_requests() == []


def test_count_tokens_refuses_what_it_does_not_take(raw: httpx.Client) -> None:
    response = raw.post("/v1/messages/count_tokens", headers=HEADERS, json={"model": MODEL, "max_tokens": 5, "messages": ask()})
    assert response.status_code == 400 and "max_tokens: Extra inputs are not permitted" in response.json()["error"]["message"]


# --------------------------------------------------------------------------------------------
# Misbehaviour on demand
# --------------------------------------------------------------------------------------------


def test_an_overloaded_reply_is_a_529(upstream: FakeUpstream, claude: anthropic.Anthropic) -> None:
    upstream.enqueue(overloaded())
    with pytest.raises(anthropic.APIStatusError) as caught:
        claude.messages.create(model=MODEL, max_tokens=64, messages=ask())
    assert caught.value.status_code == 529
    assert caught.value.body == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


def test_an_openai_shaped_error_is_translated(upstream: FakeUpstream, claude: anthropic.Anthropic) -> None:
    upstream.enqueue(Reply.error(429, {"error": {"message": "slow down", "type": "rate_limit", "code": None}}))
    with pytest.raises(anthropic.RateLimitError) as caught:
        claude.messages.create(model=MODEL, max_tokens=64, messages=ask())
    assert caught.value.body == {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}


def test_an_error_event_mid_stream(upstream: FakeUpstream, claude: anthropic.Anthropic) -> None:
    upstream.enqueue(error_mid_stream(Reply.text("partial answer that never finishes"), after_events=5))
    seen = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        with claude.messages.stream(model=MODEL, max_tokens=64, messages=ask()) as stream:
            seen.extend(stream.text_stream)
    assert caught.value.body["error"]["type"] == "overloaded_error"
    assert "".join(seen) == "partial answer"[: len("".join(seen))] and seen  # some text came first


def test_a_paused_stream_resumes_on_release(upstream: FakeUpstream, raw: httpx.Client) -> None:
    reply = Reply.text("held back", pause_after_chunks=2)
    upstream.enqueue(reply)
    body = {"model": MODEL, "max_tokens": 64, "messages": ask(), "stream": True}
    with raw.stream("POST", "/v1/messages", headers=HEADERS, json=body) as response:
        lines = response.iter_lines()
        assert next(lines) == "event: message_start"
        assert reply.reached.wait(WAIT)
        reply.release()
        text = "\n".join(lines)
    assert "message_stop" in text and '"text":"held"' in text


def test_an_endless_stream_only_pings(upstream: FakeUpstream, raw: httpx.Client) -> None:
    reply = endless_stream(Reply.text("never finished"), after_events=1, ping_every_s=0.01)
    upstream.enqueue(reply)
    body = {"model": MODEL, "max_tokens": 64, "messages": ask(), "stream": True}
    with raw.stream("POST", "/v1/messages", headers=HEADERS, json=body) as response:
        lines = response.iter_lines()
        assert next(lines) == "event: message_start"
        next(lines), next(lines)  # its data line and the blank line
        pings = [next(lines) for _ in range(9)]  # three whole pings, with nothing else between
    assert pings == ["event: ping", 'data: {"type": "ping"}', ""] * 3
    assert reply.client_gone.wait(WAIT)


def test_a_hang_holds_until_the_client_leaves(upstream: FakeUpstream) -> None:
    reply = Reply.hang()
    upstream.enqueue(reply)
    impatient = anthropic.Anthropic(base_url=upstream.anthropic.base_url, api_key=KEY, max_retries=0, timeout=0.5)
    with pytest.raises(anthropic.APITimeoutError):
        impatient.messages.create(model=MODEL, max_tokens=64, messages=ask())
    assert reply.reached.wait(WAIT) and reply.client_gone.wait(WAIT)


# --------------------------------------------------------------------------------------------
# What real clients send is accepted
# --------------------------------------------------------------------------------------------


def replay(raw: httpx.Client, sample: dict[str, Any]) -> httpx.Response:
    headers = {k: v for k, v in sample["headers"].items() if k.lower() not in ("host", "content-length", "connection")}
    return raw.post(sample["path"], headers=headers, json=sample["body"])


def test_claude_codes_first_request_passes_unchanged(upstream: FakeUpstream, raw: httpx.Client) -> None:
    sample = json.loads(CLAUDE_CODE_SAMPLE.read_text())["first_request"]
    upstream.enqueue(Reply.tool_calls([("Bash", '{"command": "echo hi"}')], reasoning="run it"))
    response = replay(raw, sample)
    assert response.status_code == 200, response.text
    assert upstream.messages_requests() == [sample["body"]]


@pytest.mark.parametrize("name", ["claude-turn1.json", "claude-tool-continuation.json", "claude-resumed-turn.json"])
def test_claude_codes_recorded_requests_pass_unchanged(upstream: FakeUpstream, raw: httpx.Client, name: str) -> None:
    sample = json.loads((SAMPLES / name).read_text())
    response = replay(raw, sample)
    assert response.status_code == 200, response.text
    assert upstream.messages_requests() == [sample["body"]]


def test_the_recorded_requests_have_the_shapes_of_the_shared_sample() -> None:
    later = json.loads(CLAUDE_CODE_SAMPLE.read_text())["later_requests"]
    recorded = [json.loads((SAMPLES / n).read_text()) for n in ("claude-tool-continuation.json", "claude-resumed-turn.json")]
    for sample, request in zip(later, recorded, strict=True):
        # The sample writes a string content as "text", blocks as their types.
        shapes = [
            [m["role"], [b["type"] for b in m["content"]] if isinstance(m["content"], list) else "text"]
            for m in request["body"]["messages"]
        ]
        assert shapes == sample["message_roles_and_blocks"]


# --------------------------------------------------------------------------------------------
# Refusals: one per rule of ANTHROPIC-RULES.md
# --------------------------------------------------------------------------------------------

TOOL_USE = {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}}
TOOL_RESULT = {"type": "tool_result", "tool_use_id": "toolu_01", "content": "sunny"}


def base() -> dict[str, Any]:
    """A valid body every refusal case mutates."""
    return {
        "model": MODEL, "max_tokens": 2048, "tools": [copy.deepcopy(WEATHER)],
        "messages": ask() + [{"role": "assistant", "content": [dict(TOOL_USE)]}, {"role": "user", "content": [dict(TOOL_RESULT)]}],
    }


def mutated(change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    body = base()
    change(body)
    return body


def add_breakpoints(body: dict[str, Any], count: int) -> None:
    body["system"] = [{"type": "text", "text": f"rule {i}", "cache_control": {"type": "ephemeral"}} for i in range(count)]


REFUSALS: dict[str, tuple[Callable[[dict[str, Any]], Any], str]] = {
    "max_tokens missing": (lambda b: b.pop("max_tokens"), "max_tokens: Field required"),
    "unknown top-level field": (lambda b: b.update(frobnicate=1), "frobnicate: Extra inputs are not permitted"),
    "beta field without its beta": (
        lambda b: b.update(context_management={"edits": []}),
        "context_management: Extra inputs are not permitted (it needs the anthropic-beta header 'context-management-2025-06-27')",
    ),
    "unknown block key": (lambda b: b["messages"][2]["content"][0].update(extra=1), "messages.2.content.0.tool_result.extra: Extra inputs are not permitted"),
    "unknown block type": (lambda b: b["messages"][0].update(content=[{"type": "video", "url": "x"}]), "Input tag 'video'"),
    "another role": (lambda b: b["messages"].insert(1, {"role": "tool", "content": "x"}), "messages.1.role: Input should be 'user', 'assistant' or 'system'"),
    "a system message's beta key": (
        lambda b: b["messages"].insert(1, {"role": "system", "content": "be brief", "output_config": {"effort": "low"}}),
        "messages.1.output_config: Extra inputs are not permitted",
    ),
    "tool_result answering nothing": (lambda b: b["messages"][2]["content"].append({**TOOL_RESULT, "tool_use_id": "toolu_99"}), "unexpected `tool_use_id` found in `tool_result` blocks: toolu_99"),
    "tool_use left unanswered": (lambda b: b["messages"].__setitem__(2, {"role": "user", "content": "never mind"}), "`tool_use` ids were found without `tool_result` blocks immediately after: toolu_01"),
    "tool_result after text": (
        lambda b: b["messages"][2]["content"].insert(0, {"type": "text", "text": "here you go"}),
        "messages.2.content.1: `tool_result` blocks must come first",
    ),
    "a forged thinking block": (
        lambda b: (b.update(thinking=THINKING), b["messages"][1]["content"].insert(0, {"type": "thinking", "thinking": "hm", "signature": "Zm9yZ2Vk"})),
        "messages.1.content.0: Invalid `signature` in `thinking` block",
    ),
    "thinking on without the thinking block": (lambda b: b.update(thinking=THINKING), "must start with a thinking block"),
    "duplicate tool names": (lambda b: b["tools"].append(copy.deepcopy(WEATHER)), "tools: Tool names must be unique."),
    "ill-formed tool name": (lambda b: b["tools"][0].update(name="get weather!"), "tools.0.custom.name: String should match pattern"),
    "no input_schema": (lambda b: b["tools"][0].pop("input_schema"), "tools.0.custom.input_schema: Field required"),
    "budget_tokens not below max_tokens": (
        lambda b: b.update(thinking={"type": "enabled", "budget_tokens": 4096}),
        "`max_tokens` must be greater than `thinking.budget_tokens`",
    ),
    "more than 4 cache breakpoints": (lambda b: add_breakpoints(b, 5), "A maximum of 4 blocks with cache_control may be provided. Found 5."),
}


def test_the_base_of_every_refusal_is_accepted(upstream: FakeUpstream, raw: httpx.Client) -> None:
    body = base()
    add_breakpoints(body, 4)
    assert raw.post("/v1/messages", headers=HEADERS, json=body).status_code == 200
    beta = {**HEADERS, "anthropic-beta": "context-management-2025-06-27,per-turn-control-2026-07-01"}
    body.update(context_management={"edits": []})
    body["messages"].insert(1, {"role": "system", "content": "be brief", "output_config": {"effort": "low"}})
    assert raw.post("/v1/messages", headers=beta, json=body).status_code == 200


@pytest.mark.parametrize("rule", REFUSALS)
def test_refuses(rule: str, upstream: FakeUpstream, claude: anthropic.Anthropic) -> None:
    change, message = REFUSALS[rule]
    body = mutated(change)
    upstream.enqueue(Reply.text("kept for the next valid request"))
    with pytest.raises(anthropic.BadRequestError) as caught:  # the client's raw post: the body as is
        claude.post("/v1/messages", body=body, cast_to=anthropic.types.Message)
    assert caught.value.body["type"] == "error"
    assert caught.value.body["error"]["type"] == "invalid_request_error"
    assert message in caught.value.body["error"]["message"]
    assert upstream.messages_requests() == []
    assert claude.messages.create(model=MODEL, max_tokens=64, messages=ask()).content[0].text == "kept for the next valid request"


def test_no_key_is_a_401_and_bearer_is_a_key(upstream: FakeUpstream, raw: httpx.Client) -> None:
    body = {"model": MODEL, "max_tokens": 64, "messages": ask()}
    response = raw.post("/v1/messages", headers={"anthropic-version": "2023-06-01"}, json=body)
    assert response.status_code == 401
    assert response.json() == {"type": "error", "error": {"type": "authentication_error", "message": "x-api-key header is required"}}
    bearer = raw.post("/v1/messages", headers={"anthropic-version": "2023-06-01", "Authorization": f"Bearer {KEY}"}, json=body)
    assert bearer.status_code == 200


def test_no_version_header_or_no_json_is_a_400(raw: httpx.Client) -> None:
    body = {"model": MODEL, "max_tokens": 64, "messages": ask()}
    assert "anthropic-version" in raw.post("/v1/messages", headers={"x-api-key": KEY}, json=body).json()["error"]["message"]
    garbled = raw.post("/v1/messages", headers={**HEADERS, "content-type": "application/json"}, content=b"{nope")
    assert garbled.status_code == 400 and garbled.json()["error"]["type"] == "invalid_request_error"
