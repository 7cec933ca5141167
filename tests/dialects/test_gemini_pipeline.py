"""The pipeline in Gemini's terms, over raw HTTP against the strict fake Gemini upstream: the
summary in `systemInstruction` after the client's own parts, asked of the conversation's own
model at the Gemini API; the window dropping a call with its responses; the quota's figures in
function responses; the inbox in the newest function response or as a user content."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ALICE, MakeProxy, live_messages, trajectory
from tests.fakes.fake_upstream import FakeUpstream, Reply
from tests.fakes.responders import SUMMARIZER_MARK, TOOL_SUMMARY_MARK
from tests.support.harness import ROOT, ProxyServer, write_config

MODEL = "gemini-2.5-pro"
SYSTEM = {"role": "user", "parts": [{"text": "You are a build agent."}]}
TOOLS = [{"functionDeclarations": [{"name": "run_build", "description": "Run the build", "parametersJsonSchema": {"type": "object"}}]}]
BUILD_LOG = "".join(f"step {i:05d}: compiled module_{i % 97}.c ok\n" for i in range(900)) + "FAILED at step 00900: linker error\n"


def gemini_proxy(
    make_proxy: MakeProxy, fake: FakeUpstream, upstream_url: str | None = None, data_dir: Path | None = None, **sections: Any
) -> ProxyServer:
    merged: dict[str, Any] = {"upstream": {"gemini_base_url": fake.gemini.base_url}}
    for name, values in sections.items():
        merged.setdefault(name, {}).update(values)
    return make_proxy(data_dir=data_dir, upstream_url=upstream_url, **merged)


@pytest.fixture
def proxy(make_proxy: MakeProxy, upstream: FakeUpstream) -> ProxyServer:  # the `http` fixture's proxy too
    return gemini_proxy(make_proxy, upstream)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"text": text}]}


def responses(model_content: dict[str, Any], output: str) -> dict[str, Any]:
    calls = [p["functionCall"] for p in model_content["parts"] if "functionCall" in p]
    return {"role": "user", "parts": [{"functionResponse": {"name": c["name"], "response": {"output": output}}} for c in calls]}


def turn(proxy: ProxyServer, contents: list[dict[str, Any]], cid: str, thoughts: bool = False, **headers: str) -> dict[str, Any]:
    """One generateContent turn (asking for the model's thoughts, or not); the model content it answered with."""
    body: dict[str, Any] = {"contents": contents, "systemInstruction": SYSTEM, "tools": TOOLS}
    if thoughts:
        body["generationConfig"] = {"thinkingConfig": {"includeThoughts": True}}
    response = httpx.post(
        proxy.url + f"/v1beta/models/{MODEL}:generateContent", json=body,
        headers={"x-goog-api-key": ALICE, "X-Conversation-ID": cid, **headers}, timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.json()["candidates"][0]["content"]


def reply_text(sse: str) -> str:
    """The text a reply's chunks (`data:` lines) say, joined."""
    chunks = [json.loads(line[6:]) for line in sse.splitlines() if line.startswith("data: ")]
    return "".join(p.get("text", "") for c in chunks for p in c["candidates"][0]["content"]["parts"])


def system_text(body: dict[str, Any]) -> str:
    return "".join(p.get("text", "") for p in (body.get("systemInstruction") or {}).get("parts", []))


def is_summary(body: dict[str, Any]) -> bool:
    return SUMMARIZER_MARK in system_text(body) or TOOL_SUMMARY_MARK in system_text(body)


def agent_calls(upstream: FakeUpstream) -> list[dict[str, Any]]:
    return [b for b in upstream.gemini.requests() if not is_summary(b)]


def test_summaries_are_asked_of_its_own_model_at_the_gemini_api_and_go_after_the_clients_system(
    make_proxy: MakeProxy, upstream: FakeUpstream
) -> None:
    proxy = gemini_proxy(
        make_proxy, upstream,
        upstream_url="http://127.0.0.1:9/v1",  # the OpenAI API is unreachable here
        truncation={"tools": {"run_build": "summarize"}},
        compaction={"strategy": "budget", "background": False, "max_history_summary_length": 1000},
    )
    upstream.responder = lambda body: (
        Reply.text("The build fails at step 900.") if is_summary(body) else Reply.tool_calls([("run_build", "{}")])
    )
    contents = [user("Why does the build fail?")]
    for _ in range(3):
        reply = turn(proxy, contents, "own-summary")
        contents += [reply, responses(reply, BUILD_LOG)]
    turn(proxy, contents, "own-summary")

    summaries = [c for c in upstream.gemini.calls() if is_summary(c.body)]
    assert {SUMMARIZER_MARK in system_text(c.body) for c in summaries} == {True, False}  # history and tool output
    assert all(c.model == MODEL and not c.stream and c.body["generationConfig"]["maxOutputTokens"] > 0 for c in summaries)
    assert all(c.headers["x-goog-api-key"] == ALICE for c in summaries)  # the client's own key
    sent = agent_calls(upstream)[-1]
    parts = sent["systemInstruction"]["parts"]
    assert parts[0] == SYSTEM["parts"][0] and "Summary of the earlier part" in parts[-1]["text"]
    assert sent["contents"][0] == contents[0]  # the task, pinned
    assert "The build fails at step 900." in json.dumps(sent["contents"][-1])  # the output's summary
    assert len(sent["contents"]) < len(contents)


def test_the_window_drops_a_call_with_its_responses(make_proxy: MakeProxy, upstream: FakeUpstream) -> None:
    proxy = gemini_proxy(make_proxy, upstream, context={"history_token_limit": 600})
    contents = [user("Build five times.")]
    for n in range(5):
        upstream.enqueue(Reply.tool_calls([("run_build", json.dumps({"n": n})), ("run_build", json.dumps({"n": -n}))]))
        reply = turn(proxy, contents, "window-1")
        contents += [reply, responses(reply, f"build {n}: " + "ok " * 60)]
    upstream.enqueue(Reply.text("Done."))
    turn(proxy, contents, "window-1")
    sent = upstream.gemini.requests()[-1]["contents"]  # the fake checked calls and responses pair up
    assert sent[0] == contents[0] and len(sent) < len(contents)
    assert sent[-2:] == contents[-2:]
    for i, content in enumerate(sent):
        if any("functionResponse" in p for p in content["parts"]):
            assert len(content["parts"]) == 2 and sent[i - 1]["role"] == "model"


def test_function_responses_carry_the_quota_when_first_forwarded(make_proxy: MakeProxy, upstream: FakeUpstream) -> None:
    proxy = gemini_proxy(make_proxy, upstream, quota={"max_llm_calls": 10})
    upstream.enqueue(Reply.tool_calls([("run_build", "{}"), ("run_build", '{"docs": true}')]))
    contents = [user("Build it all.")]
    reply = turn(proxy, contents, "quota-1")
    contents += [reply, {"role": "user", "parts": [
        {"functionResponse": {"name": "run_build", "response": {"output": json.dumps({"status": "ok"})}}},
        {"functionResponse": {"name": "run_build", "response": {"output": "docs built"}}},
    ]}]
    turn(proxy, contents, "quota-1")
    sent = upstream.gemini.requests()[-1]["contents"][-1]["parts"]
    first, second = (p["functionResponse"]["response"]["output"] for p in sent)
    assert json.loads(first) == {"status": "ok", "_quota_info": {"used": 2, "remaining": 8, "limit": 10}}
    assert second == "docs built\n\n[You have 8 LLM calls remaining (used 2 of 10).]"


def test_an_inbox_message_goes_into_the_newest_function_response_once(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client
) -> None:
    upstream.enqueue(Reply.tool_calls([("run_build", "{}")]), Reply.text("The linker fails."), Reply.text("Welcome."))
    contents = [user("Why does the build fail?")]
    reply = turn(proxy, contents, "steer-1")
    posted = http.post("/v1/conversations/steer-1/inbox", json={"content": "It is the linker."}, headers={"Authorization": f"Bearer {ALICE}"})
    assert posted.status_code == 200, posted.text
    contents += [reply, responses(reply, "compile ok; link failed")]
    contents += [turn(proxy, contents, "steer-1"), user("Thanks.")]
    turn(proxy, contents, "steer-1")
    _, delivered, later = upstream.gemini.requests()
    output = delivered["contents"][-1]["parts"][0]["functionResponse"]["response"]["output"]
    assert output.startswith("compile ok; link failed\n\n[context-proxy: a message from the user") and output.endswith("It is the linker.")
    assert later["contents"][: len(delivered["contents"])] == delivered["contents"]  # the same bytes, in place
    stored = live_messages(http, "steer-1")
    assert stored[2]["parts"][0]["functionResponse"]["response"] == {"output": "compile ok; link failed"}
    assert {m["status"] for m in trajectory(http, "steer-1")} == {"live"}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_knowledge_goes_after_the_clients_system_and_its_tools_are_answered_out_of_sight(
    make_proxy: MakeProxy, upstream: FakeUpstream, stream: bool
) -> None:
    proxy = gemini_proxy(make_proxy, upstream, knowledge={"enabled": True, "editable": True})
    pitfall = "Run `make deps` before the first build."
    append = ("knowledge_append_section", json.dumps({"heading": "Setup pitfalls", "content": pitfall}))
    upstream.enqueue(Reply.tool_calls([append]), Reply.text("Noted."))
    body = {"contents": [user("Set up the project.")], "systemInstruction": SYSTEM, "tools": TOOLS}
    method = "streamGenerateContent?alt=sse" if stream else "generateContent"
    response = httpx.post(
        proxy.url + f"/v1beta/models/{MODEL}:{method}", json=body,
        headers={"x-goog-api-key": ALICE, "X-Conversation-ID": f"notes-{stream}"}, timeout=60,
    )
    assert response.status_code == 200, response.text
    assert "knowledge_append_section" not in response.text
    assert reply_text(response.text if stream else "data: " + response.text) == "Noted."
    asked, answered = upstream.gemini.requests()  # both valid at the strict fake
    assert asked["systemInstruction"]["parts"][0] == SYSTEM["parts"][0]
    assert "Long-term knowledge" in asked["systemInstruction"]["parts"][1]["text"]
    declared = [d["name"] for t in asked["tools"] for d in t.get("functionDeclarations", [])]
    assert declared[0] == "run_build" and "knowledge_append_section" in declared
    call, answer = answered["contents"][-2:]
    assert call["parts"][0]["functionCall"]["name"] == "knowledge_append_section"
    assert answer["parts"][0]["functionResponse"]["response"]["output"].startswith("Done: section 'Setup pitfalls' added")
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        document = http.get("/v1/knowledge", headers={"Authorization": f"Bearer {ALICE}"}).json()
        assert pitfall in document["text"]
        assert [m["role"] for m in live_messages(http, f"notes-{stream}", ALICE)] == ["user", "model"]


def test_a_side_call_is_a_conversation_of_its_own_not_a_divergence(proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client) -> None:
    """Gemini CLI's router asks with a system instruction of its own (and the web search with the
    main one but another first content): each its own thread, the main run untouched."""
    def post(body: dict[str, Any]) -> None:
        response = httpx.post(proxy.url + f"/v1beta/models/{MODEL}:generateContent", json=body, headers={"x-goog-api-key": ALICE}, timeout=30)
        assert response.status_code == 200, response.text

    contents = [user("<session_context>linux</session_context>"), user("Why does the build fail?")]
    upstream.enqueue(Reply.tool_calls([("run_build", "{}")]))
    post({"contents": contents, "systemInstruction": SYSTEM, "tools": TOOLS})
    router = {"systemInstruction": {"parts": [{"text": "You are a Task Routing AI."}]}, "contents": [user("Why does the build fail?")],
              "generationConfig": {"responseMimeType": "application/json"}}
    post(router)
    post({"contents": [user("build failure linker")], "systemInstruction": SYSTEM, "tools": [{"googleSearch": {}}]})
    listed = http.get("/v1/conversations", headers={"Authorization": f"Bearer {ALICE}"}).json()["data"]
    assert len(listed) == 3
    for conversation in listed:
        assert {m["status"] for m in trajectory(http, conversation["id"], ALICE)} == {"live"}


def test_export_and_import_move_a_gemini_conversation_that_goes_on(
    make_proxy: MakeProxy, upstream: FakeUpstream, tmp_path: Path
) -> None:
    old = gemini_proxy(make_proxy, upstream, data_dir=tmp_path / "old")
    upstream.enqueue(Reply.tool_calls([("run_build", "{}")]), Reply.text("It fails at the linker."))
    contents = [user("Why does the build fail?")]
    first = turn(old, contents, "moved")
    contents += [first, responses(first, BUILD_LOG)]
    contents += [turn(old, contents, "moved"), user("And now?")]
    with httpx.Client(base_url=old.url, timeout=30) as http:
        before = live_messages(http, "moved", ALICE)
    old.stop()

    def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([sys.executable, "-m", "proxy", *args], cwd=ROOT, capture_output=True, timeout=60)

    exported = cli("export", "--config", str(write_config(tmp_path / "old.yaml", storage={"path": str(tmp_path / "old")})), "moved")
    assert exported.returncode == 0, exported.stderr.decode()
    (tmp_path / "moved.json").write_bytes(exported.stdout)
    imported = cli("import", "--config", str(write_config(tmp_path / "new.yaml", storage={"path": str(tmp_path / "new")})),
                   str(tmp_path / "moved.json"))
    assert imported.returncode == 0, imported.stderr.decode()

    new = gemini_proxy(make_proxy, upstream, data_dir=tmp_path / "new")
    upstream.enqueue(Reply.text("Still the linker."))
    turn(new, contents, "moved")
    with httpx.Client(base_url=new.url, timeout=30) as http:
        after = live_messages(http, "moved", ALICE)
        assert after[: len(before)] == before and len(after) == len(before) + 2
        assert {m["status"] for m in trajectory(http, "moved", ALICE)} <= {"live", "internal"}  # the move is no divergence
