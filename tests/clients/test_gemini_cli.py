"""Gemini CLI itself, through the proxy: a shell tool loop, then `--resume`, loopback only.

The fake Gemini upstream scripts the model (a `run_shell_command` call with a thought and its
signature, then text); Gemini CLI really runs the command (`--yolo`). What reached the fake must
be valid (the CLI does not retry a 400: it would exit 1), carry the command's output, be what the
CLI sends without the proxy (the transparency check), and be stored as one conversation.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import MakeProxy, admin_get, live_messages, trajectory
from tests.fakes.fake_upstream import FakeUpstream, Reply
from tests.support.gemini_agent import TEST_KEY, GeminiAgent
from tests.test_metrics import scrape, value

MODELS = ["gemini-2.5-pro", "gemini-3-flash-preview"]  # Gemini 3 checks each step's thought signature


def script(upstream: FakeUpstream) -> None:
    shell = Reply.tool_calls([("run_shell_command", json.dumps({"command": "echo hi"}))], reasoning="I will run it.")
    upstream.enqueue(shell, Reply.text("The command printed: hi"))


def shape(body: dict[str, Any]) -> dict[str, Any]:
    """What the proxy could alter of a request: fields, roles and part kinds, the tools, the config."""
    return {
        "fields": sorted(body),
        "contents": [[c["role"], [sorted(p) for p in c["parts"]]] for c in body["contents"]],
        "tools": [d["name"] for t in body["tools"] for d in t.get("functionDeclarations", [])],
        "generationConfig": body["generationConfig"],
    }


def session(base_url: str, upstream: FakeUpstream, folder: Path, model: str) -> list[dict[str, Any]]:
    """`gemini -p "run echo hi" --yolo`, then `--resume latest -p "say bye"`: the bodies the fake got."""
    upstream.gemini.reset()
    script(upstream)
    with GeminiAgent(base_url, folder) as agent:
        first = agent.run("run echo hi", model=model)
        assert (first["exit_code"], first["response"]) == (0, "The command printed: hi"), first
        upstream.enqueue(Reply.text("Goodbye!"))
        resumed = agent.run("say bye", model=model, resume=True)
        assert (resumed["exit_code"], resumed["response"], resumed["session_id"]) == (0, "Goodbye!", first["session_id"])
        assert agent.egress.attempts == []  # nothing but loopback
    return upstream.gemini.requests()


@pytest.mark.parametrize("model", MODELS)
def test_gemini_cli_runs_a_tool_loop_through_the_proxy_and_resumes_in_one_conversation(
    make_proxy: MakeProxy, upstream: FakeUpstream, tmp_path: Path, model: str
) -> None:
    direct = session(upstream.gemini.base_url, upstream, tmp_path / "direct", model)
    proxy = make_proxy(upstream={"gemini_base_url": upstream.gemini.base_url})
    through = session(proxy.url, upstream, tmp_path / "proxied", model)

    records = [r for r in upstream.requests if r.path.startswith("/v1beta/")]
    assert records and all(r.status_sent == 200 for r in records)  # none refused
    assert [shape(b) for b in through] == [shape(b) for b in direct]  # the proxy is transparent
    turn1, continuation, resumed = through
    # The continuation answers the call with the command's real output, the signature passed back.
    call, result = continuation["contents"][-2:]
    assert call["parts"][0]["thoughtSignature"] and call["parts"][0]["functionCall"]["name"] == "run_shell_command"
    assert "hi" in result["parts"][0]["functionResponse"]["response"]["output"]
    assert resumed["contents"][-1]["parts"][-1]["text"] == "say bye"

    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        listed = admin_get(http, "", TEST_KEY).json()["data"]
        assert len(listed) == 1, listed  # the run and its --resume: one conversation
        assert listed[0]["title"] == "run echo hi"  # the task, without the CLI's <session_context>
        stored = live_messages(http, listed[0]["id"], TEST_KEY)
        # The resumed history (dummy signatures, a response sent twice) matched the stored one.
        assert {m["status"] for m in trajectory(http, listed[0]["id"], TEST_KEY)} == {"live"}
    assert [m["role"] for m in stored] == ["user", "model", "user", "model", "user", "model"]
    assert stored[-1]["parts"] == [{"text": "Goodbye!"}]
    # The continuation extends the first request (kept in an opening slot: it had no reply to
    # name its run by); the resumed one rewrites its history (dummy signatures), so it is read whole.
    samples = scrape(proxy)
    assert value(samples, "context_proxy_fast_path_turns_total", outcome="taken") == 1
    assert [value(samples, "context_proxy_fast_path_not_taken_turns_total", reason=r)
            for r in ("no_previous_turn", "body_not_extended")] == [1, 1]


def test_without_a_model_the_clis_router_call_is_a_conversation_of_its_own(
    make_proxy: MakeProxy, upstream: FakeUpstream, tmp_path: Path
) -> None:
    """No `-m`: the CLI first asks a small model to rate the task (JSON mode, a system instruction
    of its own), then runs it on the model the rating picks: the rating is a thread of its own."""

    def model(body: dict[str, Any]) -> Reply:
        if "Task Routing AI" in json.dumps(body.get("systemInstruction")):
            return Reply.text(json.dumps({"complexity_reasoning": "one command", "complexity_score": 10}))
        if any("functionResponse" in p for c in body["contents"] for p in c["parts"]):
            return Reply.text("The command printed: hi")
        return Reply.tool_calls([("run_shell_command", json.dumps({"command": "echo hi"}))])

    upstream.responder = model
    proxy = make_proxy(upstream={"gemini_base_url": upstream.gemini.base_url})
    with GeminiAgent(proxy.url, tmp_path) as agent:
        done = agent.run("run echo hi", model=None)
        assert (done["exit_code"], done["response"]) == (0, "The command printed: hi"), done
    router, *turns = upstream.gemini.calls()
    assert not router.stream and router.body["generationConfig"]["responseMimeType"] == "application/json"
    assert len(turns) == 2 and all(t.stream and t.model == turns[0].model for t in turns)
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        listed = admin_get(http, "", TEST_KEY).json()["data"]
        sizes = sorted(len(live_messages(http, c["id"], TEST_KEY)) for c in listed)
        assert sizes == [3, 4]  # the rating (two user contents, its answer); the run (task, call, response, answer)
