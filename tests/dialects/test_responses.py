"""The Responses API through the proxy: the same engine as chat completions, in its own format."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.conftest import ALICE, live_messages, openai_client, trajectory
from tests.fakes.fake_upstream import Reply
from tests.support.agents_sdk import run_tests_agent
from tests.test_metrics import scrape, value

REF = re.compile(r"out_\d+_[0-9a-f]{24}")
BIG = "".join(f"line {i:05d}: some build log output\n" for i in range(1500))  # ~48k chars
TOOLS = [{"type": "function", "name": "exec_command", "description": "Run a command.", "strict": False,
          "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]
DEVELOPER = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are a coding agent."}]}


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def dump(items) -> list[dict]:
    """Output items as a client resends them (what the Agents SDK and Codex do)."""
    return [item.model_dump(exclude_none=True) for item in items]


def test_a_text_turn_is_stored_and_answered(proxy, upstream, http):
    client = openai_client(proxy, headers={"X-Conversation-ID": "resp-1"})
    response = client.responses.create(model="gpt-4o-mini", input=[DEVELOPER, user("hello")])
    assert response.output_text == "reply to: hello"
    stored = live_messages(http, "resp-1")
    assert [m.get("role") for m in stored] == ["developer", "user", "assistant"]
    assert stored[-1]["content"][0]["text"] == "reply to: hello"
    sent = upstream.responses_requests()[-1]
    assert sent["input"] == [DEVELOPER, user("hello")]


def test_streaming_is_relayed_and_stored(proxy, upstream, http):
    client = openai_client(proxy, headers={"X-Conversation-ID": "resp-stream"})
    events = list(client.responses.create(model="gpt-4o-mini", input="hi there", stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[-1].response.output_text == "reply to: hi there"
    assert live_messages(http, "resp-stream")[-1]["content"][0]["text"] == "reply to: hi there"


def test_full_history_with_reasoning_is_deduped_and_replayed_byte_for_byte(proxy, upstream, http):
    client = openai_client(proxy, headers={"X-Conversation-ID": "codexish"})
    history = [DEVELOPER, user("run it")]
    upstream.enqueue(Reply.tool_calls([("exec_command", '{"cmd": "ls"}')], reasoning="list first"))
    first = client.responses.create(model="gpt-4o-mini", input=history, tools=TOOLS, store=False,
                                    include=["reasoning.encrypted_content"])
    history += dump(first.output)
    call = history[-1]
    history.append({"type": "function_call_output", "call_id": call["call_id"], "output": "a.txt\nb.txt"})
    upstream.enqueue(Reply.text("two files", reasoning="done"))
    second = client.responses.create(model="gpt-4o-mini", input=history, tools=TOOLS, store=False,
                                     include=["reasoning.encrypted_content"])
    assert second.output_text == "two files"
    sent = upstream.responses_requests()[-1]["input"]
    assert sent == history  # the reasoning's encrypted_content went back untouched
    stored = live_messages(http, "codexish")
    assert [m["type"] for m in stored] == ["message", "message", "reasoning", "function_call", "function_call_output", "reasoning", "message"]
    assert len(trajectory(http, "codexish")) == len(stored)  # each item once


def test_an_unnamed_agent_whose_replies_are_calls_alone_takes_the_fast_path(proxy, upstream):
    """An agent naming no conversation is known by its bytes up to its first reply. The Agents
    SDK's replies are often a reasoning item and calls, no assistant message for many turns: the
    run is named by its first call, so its later turns reuse the previous one's work."""
    client = openai_client(proxy)
    history = [DEVELOPER, user("fix the build")]
    for step in range(5):
        upstream.enqueue(Reply.tool_calls([("exec_command", json.dumps({"cmd": f"make step{step}"}))], reasoning=f"step {step}"))
        reply = client.responses.create(model="gpt-4o-mini", input=history, tools=TOOLS, store=False,
                                        include=["reasoning.encrypted_content"])
        history += dump(reply.output)
        history.append({"type": "function_call_output", "call_id": history[-1]["call_id"], "output": f"step {step} done"})
    assert not any(item.get("role") == "assistant" for item in history)
    samples = scrape(proxy)
    counted = {o: value(samples, "context_proxy_fast_path_turns_total", outcome=o) for o in ("taken", "declined", "none")}
    assert counted == {"none": 1.0, "taken": 4.0, "declined": 0.0}  # the second found the first under its opening key


def test_codexs_client_metadata_new_every_request_keeps_the_fast_path_and_reaches_the_upstream_as_sent(proxy, upstream):
    """Codex ends each body with `client_metadata`: its turn ids, its keys in a new order every
    request. A body that extends the last one but there is still read only where new, and the
    upstream gets each request's own metadata (its bytes after the transcript made again)."""
    client = openai_client(proxy, headers={"session-id": "0199a213-81c0-7800-8aa1-bbab2d4b5c01"})
    history = [DEVELOPER, user("fix the build")]
    sent = []
    for step in range(5):
        upstream.enqueue(Reply.tool_calls([("exec_command", json.dumps({"cmd": f"make step{step}"}))], reasoning=f"step {step}"))
        ids = {"turn_id": f"turn-{step}", "session_id": "0199a213"}
        metadata = dict(reversed(ids.items())) if step % 2 else ids  # the same keys, another order
        sent.append(metadata)
        reply = client.responses.create(model="gpt-4o-mini", input=history, tools=TOOLS, store=False,
                                        include=["reasoning.encrypted_content"], extra_body={"client_metadata": metadata})
        history += dump(reply.output)
        history.append({"type": "function_call_output", "call_id": history[-1]["call_id"], "output": f"step {step} done"})
    received = upstream.responses_requests()[-5:]
    assert [list(body["client_metadata"].items()) for body in received] == [list(m.items()) for m in sent]
    assert [len(body["input"]) for body in received] == [2 + 3 * step for step in range(5)]
    samples = scrape(proxy)
    counted = {o: value(samples, "context_proxy_fast_path_turns_total", outcome=o) for o in ("taken", "declined", "none")}
    assert counted == {"none": 1.0, "taken": 4.0, "declined": 0.0}


def test_previous_response_id_is_served_from_the_proxy_store(proxy, upstream, http):
    client = openai_client(proxy)
    first = client.responses.create(model="gpt-4o-mini", input=[DEVELOPER, user("first")], store=False)
    second = client.responses.create(model="gpt-4o-mini", input=[user("second")], previous_response_id=first.id, store=False)
    assert second.output_text == "reply to: second"
    sent = upstream.responses_requests()[-1]
    assert "previous_response_id" not in sent
    assert [i.get("role") for i in sent["input"]] == ["developer", "user", "assistant", "user"]
    third = client.responses.create(model="gpt-4o-mini", input=[user("third")], previous_response_id=second.id)
    assert [i.get("role") for i in upstream.responses_requests()[-1]["input"]][-2:] == ["assistant", "user"]
    assert third.output_text == "reply to: third"
    assert (first.previous_response_id, second.previous_response_id, third.previous_response_id) == (None, first.id, second.id)


def test_an_anchored_reply_echoes_the_clients_previous_response_id_streamed_too(proxy, upstream):
    """The upstream got no previous_response_id (the proxy sent the history); the client's reply
    says the one it sent, as the real API's does, in every response object of the stream."""
    client = openai_client(proxy)
    first = client.responses.create(model="gpt-4o-mini", input=[user("first")], store=False)
    events = list(client.responses.create(model="gpt-4o-mini", input=[user("next")], previous_response_id=first.id,
                                          stream=True))
    assert "previous_response_id" not in upstream.responses_requests()[-1]
    carrying = [e for e in events if getattr(e, "response", None) is not None]
    assert [e.type for e in carrying] == ["response.created", "response.in_progress", "response.completed"]
    assert {e.response.previous_response_id for e in carrying} == {first.id}
    assert [e.sequence_number for e in events] == list(range(len(events)))


def build_history(output: str = BIG) -> list[dict]:
    call = {"type": "function_call", "id": "fc_build", "call_id": "call_build", "name": "exec_command",
            "arguments": '{"cmd": "make"}', "status": "completed"}
    return [DEVELOPER, user("build it"), call, {"type": "function_call_output", "call_id": "call_build", "output": output}]


def read_call(ref: str, offset: int, length: int) -> tuple[str, str]:
    return ("read_tool_output", json.dumps({"ref": ref, "offset": offset, "length": length}))


def sent_output(upstream, index: int = -1) -> str:
    return next(i for i in upstream.responses_requests()[index]["input"] if i.get("type") == "function_call_output")["output"]


def test_a_long_function_call_output_goes_upstream_shortened(proxy, upstream, http):
    client = openai_client(proxy, headers={"X-Conversation-ID": "trunc"})
    client.responses.create(model="gpt-4o-mini", input=build_history(), tools=TOOLS)
    shortened = sent_output(upstream)
    assert shortened.startswith(BIG[:2000]) and len(shortened) < 3000 and REF.search(shortened)
    tools = upstream.responses_requests()[-1]["tools"]
    assert [t["name"] for t in tools] == ["exec_command", "read_tool_output", "search_history"]
    assert live_messages(http, "trunc")[3]["output"] == BIG  # stored whole


@pytest.mark.parametrize("stream", [False, True])
def test_read_back_is_answered_by_the_proxy_and_hidden_from_the_client(proxy, upstream, http, stream):
    client = openai_client(proxy, headers={"X-Conversation-ID": f"rb-{stream}"})
    client.responses.create(model="gpt-4o-mini", input=build_history(), tools=TOOLS)
    ref = REF.search(sent_output(upstream)).group(0)
    history = build_history() + [user("what failed at line 1400?")]
    upstream.enqueue(
        Reply.tool_calls([read_call(ref, BIG.index("line 01400"), 60)], reasoning="read the log"),
        Reply.text("Line 1400 is fine.", reasoning="it is fine"),
    )
    kwargs = dict(model="gpt-4o-mini", input=history, tools=TOOLS, include=["reasoning.encrypted_content"])
    if stream:
        events = list(client.responses.create(stream=True, **kwargs))
        assert [e.sequence_number for e in events] == list(range(len(events)))
        assert [e.type for e in events].count("response.created") == 1
        assert [e.type for e in events].count("response.completed") == 1
        added = [e for e in events if e.type == "response.output_item.added"]
        assert [e.output_index for e in added] == list(range(len(added)))
        assert [e.item.type for e in added] == ["reasoning", "message"]  # our call and its reasoning: hidden
        final = events[-1].response
        assert final.id == events[0].response.id
    else:
        final = client.responses.create(**kwargs)
    assert [item.type for item in final.output] == ["reasoning", "message"]
    assert final.output_text == "Line 1400 is fine."
    second = upstream.responses_requests()[-1]["input"]
    assert [i["type"] for i in second[len(history):]] == ["reasoning", "function_call", "function_call_output"]
    assert "line 01400: some build log output" in second[-1]["output"]
    stored = live_messages(http, f"rb-{stream}")
    assert [m["type"] for m in stored[len(history):]] == ["reasoning", "message"]
    statuses = [(m["type"], m["status"]) for m in trajectory(http, f"rb-{stream}")[-5:]]
    assert statuses == [("reasoning", "internal"), ("function_call", "internal"), ("function_call_output", "internal"),
                        ("reasoning", "live"), ("message", "live")]
    # The client resends what it got: valid at the strict upstream (no orphaned reasoning).
    history += dump(final.output) + [user("thanks")]
    assert client.responses.create(model="gpt-4o-mini", input=history, tools=TOOLS).output_text == "reply to: thanks"


@pytest.mark.parametrize("stream", [False, True])
def test_a_mixed_reply_gives_the_client_only_its_own_calls(proxy, upstream, http, stream):
    client = openai_client(proxy, headers={"X-Conversation-ID": f"mixed-{stream}"})
    client.responses.create(model="gpt-4o-mini", input=build_history(), tools=TOOLS)
    ref = REF.search(sent_output(upstream)).group(0)
    upstream.enqueue(Reply.tool_calls([read_call(ref, 0, 10), ("exec_command", '{"cmd": "make clean"}')]))
    kwargs = dict(model="gpt-4o-mini", input=build_history() + [user("again")], tools=TOOLS)
    if stream:
        events = list(client.responses.create(stream=True, **kwargs))
        assert [e.sequence_number for e in events] == list(range(len(events)))
        final = events[-1].response
    else:
        final = client.responses.create(**kwargs)
    assert [(i.type, i.name) for i in final.output] == [("function_call", "exec_command")]
    assert [m["name"] for m in live_messages(http, f"mixed-{stream}")[-1:]] == ["exec_command"]


def test_quota_figures_ride_on_function_call_outputs(make_proxy, upstream):
    proxy = make_proxy(quota={"max_llm_calls": 10})
    history = build_history("exit 0")
    openai_client(proxy).responses.create(model="gpt-4o-mini", input=history, tools=TOOLS)
    assert sent_output(upstream) == "exit 0\n\n[You have 9 LLM calls remaining (used 1 of 10).]"


def test_the_window_drops_reasoning_calls_and_outputs_together(make_proxy, upstream, http):
    proxy = make_proxy(context={"history_token_limit": 600}, truncation={"enabled": False})
    client = openai_client(proxy, headers={"X-Conversation-ID": "window"})
    history = [DEVELOPER, user("start")]
    for step in range(6):
        upstream.enqueue(Reply.tool_calls([("exec_command", json.dumps({"cmd": f"step {step}"}))], reasoning=f"think {step}"))
        reply = client.responses.create(model="gpt-4o-mini", input=history, tools=TOOLS, include=["reasoning.encrypted_content"])
        history += dump(reply.output)
        history.append({"type": "function_call_output", "call_id": history[-1]["call_id"], "output": "word " * 120})
    client.responses.create(model="gpt-4o-mini", input=history, tools=TOOLS, include=["reasoning.encrypted_content"])
    sent = upstream.responses_requests()[-1]["input"]
    assert len(sent) < len(history)  # the window cut, and the strict upstream took it
    kinds = [i.get("type") for i in sent]
    assert kinds[:1] == ["message"] and kinds[1] in ("message", "reasoning")
    for i, kind in enumerate(kinds):  # every reasoning item still has its call right after it
        if kind == "reasoning":
            assert kinds[i + 1] == "function_call"


def test_codex_session_header_names_the_conversation(proxy, upstream, http):
    client = openai_client(proxy, headers={"session-id": "01a23192-5f1f-7413-946a-4c10e4f96cf0"})
    client.responses.create(model="gpt-4o-mini", input=[DEVELOPER, user("hello")])
    assert live_messages(http, "01a23192-5f1f-7413-946a-4c10e4f96cf0")[-1]["role"] == "assistant"


def test_bad_input_is_a_400_in_openai_shape_and_stores_nothing(proxy, upstream, http):
    response = http.post("/v1/responses", json={"model": "m", "input": [{"type": "message", "role": "wizard", "content": "x"}]},
                         headers={"Authorization": f"Bearer {ALICE}", "X-Conversation-ID": "bad"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "input[0].role"
    assert http.get("/v1/conversations/bad").status_code == 404
    assert upstream.responses_requests() == []


def test_the_agents_sdk_on_its_default_model_runs_its_tool_loop_through_the_proxy(proxy, upstream, http):
    upstream.enqueue(Reply.tool_calls([("run_tests", '{"path": "tests/"}')]), Reply.text("All 12 passed."))
    assert run_tests_agent(proxy.base_url, "gpt-4o-mini", "sdk") == ("All 12 passed.", ["tests/"])
    stored = live_messages(http, "sdk")
    assert [m.get("type", "message") for m in stored] == ["message", "function_call", "function_call_output", "message"]
    assert stored[2]["output"] == "tests/: 12 passed"


def test_compaction_reads_a_responses_conversation_through_its_codec(make_proxy, upstream, http):
    """The summarizer sees the items' texts and calls, and the user's words are quoted verbatim,
    whatever the wire format."""
    proxy = make_proxy(compaction={"strategy": "turns", "every_n_user_messages": 2, "background": False})
    prompts: list[str] = []

    def responder(body: dict) -> Reply:
        messages = body.get("messages") or []
        if messages and "summar" in str(messages[0].get("content", "")).lower():  # the summarizer (chat)
            prompts.append(messages[-1]["content"])
            return Reply.text("The agent ran make.")
        return Reply.text("ok")

    upstream.responder = responder
    client = openai_client(proxy, headers={"X-Conversation-ID": "resp-compact"})
    history = [DEVELOPER, user("build the project"), *build_history("exit 0")[2:]]
    for text in ("never touch legacy/ please", "then run the tests", "and report", "and commit", "done?"):
        history.append(user(text))
        reply = client.responses.create(model="gpt-4o-mini", input=history, tools=TOOLS)
        history += dump(reply.output)
    assert prompts, "no summary was made"
    assert "-> calls exec_command" in prompts[0] and any("never touch legacy/ please" in p for p in prompts)
    sent = upstream.responses_requests()[-1]["input"]
    note = sent[1]["content"][0]["text"]
    assert sent[1]["role"] == "system" and "The agent ran make." in note
    assert "never touch legacy/ please" in note  # the user's own words, carried by the proxy


def test_a_tool_loop_counts_about_the_same_tokens_in_either_wire_format(make_proxy, upstream):
    """The window's limit means the same over Responses as over chat completions: a function call
    and its output are counted with their call id and framing, as chat's tool_calls are."""
    proxy = make_proxy(context={"history_token_limit": 1_000_000})
    calls = [f"call_{i:024d}" for i in range(12)]
    chat = [{"role": "user", "content": "run the checks"}]
    items = [{"type": "message", "role": "user", "content": "run the checks"}]
    for i, call in enumerate(calls):
        arguments = json.dumps({"cmd": f"check --part {i}"})
        chat += [{"role": "assistant", "content": None, "tool_calls": [{"id": call, "type": "function", "function": {"name": "sh", "arguments": arguments}}]},
                 {"role": "tool", "tool_call_id": call, "content": f"part {i}: ok"}]
        items += [{"type": "function_call", "call_id": call, "name": "sh", "arguments": arguments},
                  {"type": "function_call_output", "call_id": call, "output": f"part {i}: ok"}]
    headers = {"Authorization": "Bearer sk-alice"}
    sent_chat = httpx.post(f"{proxy.url}/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": chat},
                           headers={**headers, "X-Conversation-ID": "count-chat"}).headers["X-Context-Tokens-Sent"]
    sent_responses = httpx.post(f"{proxy.url}/v1/responses", json={"model": "gpt-4o-mini", "input": items, "store": False},
                                headers={**headers, "X-Conversation-ID": "count-responses"}).headers["X-Context-Tokens-Sent"]
    assert abs(int(sent_responses) - int(sent_chat)) <= 0.02 * int(sent_chat)
