"""Threads of one client session (proxy/engine/engine.py, `_thread_of`): Claude Code's subagents
and side requests share its session id but are conversations of their own, listed with their
family; the main thread keeps the session id. Driven with the shapes of a real Claude Code
session with a background subagent (../shared/samples/claude-code-subagent.json, copied to
tests/samples/), thinking blocks left out (their signatures were elided in the recording)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import admin_get, trajectory
from tests.fakes.fake_upstream import FakeUpstream, Reply
from tests.support.messages_helpers import messages_proxy
from tests.test_metrics import scrape, value

SAMPLE = json.loads((Path(__file__).resolve().parents[1] / "samples" / "claude-code-subagent.json").read_text())
SESSION = "9bc5bf73-b7ef-4822-994d-73bb9b9c2bcc"
KEY = "sk-ant-test-threads-0123456789"


def body_of(recorded: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """A request as Claude Code sends it, from the recording's condensed form."""
    messages = []
    for message in recorded["messages"]:
        content = message["content"]
        if isinstance(content, list):
            content = [b for b in content if b.get("type") != "thinking"]
        messages.append({**message, "content": content})
    body = {
        "model": "claude-opus-5-5",
        "max_tokens": 32000,
        "system": [{"type": "text", "text": text} for text in recorded["system"]],
        "tools": [{"name": name, "description": f"The {name} tool.", "input_schema": {"type": "object"}}
                  for name in recorded["tools"]],
        "metadata": recorded["metadata"],
        "messages": messages,
    }
    return {**body, **changes}


def send(http: httpx.Client, body: dict[str, Any]) -> httpx.Response:
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01", "X-Claude-Code-Session-Id": SESSION}
    response = http.post("/v1/messages?beta=true", json=body, headers=headers)
    assert response.status_code == 200, response.text
    return response


def statuses(http: httpx.Client, conversation: str) -> list[str]:
    return [m["status"] for m in trajectory(http, conversation, api_key=KEY)]


def main_thread(http: httpx.Client, upstream: FakeUpstream) -> dict[str, Any]:
    """The main thread's first two turns as Claude Code makes them: its task, then the result of
    the Agent tool its reply called (the recording's blocks, answering the call the fake made)."""
    main_first, main_result, _, _ = SAMPLE["requests"]
    call = next(b for b in main_result["messages"][2]["content"] if b["type"] == "tool_use")
    upstream.enqueue(Reply.tool_calls([("Agent", json.dumps(call["input"]))]))
    body = body_of(main_first)
    reply = send(http, body).json()
    result = dict(main_result["messages"][3]["content"][0])
    result["tool_use_id"] = next(b["id"] for b in reply["content"] if b["type"] == "tool_use")
    body["messages"] += [{"role": "assistant", "content": reply["content"]}, {"role": "user", "content": [result]}]
    upstream.enqueue(Reply.text("(the model's answer)"))
    reply = send(http, body).json()
    body["messages"].append({"role": "assistant", "content": reply["content"]})
    return body


def test_a_subagent_is_a_thread_of_its_own_and_the_main_thread_is_never_superseded(
    make_proxy, upstream: FakeUpstream
) -> None:
    proxy = messages_proxy(make_proxy, upstream)
    _, _, sub_first, main_after = SAMPLE["requests"]
    with httpx.Client(base_url=proxy.url, timeout=60) as http:
        main = main_thread(http, upstream)
        upstream.enqueue(Reply.text("(the subagent's answer)"))
        send(http, body_of(sub_first))  # the background subagent starts
        main["messages"].append(body_of(main_after)["messages"][-1])  # its notification, to the main thread
        upstream.enqueue(Reply.text("(the model's answer)"))
        send(http, main)
        listed = {c["id"]: c for c in admin_get(http, "", api_key=KEY).json()["data"]}
        (thread,) = set(listed) - {SESSION}
        assert thread.startswith(SESSION + ":") and listed[thread]["family"] == SESSION
        assert listed[SESSION]["family"] == SESSION
        # Each thread whole and once: the main thread's requests extend one another.
        assert statuses(http, SESSION) == ["live"] * (len(main["messages"]) + 1)
        sub = trajectory(http, thread, api_key=KEY)
        assert [(m["role"], m["status"]) for m in sub] == [("user", "live"), ("system", "live"), ("assistant", "live")]
        # The subagent's later turn goes back to its own thread.
        upstream.enqueue(Reply.text("(the subagent's second answer)"))
        later = body_of(sub_first)
        later["messages"] += [{"role": "assistant", "content": [{"type": "text", "text": "(the subagent's answer)"}]},
                              {"role": "user", "content": "go on"}]
        send(http, later)
        assert statuses(http, thread) == ["live"] * 5
        assert len(admin_get(http, "", api_key=KEY).json()["data"]) == 2


def test_a_side_request_replaying_the_main_transcript_under_other_tools_neither_appends_nor_supersedes(
    make_proxy, upstream: FakeUpstream
) -> None:
    """A title or hook check: the main transcript, no tools, and a last question of its own."""
    proxy = messages_proxy(make_proxy, upstream)
    with httpx.Client(base_url=proxy.url, timeout=60) as http:
        main = main_thread(http, upstream)
        side = {**main, "tools": [], "messages": [*main["messages"], {"role": "user", "content": "Give this conversation a title."}]}
        upstream.enqueue(Reply.text("A title"))
        send(http, side)
        main["messages"].append({"role": "user", "content": "Now check the result."})
        upstream.enqueue(Reply.text("(the model's answer)"))
        send(http, main)
        kept = trajectory(http, SESSION, api_key=KEY)
        assert [m["status"] for m in kept] == ["live"] * (len(main["messages"]) + 1)
        assert all("Give this conversation a title." not in json.dumps(m["content"]) for m in kept)
        assert len(admin_get(http, "", api_key=KEY).json()["data"]) == 2


def test_a_main_thread_and_its_subagent_taking_turns_each_keep_the_fast_path(make_proxy, upstream: FakeUpstream) -> None:
    """Claude Code's main thread and a background subagent send under one session id, turn about:
    each request extends its own thread's previous one, so each takes the fast path."""
    proxy = messages_proxy(make_proxy, upstream)
    _, _, sub_first, _ = SAMPLE["requests"]
    with httpx.Client(base_url=proxy.url, timeout=60) as http:
        main = main_thread(http, upstream)
        sub = body_of(sub_first)
        for step in range(4):
            for thread, body in (("sub", sub), ("main", main)):
                body["messages"].append({"role": "user", "content": f"{thread}: go on ({step})"})
                upstream.enqueue(Reply.text(f"({thread}'s answer {step})"))
                reply = send(http, body).json()
                body["messages"].append({"role": "assistant", "content": reply["content"]})
        samples = scrape(proxy)
    counted = {o: value(samples, "context_proxy_fast_path_turns_total", outcome=o) for o in ("taken", "declined", "none")}
    # Each thread's first turn is its own (nothing before it); every later one extends its own
    # thread's last request, whatever the other sent between (the subagent's second, its first).
    assert counted == {"taken": 8.0, "declined": 0.0, "none": 2.0}
