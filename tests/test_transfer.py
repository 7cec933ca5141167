"""Moving a conversation between stores with the real `python -m proxy export` / `import`
processes: diskcache to Redis losslessly, refs valid under the new store's own secret, and the
conversation going on there as if it had never moved."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import fields

import httpx
import openai
import pytest

from proxy.identity import tenant_of
from proxy.store import Summary
from proxy.transfer import SUMMARY_FIELDS, SUMMARY_PARTS
from tests.conftest import ALICE, BOB, openai_client
from tests.fakes.fake_upstream import Reply, default_responder
from tests.fakes.responders import SUMMARIZER_MARK
from tests.support.harness import ROOT, write_config

REF = re.compile(r"out_\d+_[0-9a-f]{24}")
BIG = "".join(f"tests/test_io.py::case_{i:04d} PASSED\n" for i in range(600))  # ~22k characters
TOOLS = [{"type": "function", "function": {"name": "sh", "parameters": {"type": "object", "properties": {}}}}]
# The same settings on both sides: a quota (first-forwarded marks), summarized tool outputs (rewrites).
PROFILE = {"quota": {"max_llm_calls": 50}, "truncation": {"tools": {"sh": "summarize"}},
           "compaction": {"strategy": "turns", "every_n_user_messages": 100, "background": False}}


def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "proxy", *args], cwd=ROOT, capture_output=True, timeout=60)


class Responder:
    """The model: summaries for the summarizer; for the agent, the replies queued in `agent` first,
    one read_tool_output call when `reads_wanted`, else the fake's default."""

    def __init__(self) -> None:
        self.reads_wanted = 0
        self.agent: list[Reply] = []

    def __call__(self, body: dict) -> Reply:
        system = body["messages"][0]["content"]
        if SUMMARIZER_MARK in system:
            return Reply.text("SUMMARY: the agent is fixing tests/test_io.py.")
        if "condense" in system:
            return Reply.text("SUMMARY of the log: 600 cases passed.")
        if self.agent:
            return self.agent.pop(0)
        last = body["messages"][-1]
        if last["role"] == "tool" and last["content"].startswith("[out_"):
            return Reply.text("read it")  # the proxy answered our read: now the model answers
        ref = REF.search(json.dumps(body["messages"]))
        if self.reads_wanted and ref:
            self.reads_wanted -= 1
            return Reply.tool_calls([("read_tool_output", json.dumps({"ref": ref.group(0), "offset": 0, "length": 100}))])
        return default_responder(body)


def admin(http: httpx.Client, path: str) -> dict:
    response = http.get(f"/v1/conversations/moved{path}", params={"limit": 1000})
    assert response.status_code == 200, response.text
    return response.json()


def without_refs(document: dict) -> dict:
    return {**document, "data": [{k: v for k, v in m.items() if k != "ref"} for m in document["data"]]}


def test_export_then_import_into_redis_is_lossless_and_the_conversation_goes_on(make_proxy, upstream, redis, tmp_path):
    upstream.responder = model = Responder()
    disk = make_proxy(data_dir=tmp_path / "disk", **PROFILE)
    client = openai_client(disk, headers={"X-Conversation-ID": "moved"})
    messages = [{"role": "system", "content": "You fix tests."}]

    def say(*new: dict, **headers: str) -> None:
        messages.extend(new)
        reply = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS, extra_headers=headers)
        messages.append(reply.choices[0].message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}))

    say({"role": "user", "content": "task: fix the flaky test in tests/test_io.py"})
    say({"role": "user", "content": "look at it first"})
    model.agent.append(Reply.tool_calls([("sh", "{}")]))
    say({"role": "user", "content": "run the tests"})
    model.reads_wanted = 1
    say({"role": "tool", "tool_call_id": messages[-1]["tool_calls"][0]["id"], "content": BIG})  # a rewrite, a read
    say({"role": "user", "content": "now fix it"}, **{"X-Compaction": "force"})  # a summary, a boundary
    messages[-2:] = [{"role": "user", "content": "no: explain it"}]  # an edit: superseded messages
    say()
    model.agent.append(Reply.error(500, {"error": {"message": "down", "type": "server_error", "code": None}}))
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="gpt-4o-mini", messages=[*messages, {"role": "user", "content": "x"}], tools=TOOLS)
    with httpx.Client(base_url=disk.url, auth=disk.admin_auth) as http:
        before = {part: admin(http, part) for part in ("", "/messages", "/trajectory", "/turns")}
    statuses = {m["status"] for m in before["/trajectory"]["data"]}
    assert {"live", "compacted", "superseded", "failed", "internal"} <= statuses
    assert before[""]["boundary"] > 0 and before[""]["llm_calls"] > 0
    disk.stop()

    disk_config = write_config(tmp_path / "disk.yaml", storage={"path": str(tmp_path / "disk")})
    redis_config = write_config(tmp_path / "redis.yaml", storage={"backend": "redis", "redis_url": redis.url})
    exported = cli("export", "--config", str(disk_config), "moved")
    assert exported.returncode == 0, exported.stderr.decode()
    (tmp_path / "moved.json").write_bytes(exported.stdout)
    assert json.loads(exported.stdout)["tenant"] == tenant_of(ALICE)

    imported = cli("import", "--config", str(redis_config), str(tmp_path / "moved.json"))
    assert imported.returncode == 0, imported.stderr.decode()
    assert f"imported conversation 'moved' of tenant {tenant_of(ALICE)[:12]}" in imported.stderr.decode()
    again = cli("import", "--config", str(redis_config), str(tmp_path / "moved.json"))
    assert again.returncode == 1 and "already in this store: pass --replace" in again.stderr.decode()
    assert cli("import", "--config", str(redis_config), "--replace", str(tmp_path / "moved.json")).returncode == 0
    back = cli("export", "--config", str(redis_config), "moved")
    assert back.returncode == 0 and back.stdout == exported.stdout  # byte for byte: nothing lost or changed

    shared = make_proxy(storage={"backend": "redis", "redis_url": redis.url}, **PROFILE)
    with httpx.Client(base_url=shared.url, auth=shared.admin_auth) as http:
        after = {part: admin(http, part) for part in ("", "/messages", "/trajectory", "/turns")}
        assert {**after, "/trajectory": without_refs(after["/trajectory"])} == {**before, "/trajectory": without_refs(before["/trajectory"])}
        # Refs are derived under each store's own secret: the new store's resolve, the old ones do not.
        old_ref = next(m["ref"] for m in before["/trajectory"]["data"] if m["role"] == "tool" and m["status"] == "live")
        new_ref = next(m["ref"] for m in after["/trajectory"]["data"] if m["role"] == "tool" and m["status"] == "live")
        assert new_ref != old_ref
        assert http.get(f"/v1/conversations/moved/tool_outputs/{new_ref}").json()["content"] == BIG
        assert http.get(f"/v1/conversations/moved/tool_outputs/{old_ref}").status_code == 404

    # The conversation goes on: the resent transcript dedupes, the summary and quota carry over,
    # and the model's read of the imported tool output resolves.
    client = openai_client(shared, headers={"X-Conversation-ID": "moved"})
    model.reads_wanted = 1
    messages.append({"role": "user", "content": "read the log again"})
    response = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
    assert response.headers["X-LLM-Calls-Remaining"] == str(50 - before[""]["llm_calls"] - 2)  # a call and a read
    [*_, asked, answered] = upstream.chat_requests()
    assert "SUMMARY: the agent is fixing tests/test_io.py." in asked["messages"][1]["content"]
    tool = next(m for m in asked["messages"] if m["role"] == "tool")
    assert tool["content"].startswith("SUMMARY of the log") and f'stored as ref "{new_ref}"' in tool["content"]
    assert answered["messages"][-1]["content"] == f"[{new_ref}: characters 0-100 of {len(BIG)}; continue with offset=100]\n{BIG[:100]}"
    with httpx.Client(base_url=shared.url, auth=shared.admin_auth) as http:
        live = admin(http, "/messages")["data"]
    assert live[:-2] == before["/messages"]["data"]
    assert [(m["role"], m["content"]) for m in live[-2:]] == [("user", "read the log again"), ("assistant", "read it")]


def test_a_responses_chain_goes_on_after_the_move_by_its_previous_response_id(make_proxy, upstream, redis, tmp_path):
    disk = make_proxy(data_dir=tmp_path / "disk")
    client = openai_client(disk)
    developer = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You help."}]}
    first = client.responses.create(model="gpt-4o-mini", input=[developer, {"role": "user", "content": "first"}], store=False)
    second = client.responses.create(model="gpt-4o-mini", input="second", previous_response_id=first.id, store=False)
    with httpx.Client(base_url=disk.url, auth=disk.admin_auth) as http:
        [conversation] = http.get("/v1/conversations").json()["data"]  # its id derived from the run
    disk.stop()
    disk_config = write_config(tmp_path / "disk.yaml", storage={"path": str(tmp_path / "disk")})
    redis_config = write_config(tmp_path / "redis.yaml", storage={"backend": "redis", "redis_url": redis.url})
    exported = cli("export", "--config", str(disk_config), conversation["id"])
    assert exported.returncode == 0, exported.stderr.decode()
    assert set(json.loads(exported.stdout)["responses"]) == {first.id, second.id}
    (tmp_path / "chain.json").write_bytes(exported.stdout)
    assert cli("import", "--config", str(redis_config), str(tmp_path / "chain.json")).returncode == 0

    shared = make_proxy(storage={"backend": "redis", "redis_url": redis.url})
    third = openai_client(shared).responses.create(model="gpt-4o-mini", input="third", previous_response_id=second.id, store=False)
    assert third.output_text == "reply to: third"
    sent = upstream.responses_requests()[-1]["input"]
    assert [i.get("role") for i in sent] == ["developer", "user", "assistant", "user", "assistant", "user"]


def test_export_names_the_tenant_when_an_id_is_ambiguous_and_says_what_went_wrong(make_proxy, upstream, tmp_path):
    proxy = make_proxy(data_dir=tmp_path / "disk")
    for key in (ALICE, BOB):
        openai_client(proxy, key, headers={"X-Conversation-ID": "shared-id"}).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    proxy.stop()
    config = str(write_config(tmp_path / "disk.yaml", storage={"path": str(tmp_path / "disk")}))
    (tmp_path / "bad.json").write_text(json.dumps(
        {"object": "context-proxy.conversation", "version": 1, "tenant": "t", "id": "x", "messages": "not a list"}
    ))
    (tmp_path / "other.json").write_text('{"object": "list"}')
    ambiguous, named, missing, bad, other = cli_at_once(
        ["export", "--config", config, "shared-id"],
        ["export", "--config", config, "--tenant", tenant_of(BOB)[:12], "shared-id"],
        ["export", "--config", config, "nobody"],
        ["import", "--config", config, str(tmp_path / "bad.json")],
        ["import", "--config", config, str(tmp_path / "other.json")],
    )
    assert ambiguous.returncode == 1 and ambiguous.stdout == b""
    assert "several tenants have conversation 'shared-id'" in ambiguous.stderr.decode() and "--tenant" in ambiguous.stderr.decode()
    assert named.returncode == 0 and json.loads(named.stdout)["tenant"] == tenant_of(BOB)
    assert missing.returncode == 1 and "no conversation 'nobody' in this store" in missing.stderr.decode()
    assert bad.returncode == 1 and "not a valid export: expected a JSON array" in bad.stderr.decode()
    assert other.returncode == 1 and "not a conversation export" in other.stderr.decode()


def cli_at_once(*commands: list[str]) -> list[subprocess.CompletedProcess[bytes]]:
    """Independent CLI runs, started together (each is a Python start-up)."""
    procs = [
        subprocess.Popen([sys.executable, "-m", "proxy", *c], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for c in commands
    ]
    out = []
    for command, proc in zip(commands, procs, strict=True):
        stdout, stderr = proc.communicate(timeout=60)
        out.append(subprocess.CompletedProcess(command, proc.returncode, stdout, stderr))
    return out


def test_import_reads_stdin_and_keeps_the_tenant(make_proxy, upstream, tmp_path):
    proxy = make_proxy(data_dir=tmp_path / "one")
    openai_client(proxy, BOB, headers={"X-Conversation-ID": "piped"}).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    proxy.stop()
    source = write_config(tmp_path / "one.yaml", storage={"path": str(tmp_path / "one")})
    target = write_config(tmp_path / "two.yaml", storage={"path": str(tmp_path / "two")})
    exported = cli("export", "--config", str(source), "piped").stdout
    piped = subprocess.run(
        [sys.executable, "-m", "proxy", "import", "--config", str(target), "-"], cwd=ROOT, input=exported,
        capture_output=True, timeout=60,
    )
    assert piped.returncode == 0, piped.stderr.decode()
    moved = make_proxy(data_dir=tmp_path / "two")
    with httpx.Client(base_url=moved.url, auth=moved.admin_auth) as http:
        mine = http.get("/v1/conversations/piped/messages", headers={"Authorization": f"Bearer {BOB}"})
        theirs = http.get("/v1/conversations/piped/messages", headers={"Authorization": f"Bearer {ALICE}"})
    assert [m["content"] for m in mine.json()["data"]] == ["hi", "reply to: hi"]
    assert theirs.status_code == 404  # still Bob's: another key can neither read nor extend it


def test_the_export_format_checks_every_summary_field():
    assert set(SUMMARY_FIELDS) | set(SUMMARY_PARTS) == {f.name for f in fields(Summary)}

