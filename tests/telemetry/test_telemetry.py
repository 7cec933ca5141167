"""OpenTelemetry traces, end to end: real turns through the proxy (the official clients, the strict
fake upstream) export over OTLP/HTTP to a real receiver the test starts (tests/support/otlp_receiver.py,
decoding with the opentelemetry-proto messages); the tests read the span tree it got."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator

import openai
import pytest

from proxy.config import ConfigError
from proxy.identity import tenant_of
from proxy.state import STORE, TELEMETRY
from proxy.telemetry import NO_TELEMETRY
from tests.conftest import ALICE, openai_client
from tests.fakes.fake_upstream import Reply, default_responder
from tests.fakes.responders import by_kind
from tests.support.harness import ROOT, proxy_settings
from tests.support.messages_helpers import MODEL as CLAUDE_MODEL
from tests.support.messages_helpers import claude_client
from tests.support.otlp_receiver import OtlpReceiver, ReceivedSpan

REF = re.compile(r"out_\d+_[0-9a-f]{24}")
BIG = "".join(f"line {i:05d}: linking libledger.so ... ok\n" for i in range(900))  # ~40k chars
TOOLS = [{"type": "function", "function": {"name": "run_build", "parameters": {"type": "object", "properties": {}}}}]
TOOL_PROMPT_MARK = "You condense the output of one tool call"
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TASK = "reconcile the quarterly ledger in books/2024.csv"


@pytest.fixture
def otlp(servers, monkeypatch) -> Iterator[OtlpReceiver]:
    """A receiver of this test's own; the SDK's batch processor exports every 50 ms meanwhile."""
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
    receiver = OtlpReceiver()
    servers.run(receiver.start())
    yield receiver
    servers.run(receiver.close())
    assert receiver.refused == 0  # every export the SDK sent was well-formed OTLP


def traced(make_proxy, otlp: OtlpReceiver, **telemetry):
    return make_proxy(telemetry={"otlp_endpoint": otlp.endpoint, **telemetry})


def turns(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    return [s for s in spans if s.kind == "SERVER"]


def children(spans: list[ReceivedSpan], parent: ReceivedSpan) -> list[ReceivedSpan]:
    return sorted((s for s in spans if s.parent_id == parent.span_id), key=lambda s: s.start_ns)


def tree(spans: list[ReceivedSpan], root: ReceivedSpan, depth: int = 0) -> list[str]:
    """The span tree under `root`, one indented name a line (what docs/telemetry.md shows)."""
    lines = ["  " * depth + root.name]
    for child in children(spans, root):
        lines += tree(spans, child, depth + 1)
    return lines


def has_turns(n: int):
    return lambda spans: len(turns(spans)) >= n


def test_a_turn_is_one_genai_span_with_a_child_per_upstream_call(make_proxy, upstream, otlp):
    proxy = traced(make_proxy, otlp)
    client = openai_client(proxy, headers={"X-Conversation-ID": "ledger-run"})
    reply = client.chat.completions.create(
        model="gpt-4o-mini",
        messages=[{"role": "system", "content": "You keep books."}, {"role": "user", "content": TASK}],
    )
    spans = otlp.wait_for(lambda spans: has_turns(1)(spans) and any(s.name.startswith("upstream") for s in spans))
    [turn] = turns(spans)
    assert turn.name == "chat gpt-4o-mini" and turn.parent_id == ""
    a = turn.attributes
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "openai"
    assert a["gen_ai.request.model"] == "gpt-4o-mini" and a["gen_ai.conversation.id"] == "ledger-run"
    assert a["openai.api.type"] == "chat_completions"
    assert a["gen_ai.usage.input_tokens"] == reply.usage.prompt_tokens
    assert a["gen_ai.usage.output_tokens"] == reply.usage.completion_tokens
    assert a["gen_ai.usage.cache_read.input_tokens"] == 0
    assert a["server.address"] == "127.0.0.1" and a["server.port"] == int(upstream.base_url.rsplit(":", 1)[1].split("/")[0])
    assert a["context_proxy.tokens.sent"] > 0 and a["context_proxy.tokens.stored_estimate"] > 0
    assert a["context_proxy.messages.sent"] == 2 and a["context_proxy.messages.left_out"] == 0
    assert a["context_proxy.summary.used"] is False and a["context_proxy.upstream_calls"] == 1
    assert a["context_proxy.client"].startswith("OpenAI Python SDK ")
    assert a["gen_ai.response.id"] == reply.id  # the upstream's chatcmpl-...
    assert turn.status == "UNSET" and turn.resource["service.name"] == "context-proxy"
    assert not any(key.startswith(("gen_ai.input", "gen_ai.output")) for key in a)  # no content unless asked

    [call] = children(spans, turn)
    assert call.name == "upstream gpt-4o-mini" and call.kind == "CLIENT" and call.trace_id == turn.trace_id
    assert call.attributes["http.response.status_code"] == 200 and call.attributes["context_proxy.call.number"] == 1
    assert call.attributes["context_proxy.usage.input_tokens"] == reply.usage.prompt_tokens
    assert not any(key.startswith("gen_ai.") for key in call.attributes)  # a GenAI tool counts the turn once
    assert turn.start_ns <= call.start_ns and call.end_ns <= turn.end_ns


def test_every_format_names_its_reply_in_the_span_and_only_responses_in_the_store(make_proxy, upstream, otlp, servers):
    """gen_ai.response.id is the upstream's id for the reply the client saw, streamed or not;
    only a Responses reply, which a later request may name (previous_response_id), is one whose
    owner the store keeps (an index entry per turn the other formats would never read)."""
    proxy = make_proxy(telemetry={"otlp_endpoint": otlp.endpoint}, upstream={"anthropic_base_url": upstream.anthropic.base_url})
    chat = openai_client(proxy, headers={"X-Conversation-ID": "named-chat"})
    messages = [{"role": "user", "content": TASK}]
    replies = [chat.chat.completions.create(model="gpt-4o-mini", messages=messages)]
    streamed = chat.chat.completions.create(model="gpt-4o-mini", messages=messages, stream=True)
    replies.append(next(chunk for chunk in streamed))
    for _ in streamed:
        pass
    claude = claude_client(proxy, headers={"X-Conversation-ID": "named-claude"})
    replies.append(claude.messages.create(model=CLAUDE_MODEL, max_tokens=50, messages=messages))
    with claude.messages.stream(model=CLAUDE_MODEL, max_tokens=50, messages=messages) as stream:
        replies.append(stream.get_final_message())
    replies.append(openai_client(proxy, headers={"X-Conversation-ID": "named-responses"}).responses.create(
        model="gpt-4o-mini", input=TASK))
    spans = otlp.wait_for(has_turns(5))
    ids = [turn.attributes.get("gen_ai.response.id") for turn in sorted(turns(spans), key=lambda s: s.start_ns)]
    assert ids == [reply.id for reply in replies] and all(ids) and len(set(ids)) == 5
    store, tenant = proxy.app[STORE], tenant_of(ALICE)
    owners = [servers.run(store.response_owner(tenant, reply.id)) for reply in replies]
    assert owners[:4] == [None] * 4 and owners[4] is not None and owners[4][0] == "named-responses"


def test_the_clients_traceparent_is_continued_and_upstream_gets_the_calls(make_proxy, upstream, otlp):
    proxy = traced(make_proxy, otlp)
    traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    client = openai_client(proxy, headers={"traceparent": traceparent, "tracestate": "vendor=1"})
    client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": TASK}])
    spans = otlp.wait_for(lambda spans: len(spans) >= 2)
    [turn] = turns(spans)
    assert turn.trace_id == CLIENT_TRACE and turn.parent_id == CLIENT_SPAN
    [call] = children(spans, turn)
    sent = upstream.requests[-1].headers["traceparent"]
    assert sent == f"00-{CLIENT_TRACE}-{call.span_id}-01"  # the upstream call's own span, not the client's
    assert upstream.requests[-1].headers["tracestate"] == "vendor=1"


def summarize_then_read_back(body: dict) -> Reply:
    """The summarizer condenses the build log; the model reads part of it back, then answers."""
    messages = body["messages"]
    if messages[0]["role"] == "system" and TOOL_PROMPT_MARK in messages[0]["content"]:
        return Reply.text("SUMMARY: the build linked libledger.so")
    last, before = messages[-1], messages[-2]
    if last["role"] == "tool" and before["tool_calls"][0]["function"]["name"] == "read_tool_output":
        return Reply.text("the build is fine")
    if last["role"] == "tool" and (ref := REF.search(last["content"] or "")):
        return Reply.tool_calls([("read_tool_output", json.dumps({"ref": ref.group(0), "offset": 0, "length": 300}))])
    return default_responder(body)


BUILD_TURN = [
    {"role": "user", "content": TASK},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "run_build", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": BIG},
]


# The span tree of BUILD_TURN (what docs/telemetry.md shows).
TREE = [
    "chat gpt-4o-mini",
    "  chat gpt-4o-mini",  # the summarizer, on the tool output (before the first call)
    "  upstream gpt-4o-mini",
    "  read_back round 1",
    "    execute_tool read_tool_output",
    "  upstream gpt-4o-mini",
]


def test_read_back_rounds_and_summarizer_calls_are_spans_of_the_turn(make_proxy, upstream, otlp):
    upstream.responder = summarize_then_read_back
    proxy = make_proxy(
        telemetry={"otlp_endpoint": otlp.endpoint, "capture_content": True}, truncation={"tools": {"run_build": "summarize"}}
    )
    reply = openai_client(proxy).chat.completions.create(model="gpt-4o-mini", messages=BUILD_TURN, tools=TOOLS)
    assert reply.choices[0].message.content == "the build is fine"
    spans = otlp.wait_for(lambda spans: has_turns(1)(spans) and len(spans) >= 6)
    [turn] = turns(spans)
    assert tree(spans, turn) == TREE
    summarizer, first, round_, second = children(spans, turn)
    assert summarizer.kind == "CLIENT" and summarizer.attributes["context_proxy.operation"] == "summarize"
    assert summarizer.attributes["gen_ai.usage.output_tokens"] > 0  # its own cost: a GenAI span of its own
    assert TOOL_PROMPT_MARK in summarizer.attributes["gen_ai.input.messages"]
    assert round_.attributes["context_proxy.read_round.made"] is True and round_.attributes["context_proxy.tokens.added"] > 0
    [tool] = children(spans, round_)
    assert tool.attributes["gen_ai.tool.name"] == "read_tool_output" and tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert BIG[:300] in tool.attributes["gen_ai.tool.call.result"]
    assert second.attributes["context_proxy.call.number"] == 2 and second.attributes["context_proxy.call.read_rounds_before"] == 1
    a = turn.attributes
    assert a["context_proxy.read_rounds"] == 1 and a["context_proxy.upstream_calls"] == 2
    assert a["context_proxy.tool_outputs.shortened"] == 1
    # The turn's usage is both calls' together (the fake reports each).
    assert a["gen_ai.usage.input_tokens"] == first.attributes["context_proxy.usage.input_tokens"] + second.attributes["context_proxy.usage.input_tokens"]
    inputs = json.loads(a["gen_ai.input.messages"])  # what went upstream: the summary, not the log
    assert inputs[0] == {"role": "user", "parts": [{"type": "text", "content": TASK}]}
    assert "SUMMARY: the build linked libledger.so" in inputs[2]["parts"][0]["response"]
    assert json.loads(a["gen_ai.output.messages"]) == [{"role": "assistant", "parts": [{"type": "text", "content": "the build is fine"}]}]


def test_without_capture_content_no_span_holds_a_word_of_the_conversation(make_proxy, upstream, otlp):
    upstream.responder = summarize_then_read_back
    proxy = make_proxy(telemetry={"otlp_endpoint": otlp.endpoint}, truncation={"tools": {"run_build": "summarize"}})
    openai_client(proxy).chat.completions.create(model="gpt-4o-mini", messages=BUILD_TURN, tools=TOOLS)
    spans = otlp.wait_for(lambda spans: has_turns(1)(spans) and len(spans) >= 6)
    [turn] = turns(spans)
    assert tree(spans, turn) == TREE  # the same spans as with contents, only without them
    words = ("quarterly ledger", "libledger", "SUMMARY", "the build is fine", "condense")
    values = [str(v) for s in spans for v in s.attributes.values()]
    assert not [v for v in values if any(w in v for w in words)]
    assert not any(k.startswith(("gen_ai.input", "gen_ai.output", "gen_ai.tool.call.a", "gen_ai.tool.call.r")) for s in spans for k in s.attributes)


def test_a_failed_turn_is_an_error_span_with_the_upstreams_status_and_message(make_proxy, upstream, otlp):
    proxy = traced(make_proxy, otlp)
    upstream.enqueue(Reply.error(500, {"error": {"message": "upstream broke", "type": "server_error"}}))
    with pytest.raises(openai.InternalServerError):
        openai_client(proxy).chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": TASK}])
    spans = otlp.wait_for(lambda spans: len(spans) >= 2)
    [turn] = turns(spans)
    assert turn.status == "ERROR" and turn.status_message == "upstream broke"
    assert turn.attributes["error.type"] == "500" and turn.attributes["context_proxy.error.source"] == "upstream"
    [call] = children(spans, turn)
    assert call.status == "ERROR" and call.attributes["error.type"] == "500"
    assert call.attributes["http.response.status_code"] == 500


def test_responses_turns_report_the_upstreams_cache_reads_and_streams_end_their_call(make_proxy, upstream, otlp):
    proxy = traced(make_proxy, otlp)
    client = openai_client(proxy, headers={"X-Conversation-ID": "cached-run"})
    first = client.responses.create(model="gpt-4o-mini", input=TASK, prompt_cache_key="cached-run")
    second = client.responses.create(
        model="gpt-4o-mini", input="and the next quarter", previous_response_id=first.id, prompt_cache_key="cached-run"
    )
    with client.responses.stream(
        model="gpt-4o-mini", input="and the one after", previous_response_id=second.id, prompt_cache_key="cached-run"
    ) as stream:
        streamed = stream.get_final_response()
    spans = otlp.wait_for(lambda spans: has_turns(3)(spans) and sum(s.kind == "CLIENT" for s in spans) >= 3)
    by_time = sorted(turns(spans), key=lambda s: s.start_ns)
    assert [t.attributes["openai.api.type"] for t in by_time] == ["responses"] * 3
    for turn, reply in zip(by_time, (first, second, streamed), strict=True):
        assert turn.attributes["gen_ai.usage.input_tokens"] == reply.usage.input_tokens
        assert turn.attributes["gen_ai.usage.cache_read.input_tokens"] == reply.usage.input_tokens_details.cached_tokens
        assert turn.attributes["gen_ai.response.id"] == reply.id
        [call] = children(spans, turn)
        assert call.end_ns <= turn.end_ns and call.attributes["context_proxy.usage.output_tokens"] == reply.usage.output_tokens
    assert by_time[1].attributes["gen_ai.usage.cache_read.input_tokens"] > 0  # the second prompt extends the first


def test_messages_turns_are_anthropic_chat_spans_with_the_cache_the_upstream_reported(make_proxy, upstream, otlp):
    """A Messages turn (the anthropic client, as Claude Code speaks it), plain and streamed: one
    GenAI span each, served by Anthropic at the Anthropic base URL, its usage with the cache
    reads and writes the upstream reported counted in, and one upstream-call child."""
    proxy = make_proxy(telemetry={"otlp_endpoint": otlp.endpoint}, upstream={"anthropic_base_url": upstream.anthropic.base_url})
    client = claude_client(proxy, headers={"X-Claude-Code-Session-Id": "claude-ledger"})
    system = [{"type": "text", "text": "You keep books.", "cache_control": {"type": "ephemeral"}}]
    messages: list = [{"role": "user", "content": TASK}]
    first = client.messages.create(model=CLAUDE_MODEL, max_tokens=100, system=system, messages=messages)
    messages += [{"role": "assistant", "content": first.content[0].text}, {"role": "user", "content": "and the next quarter"}]
    with client.messages.stream(model=CLAUDE_MODEL, max_tokens=100, system=system, messages=messages) as stream:
        second = stream.get_final_message()
    spans = otlp.wait_for(lambda spans: has_turns(2)(spans) and sum(s.kind == "CLIENT" for s in spans) >= 2)
    by_time = sorted(turns(spans), key=lambda s: s.start_ns)
    port = int(upstream.anthropic.base_url.rsplit(":", 1)[1].split("/")[0])
    for turn, reply in zip(by_time, (first, second), strict=True):
        a = turn.attributes
        assert turn.name == f"chat {CLAUDE_MODEL}" and a["gen_ai.provider.name"] == "anthropic"
        assert a["gen_ai.conversation.id"] == "claude-ledger" and a["gen_ai.request.model"] == CLAUDE_MODEL
        assert "openai.api.type" not in a and a["server.port"] == port
        usage = reply.usage
        read, written = usage.cache_read_input_tokens or 0, usage.cache_creation_input_tokens or 0
        assert a["gen_ai.usage.input_tokens"] == usage.input_tokens + read + written
        assert a["gen_ai.usage.cache_read.input_tokens"] == read
        assert a.get("gen_ai.usage.cache_creation.input_tokens", 0) == written
        assert a["gen_ai.usage.output_tokens"] == usage.output_tokens
        assert a["gen_ai.response.id"] == reply.id  # the upstream's msg_...
        [call] = children(spans, turn)
        assert call.kind == "CLIENT" and call.end_ns <= turn.end_ns
        assert call.attributes["context_proxy.usage.output_tokens"] == usage.output_tokens
    assert by_time[1].attributes["gen_ai.usage.cache_read.input_tokens"] > 0  # the second prompt extends the first


def test_background_summaries_are_spans_under_the_turn_that_started_them(make_proxy, upstream, otlp):
    proxy = make_proxy(
        telemetry={"otlp_endpoint": otlp.endpoint}, compaction={"strategy": "turns", "every_n_user_messages": 2}
    )
    upstream.responder = by_kind()  # a summary the proxy accepts (the default echoes its prompt)
    client = openai_client(proxy, headers={"X-Conversation-ID": "compacting"})
    messages: list[dict] = []
    for text in (TASK, "now the next file", "and the totals"):
        messages.append({"role": "user", "content": text})
        reply = client.chat.completions.create(model="gpt-4o-mini", messages=messages)
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    summaries = lambda spans: [s for s in spans if s.attributes.get("context_proxy.operation") == "summarize"]  # noqa: E731
    spans = otlp.wait_for(lambda spans: summaries(spans) and has_turns(3)(spans))
    [summary] = summaries(spans)
    parent = next(s for s in spans if s.span_id == summary.parent_id)
    assert parent.kind == "SERVER" and parent.attributes["gen_ai.conversation.id"] == "compacting"
    assert summary.name == "chat gpt-4o-mini" and summary.attributes["gen_ai.provider.name"] == "openai"
    assert summary.attributes["gen_ai.usage.input_tokens"] > 0
    later = [t for t in turns(spans) if t.start_ns > summary.end_ns]
    assert all(t.attributes["context_proxy.summary.used"] for t in later)


def test_the_standard_otel_variables_turn_traces_on(make_proxy, upstream, otlp, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "books-agent-proxy")
    proxy = make_proxy()
    openai_client(proxy).chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": TASK}])
    [turn] = turns(otlp.wait_for(has_turns(1)))
    assert turn.resource["service.name"] == "books-agent-proxy"


@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "only OTLP over HTTP"), ("OTEL_TRACES_EXPORTER", "zipkin", "only otlp")],
)
def test_a_setting_that_cannot_be_honoured_stops_start_up(make_proxy, otlp, monkeypatch, variable, value, named):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=f"{variable}={value}: {named}"):
        make_proxy(telemetry={"otlp_endpoint": otlp.endpoint})
    with pytest.raises(ConfigError, match="otlp_endpoint"):
        proxy_settings("http://127.0.0.1:1/v1", ROOT / "unused", telemetry={"otlp_endpoint": "grpc://collector:4317"})


def test_off_it_sends_nothing_and_leaves_the_clients_traceparent_alone(make_proxy, upstream, monkeypatch, tmp_path):
    proxy = make_proxy()
    assert proxy.app[TELEMETRY] is NO_TELEMETRY
    traceparent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    openai_client(proxy, headers={"traceparent": traceparent}).chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": TASK}]
    )
    assert upstream.requests[-1].headers["traceparent"] == traceparent
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    assert make_proxy(data_dir=tmp_path / "other").app[TELEMETRY] is NO_TELEMETRY
    # Off, the SDK is never even imported: a proxy process carries none of it.
    script = (
        "import sys; from proxy.app import build_app; from proxy.config import load_settings; build_app(load_settings(None)); "
        "print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('opentelemetry.')}))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "CONTEXT_PROXY_"))}
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
