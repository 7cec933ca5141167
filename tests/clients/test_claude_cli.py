"""Claude Code itself, through the proxy: a Bash tool loop, then `--resume`, loopback only.

The fake upstream scripts the model (a `Bash` tool_use with thinking, then text); Claude Code
really runs the command. What reached the fake must be valid (no refusal: Claude Code would
silently retry with fewer betas), carry the command's output, and keep one session id.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import MakeProxy
from tests.fakes.fake_anthropic import tool_use_id
from tests.fakes.fake_upstream import FakeUpstream, Recorded, Reply
from tests.support.claude_agent import ClaudeAgent
from tests.test_metrics import scrape, value

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
RECORDED = ("claude-turn1.json", "claude-tool-continuation.json", "claude-resumed-turn.json")


def messages_records(upstream: FakeUpstream) -> list[Recorded]:
    return [r for r in upstream.requests if r.path == "/v1/messages"]


def shape(body: dict[str, Any]) -> dict[str, Any]:
    """What a Claude Code version change would alter: fields, roles and block types."""
    return {
        "fields": sorted(body),
        "messages": [
            [m["role"], sorted(m), [sorted(b) for b in m["content"]] if isinstance(m["content"], list) else "string"]
            for m in body["messages"]
        ],
        "tools": [t["name"] for t in body["tools"]],
    }


def test_claude_code_runs_a_tool_loop_through_the_proxy_and_resumes(
    make_proxy: MakeProxy, upstream: FakeUpstream, tmp_path: Path
) -> None:
    proxy = make_proxy(upstream={"anthropic_base_url": upstream.anthropic.base_url})
    bash = Reply.tool_calls([("Bash", json.dumps({"command": "echo hello", "description": "Print hello"}))],
                            reasoning="The user wants me to run echo hello.")
    upstream.enqueue(bash, Reply.text("It printed hello.", reasoning="The command printed hello."))
    with ClaudeAgent(proxy.url, tmp_path) as agent:
        first = agent.run("Run `echo hello` with Bash and tell me what it printed.")
        assert (first["is_error"], first["result"], first["num_turns"]) == (False, "It printed hello.", 2)
        upstream.enqueue(Reply.text("Goodbye!"))
        resumed = agent.run("Thanks. Now say goodbye.", resume=first["session_id"])
        assert (resumed["is_error"], resumed["result"], resumed["session_id"]) == (False, "Goodbye!", first["session_id"])
        assert agent.egress.attempts == []  # nothing but loopback

    records = messages_records(upstream)
    assert [(r.query, r.status_sent) for r in records] == [({"beta": "true"}, 200)] * 3  # none refused
    turn1, continuation, later = upstream.messages_requests()
    # The continuation answers the scripted call with the command's real output, and passes the
    # signed thinking block back first, unchanged (the fake checked the signature).
    call_id = tool_use_id(bash.calls[0])
    assistant, result = continuation["messages"][-2:]
    assert [b["type"] for b in assistant["content"]] == ["thinking", "tool_use"]
    assert assistant["content"][1] == {"type": "tool_use", "id": call_id, "name": "Bash",
                                       "input": {"command": "echo hello", "description": "Print hello"}}
    (block,) = result["content"]
    assert (block["type"], block["tool_use_id"], block["content"], block["is_error"]) == ("tool_result", call_id, "hello", False)
    # One session on every request, header and metadata alike, across --resume.
    assert {r.headers["x-claude-code-session-id"] for r in records} == {first["session_id"]}
    assert {json.loads(b["metadata"]["user_id"])["session_id"] for b in (turn1, continuation, later)} == {first["session_id"]}
    # The resumed turn resends the whole history, then the new task.
    assert len(later["messages"]) == len(continuation["messages"]) + 2
    assert later["messages"][-1]["content"][0]["text"] == "Thanks. Now say goodbye."
    # Its instructions take nothing from the history budget, so nothing left the prompt at the
    # default window: no recall tool joins, and every turn but the first reads the prompt cache
    # the one before wrote.
    assert [t["name"] for t in continuation["tools"]] == [t["name"] for t in turn1["tools"]] == [t["name"] for t in later["tools"]]
    reads = [usage["cache_read_input_tokens"] for usage in upstream.anthropic.usages()]
    assert reads[0] == 0 and 0 < reads[1] < reads[2]
    # Its continuation and its resumed turn extend the request before (its first, with no reply
    # yet, kept in an opening slot): read only where new, whatever the window then does.
    samples = scrape(proxy)
    outcomes = [value(samples, "context_proxy_fast_path_turns_total", outcome=o) for o in ("taken", "declined", "none")]
    assert outcomes[2] == 1 and outcomes[0] + outcomes[1] == 2


def test_a_live_run_still_sends_what_the_fixtures_recorded(upstream: FakeUpstream, tmp_path: Path) -> None:
    """tests/samples/claude-*.json (tests/clients/record_claude_samples.py) must stay true to the pinned
    Claude Code: same fields, roles, block keys, tools and header names on every request."""
    from tests.clients.record_claude_samples import FIRST_TASK, RESUMED_TASK, script

    upstream.enqueue(*script())
    with ClaudeAgent(upstream.anthropic.base_url, tmp_path) as agent:
        first = agent.run(FIRST_TASK)
        agent.run(RESUMED_TASK, resume=first["session_id"])
    records = messages_records(upstream)
    recorded = [json.loads((SAMPLES / name).read_text()) for name in RECORDED]
    assert [shape(r.body) for r in records] == [shape(s["body"]) for s in recorded]
    assert [sorted(r.headers.keys() - {"host", "content-length"}) for r in records] == [sorted(s["headers"]) for s in recorded]
    assert [r.headers["anthropic-beta"] for r in records] == [s["headers"]["anthropic-beta"] for s in recorded]
