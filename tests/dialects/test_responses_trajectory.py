"""A Responses conversation in the admin API and the trajectory file, like a chat one: its
function_call_outputs carry their ref and are served whole by tool_outputs/{ref}, items behind
the compaction boundary show as compacted (but not its developer prompt or its task), and the
file kept in storage.trajectory_dir says the same."""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx

from proxy.identity import tenant_of
from proxy.state import ENGINE, TRAJECTORIES
from tests.conftest import ALICE, openai_client
from tests.dialects.test_responses import TOOLS, user
from tests.fakes.fake_upstream import Reply, default_responder
from tests.fakes.responders import SUMMARIZER_MARK

BUILD_LOG = (
    "".join(f"line {i:05d}: compiling module_{i % 97}.c ... ok\n" for i in range(600)) + "END OF BUILD LOG: 3 warnings"
)
DEVELOPER = {
    "type": "message",
    "role": "developer",
    "content": [{"type": "input_text", "text": "You are Codex, a coding agent."}],
}
TASK = "task: fix the failing build in src/app.c"
SUMMARY = "SUMMARY: the build of src/app.c passes with 3 warnings; the agent is fixing them."


def responder(body: dict) -> Reply:
    """The summarizer's chat requests get a summary; everything else the fake's default."""
    messages = body.get("messages") or [{}]
    if messages[0].get("role") == "system" and SUMMARIZER_MARK in str(messages[0].get("content")):
        return Reply.text(SUMMARY)
    return default_responder(body)


@dataclass
class CodexRun:
    conversation_id: str
    call_id: str
    history: list[dict]


def codex_run(proxy, upstream, conversation_id: str = "codex-run") -> CodexRun:
    """What Codex does, through the proxy to the strict Responses fake: full history with its
    reasoning (store: false, encrypted content), a build command whose long log goes back as a
    function_call_output (truncated upstream), and a few more user turns (enough to compact
    with `turns` every 2 user messages)."""
    client = openai_client(proxy, headers={"session-id": conversation_id})
    kwargs = dict(model="gpt-4o-mini", tools=TOOLS, store=False, include=["reasoning.encrypted_content"])
    history = [DEVELOPER, user(TASK)]
    upstream.enqueue(
        Reply.tool_calls([("exec_command", json.dumps({"cmd": "make -j4"}))], reasoning="Run the build first.")
    )
    first = client.responses.create(input=history, stream=True, **kwargs)
    final = [e for e in first if e.type == "response.completed"][0].response
    history += [item.model_dump(exclude_none=True) for item in final.output]
    call_id = history[-1]["call_id"]
    history.append({"type": "function_call_output", "call_id": call_id, "output": BUILD_LOG})
    upstream.enqueue(Reply.text("The build passes, with 3 warnings.", reasoning="The log ends in 3 warnings."))
    for text in (None, "now fix the warnings", "and commit it"):
        if text is not None:
            history.append(user(text))
        reply = client.responses.create(input=history, **kwargs)
        history += [item.model_dump(exclude_none=True) for item in reply.output]
    return CodexRun(conversation_id, call_id, history)


def test_a_responses_trajectory_marks_outputs_and_compaction_like_chat(make_proxy, upstream, servers, tmp_path):
    upstream.responder = responder
    root = tmp_path / "trajectories"
    proxy = make_proxy(
        storage={"trajectory_dir": str(root)},
        compaction={"strategy": "turns", "every_n_user_messages": 2, "background": False},
    )
    run = codex_run(proxy, upstream)
    with httpx.Client(base_url=proxy.url, auth=proxy.admin_auth) as http:
        document = http.get(f"/v1/conversations/{run.conversation_id}/trajectory", params={"limit": 1000}).json()
        items = document["data"]
        assert [i["type"] for i in items] == [
            "message",
            "message",
            "reasoning",
            "function_call",
            "function_call_output",
            "reasoning",
            "message",
            "message",
            "message",
            "message",
            "message",
        ]
        [output] = [i for i in items if i["type"] == "function_call_output"]
        assert output["ref"] and all("ref" not in i for i in items if i is not output)
        # The tool output is served whole by its ref, named by the call it answers.
        served = http.get(f"/v1/conversations/{run.conversation_id}/tool_outputs/{output['ref']}").json()
        assert served == {
            "object": "tool_output",
            "ref": output["ref"],
            "seq": output["seq"],
            "tool_call_id": run.call_id,
            "length": len(BUILD_LOG),
            "content": BUILD_LOG,
        }
        # What went upstream was shortened: it names the same ref.
        sent = [i for i in upstream.responses_requests()[1]["input"] if i["type"] == "function_call_output"]
        assert output["ref"] in sent[0]["output"] and len(sent[0]["output"]) < len(BUILD_LOG)
        # Compaction: behind the boundary everything is compacted but the developer prompt and the task.
        conversation = http.get(f"/v1/conversations/{run.conversation_id}").json()
        assert conversation["boundary"] > 0 and document["summaries"][-1]["text"] == SUMMARY
        behind = [i for i in items if i["seq"] <= conversation["boundary"]]
        shown = {(i["type"], i.get("role"), i["status"]) for i in behind}
        assert ("message", "developer", "live") in shown and ("message", "user", "live") in shown
        assert {i["status"] for i in behind if i["type"] != "message"} == {"compacted"}
        assert items[1]["content"][0]["text"] == TASK and items[1]["status"] == "live"  # the pinned task
        # A ref of a message that is no tool output is no tool output.
        assert http.get(f"/v1/conversations/{run.conversation_id}/tool_outputs/out_1_{'0' * 24}").status_code == 404
    servers.run(proxy.app[ENGINE].idle())
    servers.run(proxy.app[TRAJECTORIES].idle())
    on_file = json.loads((root / tenant_of(ALICE) / f"{run.conversation_id}.json").read_text())
    assert on_file["data"] == items  # the incremental file reads the items with the same codec
