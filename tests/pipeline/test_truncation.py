"""Tool-output truncation and read-back: the upstream sees a preview and a ref, the client sees only
its own tools, and the full output stays readable."""

from __future__ import annotations

import json
import re

import pytest

from proxy.tokens import TokenCounter
from tests.conftest import ALICE, BOB, admin_get, live_messages, openai_client, trajectory
from tests.fakes.fake_upstream import Reply, validate_chat_request

REF = re.compile(r"out_\d+_[0-9a-f]{24}")
BIG = "".join(f"line {i:05d}: some build log output\n" for i in range(1500))  # ~48k chars
TOOLS = [{"type": "function", "function": {"name": "run_build", "parameters": {"type": "object", "properties": {}}}}]


def transcript(output: str = BIG, tool: str = "run_build") -> list[dict]:
    return [
        {"role": "system", "content": "You build software."},
        {"role": "user", "content": "build it"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "call_build", "type": "function", "function": {"name": tool, "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "call_build", "content": output},
    ]


def sent_tool_message(upstream, index: int = -1) -> dict:
    return next(m for m in upstream.chat_requests()[index]["messages"] if m["role"] == "tool")


def read_call(ref: str, offset: int, length: int) -> tuple[str, str]:
    return ("read_tool_output", json.dumps({"ref": ref, "offset": offset, "length": length}))


def test_long_output_goes_upstream_as_preview_and_ref_and_is_stored_whole(proxy, upstream, http):
    client = openai_client(proxy, headers={"X-Conversation-ID": "trunc"})
    client.chat.completions.create(model="gpt-4o-mini", messages=transcript(), tools=TOOLS)
    sent = sent_tool_message(upstream)["content"]
    assert sent.startswith(BIG[:2000]) and BIG[:2001] not in sent
    assert f"({len(BIG)} characters)" in sent
    ref = REF.search(sent).group(0)
    assert f'read_tool_output(ref="{ref}", offset=2000' in sent
    offered = [t["function"]["name"] for t in upstream.chat_requests()[-1]["tools"]]
    assert offered == ["run_build", "read_tool_output", "search_history"]  # the recall tools, together

    assert live_messages(http, "trunc")[3]["content"] == BIG  # the log keeps the full output
    full = admin_get(http, f"/trunc/tool_outputs/{ref}").json()
    assert full["content"] == BIG and full["length"] == len(BIG) and full["tool_call_id"] == "call_build"


def test_refs_do_not_cross_tenants_or_conversations(proxy, upstream, http):
    openai_client(proxy, headers={"X-Conversation-ID": "mine"}).chat.completions.create(
        model="m", messages=transcript(), tools=TOOLS
    )
    ref = REF.search(sent_tool_message(upstream)["content"]).group(0)
    assert admin_get(http, f"/mine/tool_outputs/{ref}", ALICE).status_code == 200
    assert admin_get(http, f"/mine/tool_outputs/{ref}", BOB).status_code == 404
    openai_client(proxy, headers={"X-Conversation-ID": "other"}).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    assert admin_get(http, f"/other/tool_outputs/{ref}").status_code == 404
    forged = ref[:-4] + ("0000" if not ref.endswith("0000") else "1111")
    assert admin_get(http, f"/mine/tool_outputs/{forged}").status_code == 404


def test_short_outputs_and_kept_tools_are_untouched(make_proxy, upstream):
    proxy = make_proxy(truncation={"tools": {"cat_file": "keep"}})
    client = openai_client(proxy)
    client.chat.completions.create(model="m", messages=transcript("short output"), tools=TOOLS)
    assert sent_tool_message(upstream)["content"] == "short output"
    assert "tools" in upstream.chat_requests()[-1] and len(upstream.chat_requests()[-1]["tools"]) == 1
    client.chat.completions.create(model="m", messages=transcript(BIG, tool="cat_file"))
    assert sent_tool_message(upstream)["content"] == BIG
    assert "tools" not in upstream.chat_requests()[-1]


@pytest.mark.parametrize("stream", [False, True])
def test_read_back_is_answered_by_the_proxy_and_hidden_from_the_client(proxy, upstream, http, stream):
    client = openai_client(proxy, headers={"X-Conversation-ID": f"rb-{stream}"})
    client.chat.completions.create(model="m", messages=transcript(), tools=TOOLS)
    ref = REF.search(sent_tool_message(upstream)["content"]).group(0)

    history = transcript() + [{"role": "assistant", "content": "reply to: build it"}, {"role": "user", "content": "what failed at line 1400?"}]
    upstream.enqueue(
        Reply.tool_calls([read_call(ref, BIG.index("line 01400"), 60), read_call(ref, 0, 10)]),
        Reply.text("Line 1400 is fine."),
    )
    result = client.chat.completions.create(model="m", messages=history, tools=TOOLS, stream=stream)
    if stream:
        chunks = list(result)
        assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    else:
        assert result.choices[0].message.tool_calls is None
        text = result.choices[0].message.content
    assert text == "Line 1400 is fine."

    second = upstream.chat_requests()[-1]["messages"]
    answers = [m for m in second[len(history):] if m["role"] == "tool"]
    assert [m["role"] for m in second[len(history):]] == ["assistant", "tool", "tool"]
    assert "line 01400: some build log output" in answers[0]["content"]
    assert answers[1]["content"].endswith("\n" + BIG[:10])
    statuses = [(m["role"], m["status"]) for m in trajectory(http, f"rb-{stream}")[-5:]]
    assert statuses == [("user", "live"), ("assistant", "internal"), ("tool", "internal"), ("tool", "internal"), ("assistant", "live")]
    assert live_messages(http, f"rb-{stream}")[-1] == {"role": "assistant", "content": "Line 1400 is fine."}


@pytest.mark.parametrize("stream", [False, True])
def test_mixed_reply_gives_the_client_only_its_own_calls(proxy, upstream, http, stream):
    client = openai_client(proxy, headers={"X-Conversation-ID": f"mixed-{stream}"})
    client.chat.completions.create(model="m", messages=transcript(), tools=TOOLS)
    ref = REF.search(sent_tool_message(upstream)["content"]).group(0)
    history = transcript() + [{"role": "assistant", "content": "reply to: build it"}, {"role": "user", "content": "again"}]
    upstream.enqueue(Reply.tool_calls([read_call(ref, 0, 10), ("run_build", '{"clean": true}')]))
    result = client.chat.completions.create(model="m", messages=history, tools=TOOLS, stream=stream)
    if stream:
        calls: dict[int, dict] = {}
        for chunk in result:
            for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                slot = calls.setdefault(d.index, {"name": "", "arguments": ""})
                slot["name"] += (d.function.name or "") if d.function else ""
                slot["arguments"] += (d.function.arguments or "") if d.function else ""
        assert calls == {0: {"name": "run_build", "arguments": '{"clean": true}'}}
    else:
        calls_seen = result.choices[0].message.tool_calls
        assert [(c.function.name, c.function.arguments) for c in calls_seen] == [("run_build", '{"clean": true}')]
    stored = live_messages(http, f"mixed-{stream}")[-1]
    assert [c["function"]["name"] for c in stored["tool_calls"]] == ["run_build"]


@pytest.mark.parametrize("theirs", [False, True])
def test_text_streamed_before_our_call_reaches_the_client_once(proxy, upstream, http, theirs):
    """The relay assembles a round's text once for the client's view and the reply until our call
    comes: both still part there (the client's call renumbered, ours kept for the read round)."""
    cid = f"text-first-{theirs}"
    client = openai_client(proxy, headers={"X-Conversation-ID": cid})
    client.chat.completions.create(model="m", messages=transcript(), tools=TOOLS)
    ref = REF.search(sent_tool_message(upstream)["content"]).group(0)
    history = transcript() + [{"role": "assistant", "content": "reply to: build it"}, {"role": "user", "content": "again"}]
    calls = [read_call(ref, 0, 10), *([("run_build", '{"clean": true}')] if theirs else [])]
    upstream.enqueue(Reply.tool_calls(calls, content="Let me look at the log first. "), Reply.text("It is fine."))
    chunks = list(client.chat.completions.create(model="m", messages=history, tools=TOOLS, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    stored = live_messages(http, cid)[-1]
    if theirs:  # no read round: the reply is the text and the client's call
        assert text == "Let me look at the log first. "
        assert {d.index for d in deltas} == {0} and "".join(d.function.name or "" for d in deltas) == "run_build"
        assert stored["content"] == text and [c["function"]["name"] for c in stored["tool_calls"]] == ["run_build"]
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    else:  # our call answered in a second round, whose text follows the first's
        assert text == "Let me look at the log first. It is fine."
        assert deltas == []
        assert stored == {"role": "assistant", "content": text}
        assert [m["role"] for m in upstream.chat_requests()[-1]["messages"][len(history):]] == ["assistant", "tool"]


def test_read_rounds_are_bounded(make_proxy, upstream):
    proxy = make_proxy(truncation={"max_read_rounds": 2})
    client = openai_client(proxy)
    client.chat.completions.create(model="m", messages=transcript(), tools=TOOLS)
    ref = REF.search(sent_tool_message(upstream)["content"]).group(0)
    upstream.reset()
    upstream.enqueue(Reply.tool_calls([read_call(ref, 0, 5)]), Reply.tool_calls([read_call(ref, 5, 5)]), Reply.text("done"))
    history = transcript() + [{"role": "assistant", "content": "reply to: build it"}, {"role": "user", "content": "more"}]
    assert client.chat.completions.create(model="m", messages=history, tools=TOOLS).choices[0].message.content == "done"
    offered = [[t["function"]["name"] for t in r.get("tools", [])] for r in upstream.chat_requests()]
    # The last call still declares the tool its prompt holds calls of (a prompt stays valid).
    assert offered == [["run_build", "read_tool_output", "search_history"]] * 3
    assert [m["role"] for m in upstream.chat_requests()[-1]["messages"][len(history) :]] == ["assistant", "tool"] * 2


@pytest.mark.parametrize("stream", [False, True])
def test_a_read_past_the_round_limit_never_reaches_the_client(make_proxy, upstream, stream):
    proxy = make_proxy(truncation={"max_read_rounds": 1})
    client = openai_client(proxy, headers={"X-Conversation-ID": f"past-{stream}"})
    client.chat.completions.create(model="m", messages=transcript(), tools=TOOLS)
    ref = REF.search(sent_tool_message(upstream)["content"]).group(0)
    upstream.enqueue(Reply.tool_calls([read_call(ref, 0, 5)]), Reply.tool_calls([read_call(ref, 5, 5)], content="so far"))
    history = transcript() + [{"role": "assistant", "content": "reply to: build it"}, {"role": "user", "content": "more"}]
    result = client.chat.completions.create(model="m", messages=history, tools=TOOLS, stream=stream)
    if stream:
        chunks = list(result)
        assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "so far"
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    else:
        assert result.choices[0].message.tool_calls is None and result.choices[0].message.content == "so far"
        assert result.choices[0].finish_reason == "stop"
    assert len(upstream.chat_requests()) == 3  # the first turn, then one round and the final call


@pytest.mark.parametrize("stream", [False, True])
def test_a_reply_that_was_only_our_calls_can_be_sent_back(make_proxy, upstream, stream):
    """Past the round limit the model called only our tool: the client gets an empty reply, and
    sending that reply back (null content, no calls, as a stream client assembles it) is valid."""
    proxy = make_proxy(truncation={"max_read_rounds": 1})
    client = openai_client(proxy, headers={"X-Conversation-ID": f"empty-{stream}"})
    client.chat.completions.create(model="m", messages=transcript(), tools=TOOLS)
    ref = REF.search(sent_tool_message(upstream)["content"]).group(0)
    upstream.enqueue(Reply.tool_calls([read_call(ref, 0, 5)]), Reply.tool_calls([read_call(ref, 5, 5)]))
    history = transcript() + [{"role": "assistant", "content": "reply to: build it"}, {"role": "user", "content": "more"}]
    result = client.chat.completions.create(model="m", messages=history, tools=TOOLS, stream=stream)
    if stream:
        content = "".join(c.choices[0].delta.content or "" for c in result if c.choices) or None
    else:
        content = result.choices[0].message.content
        assert content == "" and result.choices[0].message.tool_calls is None
    history += [{"role": "assistant", "content": content}, {"role": "user", "content": "go on"}]
    assert client.chat.completions.create(model="m", messages=history, tools=TOOLS).choices[0].message.content == "reply to: go on"


def first_turn(proxy, upstream, cid: str) -> str:
    """A conversation's first turn (a long build output): the ref of its shortened output."""
    openai_client(proxy, headers={"X-Conversation-ID": cid}).chat.completions.create(model="m", messages=transcript(), tools=TOOLS)
    return REF.search(sent_tool_message(upstream)["content"]).group(0)


def second_turn(proxy, upstream, cid: str, *replies: Reply) -> tuple[str | None, list[dict]]:
    """The next turn, the model answering with `replies`: the client's reply text, every upstream body."""
    history = transcript() + [{"role": "assistant", "content": "reply to: build it"}, {"role": "user", "content": "more"}]
    first = len(upstream.chat_requests())
    upstream.enqueue(*replies)
    client = openai_client(proxy, headers={"X-Conversation-ID": cid})
    reply = client.chat.completions.create(model="gpt-4o-mini", messages=history, tools=TOOLS)
    return reply.choices[0].message.content, upstream.chat_requests()[first:]


def read_answers(body: dict, after: int) -> list[str]:
    return [m["content"] for m in body["messages"][after:] if m["role"] == "tool"]


def test_a_repeated_read_is_answered_already_shown(make_proxy, upstream):
    proxy = make_proxy(truncation={"max_read_rounds": 6})
    ref = first_turn(proxy, upstream, "repeat")
    text, calls = second_turn(proxy, upstream, "repeat", *[Reply.tool_calls([read_call(ref, 100, 300)])] * 3, Reply.text("done"))
    assert text == "done" and len(calls) == 4
    answers = read_answers(calls[-1], len(transcript()) + 2)
    assert answers[0].startswith(f"[{ref}: characters 100-400 of ") and answers[0].endswith(BIG[100:400])
    assert answers[1:] == [f"[{ref}: characters 100-400 were already shown above in this turn]"] * 2


def test_read_back_never_takes_a_prompt_past_the_window(make_proxy, upstream):
    proxy = make_proxy(context={"history_token_limit": 3000}, truncation={"max_read_rounds": 6})
    ref = first_turn(proxy, upstream, "window")
    # A model that keeps reading a big range, then invents a ref (a real small model did both).
    replies = [Reply.tool_calls([read_call(ref, 2000, 8000)])] * 2
    replies += [Reply.tool_calls([read_call("out_10020_" + "0" * 24, 0, 8000)], content="hmm") for _ in range(4)]
    text, calls = second_turn(proxy, upstream, "window", *replies, Reply.text("done"))
    assert "cut to fit the context window" in read_answers(calls[1], len(transcript()) + 2)[0]
    counter = TokenCounter()
    for body in calls:  # every prompt: the history (system aside) and the tools within the limit
        counts = counter.count_many(body["messages"], "gpt-4o-mini")
        tools = counter.count_texts([json.dumps(body["tools"], separators=(",", ":"))], "gpt-4o-mini")
        assert sum(counts[1:]) + tools <= 3000
        assert validate_chat_request(body) is None
    # The budget ran out before the model stopped: its last reply, without our calls.
    assert len(calls) < 7 and text in ("", "hmm", None)


def test_client_tool_named_read_tool_output_is_left_alone(proxy, upstream):
    tools = TOOLS + [{"type": "function", "function": {"name": "read_tool_output", "parameters": {"type": "object", "properties": {}}}}]
    openai_client(proxy).chat.completions.create(model="m", messages=transcript(), tools=tools)
    names = [t["function"]["name"] for t in upstream.chat_requests()[-1]["tools"]]
    assert names == ["run_build", "read_tool_output", "search_history"]  # the client's read tool, once


def summarizing_responder(body: dict):
    system = body["messages"][0]
    if system["role"] == "system" and "condense the output of one tool call" in system["content"]:
        return Reply.text(f"SUMMARY of {len(body['messages'][1]['content'])} chars")
    return Reply.text("ok")


def test_summarize_handling_summarizes_once_and_resends_the_same_bytes(make_proxy, upstream):
    proxy = make_proxy(truncation={"tools": {"run_build": "summarize"}})
    upstream.responder = summarizing_responder
    client = openai_client(proxy, headers={"X-Conversation-ID": "summ"})
    history = transcript()
    client.chat.completions.create(model="m", messages=history, tools=TOOLS)
    first = sent_tool_message(upstream)["content"]
    assert first.startswith("SUMMARY of") and "shortened to a summary" in first and REF.search(first)
    history += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}]
    client.chat.completions.create(model="m", messages=history, tools=TOOLS)
    assert sent_tool_message(upstream)["content"] == first
    summaries = [r for r in upstream.chat_requests() if "condense" in r["messages"][0]["content"]]
    assert len(summaries) == 1
    assert summaries[0]["model"] == "m"  # the request's own model, with the client's key
    assert upstream.requests[0].headers["authorization"] == f"Bearer {ALICE}"


def test_failing_summarizer_falls_back_to_a_preview(make_proxy, upstream):
    proxy = make_proxy(truncation={"tools": {"run_build": "summarize"}})
    upstream.enqueue(Reply.error(500, {"error": {"message": "down", "type": "server_error", "code": None}}))
    reply = openai_client(proxy).chat.completions.create(model="m", messages=transcript(), tools=TOOLS)
    assert reply.choices[0].message.content
    assert sent_tool_message(upstream)["content"].startswith(BIG[:2000])


def test_tokens_sent_header(proxy, upstream, http):
    response = http.post(
        "/v1/chat/completions",
        json={"model": "gpt-4o-mini", "messages": transcript(), "tools": TOOLS},
        headers={"Authorization": f"Bearer {ALICE}"},
    )
    tokens = int(response.headers["X-Context-Tokens-Sent"])
    assert 400 < tokens < 2000  # the preview and marker, not the 48k-char output
    assert response.headers["X-Context-Messages-Left-Out"] == "0"


def test_reads_past_a_full_window_end_the_turn_not_fail_it(make_proxy, upstream):
    """Three reads of new ranges in one round: the first takes the room there is but what the
    next round needs, the next find little or none (none once divided by zero: a 500) and say so.
    The round fits, and the model's answer after it reaches the client."""
    proxy = make_proxy(context={"history_token_limit": 3000}, truncation={"max_read_rounds": 6})
    ref = first_turn(proxy, upstream, "full")
    reads = Reply.tool_calls([read_call(ref, offset, 8000) for offset in (0, 8000, 16000)])
    text, calls = second_turn(proxy, upstream, "full", reads, Reply.text("done"))
    assert text == "done" and len(calls) == 2
    assert all(validate_chat_request(call) is None for call in calls)
    answers = [m["content"] for m in calls[1]["messages"][-3:]]
    assert "would overflow the context window" in answers[-1]
