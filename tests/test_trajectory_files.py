"""Trajectory files (`storage.trajectory_dir`): after each turn the file is the API's trajectory,
written atomically and privately, off the turn's path; and the incremental writer agrees with a
whole read of the store through every kind of status change."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import httpx
import openai
import pytest

from proxy.identity import ConversationKey, tenant_of
from proxy.messages import message_hash
from proxy.refs import RefSigner
from proxy.state import ENGINE, TRAJECTORIES
from proxy.store import FAILED, INTERNAL, LIVE, PENDING, SUPERSEDED, Summary, TurnRecord
from proxy.store.disk import DiskStore
from proxy.trajectory import build_trajectory
from proxy.trajectory_files import TrajectoryWriter
from tests.conftest import ALICE, openai_client
from tests.fakes.fake_upstream import Reply, default_responder
from tests.fakes.responders import is_summary_request

BIG = "".join(f"line {i:05d}: test output\n" for i in range(800))  # ~20k characters: truncated upstream
TOOLS = [{"type": "function", "function": {"name": "sh", "parameters": {"type": "object", "properties": {}}}}]


def api_trajectory(http: httpx.Client, cid: str) -> dict:
    response = http.get(f"/v1/conversations/{cid}/trajectory", params={"limit": 1000})
    assert response.status_code == 200, response.text
    return response.json()


def settle(servers, proxy) -> None:
    """Wait for background work: compactions (each marks the file due), then the files."""
    servers.run(proxy.app[ENGINE].idle())
    servers.run(proxy.app[TRAJECTORIES].idle())


def responder(body: dict) -> Reply:
    if is_summary_request(body):
        return Reply.text("SUMMARY: the agent ran the tests.")
    return default_responder(body)


def test_the_file_equals_the_api_trajectory_after_each_turn(make_proxy, upstream, servers, tmp_path):
    upstream.responder = responder
    root = tmp_path / "trajectories"
    proxy = make_proxy(storage={"trajectory_dir": str(root)}, compaction={"strategy": "turns", "every_n_user_messages": 2})
    client = openai_client(proxy, headers={"X-Conversation-ID": "run-1"})
    path = root / tenant_of(ALICE) / "run-1.json"
    messages: list[dict] = [{"role": "system", "content": "You run tests."}]

    def turn(*new: dict, stream: bool = False, expect_error: bool = False) -> None:
        messages.extend(new)
        try:
            if stream:
                chunks = list(client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS, stream=True))
                reply = {"role": "assistant", "content": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)}
            else:
                message = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS).choices[0].message
                reply = message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})
            messages.append(reply)
        except openai.APIStatusError:
            assert expect_error
            del messages[-len(new):]
        settle(servers, proxy)
        with httpx.Client(base_url=proxy.url, auth=proxy.admin_auth) as http:
            assert json.loads(path.read_bytes()) == api_trajectory(http, "run-1")

    turn({"role": "user", "content": "run the test suite"})
    upstream.enqueue(Reply.tool_calls([("sh", "{}")]))
    turn({"role": "user", "content": "and show me the log"})
    call = messages[-1]["tool_calls"][0]["id"]
    turn({"role": "tool", "tool_call_id": call, "content": BIG}, stream=True)  # truncated: a ref; a summary is due
    upstream.enqueue(Reply.error(500, {"error": {"message": "boom", "type": "server_error", "code": None}}))
    turn({"role": "user", "content": "this one fails upstream"}, expect_error=True)
    turn({"role": "user", "content": "what failed?"})
    messages[-2:] = [{"role": "user", "content": "no, what passed?"}]  # an edit: the old branch is superseded
    turn()
    turn({"role": "user", "content": "thanks"})

    document = json.loads(path.read_bytes())
    statuses = {m["status"] for m in document["data"]}
    assert {"live", "compacted", "failed", "superseded"} <= statuses
    assert document["summaries"] and document["turns"][-1]["turn"] == len(document["turns"]) == 7
    assert document["conversation"]["id"] == "run-1"
    tool = next(m for m in document["data"] if m["role"] == "tool")
    assert tool["content"] == BIG and tool["ref"].startswith("out_")


def test_files_and_folders_are_private_and_no_temp_file_is_left(make_proxy, upstream, servers, tmp_path):
    root = tmp_path / "trajectories"
    proxy = make_proxy(storage={"trajectory_dir": str(root)})
    for cid in ("a", "b"):
        openai_client(proxy, headers={"X-Conversation-ID": cid}).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}]
        )
    settle(servers, proxy)
    tenant = root / tenant_of(ALICE)
    assert sorted(p.name for p in tenant.iterdir()) == ["a.json", "b.json"]
    for folder in (root, tenant):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    for file in tenant.iterdir():
        assert stat.S_IMODE(file.stat().st_mode) == 0o600


def test_a_deleted_conversation_loses_its_file(make_proxy, upstream, servers, tmp_path):
    root = tmp_path / "trajectories"
    proxy = make_proxy(storage={"trajectory_dir": str(root)})
    openai_client(proxy, headers={"X-Conversation-ID": "gone"}).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    settle(servers, proxy)
    path = root / tenant_of(ALICE) / "gone.json"
    assert path.is_file()
    with httpx.Client(base_url=proxy.url, auth=proxy.admin_auth) as http:
        assert http.delete("/v1/conversations/gone").status_code == 200
    settle(servers, proxy)
    assert not path.exists()


def test_a_failed_write_is_logged_and_counted_and_never_fails_the_turn(make_proxy, upstream, servers, tmp_path, caplog):
    root = tmp_path / "trajectories"
    root.mkdir()
    blocked = root / tenant_of(ALICE)
    blocked.write_text("a file where the tenant's folder should be")  # (a root like that stops start-up)
    proxy = make_proxy(storage={"trajectory_dir": str(root)})
    client = openai_client(proxy, headers={"X-Conversation-ID": "blocked"})
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "reply to: hi"
    settle(servers, proxy)
    assert proxy.app[TRAJECTORIES].failures == 1
    assert any(r.getMessage() == "trajectory file not written" for r in caplog.records)
    with httpx.Client(base_url=proxy.url, auth=proxy.admin_auth) as http:
        metrics = http.get("/metrics").text
    assert "context_proxy_trajectory_write_failures_total 1.0" in metrics

    blocked.unlink()  # fixed: the next turn writes the whole file
    transcript = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "reply to: hi"}, {"role": "user", "content": "again"}]
    client.chat.completions.create(model="m", messages=transcript)
    settle(servers, proxy)
    with httpx.Client(base_url=proxy.url, auth=proxy.admin_auth) as http:
        assert json.loads((root / tenant_of(ALICE) / "blocked.json").read_bytes()) == api_trajectory(http, "blocked")


# -- the incremental writer against a whole read, straight on a store -------------------------------

KEY = ConversationKey("t" * 24, "steps")


def user(text: str) -> dict:
    return {"role": "user", "content": text}


async def append(store: DiskStore, messages: list[dict], status: str) -> list[int]:
    return await store.append(KEY, messages, [message_hash(m) for m in messages], status)


@pytest.mark.parametrize("cache_bytes", [1 << 30, 0], ids=["cached", "no-cache"])
async def test_the_incremental_file_matches_a_whole_read_through_every_status_change(tmp_path: Path, cache_bytes: int):
    store = DiskStore(tmp_path / "store")
    refs = RefSigner(await store.secret())
    writer = TrajectoryWriter(tmp_path / "files", store, refs, cache_bytes=cache_bytes)
    path = writer.path(KEY)

    async def check() -> None:
        await writer.after_turn(KEY)
        await writer.idle()
        conversation = await store.get(KEY)
        assert conversation is not None
        whole = await build_trajectory(store, refs, conversation)
        assert path.read_bytes() == whole.to_bytes()

    await append(store, [{"role": "system", "content": "s"}, user("the task")], LIVE)
    await check()
    for n in range(6):  # turns: pending, then live with a reply (a tool output among them)
        [seq] = await append(store, [user(f"q{n}") if n != 3 else {"role": "tool", "tool_call_id": "c", "content": "out"}], PENDING)
        await check()
        reply = {"role": "assistant", "content": f"a{n}"}
        await store.finish_turn(KEY, {seq: LIVE}, [(reply, message_hash(reply))], LIVE, TurnRecord(tokens_sent=n))
        await check()
    await append(store, [{"role": "assistant", "content": None, "tool_calls": []}], INTERNAL)
    [failed] = await append(store, [user("refused")], PENDING)
    await store.finish_turn(KEY, {failed: FAILED}, [], FAILED, TurnRecord(status="failed"))
    await check()
    await store.add_summary(KEY, Summary("first", 1, 6, "turns", "m", 3, 1))  # compacted marks; the task pinned
    await check()
    await store.set_statuses(KEY, {9: SUPERSEDED, 10: SUPERSEDED, 11: SUPERSEDED})  # a deep edit
    await append(store, [user("the new branch")], LIVE)
    await check()
    await store.add_summary(KEY, Summary("second", 1, 12, "turns", "m", 3, 1))
    await store.add_summary(KEY, Summary("stale", 1, 8, "turns", "m", 3, 1))
    await check()
    await store.delete(KEY)
    await check_deleted(writer, path)
    await append(store, [user("made again")], LIVE)  # same key, a new conversation: rebuilt, not mixed
    await check()
    await writer.close()
    await store.close()


async def check_deleted(writer: TrajectoryWriter, path: Path) -> None:
    await writer.deleted(KEY)
    await writer.idle()
    assert not path.exists()
