"""Anthropic Messages through the proxy, driven by the official `anthropic` client against the
strict Anthropic fake (it refuses what the real API refuses: a changed thinking signature, a
tool_use without its result, a fifth cache breakpoint...): tool loops streamed and not, thinking
round-tripped, messages compared by meaning, truncation with read-back hidden from the stream,
the summary in `system`, the window cutting whole units, count_tokens, errors, identity."""

from __future__ import annotations

import json
import socket
from typing import Any

import anthropic
import httpx
import pytest

from tests.conftest import ALICE, BOB, MakeProxy, admin_get, live_messages, trajectory
from tests.fakes.fake_anthropic import REDACTED_THINKING_TRIGGER, error_mid_stream, overloaded, tool_use_id
from tests.fakes.fake_upstream import FakeUpstream, Reply
from tests.fakes.responders import by_kind, fixed_summary, is_summary_request, is_tool_summary_request
from tests.support.harness import ProxyServer
from tests.support.messages_helpers import (
    BUILD,
    MODEL,
    THINKING,
    WEATHER,
    as_params,
    block_types,
    claude_client,
    messages_proxy,
    results,
    sse_events,
)

HEADERS = {"x-api-key": ALICE, "anthropic-version": "2023-06-01"}


@pytest.fixture
def proxy(make_proxy: MakeProxy, upstream: FakeUpstream) -> ProxyServer:  # the `http` fixture's proxy too
    return messages_proxy(make_proxy, upstream)
# A build log whose end matters: only a read of the stored output finds the failing step.
BUILD_LOG = "".join(f"step {i:05d}: compiled module_{i % 97}.c ok\n" for i in range(900)) + "FAILED at step 00900: linker error in libfoo.so\n"


def create(client: anthropic.Anthropic, stream: bool, **params: Any) -> anthropic.types.Message:
    params.setdefault("max_tokens", 4096)
    if not stream:
        return client.messages.create(model=MODEL, **params)
    with client.messages.stream(model=MODEL, **params) as events:
        return events.get_final_message()


def conversation(http: httpx.Client, conversation_id: str) -> dict[str, Any]:
    response = admin_get(http, f"/{conversation_id}")
    assert response.status_code == 200, response.text
    return response.json()


# -- tool loops, thinking, dedupe --------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_tool_loop_with_thinking_round_trips_its_signatures(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client, stream: bool
) -> None:
    client = claude_client(proxy, headers={"X-Conversation-ID": "loop-1"})
    call = Reply.tool_calls([("get_weather", json.dumps({"city": "Paris"}))], reasoning="I should look it up.")
    upstream.enqueue(call, Reply.text("Sunny in Paris.", reasoning="The tool said sunny."))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in Paris?"}]
    first = create(client, stream, messages=messages, tools=[WEATHER], thinking=THINKING)
    assert [b.type for b in first.content] == ["thinking", "tool_use"]
    assert first.content[1].id == tool_use_id(call.calls[0])
    messages += [as_params(first), results(first, "sunny, 22 C")]
    second = create(client, stream, messages=messages, tools=[WEATHER], thinking=THINKING)
    assert ([b.type for b in second.content], second.content[1].text) == (["thinking", "text"], "Sunny in Paris.")

    # The fake checked the signature and that the continuation starts with its own thinking.
    continuation = upstream.messages_requests()[-1]
    assert continuation["messages"] == messages
    stored = live_messages(http, "loop-1")
    assert [m["role"] for m in stored] == ["user", "assistant", "user", "assistant"]
    assert stored[1]["content"] == as_params(first)["content"]  # byte for byte, signature included
    assert stored[3]["content"][0]["signature"] == second.content[0].signature

    # The next turn resends all of it: only the new message is stored (by meaning, not bytes).
    messages += [as_params(second), {"role": "user", "content": "Thanks!"}]
    create(client, stream, messages=messages, tools=[WEATHER], thinking=THINKING)
    assert conversation(http, "loop-1")["message_count"] == 6
    assert {m["status"] for m in trajectory(http, "loop-1")} == {"live"}


PIXEL = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="


def test_redacted_thinking_and_images_go_back_byte_for_byte(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client
) -> None:
    client = claude_client(proxy, headers={"X-Conversation-ID": "redacted-1"})
    upstream.enqueue(Reply.tool_calls([("get_weather", '{"city": "Oslo"}')], reasoning=REDACTED_THINKING_TRIGGER))
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PIXEL}}
    messages: list[dict[str, Any]] = [{"role": "user", "content": [image, {"type": "text", "text": "Weather here?"}]}]
    first = create(client, True, messages=messages, tools=[WEATHER], thinking=THINKING)
    assert first.content[0].type == "redacted_thinking"
    messages += [as_params(first), results(first, "snow")]
    create(client, True, messages=messages, tools=[WEATHER], thinking=THINKING)  # the fake checks the blob
    stored = live_messages(http, "redacted-1")
    assert stored[0]["content"][0] == image and stored[1]["content"] == as_params(first)["content"]
    assert upstream.messages_requests()[-1]["messages"] == messages


def test_tool_results_carry_the_quota_when_first_forwarded(make_proxy: MakeProxy, upstream: FakeUpstream) -> None:
    quota = messages_proxy(make_proxy, upstream, quota={"max_llm_calls": 10})
    client = claude_client(quota, headers={"X-Conversation-ID": "quota-info"})
    upstream.enqueue(Reply.tool_calls([("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Rome"}')]))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Paris and Rome?"}]
    first = client.messages.create(model=MODEL, max_tokens=100, tools=[WEATHER], messages=messages)
    paris, rome = [b.id for b in first.content if b.type == "tool_use"]
    messages += [as_params(first), {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": paris, "content": json.dumps({"sky": "sunny"})},
        {"type": "tool_result", "tool_use_id": rome, "content": [{"type": "text", "text": "rain"}]},
    ]}]
    for _ in range(2):  # the figures of the first forwarding, on a retry of the turn too
        client.messages.create(model=MODEL, max_tokens=100, tools=[WEATHER], messages=messages)
        sent = upstream.messages_requests()[-1]["messages"][-1]["content"]
        assert json.loads(sent[0]["content"]) == {"sky": "sunny", "_quota_info": {"used": 2, "remaining": 8, "limit": 10}}
        assert sent[1]["content"] == [{"type": "text", "text": "rain"}, {"type": "text", "text": "\n\n[You have 8 LLM calls remaining (used 2 of 10).]"}]


def test_a_message_resent_as_a_string_or_without_its_breakpoint_is_not_new(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client
) -> None:
    """Claude Code re-sends a block message as a string and moves its cache_control to the newest
    message each turn; neither is a divergence. A derived id keeps naming the same run too."""
    client = claude_client(proxy)
    system = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    marked = {"type": "ephemeral"}
    first = client.messages.create(
        model=MODEL, max_tokens=100, system=system,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hello", "cache_control": marked}]}],
    )
    client.messages.create(
        model=MODEL, max_tokens=100, system=system,
        messages=[
            {"role": "user", "content": "Hello"},
            as_params(first),
            {"role": "user", "content": [{"type": "text", "text": "Again", "cache_control": marked}]},
        ],
    )
    (only,) = admin_get(http, "").json()["data"]
    assert only["id"].startswith("auto-") and only["message_count"] == 4
    assert [m["status"] for m in trajectory(http, only["id"])] == ["live"] * 4
    # What went upstream is the client's own bytes: its new breakpoint, its string.
    assert upstream.messages_requests()[-1]["messages"][0] == {"role": "user", "content": "Hello"}


def test_tool_results_are_stored_one_by_one_and_sent_back_as_one_message(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client
) -> None:
    client = claude_client(proxy, headers={"X-Conversation-ID": "parts-1"})
    upstream.enqueue(Reply.tool_calls([("get_weather", '{"city": "Paris"}'), ("get_weather", '{"city": "Rome"}')]))
    first = client.messages.create(model=MODEL, max_tokens=100, tools=[WEATHER], messages=[{"role": "user", "content": "Paris and Rome?"}])
    reminder = {"type": "text", "text": "<system-reminder>Be brief.</system-reminder>"}
    answer = results(first, "sunny", reminder)
    client.messages.create(
        model=MODEL, max_tokens=100, tools=[WEATHER],
        messages=[{"role": "user", "content": "Paris and Rome?"}, as_params(first), answer],
    )
    assert upstream.messages_requests()[-1]["messages"][-1] == answer  # rebuilt in order, byte for byte
    stored = live_messages(http, "parts-1")
    assert [len(m["content"]) for m in stored[2:5]] == [1, 1, 1]
    assert [m["content"][0]["type"] for m in stored[2:5]] == ["tool_result", "tool_result", "text"]
    refs = [m.get("ref") for m in trajectory(http, "parts-1")]
    assert [r is not None for r in refs] == [False, False, True, True, False, False]


# -- truncation and read-back --------------------------------------------------------------------


def reading_model(body: dict[str, Any]) -> Reply:
    """A model that reads the end of a shortened output once, then answers from what it read."""
    last = body["messages"][-1]["content"]
    text = json.dumps(last)
    if "FAILED at step 00900" in text:
        return Reply.text("The build failed at step 900: a linker error in libfoo.so.", reasoning="Found the failure.")
    if "read_tool_output" in text:
        ref = text.split('ref \\"', 1)[1].split('\\"', 1)[0]
        args = {"ref": ref, "offset": len(BUILD_LOG) - 200, "length": 200}
        return Reply.tool_calls([("read_tool_output", json.dumps(args))], reasoning="The end of the log is cut off.")
    return Reply.tool_calls([("run_build", "{}")], reasoning="I will run the build.")


def test_a_long_tool_result_is_shortened_and_read_back_out_of_the_clients_sight(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client
) -> None:
    upstream.responder = reading_model
    client = claude_client(proxy, headers={"X-Conversation-ID": "read-1"})
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Why does the build fail?"}]
    first = client.messages.create(model=MODEL, max_tokens=4096, tools=[BUILD], thinking=THINKING, messages=messages)
    messages += [as_params(first), results(first, BUILD_LOG)]
    body = {"model": MODEL, "max_tokens": 4096, "tools": [BUILD], "thinking": THINKING, "messages": messages, "stream": True}
    response = httpx.post(proxy.url + "/v1/messages", json=body, headers={**HEADERS, "X-Conversation-ID": "read-1"}, timeout=30)
    assert response.status_code == 200, response.text
    events = sse_events(response.text)

    # One message, contiguous blocks, none of ours, none of the read round's thinking.
    names = [name for name, _ in events]
    assert names.count("message_start") == names.count("message_delta") == names.count("message_stop") == 1
    assert names[0] == "message_start" and names[-1] == "message_stop"
    starts = [data for name, data in events if name == "content_block_start"]
    assert [s["index"] for s in starts] == [0, 1]
    assert [s["content_block"]["type"] for s in starts] == ["thinking", "text"]
    assert "read_tool_output" not in response.text and "cut off" not in response.text
    (delta,) = [data for name, data in events if name == "message_delta"]
    assert delta["delta"]["stop_reason"] == "end_turn"

    _, round1, round2 = upstream.messages_requests()
    sent_result = round1["messages"][-1]["content"][0]["content"]
    assert len(sent_result) < 3000 and "read_tool_output" in sent_result and "FAILED" not in sent_result
    assert [t["name"] for t in round1["tools"]] == ["run_build", "read_tool_output", "search_history"]
    # The read round: the model's own thinking + call, byte for byte, then the proxy's answer.
    assert block_types(round2)[-2:] == [("assistant", ["thinking", "tool_use"]), ("user", ["tool_result"])]
    assert "FAILED at step 00900" in round2["messages"][-1]["content"][0]["content"]

    # The client sends its reply back: valid (its thinking is the final round's own), and the
    # read round stays out of the transcript.
    final = {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Found the failure.", "signature": _signature(events)},
        {"type": "text", "text": "The build failed at step 900: a linker error in libfoo.so."},
    ]}
    upstream.responder = lambda body: Reply.text("You're welcome.", reasoning="Polite.")
    client.messages.create(
        model=MODEL, max_tokens=4096, tools=[BUILD], thinking=THINKING,
        messages=[*messages, final, {"role": "user", "content": "Thanks"}],
    )
    later = upstream.messages_requests()[-1]["messages"]
    assert [b["name"] for m in later for b in m["content"] if isinstance(b, dict) and b["type"] == "tool_use"] == ["run_build"]
    stored = live_messages(http, "read-1")
    assert stored[2]["content"][0]["content"] == BUILD_LOG  # the full output is kept
    assert stored[3] == final
    statuses = [m["status"] for m in trajectory(http, "read-1")]
    assert statuses.count("internal") == 2


@pytest.mark.parametrize("theirs", [False, True])
def test_text_streamed_before_our_call_reaches_the_client_once(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client, theirs: bool
) -> None:
    """The relay assembles a round's blocks once for the client's view and the round's reply
    until one of them differs (our tool_use starts): both still part there, the read round gets
    the round's whole reply, the client its text once and its own call renumbered."""
    cid = f"text-first-{theirs}"

    def model(body: dict[str, Any]) -> Reply:
        last = json.dumps(body["messages"][-1]["content"])
        if "FAILED at step 00900" in last:  # our read answered
            return Reply.text("It is a linker error.")
        if "read_tool_output" in last:  # the shortened build log
            ref = last.split('ref \\"', 1)[1].split('\\"', 1)[0]
            read = ("read_tool_output", json.dumps({"ref": ref, "offset": len(BUILD_LOG) - 200, "length": 200}))
            return Reply.tool_calls([read, *([("run_build", "{}")] if theirs else [])], content="Let me look at the log first. ")
        return Reply.tool_calls([("run_build", "{}")])

    upstream.responder = model
    client = claude_client(proxy, headers={"X-Conversation-ID": cid})
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Why does the build fail?"}]
    first = client.messages.create(model=MODEL, max_tokens=4096, tools=[BUILD], messages=messages)
    messages += [as_params(first), results(first, BUILD_LOG)]
    body = {"model": MODEL, "max_tokens": 4096, "tools": [BUILD], "messages": messages, "stream": True}
    response = httpx.post(proxy.url + "/v1/messages", json=body, headers={**HEADERS, "X-Conversation-ID": cid}, timeout=30)
    assert response.status_code == 200, response.text
    events = sse_events(response.text)
    starts = [data for name, data in events if name == "content_block_start"]
    text = "".join(data["delta"]["text"] for name, data in events
                   if name == "content_block_delta" and data["delta"]["type"] == "text_delta")
    stored = live_messages(http, cid)[-1]
    assert "read_tool_output" not in response.text
    if theirs:  # no read round: the reply is the text and the client's call
        assert [(s["index"], s["content_block"]["type"]) for s in starts] == [(0, "text"), (1, "tool_use")]
        assert starts[1]["content_block"]["name"] == "run_build"
        assert text == "Let me look at the log first. "
        assert [b["type"] for b in stored["content"]] == ["text", "tool_use"] and stored["content"][0]["text"] == text
        assert len(upstream.messages_requests()) == 2
    else:  # our call answered in a second round, whose text follows the first's
        assert [(s["index"], s["content_block"]["type"]) for s in starts] == [(0, "text"), (1, "text")]
        assert text == "Let me look at the log first. It is a linker error."
        assert [b.get("text") for b in stored["content"]] == ["Let me look at the log first. ", "It is a linker error."]
        read_round = upstream.messages_requests()[-1]["messages"]
        assert block_types(upstream.messages_requests()[-1])[-2:] == [("assistant", ["text", "tool_use"]), ("user", ["tool_result"])]
        assert read_round[-2]["content"][0]["text"] == "Let me look at the log first. "


def _signature(events: list[tuple[str, dict[str, Any]]]) -> str:
    return "".join(
        data["delta"]["signature"] for name, data in events
        if name == "content_block_delta" and data["delta"]["type"] == "signature_delta"
    )


def test_a_breakpoint_on_a_shortened_output_stays_on_it(proxy: ProxyServer, upstream: FakeUpstream) -> None:
    """The client's cache_control on the text of a long tool_result: the shortened text keeps it
    (the rewrite is the same bytes every turn, so the cache it marks still pays)."""
    client = claude_client(proxy, headers={"X-Conversation-ID": "bp-short"})
    upstream.enqueue(Reply.tool_calls([("run_build", "{}")]), Reply.text("It failed."))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Build it."}]
    first = client.messages.create(model=MODEL, max_tokens=100, tools=[BUILD], messages=messages)
    marked = {"type": "ephemeral"}
    log = [{"type": "text", "text": BUILD_LOG, "cache_control": marked}]
    messages += [as_params(first), {"role": "user", "content": [{"type": "tool_result", "tool_use_id": first.content[0].id, "content": log}]}]
    client.messages.create(model=MODEL, max_tokens=100, tools=[BUILD], messages=messages)
    (block,) = upstream.messages_requests()[-1]["messages"][-1]["content"][0]["content"]
    assert block["cache_control"] == marked and "read_tool_output" in block["text"] and len(block["text"]) < 3000


def test_read_back_in_a_json_reply(proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client) -> None:
    upstream.responder = reading_model
    client = claude_client(proxy, headers={"X-Conversation-ID": "read-2"})
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Why does the build fail?"}]
    first = client.messages.create(model=MODEL, max_tokens=4096, tools=[BUILD], messages=messages)
    messages += [as_params(first), results(first, BUILD_LOG)]
    answer = client.messages.with_raw_response.create(model=MODEL, max_tokens=4096, tools=[BUILD], messages=messages)
    reply = answer.parse()
    assert [b.type for b in reply.content] == ["text"] and "libfoo.so" in reply.content[0].text
    assert reply.stop_reason == "end_turn"
    assert len(upstream.messages_requests()) == 3
    assert int(answer.headers["X-Context-Tokens-Sent"]) < len(BUILD_LOG) // 8


def test_a_reply_that_was_only_a_read_past_the_limit_goes_back_upstream_valid(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    proxy = messages_proxy(make_proxy, upstream, truncation={"max_read_rounds": 0})
    upstream.responder = reading_model
    client = claude_client(proxy, headers={"X-Conversation-ID": "read-3"})
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Why does the build fail?"}]
    first = client.messages.create(model=MODEL, max_tokens=4096, tools=[BUILD], messages=messages)
    messages += [as_params(first), results(first, BUILD_LOG)]
    empty = client.messages.create(model=MODEL, max_tokens=4096, tools=[BUILD], messages=messages)
    assert (empty.content, empty.stop_reason) == ([], "end_turn")  # only our call, taken out
    upstream.responder = lambda body: Reply.text("Let me look again.")
    client.messages.create(
        model=MODEL, max_tokens=4096, tools=[BUILD],
        messages=[*messages, as_params(empty), {"role": "user", "content": "Well?"}],
    )
    sent = upstream.messages_requests()[-1]["messages"]
    assert all(m["content"] for m in sent)  # no empty message: the real API refuses one
    assert sent[-1] == {"role": "user", "content": "Well?"} and sent[-2]["content"][0]["type"] == "tool_result"


# -- compaction, the window, cache breakpoints ---------------------------------------------------


def test_the_summary_goes_into_system_after_the_clients_own_blocks(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    compaction = {"strategy": "turns", "compactor_class": "tests.support.custom_compactor.FixedCompactor", "background": False}
    proxy = messages_proxy(make_proxy, upstream, compaction=compaction)
    client = claude_client(proxy, headers={"X-Conversation-ID": "summary-1"})
    system = [
        {"type": "text", "text": "You are a build agent."},
        {"type": "text", "text": "Be precise.", "cache_control": {"type": "ephemeral"}},
    ]
    # Claude Code's environment note: a system message inside `messages`, right after the task.
    environment = {"role": "system", "content": "Working directory: /home/dev/project"}
    messages: list[dict[str, Any]] = []
    for text in ("Build the project.", "Now run the tests.", "And the linter."):
        messages.append({"role": "user", "content": text})
        if len(messages) == 1:
            messages.append(environment)
        reply = client.messages.with_raw_response.create(model=MODEL, max_tokens=100, system=system, messages=messages)
        messages.append(as_params(reply.parse()))
    sent = upstream.messages_requests()[-1]
    assert sent["system"][:2] == system
    assert sent["system"][2]["type"] == "text" and sent["system"][2]["text"].endswith("CUSTOM SUMMARY")
    # The task, pinned with the note that joins it; the summarized turn between them and now, out.
    assert sent["messages"][:2] == [{"role": "user", "content": "Build the project."}, environment]
    assert {"role": "user", "content": "Now run the tests."} not in sent["messages"]
    assert sent["messages"][-1] == {"role": "user", "content": "And the linter."}
    assert int(reply.headers["X-Context-Messages-Left-Out"]) >= 1


def test_mask_turns_older_results_into_placeholders_inside_their_message(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    proxy = messages_proxy(make_proxy, upstream, compaction={"strategy": "mask", "keep_tool_outputs": 1, "mask_batch": 1})
    client = claude_client(proxy, headers={"X-Conversation-ID": "mask-1"})
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Weather in three cities?"}]
    for city in ("Paris", "Rome", "Oslo"):
        upstream.enqueue(Reply.tool_calls([("get_weather", json.dumps({"city": city}))]))
        reply = client.messages.create(model=MODEL, max_tokens=100, tools=[WEATHER], messages=messages)
        messages += [as_params(reply), results(reply, f"{city}: mild", {"type": "text", "text": f"(asked about {city})"})]
    upstream.enqueue(Reply.text("Done."))
    client.messages.create(model=MODEL, max_tokens=100, tools=[WEATHER], messages=messages)
    sent = upstream.messages_requests()[-1]["messages"]
    contents = [m["content"] for m in sent if m["role"] == "user" and isinstance(m["content"], list)]
    assert [c[0]["content"].startswith("[context-proxy: older tool output omitted") for c in contents] == [True, True, False]
    assert [c[1]["text"] for c in contents] == ["(asked about Paris)", "(asked about Rome)", "(asked about Oslo)"]
    assert "read_tool_output" in [t["name"] for t in upstream.messages_requests()[-1]["tools"]]


def test_an_llm_summary_of_a_tool_loop_keeps_calls_with_their_results(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    """The built-in compactor on a Messages conversation: its summarizer is a chat model here
    (summarizer.model), its window cut between units, and what stays after it valid upstream."""
    proxy = messages_proxy(
        make_proxy, upstream,
        upstream={"api_key": "sk-summarizer-0123456789"},  # the chat fake wants a Bearer key
        summarizer={"model": "gpt-4o-mini"},
        compaction={"strategy": "budget", "background": False, "max_history_summary_length": 1000},
    )
    client = claude_client(proxy, headers={"X-Conversation-ID": "llm-summary"})
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Check the weather in four cities."}]
    for city in ("Paris", "Rome", "Oslo", "Lima"):
        upstream.enqueue(Reply.tool_calls([("get_weather", json.dumps({"city": city}))], reasoning=f"Now {city}."))
        reply = client.messages.create(model=MODEL, max_tokens=4096, tools=[WEATHER], thinking=THINKING, messages=messages)
        messages += [as_params(reply), results(reply, f"{city}: " + "mild and dry. " * 30)]
    upstream.enqueue(Reply.text("Done.", reasoning="All four."))
    client.messages.create(model=MODEL, max_tokens=4096, tools=[WEATHER], thinking=THINKING, messages=messages)
    (summarizer_call, *_) = [b for b in upstream.chat_requests() if "working memory" in json.dumps(b["messages"][0])]
    assert "Paris: mild and dry" in summarizer_call["messages"][-1]["content"]  # the results, read by the codec
    sent = upstream.messages_requests()[-1]
    assert "Summary of the earlier part" in sent["system"][-1]["text"]
    assert sent["messages"][0] == messages[0]  # the task, pinned
    kept = sent["messages"][1:]
    assert kept and kept[0]["role"] == "assistant" and len(kept) < len(messages) - 1
    assert all(m in messages for m in kept)  # whole messages: no call without its result (the fake checked)


def test_summaries_of_a_claude_code_conversation_are_asked_of_its_own_model_at_the_anthropic_api(
    make_proxy: MakeProxy, upstream: FakeUpstream, http: httpx.Client
) -> None:
    """The default summarizer is the request's own model with the client's key: for Claude Code
    that is the Anthropic API, in Messages (the OpenAI base URL is unreachable here)."""
    proxy = make_proxy(
        upstream_url="http://127.0.0.1:9/v1",
        upstream={"anthropic_base_url": upstream.anthropic.base_url},
        truncation={"tools": {"run_build": "summarize"}},
        compaction={"strategy": "budget", "background": False, "max_history_summary_length": 1000},
    )
    upstream.responder = by_kind(lambda body: Reply.tool_calls([("run_build", "{}")]), fixed_summary("The build fails at step 900."))
    client = claude_client(proxy, headers={"X-Conversation-ID": "own-summary"})
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Why does the build fail?"}]
    for _ in range(3):
        reply = client.messages.create(model=MODEL, max_tokens=4096, tools=[BUILD], messages=messages)
        messages += [as_params(reply), results(reply, BUILD_LOG)]
    client.messages.create(model=MODEL, max_tokens=4096, tools=[BUILD], messages=messages)

    asked = upstream.messages_requests()
    tool_summaries = [b for b in asked if is_tool_summary_request(b)]
    history_summaries = [b for b in asked if is_summary_request(b)]
    assert tool_summaries and history_summaries  # both kinds, at the Anthropic API
    assert all(b["model"] == MODEL and b["max_tokens"] > 0 for b in tool_summaries + history_summaries)
    assert upstream.chat_requests() == []
    sent = [b for b in asked if not is_tool_summary_request(b) and not is_summary_request(b)][-1]
    assert "Summary of the earlier part" in sent["system"][-1]["text"]
    assert "The build fails at step 900." in sent["messages"][-1]["content"][0]["content"]  # the output's summary
    (summary,) = admin_get(http, "/own-summary/trajectory").json()["summaries"][-1:]
    assert summary["tokens_in"] > 0 and summary["tokens_out"] > 0  # Anthropic's usage, read


def test_the_window_drops_thinking_tool_use_and_results_as_one_unit(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    proxy = messages_proxy(make_proxy, upstream, context={"history_token_limit": 600})
    client = claude_client(proxy, headers={"X-Conversation-ID": "window-1"})
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Check the weather in five cities."}]
    for city in ("Paris", "Rome", "Oslo", "Lima", "Cairo"):
        upstream.enqueue(Reply.tool_calls([("get_weather", json.dumps({"city": city}))], reasoning=f"Now {city}."))
        reply = client.messages.with_raw_response.create(
            model=MODEL, max_tokens=4096, tools=[WEATHER], thinking=THINKING, messages=messages
        )
        messages += [as_params(reply.parse()), results(reply.parse(), f"{city}: " + "mild and dry. " * 40)]
    upstream.enqueue(Reply.text("Done.", reasoning="All five."))
    last = client.messages.with_raw_response.create(model=MODEL, max_tokens=4096, tools=[WEATHER], thinking=THINKING, messages=messages)
    assert last.parse().content[-1].text == "Done."
    assert int(last.headers["X-Context-Messages-Left-Out"]) > 0
    sent = upstream.messages_requests()[-1]
    assert len(sent["messages"]) < len(messages) and sent["messages"][0]["role"] == "user"
    kept = [m for m in sent["messages"] if m["role"] == "assistant"]
    assert kept and all(m in messages for m in kept)  # whole, byte for byte
    assert all(m["content"][0]["type"] == "thinking" for m in kept)
    assert sent["messages"][-2:] == messages[-2:]  # the newest unit, always


def test_stored_breakpoints_replayed_in_proxy_history_stay_within_four(
    proxy: ProxyServer, upstream: FakeUpstream
) -> None:
    client = claude_client(proxy, headers={"X-Conversation-ID": "bp-1", "X-History": "proxy"})
    marked = {"type": "ephemeral"}
    system = [{"type": "text", "text": "A", "cache_control": marked}, {"type": "text", "text": "B", "cache_control": marked}]
    for turn in range(4):
        content = [{"type": "text", "text": f"Turn {turn}", "cache_control": marked}]
        client.messages.create(model=MODEL, max_tokens=100, system=system, messages=[{"role": "user", "content": content}])
    assert [r.status_sent for r in upstream.requests] == [200] * 4
    sent = json.dumps(upstream.messages_requests()[-1])
    assert sent.count('"cache_control"') == 4
    assert upstream.messages_requests()[-1]["messages"][-1]["content"][0]["cache_control"] == marked


# -- count_tokens ------------------------------------------------------------------------------


def test_count_tokens_counts_the_prompt_the_proxy_would_send_and_stores_nothing(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client
) -> None:
    client = claude_client(proxy, headers={"X-Claude-Code-Session-Id": "count-1"})
    upstream.enqueue(Reply.tool_calls([("run_build", "{}")]))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Build it."}]
    first = client.messages.create(model=MODEL, max_tokens=100, tools=[BUILD], messages=messages)
    messages += [as_params(first), results(first, BUILD_LOG)]
    before = conversation(http, "count-1")

    managed = client.messages.count_tokens(model=MODEL, tools=[BUILD], messages=messages)
    direct = claude_client(proxy, base_url=upstream.anthropic.base_url).messages.count_tokens(
        model=MODEL, tools=[BUILD], messages=messages
    )
    assert managed.input_tokens < direct.input_tokens // 3
    counted = upstream.anthropic.count_tokens_requests()[0]
    assert "read_tool_output" in counted["messages"][-1]["content"][0]["content"]
    assert [t["name"] for t in counted["tools"]] == ["run_build", "read_tool_output", "search_history"]
    # Nothing written: no message, no call, no turn; a new conversation is not created either.
    assert conversation(http, "count-1") == before
    fresh = claude_client(proxy, headers={"X-Claude-Code-Session-Id": "count-2"})
    assert fresh.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "Hi"}]).input_tokens > 0
    assert admin_get(http, "/count-2").status_code == 404
    # The same long result, sent for real, goes upstream exactly as it was counted.
    upstream.enqueue(Reply.text("It failed."))
    client.messages.create(model=MODEL, max_tokens=100, tools=[BUILD], messages=messages)
    assert upstream.messages_requests()[-1]["messages"] == counted["messages"]


def test_a_count_of_something_on_its_own_is_not_counted_with_the_conversations_summary(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    """Claude Code counts a tool result or its tool list on its own, under its session id: that
    count is no continuation of the session, so neither its summary nor its cuts go with it."""
    compaction = {"strategy": "turns", "compactor_class": "tests.support.custom_compactor.FixedCompactor", "background": False}
    proxy = messages_proxy(make_proxy, upstream, compaction=compaction)
    client = claude_client(proxy, headers={"X-Claude-Code-Session-Id": "count-alone"})
    messages: list[dict[str, Any]] = []
    for text in ("Build the project.", "Now run the tests."):
        messages.append({"role": "user", "content": text})
        messages.append(as_params(client.messages.create(model=MODEL, max_tokens=100, messages=messages)))
    messages.append({"role": "user", "content": "And the linter."})
    client.messages.count_tokens(model=MODEL, messages=messages)
    alone = [{"role": "user", "content": "The output of a tool, counted on its own."}]
    client.messages.count_tokens(model=MODEL, tools=[BUILD], messages=alone)
    continuation, fragment = upstream.anthropic.count_tokens_requests()
    assert continuation["system"][-1]["text"].endswith("CUSTOM SUMMARY")
    assert fragment == {"model": MODEL, "tools": [BUILD], "messages": alone}  # as it was sent
    # As Claude Code sends it: ?beta=true and its betas, passed through as for /v1/messages.
    betas = {"anthropic-beta": "claude-code-20250219,token-counting-2024-11-01", "X-Claude-Code-Session-Id": "count-alone"}
    response = httpx.post(proxy.url + "/v1/messages/count_tokens?beta=true", json={"model": MODEL, "messages": messages},
                          headers={**HEADERS, **betas})
    assert response.status_code == 200 and response.json()["input_tokens"] > 0, response.text
    record = [r for r in upstream.requests if r.path == "/v1/messages/count_tokens"][-1]
    assert record.query == {"beta": "true"} and record.headers["anthropic-beta"] == betas["anthropic-beta"]
    assert record.headers["anthropic-version"] == "2023-06-01" and "x-claude-code-session-id" in record.headers


# -- errors ------------------------------------------------------------------------------------


def test_the_upstreams_own_errors_pass_unmodified_and_store_nothing_live(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client
) -> None:
    client = claude_client(proxy, headers={"X-Conversation-ID": "err-1"})
    upstream.enqueue(overloaded())
    with pytest.raises(anthropic.APIStatusError) as caught:
        client.messages.create(model=MODEL, max_tokens=100, messages=[{"role": "user", "content": "Hi"}])
    assert caught.value.status_code == 529
    assert caught.value.body == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    with pytest.raises(anthropic.BadRequestError) as refused:  # the fake's own 400: temperature out of range
        client.messages.create(model=MODEL, max_tokens=100, extra_body={"temperature": 3}, messages=[{"role": "user", "content": "Hi"}])
    assert refused.value.body["error"]["message"] == "temperature: Input should be a number between 0 and 1"
    assert live_messages(http, "err-1") == []
    assert {m["status"] for m in trajectory(http, "err-1")} == {"failed"}


def test_the_proxys_own_errors_take_anthropics_shape(make_proxy: MakeProxy, upstream: FakeUpstream) -> None:
    proxy = messages_proxy(make_proxy, upstream, quota={"max_llm_calls": 1})
    post = lambda body, **headers: httpx.post(
        proxy.url + "/v1/messages", content=body, headers={**HEADERS, "Content-Type": "application/json", **headers}
    )
    bad = post(b"{not json")
    assert bad.status_code == 400 and bad.json()["type"] == "error"
    assert bad.json()["error"]["type"] == "invalid_request_error"
    no_messages = post(json.dumps({"model": MODEL, "max_tokens": 10}).encode())
    assert no_messages.json()["error"] == {"type": "invalid_request_error", "message": "messages: Field required"}
    bad_id = post(json.dumps({"model": MODEL, "max_tokens": 10, "messages": []}).encode(), **{"X-Conversation-ID": "a b"})
    assert (bad_id.status_code, bad_id.json()["error"]["type"]) == (400, "invalid_request_error")
    bad_block = post(json.dumps({"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": [{"text": "x"}]}]}).encode())
    assert (bad_block.status_code, bad_block.json()["type"]) == (400, "error")
    body = json.dumps({"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": "Hi"}]}).encode()
    assert post(body, **{"X-Conversation-ID": "quota-1"}).status_code == 200
    over = post(body, **{"X-Conversation-ID": "quota-1"})
    assert over.status_code == 429 and over.json()["error"]["type"] == "rate_limit_error"


def test_what_the_proxy_refuses_before_reading_a_turn_is_in_anthropics_shape_too(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    """The guard, the body and message limits, a body that never arrives: refused before the
    handler runs, and still the shape Claude Code reads (it shows `error.message`)."""
    proxy = messages_proxy(make_proxy, upstream, server={"max_body_mb": 0.05, "max_messages": 4, "body_timeout_s": 0.5})
    hi = {"model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": "Hi"}]}

    def refused(response: httpx.Response, status: int, kind: str) -> None:
        assert response.status_code == status, response.text
        assert response.json()["type"] == "error" and response.json()["error"]["type"] == kind, response.text

    for path in ("/v1/messages", "/v1/messages/count_tokens", "/c/guard-1/v1/messages?beta=true"):
        refused(httpx.post(proxy.url + path, content=json.dumps(hi), headers={**HEADERS, "Content-Type": "text/plain"}),
                415, "invalid_request_error")
        refused(httpx.post(proxy.url + path, json=hi, headers={**HEADERS, "Origin": "https://evil.example"}),
                403, "permission_error")
    big = {**hi, "messages": [{"role": "user", "content": "x" * 100_000}]}
    refused(httpx.post(proxy.url + "/v1/messages", json=big, headers=HEADERS), 413, "request_too_large")
    many = {**hi, "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}] * 3}
    with pytest.raises(anthropic.APIStatusError) as too_many:
        claude_client(proxy).messages.create(**many)
    assert too_many.value.status_code == 413 and too_many.value.body["error"]["type"] == "request_too_large"

    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:  # a body that never comes
        sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"x-api-key: " + ALICE.encode() + b"\r\nContent-Length: 1000\r\n\r\n{\"model\": ")
        answer = b""
        while chunk := sock.recv(65536):  # until the proxy closes it, at body_timeout_s
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert json.loads(answer.partition(b"\r\n\r\n")[2])["type"] == "error"
    assert upstream.requests == []  # none of it went upstream


def test_an_unreachable_or_silent_upstream_is_a_502_or_504_in_anthropics_shape(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    gone = make_proxy(upstream={"anthropic_base_url": "http://127.0.0.1:9"})
    with pytest.raises(anthropic.APIStatusError) as unreachable:
        claude_client(gone).messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    assert unreachable.value.status_code == 502 and unreachable.value.body["error"]["type"] == "api_error"
    slow = messages_proxy(make_proxy, upstream, upstream={"timeout_s": 0.5})
    hang = Reply.hang()
    upstream.enqueue(hang)
    try:
        with pytest.raises(anthropic.APIStatusError) as silent:
            claude_client(slow).messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    finally:
        hang.release()
    assert silent.value.status_code == 504 and silent.value.body["error"]["type"] == "timeout_error"


def test_an_error_mid_stream_reaches_the_client_once_as_the_upstream_sent_it(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client
) -> None:
    upstream.enqueue(error_mid_stream(Reply.text("Hello there, this is long."), after_events=4))
    body = {"model": MODEL, "max_tokens": 100, "stream": True, "messages": [{"role": "user", "content": "Hi"}]}
    response = httpx.post(proxy.url + "/v1/messages", json=body, headers={**HEADERS, "X-Conversation-ID": "mid-1"})
    events = sse_events(response.text)
    errors = [data for name, data in events if name == "error"]
    assert errors == [{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}]
    assert "message_stop" not in [name for name, _ in events]
    assert live_messages(http, "mid-1") == []
    assert [m["status"] for m in trajectory(http, "mid-1")] == ["failed", "incomplete"]


# -- identity, passthrough, credentials ------------------------------------------------------------


def test_claude_codes_session_ids_and_the_path_name_the_conversation(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client
) -> None:
    hi = [{"role": "user", "content": "Hi"}]
    claude_client(proxy, headers={"X-Claude-Code-Session-Id": "9c9ad33a-0bb7-4b0f"}).messages.create(
        model=MODEL, max_tokens=10, messages=hi
    )
    user_id = json.dumps({"device_id": "d", "account_uuid": "", "session_id": "from-metadata-1"})
    claude_client(proxy).messages.create(model=MODEL, max_tokens=10, messages=hi, metadata={"user_id": user_id})
    claude_client(proxy, base_url=proxy.url + "/c/from-path-1").messages.create(model=MODEL, max_tokens=10, messages=hi)
    named = claude_client(proxy, headers={"X-Conversation-ID": "named-1", "X-Claude-Code-Session-Id": "other"})
    named.messages.create(model=MODEL, max_tokens=10, messages=hi)
    invalid = claude_client(proxy, headers={"X-Claude-Code-Session-Id": "not a valid id"})
    invalid.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Hello?"}])
    ids = {c["id"] for c in admin_get(http, "").json()["data"]}
    assert {"9c9ad33a-0bb7-4b0f", "from-metadata-1", "from-path-1", "named-1"} < ids
    assert "other" not in ids and any(i.startswith("auto-") for i in ids)
    assert all(r.path == "/v1/messages" for r in upstream.requests)  # the /c/<id> prefix is ours


def test_betas_query_headers_and_unknown_fields_pass_through_untouched(
    proxy: ProxyServer, upstream: FakeUpstream
) -> None:
    edits = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}
    body = {
        "model": MODEL, "max_tokens": 10, "messages": [{"role": "user", "content": "Hi"}],
        "context_management": edits, "output_config": {"effort": "low"},
    }
    headers = {
        **HEADERS, "anthropic-beta": "context-management-2025-06-27", "X-Custom-Trace": "t-1",
        "X-Conversation-ID": "beta-1", "X-History": "full",
    }
    response = httpx.post(proxy.url + "/v1/messages?beta=true", json=body, headers=headers)
    assert response.status_code == 200, response.text
    (record,) = upstream.requests
    assert record.query == {"beta": "true"}
    assert record.headers["anthropic-beta"] == "context-management-2025-06-27"
    assert record.headers["anthropic-version"] == "2023-06-01" and record.headers["x-custom-trace"] == "t-1"
    assert "x-conversation-id" not in record.headers and "x-history" not in record.headers
    assert record.body["context_management"] == edits and record.body["output_config"] == {"effort": "low"}


def test_other_paths_of_an_anthropic_client_go_to_the_anthropic_api(make_proxy: MakeProxy, upstream: FakeUpstream) -> None:
    # The OpenAI base URL is unreachable: only the Anthropic one can answer.
    proxy = make_proxy(upstream_url="http://127.0.0.1:9/v1", upstream={"anthropic_base_url": upstream.anthropic.base_url})
    response = httpx.get(
        proxy.url + "/c/batch-1/v1/messages/batches?limit=2",
        headers={**HEADERS, "Authorization": "Bearer sk-x", "anthropic-beta": "message-batches-2024-09-24"},
    )
    assert response.status_code == 200, response.text
    echo = response.json()
    assert (echo["path"], echo["query"]) == ("/v1/messages/batches", {"limit": "2"})
    assert echo["headers_seen"]["anthropic-beta"] == "message-batches-2024-09-24"
    assert httpx.get(proxy.url + "/v1/models", headers={"Authorization": "Bearer sk-x"}).status_code == 502


def test_a_configured_anthropic_key_goes_upstream_while_the_clients_key_names_the_tenant(
    make_proxy: MakeProxy, upstream: FakeUpstream, http: httpx.Client
) -> None:
    proxy = messages_proxy(make_proxy, upstream, upstream={"anthropic_api_key": "sk-ant-proxy-key-000"})
    claude_client(proxy, api_key=BOB, headers={"X-Conversation-ID": "key-1"}).messages.create(
        model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Hi"}]
    )
    assert upstream.requests[-1].headers["x-api-key"] == "sk-ant-proxy-key-000"
    assert admin_get(http, "/key-1", api_key=BOB).status_code == 200
    assert admin_get(http, "/key-1", api_key=ALICE).status_code == 404


def test_a_bearer_token_is_forwarded_and_names_the_tenant_like_a_key(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client
) -> None:
    """Claude Code with ANTHROPIC_AUTH_TOKEN sends `Authorization: Bearer` instead of x-api-key."""
    client = anthropic.Anthropic(base_url=proxy.url, auth_token=BOB, max_retries=0, default_headers={"X-Conversation-ID": "bearer-1"})
    client.messages.create(model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "Hi"}])
    record = upstream.requests[-1]
    assert record.headers["authorization"] == f"Bearer {BOB}" and "x-api-key" not in record.headers
    assert admin_get(http, "/bearer-1", api_key=BOB).status_code == 200
    assert admin_get(http, "/bearer-1", api_key=ALICE).status_code == 404


# -- what the admin API and /metrics show ----------------------------------------------------------


def test_the_admin_api_and_metrics_show_messages_conversations(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client
) -> None:
    client = claude_client(proxy, headers={"X-Conversation-ID": "admin-1"})
    upstream.enqueue(Reply.tool_calls([("run_build", "{}")]), Reply.text("It failed at step 900."))
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Build it."}]
    first = client.messages.create(model=MODEL, max_tokens=100, tools=[BUILD], messages=messages)
    client.messages.create(model=MODEL, max_tokens=100, tools=[BUILD], messages=[*messages, as_params(first), results(first, BUILD_LOG)])
    tool = next(m for m in trajectory(http, "admin-1") if m.get("ref"))
    output = admin_get(http, f"/admin-1/tool_outputs/{tool['ref']}").json()
    assert output["content"] == BUILD_LOG and output["tool_call_id"] == first.content[0].id
    turns = admin_get(http, "/admin-1/turns").json()["data"]
    assert [t["format"] for t in turns] == ["messages", "messages"] and turns[1]["truncated"] == 1
    metrics = http.get("/metrics").text
    assert 'context_proxy_requests_total{route="/v1/messages",status="200"} 2.0' in metrics
    assert 'context_proxy_usage_tokens_total{kind="input_tokens"}' in metrics
