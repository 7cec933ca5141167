"""Any model behind the Gemini API: a `models:` entry with `litellm_model` serves Gemini requests
through litellm (here to the strict OpenAI chat fake), the reply in Gemini's format, streaming and
function calls included, so a Gemini client (Gemini CLI) runs on an OpenAI model."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from tests.conftest import MakeProxy, live_messages
from tests.dialects.test_gemini import ask, client_of, results, user
from tests.fakes.fake_upstream import FakeUpstream, Reply
from tests.fakes.responders import by_kind, fixed_summary, is_summary_request
from tests.support.gemini_agent import GeminiAgent
from tests.support.harness import ProxyServer

KEY = "sk-openai-routed-0123456789"
MODEL = "gemini-on-gpt"


@pytest.fixture
def routed(make_proxy: MakeProxy, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch) -> ProxyServer:
    monkeypatch.setenv("ROUTED_OPENAI_KEY", KEY)
    entry = {"litellm_model": "openai/gpt-4o-mini", "api_base": upstream.base_url, "api_key_env": "ROUTED_OPENAI_KEY"}
    return make_proxy(upstream={"gemini_base_url": upstream.gemini.base_url}, models={MODEL: entry})


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_tool_loop_on_an_openai_model_in_gemini_format(routed: ProxyServer, upstream: FakeUpstream, stream: bool) -> None:
    client = client_of(routed.url, headers={"X-Conversation-ID": f"routed-{stream}"})
    upstream.enqueue(
        Reply.tool_calls([("run_build", "{}"), ("run_build", json.dumps({"target": "docs"}))], content="Building."),
        Reply.text("Both built."),
    )
    contents = [user("Build everything.")]
    first = ask(client, contents, stream, model=MODEL)
    assert [(c.name, c.args) for c in first.function_calls] == [("run_build", {}), ("run_build", {"target": "docs"})]
    assert first.text == "Building." and first.model_version == MODEL
    contents += [first.candidates[0].content, results(first, "ok")]
    second = ask(client, contents, stream, model=MODEL)
    assert second.text == "Both built."

    records = [r for r in upstream.requests if r.path == "/v1/chat/completions"]
    assert [r.status_sent for r in records] == [200, 200] and records[-1].headers["authorization"] == f"Bearer {KEY}"
    chat = upstream.chat_requests()[-1]
    assert chat["model"] == "gpt-4o-mini" and chat["messages"][0]["role"] == "system"
    assert [m["role"] for m in chat["messages"][1:]] == ["user", "assistant", "tool", "tool"]
    ids = [c["id"] for c in chat["messages"][2]["tool_calls"]]
    assert [m["tool_call_id"] for m in chat["messages"][3:]] == ids and len(set(ids)) == 2
    assert [t["function"]["name"] for t in chat["tools"]] == ["run_build"]
    assert upstream.gemini.calls() == []  # nothing went to the Gemini API
    with httpx.Client(base_url=routed.url, timeout=30, auth=routed.admin_auth) as http:
        stored = live_messages(http, f"routed-{stream}")
    assert [m["role"] for m in stored] == ["user", "model", "user", "user", "model"]  # each response its own part
    assert [p["functionCall"]["id"] for p in stored[1]["parts"][1:]] == ids  # the provider's ids, on the calls


def test_gemini_cli_runs_on_an_openai_model(routed: ProxyServer, upstream: FakeUpstream, tmp_path: Path) -> None:
    upstream.enqueue(
        Reply.tool_calls([("run_shell_command", json.dumps({"command": "echo hi"}))]),
        Reply.text("The command printed: hi"),
    )
    with GeminiAgent(routed.url, tmp_path) as agent:
        done = agent.run("run echo hi", model=MODEL)
    assert (done["exit_code"], done["response"]) == (0, "The command printed: hi"), done
    tool = upstream.chat_requests()[-1]["messages"][-1]
    assert tool["role"] == "tool" and "hi" in tool["content"]
    assert upstream.gemini.calls() == []


def test_summaries_of_a_routed_gemini_conversation_go_through_its_models_route(
    make_proxy: MakeProxy, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROUTED_OPENAI_KEY", KEY)
    entry = {"litellm_model": "openai/gpt-4o-mini", "api_base": upstream.base_url, "api_key_env": "ROUTED_OPENAI_KEY"}
    proxy = make_proxy(
        upstream={"gemini_base_url": upstream.gemini.base_url}, models={MODEL: entry},
        compaction={"strategy": "budget", "background": False, "max_history_summary_length": 1000},
    )
    upstream.responder = by_kind(lambda body: Reply.tool_calls([("run_build", "{}")]), fixed_summary("The build fails at step 900."))
    client = client_of(proxy.url, headers={"X-Conversation-ID": "routed-summary"})
    contents = [user("Why does the build fail?")]
    for _ in range(4):
        reply = ask(client, contents, stream=False, model=MODEL)
        contents += [reply.candidates[0].content, results(reply, "step ok\n" * 100)]
    summaries = [b for b in upstream.chat_requests() if is_summary_request(b)]
    assert summaries and all(b["model"] == "gpt-4o-mini" for b in summaries)  # the route's model, in chat
    sent = upstream.chat_requests()[-1]
    assert "The build fails at step 900." in sent["messages"][0]["content"]  # the summary in the system message
    assert upstream.gemini.calls() == []
