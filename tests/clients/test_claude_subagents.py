"""Claude Code's subagents through the proxy (its `Agent` tool, in the foreground and in the
background): the subagent's requests carry the main thread's session id but their own system
prompt and task, so they are a thread of their own (`<session>:<token>`), and neither thread
supersedes or copies the other. The same session run straight against the fake and through the
proxy sends the upstream the same requests, in the same roles and block types."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import MakeProxy, admin_get, trajectory
from tests.fakes.fake_upstream import FakeUpstream, Reply
from tests.support.claude_agent import ClaudeAgent
from tests.test_metrics import scrape, value

TASK = "Main task: delegate one check to a subagent."
SUBTASK = "Subagent task: answer 42"
# Claude Code's own system prompt, tools and environment block are ~11,000 tokens.
CONTEXT = {"history_token_limit": 100_000}


def text_of(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return " ".join(b.get("text", "") if b.get("type") == "text" else json.dumps(b.get("content", "")) for b in content)


def scripted(background: bool):
    """The model of both threads: the main one delegates with the Agent tool, the subagent answers."""

    def responder(body: dict[str, Any]) -> Reply:
        messages = body["messages"]
        if SUBTASK in text_of(messages[0]):
            return Reply.text("SUB-RESULT 42")
        if len(messages) <= 2:
            agent = {"description": "Check 42", "prompt": SUBTASK, "subagent_type": "general-purpose",
                     "run_in_background": background}
            return Reply.tool_calls([("Agent", json.dumps(agent))])
        if any(b.get("type") == "tool_result" for b in messages[-1]["content"] if isinstance(b, dict)):
            return Reply.text("The subagent is on it." if background else "Main done: 42")
        return Reply.text("Main done after its notification.")

    return responder


def shapes(bodies: list[dict[str, Any]]) -> list[tuple]:
    """Each request by meaning: its thread, and its messages' roles and block types."""
    out = []
    for body in bodies:
        thread = "sub" if SUBTASK in text_of(body["messages"][0]) else "main"
        out.append((thread, [(m["role"], [b["type"] for b in m["content"]] if isinstance(m["content"], list) else "text")
                             for m in body["messages"]]))
    return sorted(out, key=lambda s: (s[0], len(s[1])))


def session(upstream: FakeUpstream, base_url: str, folder: Path, background: bool) -> tuple[dict, list[dict]]:
    upstream.responder = scripted(background)
    before = len(upstream.messages_requests())
    with ClaudeAgent(base_url, folder) as agent:
        result = agent.run(TASK, allowed_tools="Bash,Agent", timeout=90)
    assert result["is_error"] is False, result
    return result, upstream.messages_requests()[before:]


@pytest.mark.parametrize("background", [False, True], ids=["foreground", "background"])
def test_a_subagent_is_a_thread_of_its_own_and_the_session_reaches_the_upstream_as_sent(
    make_proxy: MakeProxy, upstream: FakeUpstream, tmp_path: Path, background: bool
) -> None:
    _, direct = session(upstream, upstream.anthropic.base_url, tmp_path / "direct", background)
    proxy = make_proxy(upstream={"anthropic_base_url": upstream.anthropic.base_url}, context=CONTEXT)
    result, through = session(upstream, proxy.url, tmp_path / "proxy", background)
    assert shapes(through) == shapes(direct)
    assert {"main", "sub"} == {s[0] for s in shapes(through)}

    main_id = result["session_id"]
    with httpx.Client(base_url=proxy.url, timeout=30, auth=proxy.admin_auth) as http:
        listed = {c["id"]: c for c in admin_get(http, "").json()["data"]}
        (sub_id,) = set(listed) - {main_id}
        assert sub_id.startswith(main_id + ":") and {c["family"] for c in listed.values()} == {main_id}
        main, sub = trajectory(http, main_id), trajectory(http, sub_id)
    assert {m["status"] for m in main} == {m["status"] for m in sub} == {"live"}  # nothing superseded
    assert SUBTASK in text_of(sub[0]) and all(SUBTASK not in text_of(m) for m in main[:1])
    # Nothing stored twice, in either thread: no two stored messages alike.
    for stored in (main, sub):
        kept = [json.dumps({k: v for k, v in m.items() if k not in ("seq", "created_at")}, sort_keys=True) for m in stored]
        assert len(set(kept)) == len(kept)
    assert text_of(main[-1]) == ("Main done after its notification." if background else "Main done: 42")
    # Each thread's first request is parsed whole; every later one extends its own thread's last
    # request, though the other thread's came between (the fast path: none of them is `none`).
    samples = scrape(proxy)
    outcomes = {o: value(samples, "context_proxy_fast_path_turns_total", outcome=o) for o in ("taken", "declined", "none")}
    assert outcomes["none"] == 2 and outcomes["taken"] + outcomes["declined"] == len(through) - 2
