"""Codex CLI through the proxy: a shell-tool loop and `exec resume`, against the strict fake.

Codex (the npm package, installed by scripts/ensure-codex.sh) runs for real, with a custom
Responses provider whose base URL is the proxy; nothing but loopback may be contacted. One
session serves the module's tests: each Codex run takes seconds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ALICE
from tests.fakes.fake_upstream import FakeUpstream, Recorded, Reply
from tests.support.agents import codex_session
from tests.support.harness import LoopThread, ProxyServer, proxy_settings
from tests.test_metrics import scrape, value

RECORDED = Path(__file__).resolve().parents[1] / "samples" / "codex-session.json"
TRANSPORT_HEADERS = {"host", "content-length"}


def shape(body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    """What a parser of Codex's requests relies on: header names, body keys, item kinds."""
    return {
        "headers": sorted(set(headers) - TRANSPORT_HEADERS),
        "body": sorted(body),
        "items": [(item.get("type"), item.get("role"), sorted(item)) for item in body["input"]],
        "tools": [(tool["type"], tool.get("name")) for tool in body["tools"] if tool.get("name") not in ("read_tool_output", "search_history")],
    }


@pytest.fixture(scope="module")
def codex_requests(
    servers: LoopThread, _upstream: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """One Codex session through a proxy (`echo hello` through the shell tool, then a resume),
    run once for the module's tests: what Codex saw, and what the upstream received."""
    upstream = _upstream
    upstream.reset()
    tmp_path = tmp_path_factory.mktemp("codex")
    # Codex caps a command's output itself (~10,000 characters): the proxy's limit sits below it.
    settings = proxy_settings(upstream.base_url, tmp_path / "data", truncation={"max_tool_response_length": 4000})
    proxy = ProxyServer(servers, settings).start()
    upstream.enqueue(
        Reply.tool_calls([("exec_command", json.dumps({"cmd": "echo hello; seq 1 4000"}))], reasoning="Run the command."),
        Reply.text("It printed hello.", reasoning="The command succeeded."),
        Reply.text("Still here."),
    )
    try:
        with codex_session(proxy.base_url, ALICE, tmp_path) as codex:
            first = codex.exec("Run `echo hello; seq 1 4000` in the shell, then say what it printed.")
            resumed = codex.resume("Are you still there?")
            attempts = list(codex.guard.attempts)
        bodies = upstream.responses_requests()
        session = bodies[0]["prompt_cache_key"]
        with httpx.Client(base_url=proxy.url, timeout=30, auth=proxy.admin_auth) as admin:
            stored = admin.get(f"/v1/conversations/{session}/messages", params={"limit": 1000}).json()
            trajectory = admin.get(f"/v1/conversations/{session}/trajectory", params={"limit": 1000}).json()
        samples = scrape(proxy)
        fast_path = {o: value(samples, "context_proxy_fast_path_turns_total", outcome=o) for o in ("taken", "declined", "none")}
        yield {"first": first, "resumed": resumed, "attempts": attempts, "records": list(upstream.requests),
               "bodies": bodies, "stored": stored, "trajectory": trajectory, "fast_path": fast_path}
    finally:
        proxy.stop()
        upstream.reset()


def test_codex_runs_the_shell_tool_and_resumes(codex_requests: dict[str, Any]) -> None:
    first, resumed = codex_requests["first"], codex_requests["resumed"]

    assert first.completed, first.stderr[-3000:]
    [command] = first.commands
    assert "echo hello" in command["command"] and command["exit_code"] == 0
    assert command["aggregated_output"].strip().endswith("4000")
    assert first.messages == ["It printed hello."]
    assert resumed.completed, resumed.stderr[-3000:]
    assert resumed.messages == ["Still here."] and resumed.thread_id == first.thread_id


def test_codexs_later_requests_reuse_the_previous_ones_work(codex_requests: dict[str, Any]) -> None:
    """Codex ends each body with its `client_metadata`, new every request (turn ids, its keys in
    another order): its tool continuation and its resumed turn still extend the request before
    (the fast path taken, or declined by a stage: `none` is the first request's alone)."""
    fast_path = codex_requests["fast_path"]
    assert fast_path["none"] == 1 and fast_path["taken"] + fast_path["declined"] == 2 and fast_path["taken"] >= 1


def test_codex_contacts_nothing_but_the_proxy(codex_requests: dict[str, Any]) -> None:
    assert codex_requests["attempts"] == []  # no CONNECT (or plain request) beyond loopback
    records: list[Recorded] = codex_requests["records"]
    assert [(r.method, r.path, r.status_sent) for r in records] == [("POST", "/v1/responses", 200)] * 3


def test_the_upstream_receives_valid_requests_of_one_session(codex_requests: dict[str, Any]) -> None:
    turn_1, continuation, resumed = codex_requests["bodies"]  # all three passed the strict fake
    records: list[Recorded] = codex_requests["records"]

    [output] = [item for item in continuation["input"] if item["type"] == "function_call_output"]
    [call] = [item for item in continuation["input"] if item["type"] == "function_call"]
    assert output["call_id"] == call["call_id"] and json.loads(call["arguments"]) == {"cmd": "echo hello; seq 1 4000"}
    assert "Process exited with code 0" in output["output"] and "\nhello\n1\n2\n" in output["output"]
    # Everything resent, and the proxy's rewrites stable: each request extends the one before it.
    assert continuation["input"][: len(turn_1["input"])] == turn_1["input"]
    assert resumed["input"][: len(continuation["input"])] == continuation["input"]
    assert all(body["store"] is False and body["stream"] is True for body in (turn_1, continuation, resumed))
    # One session across `exec resume`: the same cache key and session headers throughout.
    session_id = turn_1["prompt_cache_key"]
    assert {body["prompt_cache_key"] for body in (continuation, resumed)} == {session_id}
    for name in ("session-id", "thread-id", "x-client-request-id"):
        assert {record.headers[name] for record in records} == {session_id}
    metadata = [json.loads(record.headers["x-codex-turn-metadata"]) for record in records]
    assert [m["history_initialization"] for m in metadata] == ["new", "new", "cold_resume"]
    assert metadata[0]["turn_id"] == metadata[1]["turn_id"] != metadata[2]["turn_id"]


def test_codex_still_sends_what_the_recorded_sample_shows(codex_requests: dict[str, Any]) -> None:
    """tests/samples/codex-session.json is what the Responses parser is built against: when a
    Codex upgrade changes what it sends, re-record it (python -m tests.clients.record_codex_session)."""
    recorded = json.loads(RECORDED.read_text())
    live = [shape(body, record.headers) for body, record in zip(codex_requests["bodies"], codex_requests["records"])]
    expected = [shape(recorded[turn]["body"], recorded[turn]["headers"])
                for turn in ("turn_1", "tool_continuation", "resumed_turn")]
    assert live == expected


def test_both_runs_land_in_one_stored_conversation_with_the_long_output_shortened(codex_requests: dict[str, Any]) -> None:
    """`exec` and `exec resume` are one conversation, named by Codex's session id; every item is
    stored once; the long command output went upstream shortened, and is stored whole."""
    stored = codex_requests["stored"]["data"]
    resumed = codex_requests["bodies"][-1]
    kinds = [item.get("type") for item in stored]
    assert kinds == [item.get("type") for item in resumed["input"]] + ["message"]
    assert len(codex_requests["trajectory"]["data"]) == len(stored)  # nothing stored twice, nothing failed
    [output] = [item for item in stored if item.get("type") == "function_call_output"]
    [sent] = [item for item in resumed["input"] if item.get("type") == "function_call_output"]
    assert len(output["output"]) > 8_000 and output["output"].endswith("4000\n")
    assert len(sent["output"]) < 3_000 and "read_tool_output" in sent["output"]
    assert "read_tool_output" in [tool.get("name") for tool in resumed["tools"]]


def test_codexs_tools_are_in_its_record_once_and_its_instructions_in_its_transcript(codex_requests: dict[str, Any]) -> None:
    """The record holds the whole request: Codex's tool definitions (as it sent them: the proxy's
    own tool is not one of them), kept once and named by every turn that sent them; its
    instructions are developer messages of `input`, stored with the transcript."""
    trajectory, bodies = codex_requests["trajectory"], codex_requests["bodies"]
    parts = {p["hash"]: p for p in trajectory["request_parts"]}
    for record, body in zip(trajectory["turns"], bodies, strict=True):
        assert "instructions" not in body and record["system_hash"] is None
        assert parts[record["tools_hash"]]["value"] == [t for t in body["tools"] if t.get("name") not in ("read_tool_output", "search_history")]
    assert [(p["kind"], p["turns"]) for p in trajectory["request_parts"]] == [("tools", [1, 2, 3])]
    developer = [m for m in codex_requests["stored"]["data"] if m.get("role") == "developer"]
    assert developer and developer[0]["content"] == bodies[0]["input"][0]["content"]
