"""The inbox: a message left for a running agent reaches the upstream at the conversation's next
turn, once, and on every later turn in the same bytes at the same place; only the admin and the
conversation's own key can post or read it; a turn that fails hands it to the next one."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from proxy.identity import tenant_of
from proxy.state import ENGINE, TRAJECTORIES
from tests.conftest import ALICE, BOB, openai_client, trajectory
from tests.fakes.fake_upstream import Reply
from tests.support.harness import chat

AUTH = {"Authorization": f"Bearer {ALICE}"}
SYSTEM = {"role": "system", "content": "You are a coding agent."}
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {}}}}]
RESPONSES_TOOLS = [{"type": "function", "name": "read_file", "strict": False,
                    "parameters": {"type": "object", "properties": {}}}]
STEER = "Stop: the bug is in b.py, not a.py."


def post(http: httpx.Client, cid: str, content: str, key: str | None = ALICE, **kwargs: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return http.post(f"/v1/conversations/{cid}/inbox", json={"content": content}, headers=headers, **kwargs)


def inbox(http: httpx.Client, cid: str, key: str | None = ALICE) -> list[dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = http.get(f"/v1/conversations/{cid}/inbox", headers=headers)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def occurrences(body: dict, text: str) -> int:
    return json.dumps(body, ensure_ascii=False).count(json.dumps(text, ensure_ascii=False)[1:-1])


def assert_extends(requests: list[dict], key: str) -> None:
    """Each prompt extends the one before byte for byte (what provider prompt caches need)."""
    for earlier, later in zip(requests, requests[1:], strict=False):
        assert later[key][: len(earlier[key])] == earlier[key]


# -- chat completions ------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_message_posted_during_a_tool_loop_reaches_the_next_request_and_stays_put(proxy, upstream, http, stream):
    cid = f"loop-{stream}"
    client = openai_client(proxy, headers={"X-Conversation-ID": cid})
    history: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "fix the failing test"}]

    def step(reply: Reply) -> dict[str, Any]:
        upstream.enqueue(reply)
        result = client.chat.completions.create(model="gpt-4o-mini", messages=history, tools=TOOLS, stream=stream)
        if stream:
            chunks = list(result)
            calls: dict[int, dict[str, Any]] = {}
            for chunk in chunks:
                for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                    slot = calls.setdefault(d.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
                    slot["id"] += d.id or ""
                    slot["function"]["name"] += d.function.name or ""
                    slot["function"]["arguments"] += d.function.arguments or ""
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) or None
            message = {"role": "assistant", "content": text}
            if calls:
                message["tool_calls"] = [calls[i] for i in sorted(calls)]
        else:
            raw = result.choices[0].message
            message = {"role": "assistant", "content": raw.content}
            if raw.tool_calls:
                message["tool_calls"] = [c.model_dump(include={"id", "type", "function"}) for c in raw.tool_calls]
        history.append(message)
        return message

    first = step(Reply.tool_calls([("read_file", '{"path": "a.py"}')]))
    # The agent runs its tool; meanwhile the user steers it.
    assert post(http, cid, STEER).json()["status"] == "pending"
    history.append({"role": "tool", "tool_call_id": first["tool_calls"][0]["id"], "content": "def a(): ..."})
    second = step(Reply.tool_calls([("read_file", '{"path": "b.py"}')]))
    history.append({"role": "tool", "tool_call_id": second["tool_calls"][0]["id"], "content": "def b(): ..."})
    step(Reply.text("Fixed b.py."))
    history.append({"role": "user", "content": "thanks"})
    step(Reply.text("You're welcome."))

    requests = upstream.chat_requests()
    assert len(requests) == 4
    assert occurrences(requests[0], STEER) == 0
    delivered = requests[1]["messages"][-1]  # appended to the newest tool result, the client's bytes first
    assert delivered["role"] == "tool" and delivered["content"].startswith("def a(): ...\n\n[context-proxy: a message from the user")
    assert delivered["content"].endswith(STEER)
    for later in requests[1:]:
        assert occurrences(later, STEER) == 1  # once, never a second copy
        assert later["messages"][3] == delivered  # the same bytes in the same place
    assert_extends(requests, "messages")

    [message] = inbox(http, cid)
    assert (message["status"], message["content"], message["placement"], message["turn"]) == ("delivered", STEER, "append", 2)
    stored = trajectory(http, cid)
    assert stored[message["seq"] - 1]["content"] == "def a(): ..."  # the log keeps what the client sent
    turns = http.get(f"/v1/conversations/{cid}/turns", headers=AUTH).json()["data"]
    assert [t["inbox"] for t in turns] == [[], [1], [], []]


def test_without_a_tool_result_it_goes_as_a_user_message_before_the_newest(proxy, upstream, http):
    client = openai_client(proxy, headers={"X-Conversation-ID": "chatty"})
    history = [SYSTEM, {"role": "user", "content": "plan the release"}]
    history.append({"role": "assistant", "content": client.chat.completions.create(model="m", messages=history).choices[0].message.content})
    post(http, "chatty", "Ship on Friday, not Monday.")
    post(http, "chatty", "And tag it v2.")
    for text in ("what next?", "and then?"):
        history.append({"role": "user", "content": text})
        history.append({"role": "assistant", "content": client.chat.completions.create(model="m", messages=history).choices[0].message.content})
    second, third = upstream.chat_requests()[1:]
    note = second["messages"][3]
    assert note["role"] == "user" and second["messages"][4] == {"role": "user", "content": "what next?"}
    assert note["content"].index("Ship on Friday") < note["content"].index("And tag it v2.")  # both, in order, one item
    assert third["messages"][:5] == second["messages"]
    assert [m["status"] for m in inbox(http, "chatty")] == ["delivered", "delivered"]
    # The client resends its own transcript: no divergence, nothing superseded.
    assert {m["status"] for m in trajectory(http, "chatty")} == {"live"}


def test_a_turn_that_fails_hands_the_message_to_the_next_one(proxy, upstream, http):
    client = openai_client(proxy, headers={"X-Conversation-ID": "flaky"})
    history = [SYSTEM, {"role": "user", "content": "go"}]
    history.append({"role": "assistant", "content": client.chat.completions.create(model="m", messages=history).choices[0].message.content})
    post(http, "flaky", STEER)
    history.append({"role": "user", "content": "status?"})
    upstream.enqueue(Reply.error(500, {"error": {"message": "boom", "type": "server_error", "code": None}}))
    with pytest.raises(Exception):
        client.chat.completions.create(model="m", messages=history)
    assert occurrences(upstream.chat_requests()[-1], STEER) == 1
    assert inbox(http, "flaky")[0]["status"] == "pending"  # the turn failed: not delivered after all
    client.chat.completions.create(model="m", messages=history)  # the client retries
    retried = upstream.chat_requests()[-1]
    assert occurrences(retried, STEER) == 1
    [message] = inbox(http, "flaky")
    assert message["status"] == "delivered" and message["turn"] == 3  # turn 2 is the failed attempt


# -- the Responses API -----------------------------------------------------------------------------


def test_responses_a_message_is_appended_to_the_newest_function_output(proxy, upstream, http):
    client = openai_client(proxy, headers={"X-Conversation-ID": "resp-inbox"})
    history: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "You are a coding agent."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix it"}]},
    ]
    upstream.enqueue(Reply.tool_calls([("read_file", "{}")]))
    first = client.responses.create(model="gpt-4o-mini", input=history, tools=RESPONSES_TOOLS)
    history += [item.model_dump(exclude_none=True) for item in first.output]
    post(http, "resp-inbox", STEER)
    history.append({"type": "function_call_output", "call_id": history[-1]["call_id"], "output": "a.py: ok"})
    upstream.enqueue(Reply.tool_calls([("read_file", "{}")]))
    second = client.responses.create(model="gpt-4o-mini", input=history, tools=RESPONSES_TOOLS)
    history += [item.model_dump(exclude_none=True) for item in second.output]
    history.append({"type": "function_call_output", "call_id": history[-1]["call_id"], "output": "b.py: bug"})
    client.responses.create(model="gpt-4o-mini", input=history, tools=RESPONSES_TOOLS)
    requests = upstream.responses_requests()
    delivered = requests[1]["input"][-1]
    assert delivered["type"] == "function_call_output" and delivered["output"].startswith("a.py: ok\n\n")
    assert delivered["output"].endswith(STEER)
    assert requests[2]["input"][: len(requests[1]["input"])] == requests[1]["input"]
    assert [occurrences(r, STEER) for r in requests] == [0, 1, 1]
    assert inbox(http, "resp-inbox")[0]["status"] == "delivered"


# -- who may ---------------------------------------------------------------------------------------


def test_only_the_admin_and_the_conversations_own_key_may_post_or_read(make_proxy, upstream):
    proxy = make_proxy(admin={"token": "inbox-admin-token"})
    openai_client(proxy, headers={"X-Conversation-ID": "private"}).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        assert post(http, "private", "from bob", key=BOB).status_code == 404
        assert http.get("/v1/conversations/private/inbox", headers={"Authorization": f"Bearer {BOB}"}).status_code == 404
        assert post(http, "private", "no key", key=None).status_code == 401
        assert post(http, "private", "from alice").status_code == 200
        assert post(http, "private", "from the admin", key="inbox-admin-token").status_code == 200
        assert [m["content"] for m in inbox(http, "private", key="inbox-admin-token")] == ["from alice", "from the admin"]
        assert post(http, "nobody-has-this", "hello").status_code == 404
    upstream.reset()
    # Bob's own conversation of the same id gets nothing of Alice's.
    openai_client(proxy, api_key=BOB, headers={"X-Conversation-ID": "private"}).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    assert occurrences(upstream.chat_requests()[-1], "from alice") == 0


def test_bad_posts_are_refused_and_store_nothing(make_proxy, upstream):
    proxy = make_proxy(inbox={"max_message_chars": 100, "max_pending": 2})
    openai_client(proxy, headers={"X-Conversation-ID": "strict"}).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    with httpx.Client(base_url=proxy.url, timeout=30, auth=proxy.admin_auth) as http:
        url = "/v1/conversations/strict/inbox"
        form = http.post(url, content="content=hi", headers={**AUTH, "Content-Type": "application/x-www-form-urlencoded"})
        assert form.status_code == 415 and form.json()["error"]["code"] == "unsupported_media_type"
        foreign = http.post(url, json={"content": "hi"}, headers={**AUTH, "Origin": "https://evil.example"})
        assert foreign.status_code == 403
        assert http.post(url, json={"content": ""}, headers=AUTH).status_code == 400
        assert http.post(url, json={"content": "x" * 101}, headers=AUTH).status_code == 400
        assert http.post(url, json={"content": 3}, headers=AUTH).status_code == 400
        assert http.post(url, json={"content": "hi", "role": "system"}, headers=AUTH).status_code == 400
        assert inbox(http, "strict") == []
        assert post(http, "strict", "one").status_code == 200 and post(http, "strict", "two").status_code == 200
        full = post(http, "strict", "three")
        assert full.status_code == 429 and full.json()["error"]["code"] == "inbox_full"
        assert [m["content"] for m in inbox(http, "strict")] == ["one", "two"]


# -- two replicas on one Redis ---------------------------------------------------------------------


def test_two_replicas_deliver_a_message_once(processes, redis, upstream):
    procs = processes(2, storage={"backend": "redis", "redis_url": redis.url})
    https = [httpx.Client(base_url=f"http://127.0.0.1:{p.port}", auth=p.admin_auth, timeout=30) for p in procs]
    headers = {**AUTH, "X-Conversation-ID": "shared"}
    transcript: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "fix it"}]
    upstream.enqueue(Reply.tool_calls([("read_file", "{}")]))
    result = chat(https[0], transcript, headers=headers, tools=TOOLS)
    transcript += [result.message, {"role": "tool", "tool_call_id": result.message["tool_calls"][0]["id"], "content": "a.py"}]
    assert post(https[1], "shared", STEER).status_code == 200

    # The same next request reaches both replicas at once; the first holds the conversation.
    held = Reply.text("held", pause_after_chunks=0)
    upstream.enqueue(held)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(chat, https[0], transcript, headers=headers, tools=TOOLS)
        assert held.reached.wait(10)
        second = pool.submit(chat, https[1], transcript, headers=headers, tools=TOOLS)
        held.release()  # whether the second came before or after, it waits for the first turn's end
        assert first.result(30).ok and second.result(30).ok
    prompts = upstream.chat_requests()[1:]
    assert len(prompts) == 2
    assert [occurrences(p, STEER) for p in prompts] == [1, 1]  # each prompt carries it once ...
    assert prompts[1]["messages"] == prompts[0]["messages"]  # ... in the same place: one delivery
    for http in https:
        [message] = inbox(http, "shared")
        assert message["status"] == "delivered" and message["turn"] == 2
        turns = http.get("/v1/conversations/shared/turns", headers=AUTH).json()["data"]
        assert [t["inbox"] for t in turns] == [[], [1], []]
    for http in https:
        http.close()


def test_the_page_reads_the_inbox_in_the_trajectory(proxy, upstream, http):
    openai_client(proxy, headers={"X-Conversation-ID": "traj"}).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}]
    )
    post(http, "traj", STEER)
    page = http.get("/v1/conversations/traj/trajectory", headers=AUTH).json()
    assert [(m["content"], m["status"]) for m in page["inbox"]] == [(STEER, "pending")]


def tool_result_with_a_note(make_proxy, upstream, cid: str, output: str) -> tuple[str, str]:
    """With the quota on, a message posted while a tool runs, then two turns: the tool result as
    the first and the second of them sent it."""
    proxy = make_proxy(quota={"max_llm_calls": 20})
    client = openai_client(proxy, headers={"X-Conversation-ID": cid})
    history: list[dict[str, Any]] = [SYSTEM, {"role": "user", "content": "build"}]
    upstream.enqueue(Reply.tool_calls([("read_file", "{}")]))
    call = client.chat.completions.create(model="m", messages=history, tools=TOOLS).choices[0].message
    history.append(call.model_dump(exclude_none=True))
    with httpx.Client(base_url=proxy.url, timeout=30, auth=proxy.admin_auth) as http:
        post(http, cid, STEER)
    history.append({"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": output})
    reply = client.chat.completions.create(model="m", messages=history, tools=TOOLS).choices[0].message
    history += [{"role": "assistant", "content": reply.content}, {"role": "user", "content": "and?"}]
    client.chat.completions.create(model="m", messages=history, tools=TOOLS)
    first, second = (r["messages"][3]["content"] for r in upstream.chat_requests()[1:])
    return first, second


def test_a_note_on_a_shortened_output_comes_after_its_marker_and_quota_figures(make_proxy, upstream):
    """Truncation rewrites the tool result as if no note were there (its marker carries the quota
    figures); the note comes after it, and the whole rewrite is the same on the next turn."""
    log = "".join(f"line {i:05d}: compiling\n" for i in range(2000))
    first, second = tool_result_with_a_note(make_proxy, upstream, "big", log)
    preview, _, note = first.partition("\n\n[context-proxy: a message from the user")
    assert preview.startswith(log[:2000]) and "is stored as ref" in preview and "LLM calls remaining" in preview
    assert note.endswith(STEER) and second == first


def test_the_quota_line_follows_the_note_and_both_stay(make_proxy, upstream):
    first, second = tool_result_with_a_note(make_proxy, upstream, "quota-note", '{"ok": true}')
    output, note_and_quota = first.split("\n\n", 1)
    assert output == '{"ok": true}' and note_and_quota.index(STEER) < note_and_quota.index("LLM calls remaining")
    assert second == first


def test_proxy_history_clients_get_the_note_from_the_store_on_every_turn(proxy, upstream, http):
    client = openai_client(proxy, headers={"X-Conversation-ID": "proxied", "X-History": "proxy"})
    client.chat.completions.create(model="m", messages=[SYSTEM, {"role": "user", "content": "start"}])
    post(http, "proxied", STEER)
    for text in ("one", "two"):
        client.chat.completions.create(model="m", messages=[SYSTEM, {"role": "user", "content": text}])
    second, third = upstream.chat_requests()[1:]
    assert second["messages"][3]["role"] == "user" and second["messages"][3]["content"].endswith(STEER)
    assert third["messages"][: len(second["messages"])] == second["messages"]
    assert [occurrences(r, STEER) for r in (second, third)] == [1, 1]


def test_the_trajectory_file_holds_the_inbox_as_the_api_does(make_proxy, upstream, servers, tmp_path):
    root = tmp_path / "trajectories"
    proxy = make_proxy(storage={"trajectory_dir": str(root)})
    client = openai_client(proxy, headers={"X-Conversation-ID": "filed"})
    history = [SYSTEM, {"role": "user", "content": "go"}]
    history.append({"role": "assistant", "content": client.chat.completions.create(model="m", messages=history).choices[0].message.content})
    with httpx.Client(base_url=proxy.url, timeout=30, auth=proxy.admin_auth) as http:
        post(http, "filed", STEER)
        history.append({"role": "user", "content": "on"})
        client.chat.completions.create(model="m", messages=history)
        servers.run(proxy.app[ENGINE].idle())  # the turn's end marks the file due
        servers.run(proxy.app[TRAJECTORIES].idle())
        api = http.get("/v1/conversations/filed/trajectory", params={"limit": 1000}).json()
    written = json.loads((root / tenant_of(ALICE) / "filed.json").read_text())
    assert [m["status"] for m in api["inbox"]] == ["delivered"]
    assert written == api
