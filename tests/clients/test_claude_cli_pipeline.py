"""Claude Code itself (`claude -p`, then `--resume`) through the proxy, loopback only: against the
strict Anthropic fake, a Bash tool loop whose long output is shortened on its way upstream and
kept whole in the one stored conversation both runs land in; and on an OpenAI model through a
`models:` entry (litellm to the strict chat fake)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.conftest import MakeProxy, admin_get, live_messages
from tests.fakes.fake_upstream import FakeUpstream, Reply
from tests.support.claude_agent import ClaudeAgent
from tests.support.messages_helpers import messages_proxy

COUNT = 6000
SEQ_OUTPUT = "".join(f"{i}\n" for i in range(1, COUNT + 1)).rstrip("\n")  # what Bash gives back
TASK = f"Run `seq 1 {COUNT}` with Bash and tell me how many lines it printed."
CLAUDE_MODEL = "claude-opus-5-5"  # what this Claude Code asks for (tests/samples/claude-*.json)
# Claude Code's own system prompt and tool schemas are ~9,000 tokens: the default 10,000 leaves no room.
CONTEXT = {"history_token_limit": 100_000}


def bash(command: str) -> Reply:
    return Reply.tool_calls([("Bash", json.dumps({"command": command, "description": "Count lines"}))],
                            reasoning="I will run the command.")


def tool_results(body: dict) -> list[dict]:
    return [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"] if b["type"] == "tool_result"]


def test_claude_code_resumes_into_one_conversation_with_its_long_output_shortened_upstream(
    make_proxy: MakeProxy, upstream: FakeUpstream, tmp_path: Path
) -> None:
    proxy = messages_proxy(make_proxy, upstream, context=CONTEXT)
    upstream.enqueue(bash(f"seq 1 {COUNT}"), Reply.text(f"It printed {COUNT} lines.", reasoning="Counted."))
    with ClaudeAgent(proxy.url, tmp_path) as agent:
        first = agent.run(TASK)
        assert (first["is_error"], first["result"]) == (False, f"It printed {COUNT} lines.")
        upstream.enqueue(Reply.text("Goodbye!"))
        resumed = agent.run("Thanks. Now say goodbye.", resume=first["session_id"])
        assert (resumed["is_error"], resumed["result"]) == (False, "Goodbye!")
        assert resumed["session_id"] == first["session_id"]

    records = [r for r in upstream.requests if r.path == "/v1/messages"]
    assert [(r.query, r.status_sent) for r in records] == [({"beta": "true"}, 200)] * 3  # none refused
    _, continuation, later = upstream.messages_requests()
    (sent,) = tool_results(continuation)
    assert len(sent["content"]) < 3000 and "read_tool_output" in sent["content"]
    assert "read_tool_output" in [t["name"] for t in continuation["tools"]]
    # The same bytes on the resumed turn (a stable rewrite), but the breakpoint Claude Code moved on.
    unmarked = {k: v for k, v in sent.items() if k != "cache_control"}
    assert tool_results(later) == [unmarked] and sent["cache_control"] == {"type": "ephemeral"}

    with httpx.Client(base_url=proxy.url, auth=proxy.admin_auth) as http:
        (only,) = admin_get(http, "").json()["data"]
        assert only["id"] == first["session_id"]
        stored = live_messages(http, only["id"])
    results = [b for m in stored for b in m["content"] if isinstance(m["content"], list) and b["type"] == "tool_result"]
    assert [r["content"] for r in results] == [SEQ_OUTPUT]  # kept whole
    assert stored[-1]["content"][-1] == {"type": "text", "text": "Goodbye!"}
    assert [m["role"] for m in stored].count("assistant") == 3


@pytest.fixture
def on_gpt(make_proxy: MakeProxy, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("CLAUDE_ON_GPT_KEY", "sk-openai-claude-code-0123")
    entry = {"litellm_model": "openai/gpt-4o-mini", "api_base": upstream.base_url, "api_key_env": "CLAUDE_ON_GPT_KEY"}
    return messages_proxy(make_proxy, upstream, context=CONTEXT, models={CLAUDE_MODEL: entry})


def test_claude_code_runs_its_tool_loop_on_an_openai_model(
    on_gpt, upstream: FakeUpstream, tmp_path: Path
) -> None:
    upstream.enqueue(bash("echo hello"), Reply.text("It printed hello."))
    with ClaudeAgent(on_gpt.url, tmp_path) as agent:
        first = agent.run("Run `echo hello` with Bash and tell me what it printed.")
        assert (first["is_error"], first["result"]) == (False, "It printed hello.")
        upstream.enqueue(Reply.text("Goodbye!"))
        resumed = agent.run("Thanks. Now say goodbye.", resume=first["session_id"])
        assert (resumed["is_error"], resumed["result"]) == (False, "Goodbye!")

    chats = [r for r in upstream.requests if r.path == "/v1/chat/completions"]
    assert [r.status_sent for r in chats] == [200, 200, 200]  # valid chat requests, every one
    assert upstream.messages_requests() == []
    # Found by role, not by place: in one loaded full run the message before the last was not the
    # call (not seen alone in 8 runs; Claude Code adds messages of its own at times). What counts is
    # that the call and its result went upstream, the result right after the call.
    continuation = upstream.chat_requests()[1]["messages"]
    (asked,) = [m for m in continuation if m.get("tool_calls")]
    call = asked["tool_calls"][0]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])["command"]) == ("Bash", "echo hello")
    (answered,) = [m for m in continuation if m["role"] == "tool"]
    assert answered == {"role": "tool", "tool_call_id": call["id"], "content": "hello"}
    assert continuation.index(answered) == continuation.index(asked) + 1
    with httpx.Client(base_url=on_gpt.url, auth=on_gpt.admin_auth) as http:
        (only,) = admin_get(http, "").json()["data"]
        assert only["id"] == first["session_id"] and only["llm_calls"] == 3
