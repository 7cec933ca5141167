"""Responses requests for `models:` entries: through litellm, back in Responses format.

Two routes, both real litellm against the strict fakes on loopback: `house`, an OpenAI-compatible
chat server (`custom_openai/`, the fake's /v1/chat/completions, which refuses what the real Chat
Completions API refuses), and `claude`, Anthropic (`anthropic/`, the fake's /v1/messages, which
checks its thinking signatures when they come back). The clients are the official openai client
and the Agents SDK, over HTTP to a real proxy.
"""

from __future__ import annotations

import json

import openai
import pytest

from tests.conftest import live_messages, openai_client, trajectory
from tests.dialects.test_responses import BIG, DEVELOPER, REF, TOOLS, dump, user
from tests.fakes.fake_upstream import Reply
from tests.support.agents_sdk import run_tests_agent

pytestmark = [
    pytest.mark.filterwarnings("ignore:.*using the `ReadOnly` qualifier"),
    pytest.mark.filterwarnings("ignore:Accessing the 'model_.*fields' attribute on the instance is deprecated"),  # litellm's
]

KEY_ENV = "CP_TEST_RESPONSES_KEY"
KEY = "sk-provider-responses-5f1d2c3b"
# What Codex also offers: a namespace of tools, and a hosted tool no chat model can run.
CODEX_TOOLS = TOOLS + [
    {
        "type": "namespace",
        "name": "agents",
        "description": "Sub-agents.",
        "tools": [
            {
                "type": "function",
                "name": "spawn",
                "description": "Start one.",
                "strict": False,
                "parameters": {"type": "object", "properties": {"task": {"type": "string"}}},
            }
        ],
    },
    {"type": "web_search", "external_web_access": False},
]
ENCRYPTED = ["reasoning.encrypted_content"]


def output(call_id: str, text: str) -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


@pytest.fixture
def routed(make_proxy, upstream, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    return make_proxy(
        models={
            "house": {
                "litellm_model": "custom_openai/gpt-4o-mini",
                "api_base": upstream.base_url,
                "api_key_env": KEY_ENV,
            },
            "claude": {
                "litellm_model": "anthropic/claude-sonnet-4-5",
                "api_base": upstream.base_url.removesuffix("/v1"),
                "api_key_env": KEY_ENV,
            },
        }
    )


def events_of(stream) -> list:
    events = list(stream)
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    added = [e.output_index for e in events if e.type == "response.output_item.added"]
    done = [e.output_index for e in events if e.type == "response.output_item.done"]
    assert added == done == list(range(len(added)))  # one item after the other
    return events


def create(client, stream: bool, **kwargs):
    """responses.create, streamed or not; the final response either way."""
    if not stream:
        return client.responses.create(**kwargs)
    events = events_of(client.responses.create(stream=True, **kwargs))
    final = events[-1].response
    assert final.id == events[0].response.id
    assert [dump([e.item])[0] for e in events if e.type == "response.output_item.done"] == dump(final.output)
    return final


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_model_answers_in_responses_format_and_is_stored(routed, upstream, http, stream):
    client = openai_client(routed, headers={"X-Conversation-ID": f"house-{stream}"})
    response = create(client, stream, model="house", input=[DEVELOPER, user("hello")], store=False)
    assert response.output_text == "reply to: hello" and response.model == "house"
    assert response.status == "completed" and response.usage.input_tokens > 0
    sent = upstream.chat_requests()[-1]
    assert sent["model"] == "gpt-4o-mini"
    assert sent["messages"] == [
        {"role": "system", "content": "You are a coding agent."},  # litellm: developer -> system
        {"role": "user", "content": [{"type": "text", "text": "hello"}]},
    ]
    assert upstream.requests[-1].headers["authorization"] == f"Bearer {KEY}"
    stored = live_messages(http, f"house-{stream}")
    assert [m["type"] for m in stored] == ["message", "message", "message"]
    assert stored[-1]["content"][0]["text"] == "reply to: hello"


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_loop_with_codex_tools_runs_against_the_strict_chat_server(routed, upstream, http, stream):
    client = openai_client(routed, headers={"X-Conversation-ID": f"loop-{stream}"})
    history = [DEVELOPER, user("list the files, then ask a helper")]
    upstream.enqueue(Reply.tool_calls([("exec_command", '{"cmd": "ls"}')], content="Looking."))
    first = create(client, stream, model="house", input=history, tools=CODEX_TOOLS, store=False)
    assert [i.type for i in first.output] == ["message", "function_call"]  # the text first, as it was said
    call = first.output[1]
    assert (call.name, json.loads(call.arguments)) == ("exec_command", {"cmd": "ls"})
    sent_tools = upstream.chat_requests()[-1]["tools"]
    assert [t["function"]["name"] for t in sent_tools] == ["exec_command", "agents__spawn"]  # no web_search
    history += dump(first.output) + [output(call.call_id, "a.txt\nb.txt")]
    upstream.enqueue(Reply.tool_calls([("agents__spawn", '{"task": "read a.txt"}')]))
    second = create(client, stream, model="house", input=history, tools=CODEX_TOOLS, store=False)
    spawn = second.output[0]
    assert (spawn.type, spawn.name, spawn.namespace) == ("function_call", "spawn", "agents")
    messages = upstream.chat_requests()[-1]["messages"]
    assert messages[2] == {
        "role": "assistant",
        "content": "Looking.",
        "tool_calls": [
            {"id": call.call_id, "type": "function", "function": {"name": "exec_command", "arguments": call.arguments}}
        ],
    }
    assert messages[3] == {"role": "tool", "tool_call_id": call.call_id, "content": "a.txt\nb.txt"}
    history += dump(second.output) + [output(spawn.call_id, "a.txt says hi")]
    third = create(client, stream, model="house", input=history + [user("and?")], tools=CODEX_TOOLS, store=False)
    assert third.output_text == "reply to: and?"
    assert upstream.chat_requests()[-1]["messages"][4]["tool_calls"][0]["function"]["name"] == "agents__spawn"
    stored = live_messages(http, f"loop-{stream}")
    calls = ["function_call", "function_call_output"]
    assert [m["type"] for m in stored] == ["message"] * 3 + calls * 2 + ["message"] * 2


PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+hello\n*** End Patch"


@pytest.mark.parametrize("stream", [False, True])
def test_a_free_form_tool_goes_as_a_function_of_one_string_and_comes_back_custom(routed, upstream, stream):
    """Codex's apply_patch is a custom tool: its input is free text, not JSON arguments."""
    client = openai_client(routed, headers={"X-Conversation-ID": f"custom-{stream}"})
    tools = [{"type": "custom", "name": "apply_patch", "description": "Apply a patch."}]
    history = [user("add hello.txt")]
    upstream.enqueue(Reply.tool_calls([("apply_patch", json.dumps({"input": PATCH}))]))
    first = create(client, stream, model="house", input=history, tools=tools, store=False)
    [call] = first.output
    assert (call.type, call.name, call.input) == ("custom_tool_call", "apply_patch", PATCH)
    [sent] = upstream.chat_requests()[-1]["tools"]
    assert sent["function"]["name"] == "apply_patch" and sent["function"]["parameters"]["required"] == ["input"]
    history += dump(first.output) + [{"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Done."}]
    assert (
        create(client, stream, model="house", input=history + [user("ok?")], tools=tools).output_text == "reply to: ok?"
    )
    messages = upstream.chat_requests()[-1]["messages"]
    assert json.loads(messages[1]["tool_calls"][0]["function"]["arguments"]) == {"input": PATCH}
    assert messages[2] == {"role": "tool", "tool_call_id": call.call_id, "content": "Done."}


def build_history(text: str = BIG) -> list[dict]:
    call = {
        "type": "function_call",
        "id": "fc_build",
        "call_id": "call_build",
        "name": "exec_command",
        "arguments": '{"cmd": "make"}',
        "status": "completed",
    }
    return [DEVELOPER, user("build it"), call, output("call_build", text)]


@pytest.mark.parametrize("stream", [False, True])
def test_read_back_of_a_truncated_output_is_answered_by_the_proxy(routed, upstream, http, stream):
    client = openai_client(routed, headers={"X-Conversation-ID": f"rb-{stream}"})
    client.responses.create(model="house", input=build_history(), tools=TOOLS)
    tool_message = upstream.chat_requests()[-1]["messages"][3]
    assert tool_message["role"] == "tool" and len(tool_message["content"]) < 3000
    ref = REF.search(tool_message["content"]).group(0)
    assert [t["function"]["name"] for t in upstream.chat_requests()[-1]["tools"]] == [
        "exec_command",
        "read_tool_output",
        "search_history",
    ]
    history = build_history() + [user("what is on line 1400?")]
    upstream.enqueue(
        Reply.tool_calls(
            [("read_tool_output", json.dumps({"ref": ref, "offset": BIG.index("line 01400"), "length": 60}))]
        ),
        Reply.text("Line 1400 is fine."),
    )
    final = create(client, stream, model="house", input=history, tools=TOOLS)
    assert [i.type for i in final.output] == ["message"] and final.output_text == "Line 1400 is fine."
    round_two = upstream.chat_requests()[-1]["messages"]
    assert round_two[-2]["tool_calls"][0]["function"]["name"] == "read_tool_output"
    assert round_two[-1]["role"] == "tool" and "line 01400: some build log output" in round_two[-1]["content"]
    assert [m["type"] for m in live_messages(http, f"rb-{stream}")[len(history) :]] == ["message"]
    statuses = [(m["type"], m["status"]) for m in trajectory(http, f"rb-{stream}")[-3:]]
    assert statuses == [("function_call", "internal"), ("function_call_output", "internal"), ("message", "live")]


def test_another_models_reasoning_is_left_out_for_a_chat_model(routed, upstream, http):
    """A conversation that moves from an OpenAI reasoning model (passthrough) to a models: entry:
    the sealed reasoning means nothing to the new model, and a chat server refuses what it would
    become, so it stays in the transcript but not in the request."""
    client = openai_client(routed, headers={"X-Conversation-ID": "switch"})
    history = [DEVELOPER, user("run it")]
    upstream.enqueue(Reply.tool_calls([("exec_command", '{"cmd": "ls"}')], reasoning="list first"))
    first = client.responses.create(model="gpt-4o-mini", input=history, tools=TOOLS, store=False, include=ENCRYPTED)
    assert first.output[0].type == "reasoning" and first.output[0].encrypted_content
    history += dump(first.output) + [output(first.output[1].call_id, "a.txt")]
    second = client.responses.create(model="house", input=history + [user("so?")], tools=TOOLS, store=False)
    assert second.output_text == "reply to: so?"
    roles = [m["role"] for m in upstream.chat_requests()[-1]["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "user"]
    assert "reasoning" in [m["type"] for m in live_messages(http, "switch")]


@pytest.mark.parametrize("stream", [False, True])
def test_claude_thinks_calls_tools_and_gets_its_signed_thinking_back(routed, upstream, http, stream):
    client = openai_client(routed, headers={"X-Conversation-ID": f"claude-{stream}"})
    history = [DEVELOPER, user("list the files")]
    kwargs = dict(
        model="claude",
        tools=TOOLS,
        store=False,
        include=ENCRYPTED,
        reasoning={"effort": "medium"},
        max_output_tokens=4000,
    )
    upstream.enqueue(
        Reply.tool_calls([("exec_command", '{"cmd": "ls"}')], content="Let me look.", reasoning="ls shows them")
    )
    first = create(client, stream, input=history, **kwargs)
    assert [i.type for i in first.output] == ["reasoning", "message", "function_call"]
    reasoning = first.output[0]
    assert reasoning.summary[0].text == "ls shows them" and reasoning.encrypted_content
    sent = upstream.messages_requests()[-1]
    assert sent["thinking"]["type"] == "enabled" and sent["system"][0]["text"] == "You are a coding agent."
    history += dump(first.output) + [output(first.output[2].call_id, "a.txt")]
    upstream.enqueue(Reply.text("One file.", reasoning="just one"))
    second = create(client, stream, input=history, **kwargs)
    assert second.output_text == "One file." and second.model == "claude"
    # The fake checked the signature of the thinking block it got back (it refuses a forged one).
    assistant = upstream.messages_requests()[-1]["messages"][1]
    assert [b["type"] for b in assistant["content"]] == ["thinking", "text", "tool_use"]
    assert assistant["content"][0]["thinking"] == "ls shows them"
    assert upstream.messages_requests()[-1]["thinking"]["type"] == "enabled"  # still thinking on this turn
    stored = live_messages(http, f"claude-{stream}")
    turn_one = ["reasoning", "message", "function_call", "function_call_output"]
    assert [m["type"] for m in stored] == ["message", "message", *turn_one, "reasoning", "message"]


def test_provider_errors_keep_their_status_and_the_openai_shape(routed, upstream, http):
    client = openai_client(routed, headers={"X-Conversation-ID": "errors"})
    upstream.enqueue(Reply.error(429, {"error": {"message": "slow down", "type": "rate_limit_error", "code": None}}))
    with pytest.raises(openai.RateLimitError) as info:
        client.responses.create(model="house", input="x")
    assert "slow down" in str(info.value) and KEY not in str(info.value)
    upstream.enqueue(Reply.text("abcdefghijklmnopqrstuvwxyz", chunk_size=2).failing_after(5))
    events = list(client.responses.create(model="house", input="y", stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].type == "error" and "failed mid-stream" in events[-1].message  # as OpenAI ends a failed stream
    assert live_messages(http, "errors") == []  # neither turn joined the transcript


def test_server_side_state_is_refused_and_nothing_is_sent(routed, upstream, http):
    client = openai_client(routed, headers={"X-Conversation-ID": "stateless"})
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="house", input="x", previous_response_id="resp_never_seen")
    assert info.value.code == "previous_response_not_found" and info.value.param == "previous_response_id"
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="house", input="x", background=True)
    assert info.value.param == "background"
    assert upstream.chat_requests() == []
    # ...while the proxy's own response ids resolve, and nothing of them goes upstream.
    first = client.responses.create(model="house", input=[DEVELOPER, user("first")])
    second = client.responses.create(model="house", input=[user("second")], previous_response_id=first.id)
    assert second.output_text == "reply to: second"
    assert [m["role"] for m in upstream.chat_requests()[-1]["messages"]] == ["system", "user", "assistant", "user"]


def test_the_agents_sdk_on_its_default_model_runs_a_tool_loop_on_a_litellm_model(routed, upstream, http):
    upstream.enqueue(Reply.tool_calls([("run_tests", '{"path": "tests/"}')]), Reply.text("All 12 passed."))
    assert run_tests_agent(routed.base_url, "house", "sdk") == ("All 12 passed.", ["tests/"])
    stored = live_messages(http, "sdk")
    assert [m.get("type", "message") for m in stored] == ["message", "function_call", "function_call_output", "message"]
    tools = upstream.chat_requests()[-1]["tools"]
    assert tools[0]["function"]["name"] == "run_tests" and tools[0]["function"]["strict"] is True
    assert upstream.chat_requests()[-1]["messages"][0] == {"role": "system", "content": "Run the tests."}
