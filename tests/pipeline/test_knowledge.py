"""Long-term knowledge: the tenant's document goes upstream after the client's system prompt, the
agent edits it through the proxy's own tools (never seen by the client), the edit reaches the
next conversation of the same tenant and namespace and no other, and every version is kept and
diffable through the admin API."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import httpx
import pytest

from proxy.knowledge import append_section, replace_section, sections
from tests.conftest import ALICE, BOB, openai_client
from tests.fakes.fake_upstream import Reply, default_responder
from tests.support.harness import ProxyServer
from tests.support.messages_helpers import MODEL as CLAUDE_MODEL
from tests.support.messages_helpers import claude_client, messages_proxy

SYSTEM = {"role": "system", "content": "You are a coding agent."}
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {}}}}]
OURS = ["knowledge_read", "knowledge_replace_section", "knowledge_append_section"]
ON = {"knowledge": {"enabled": True, "editable": True}}
PITFALL = "Run make install before make test: the venv is not made by the tests."
AUTH = {"Authorization": f"Bearer {ALICE}"}


@pytest.fixture
def http_to() -> Iterator[Callable[[ProxyServer], httpx.Client]]:
    """Raw HTTP to a proxy of the test's own making (the `http` fixture talks to the default one)."""
    made: list[httpx.Client] = []

    def make(proxy: ProxyServer) -> httpx.Client:
        made.append(httpx.Client(base_url=proxy.url, timeout=30, auth=proxy.admin_auth))
        return made[-1]

    yield make
    for client in made:
        client.close()


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def append_call(heading: str, content: str) -> tuple[str, str]:
    return "knowledge_append_section", json.dumps({"heading": heading, "content": content})


def ask(proxy, cid: str, text: str = "hello", key: str = ALICE, **headers: str):
    client = openai_client(proxy, api_key=key, headers={"X-Conversation-ID": cid, **headers})
    return client.chat.completions.create(model="gpt-4o-mini", messages=[SYSTEM, user(text)], tools=TOOLS)


def knowledge_message(body: dict) -> str | None:
    """The knowledge system message of an upstream chat request: right after the client's own."""
    second = body["messages"][1]
    return second["content"] if second["role"] == "system" and "Long-term knowledge" in second["content"] else None


def test_off_by_default(proxy, upstream):
    ask(proxy, "plain")
    body = upstream.chat_requests()[-1]
    assert body["messages"] == [SYSTEM, user("hello")]
    assert [t["function"]["name"] for t in body["tools"]] == ["read_file"]


@pytest.mark.parametrize("stream", [False, True])
def test_the_agents_edit_reaches_the_next_conversation_of_its_tenant_and_namespace(make_proxy, upstream, http_to, stream):
    proxy = make_proxy(**ON)
    http = http_to(proxy)
    upstream.enqueue(Reply.tool_calls([append_call("Setup pitfalls", PITFALL)]), Reply.text("Noted."))
    client = openai_client(proxy, headers={"X-Conversation-ID": "first"})
    result = client.chat.completions.create(model="gpt-4o-mini", messages=[SYSTEM, user("set up")], tools=TOOLS, stream=stream)
    if stream:
        chunks = list(result)
        assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Noted."
    else:
        assert result.choices[0].message.tool_calls is None and result.choices[0].message.content == "Noted."

    asked, answered = upstream.chat_requests()
    seeded = knowledge_message(asked)
    assert seeded is not None and "## Pitfalls" in seeded and PITFALL not in seeded  # the template
    assert [t["function"]["name"] for t in asked["tools"]] == ["read_file", *OURS]
    call, answer = answered["messages"][-2:]
    assert call["tool_calls"][0]["function"]["name"] == "knowledge_append_section"
    assert answer["role"] == "tool" and answer["content"].startswith("Done: section 'Setup pitfalls' added")

    ask(proxy, "second")  # a new conversation of the same tenant and namespace
    assert PITFALL in knowledge_message(upstream.chat_requests()[-1])
    ask(proxy, "bobs", key=BOB)  # another tenant: its own document, the template
    assert PITFALL not in knowledge_message(upstream.chat_requests()[-1])
    ask(proxy, "ops", **{"X-Knowledge-Namespace": "ops"})  # another namespace of the same tenant
    assert PITFALL not in knowledge_message(upstream.chat_requests()[-1])
    ask(proxy, "ops-2", **{"X-Knowledge-Namespace": "ops"})
    assert PITFALL not in knowledge_message(upstream.chat_requests()[-1])

    document = http.get("/v1/knowledge", headers=AUTH).json()
    assert document["version"] == 2 and PITFALL in document["text"] and document["source"] == "agent:first turn 1"
    assert document["namespaces"] == ["ops"]
    bobs = http.get("/v1/knowledge", headers={"Authorization": f"Bearer {BOB}"}).json()
    assert bobs["version"] == 1 and PITFALL not in bobs["text"]


def test_a_conversation_keeps_the_version_it_started_with_until_its_history_is_summarized(make_proxy, upstream, http_to):
    proxy = make_proxy(**ON, compaction={"strategy": "turns", "every_n_user_messages": 100})
    http = http_to(proxy)
    upstream.responder = summarizing
    client = openai_client(proxy, headers={"X-Conversation-ID": "long"})
    history = [SYSTEM, user("task")]
    upstream.enqueue(Reply.tool_calls([append_call("Decisions made", "Use Redis for sessions.")]), Reply.text("ok"))
    for text in ("next", "and next"):
        history.append({"role": "assistant", "content": client.chat.completions.create(model="m", messages=history).choices[0].message.content})
        history.append(user(text))
    client.chat.completions.create(model="m", messages=history)
    prompts = [r for r in upstream.chat_requests() if not is_summary(r)]
    assert len(prompts) == 4  # the first turn's two calls, then two turns
    assert all("Use Redis for sessions." not in knowledge_message(p) for p in prompts)  # still version 1 ...
    for earlier, later in zip(prompts[2:], prompts[3:], strict=False):
        assert later["messages"][: len(earlier["messages"])] == earlier["messages"]  # ... so every prompt extends the last
    # A summary rewrites the prompt after this message anyway: the newest version comes in then.
    history.append({"role": "assistant", "content": "ok"})
    history.append(user("summarize now"))
    forced = openai_client(proxy, headers={"X-Conversation-ID": "long", "X-Compaction": "force"})
    forced.chat.completions.create(model="m", messages=history)
    assert "Use Redis for sessions." in knowledge_message(upstream.chat_requests()[-1])
    turns = http.get("/v1/conversations/long/turns", headers=AUTH).json()["data"]
    assert [t["knowledge"]["version"] for t in turns] == [1, 1, 1, 2]


SUMMARIZER_MARK = "You maintain the working memory of an AI agent"


def is_summary(body: dict) -> bool:
    return SUMMARIZER_MARK in str(body["messages"][0]["content"])


def summarizing(body: dict) -> Reply:
    return Reply.text("SUMMARY: work so far.") if is_summary(body) else default_responder(body)


def test_versions_and_diffs_through_the_admin_api(make_proxy, upstream):
    proxy = make_proxy(**ON, admin={"token": "kn-admin"})
    upstream.enqueue(Reply.tool_calls([append_call("Deploy config", "Config lives in deploy/.")]), Reply.text("ok"))
    ask(proxy, "editor")
    with httpx.Client(base_url=proxy.url, timeout=30, auth=proxy.admin_auth) as http:
        versions = http.get("/v1/knowledge/versions", headers=AUTH).json()
        assert [(v["version"], v["source"]) for v in versions["data"]] == [(2, "agent:editor turn 1"), (1, "seed")]
        assert "text" not in versions["data"][0]
        assert "Config lives in deploy/." not in http.get("/v1/knowledge/versions/1", headers=AUTH).json()["text"]
        diff = http.get("/v1/knowledge/diff", headers=AUTH).json()
        assert (diff["from"], diff["to"]) == (1, 2)
        assert "+Config lives in deploy/.\n" in diff["diff"] and "--- version 1" in diff["diff"]

        edited = http.put("/v1/knowledge", json={"text": "# Notes\n\nAll new.\n", "base_version": 2}, headers=AUTH)
        assert edited.status_code == 200 and (edited.json()["version"], edited.json()["source"]) == (3, "api")
        stale = http.put("/v1/knowledge", json={"text": "lost", "base_version": 2}, headers=AUTH)
        assert stale.status_code == 409 and stale.json()["error"]["code"] == "version_conflict"
        assert "-Config lives in deploy/.\n" in http.get("/v1/knowledge/diff", params={"from": 2, "to": 3}, headers=AUTH).json()["diff"]
        assert http.get("/v1/knowledge/versions/9", headers=AUTH).status_code == 404

        # The admin names the tenant as conversations show it; Bob sees only his own (none yet).
        tenant = http.get("/v1/knowledge", headers=AUTH).json()["tenant"]
        admin = {"Authorization": "Bearer kn-admin"}
        assert http.get("/v1/knowledge", headers=admin).status_code == 400
        assert http.get("/v1/knowledge", params={"tenant": tenant}, headers=admin).json()["version"] == 3
        put = http.put("/v1/knowledge/ops", params={"tenant": tenant}, json={"text": "ops"}, headers=admin)
        assert put.status_code == 200 and put.json()["source"] == "admin"
        bob = {"Authorization": f"Bearer {BOB}"}
        assert http.get("/v1/knowledge", headers=bob).json()["version"] == 0  # the template, not stored yet
        assert http.get("/v1/knowledge/ops", headers=bob).json()["version"] == 0
        assert http.get("/v1/knowledge/versions", headers=bob).json()["data"] == []

        # Bad writes change nothing; nothing under /v1/knowledge goes upstream; other origins are refused.
        assert http.put("/v1/knowledge", content="text", headers={**AUTH, "Content-Type": "text/plain"}).status_code == 415
        assert http.put("/v1/knowledge", json={"text": "x"}, headers={**AUTH, "Origin": "https://evil.example"}).status_code == 403
        before = len(upstream.requests)
        assert http.delete("/v1/knowledge", headers=AUTH).status_code == 404
        assert http.get("/v1/knowledge/ops/nothing/here", headers=AUTH).status_code == 404
        assert len(upstream.requests) == before
        assert http.put("/v1/knowledge", json={"text": 1}, headers=AUTH).status_code == 400
        assert http.put("/v1/knowledge/bad%20name", json={"text": "x"}, headers=AUTH).status_code == 400
        assert http.get("/v1/knowledge", headers=AUTH).json()["version"] == 3


def test_a_count_of_tokens_carries_the_seed_document_and_writes_no_version(make_proxy, upstream, http_to):
    """Anthropic's count_tokens is a dry run: the document it counts is the seed a first turn
    would write, and nothing is written (the tenant still has no version)."""
    proxy = messages_proxy(make_proxy, upstream, **ON, admin={"token": "kn-admin"})
    counted = claude_client(proxy).messages.count_tokens(model=CLAUDE_MODEL, messages=[user("Hi")])
    assert counted.input_tokens > 0
    [sent] = upstream.anthropic.count_tokens_requests()
    assert "Long-term knowledge" in json.dumps(sent["system"])
    assert http_to(proxy).get("/v1/knowledge/versions", headers=AUTH).json()["data"] == []


def test_an_edit_past_the_budget_is_refused_and_changes_nothing(make_proxy, upstream, http_to):
    proxy = make_proxy(knowledge={"enabled": True, "editable": True, "max_tokens": 400})
    http = http_to(proxy)
    upstream.enqueue(Reply.tool_calls([append_call("Huge", "word " * 2000)]), Reply.text("ok"))
    ask(proxy, "greedy")
    answer = upstream.chat_requests()[-1]["messages"][-1]["content"]
    assert answer.startswith("Not changed: The notes would take about") and "budget of 400" in answer
    assert http.get("/v1/knowledge", headers=AUTH).json()["version"] == 1


def test_the_tool_round_counts_against_the_quota(make_proxy, upstream):
    proxy = make_proxy(**ON, quota={"max_llm_calls": 10})
    upstream.enqueue(Reply.tool_calls([("knowledge_read", "{}")]), Reply.text("read it"))
    with httpx.Client(base_url=proxy.url, timeout=30, auth=proxy.admin_auth) as http:
        response = http.post(
            "/v1/chat/completions", json={"model": "m", "messages": [SYSTEM, user("what do we know?")]},
            headers={**AUTH, "X-Conversation-ID": "counted"},
        )
    assert response.json()["choices"][0]["message"]["content"] == "read it"
    assert response.headers["X-LLM-Calls-Remaining"] == "8"
    read = upstream.chat_requests()[-1]["messages"][-1]["content"]
    assert read.startswith("[knowledge notes version 1, characters 0-") and "## Decisions" in read


def test_a_profile_turns_it_on_with_its_own_namespace(make_proxy, upstream, http_to):
    proxy = make_proxy(profiles={"team": {"knowledge": {"enabled": True, "namespace": "team", "editable": False}}})
    http = http_to(proxy)
    ask(proxy, "no-profile")
    assert knowledge_message(upstream.chat_requests()[-1]) is None
    ask(proxy, "with-profile", **{"X-Context-Profile": "team"})
    body = upstream.chat_requests()[-1]
    assert 'namespace "team"' in knowledge_message(body)
    assert [t["function"]["name"] for t in body["tools"]] == ["read_file", "knowledge_read"]
    assert http.get("/v1/knowledge/team", headers=AUTH).json()["version"] == 1
    bad = http.post(
        "/v1/chat/completions", json={"model": "m", "messages": [user("hi")]},
        headers={**AUTH, "X-Context-Profile": "team", "X-Knowledge-Namespace": "no spaces"},
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "X-Knowledge-Namespace"


def test_responses_the_document_follows_the_developer_message_and_the_tool_stays_hidden(make_proxy, upstream, http_to):
    proxy = make_proxy(**ON)
    http = http_to(proxy)
    client = openai_client(proxy, headers={"X-Conversation-ID": "resp-kn"})
    developer = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]}
    upstream.enqueue(Reply.tool_calls([append_call("Facts learned", "The API is versioned.")]), Reply.text("Done."))
    response = client.responses.create(
        model="gpt-4o-mini", input=[developer, {"type": "message", "role": "user", "content": "learn"}]
    )
    assert response.output_text == "Done." and not any(i.type == "function_call" for i in response.output)
    first = upstream.responses_requests()[0]
    assert first["input"][0] == developer and "Long-term knowledge" in first["input"][1]["content"][0]["text"]
    assert [t["name"] for t in first["tools"]] == OURS
    assert "The API is versioned." in http.get("/v1/knowledge", headers=AUTH).json()["text"]


# -- the document's sections ------------------------------------------------------------------------


def test_sections_are_replaced_appended_and_removed_by_their_heading():
    text = "# Notes\n\n## Facts\nold fact\n\n### Detail\ndeep\n\n## Pitfalls\n```\n# not a heading\n```\n"
    assert [(s.title, s.level) for s in sections(text)] == [("Notes", 1), ("Facts", 2), ("Detail", 3), ("Pitfalls", 2)]
    replaced = replace_section(text, "facts", "new fact")
    assert "## Facts\n\nnew fact\n\n## Pitfalls" in replaced and "deep" not in replaced  # subsections go with it
    assert "## Facts" not in replace_section(text, "## Facts", "")
    appended = append_section(text, "Where things are", "src/")
    assert appended.endswith("# not a heading\n```\n\n## Where things are\n\nsrc/\n")
    with pytest.raises(ValueError, match="Pitfalls"):
        replace_section(text, "Missing", "x")
    with pytest.raises(ValueError, match="exists already"):
        append_section(text, "PITFALLS", "x")


def test_on_redis_the_edit_reaches_the_next_conversation_too(make_proxy, upstream, redis, http_to):
    proxy = make_proxy(**ON, storage={"backend": "redis", "redis_url": redis.url})
    upstream.enqueue(Reply.tool_calls([append_call("Redis notes", "Keys are prefixed cp:.")]), Reply.text("ok"))
    ask(proxy, "r1")
    ask(proxy, "r2")
    assert "Keys are prefixed cp:." in knowledge_message(upstream.chat_requests()[-1])
    ask(proxy, "r3", key=BOB)
    assert "Keys are prefixed cp:." not in knowledge_message(upstream.chat_requests()[-1])
    versions = http_to(proxy).get("/v1/knowledge/versions", headers=AUTH).json()["data"]
    assert [v["source"] for v in versions] == ["agent:r1 turn 1", "seed"]


def test_the_document_moves_to_the_newest_version_when_the_window_cuts(make_proxy, upstream, http_to):
    # A limit far above one turn's growth (~150 tokens): the window refilled to 60% of it has room
    # for the next turns whatever the tokens of the note's refs (their MACs vary with the secret).
    proxy = make_proxy(**ON, context={"history_token_limit": 2400})
    http = http_to(proxy)
    client = openai_client(proxy, headers={"X-Conversation-ID": "cut"})
    history = [SYSTEM]

    def turn(n: int) -> dict:
        history.append(user(f"step {n}: " + "lorem ipsum dolor sit amet " * 12))
        history.append({"role": "assistant", "content": client.chat.completions.create(model="m", messages=history).choices[0].message.content})
        return upstream.chat_requests()[-1]

    prompts = [turn(0)]
    base = http.get("/v1/knowledge", headers=AUTH).json()
    written = http.put("/v1/knowledge", json={"text": base["text"] + "\n## Added later\n\nDeploys go through CI.\n",
                                              "base_version": base["version"]}, headers=AUTH)
    assert written.status_code == 200
    n = 1
    while len(prompts) < 2 or prompts[-1]["messages"][: len(prompts[-2]["messages"])] == prompts[-2]["messages"]:
        assert "Deploys go through CI." not in knowledge_message(prompts[-1])  # no cut yet: the same bytes
        prompts.append(turn(n))
        n += 1
        assert n < 40, "the window never cut"
    cut = prompts[-1]
    assert len(prompts) > 3 and cut["messages"][2] != history[1]  # the window did cut: its start moved on
    assert "Deploys go through CI." in knowledge_message(cut)  # the cut re-reads the prompt anyway
    after = turn(n)
    assert after["messages"][: len(cut["messages"])] == cut["messages"]  # and stable again
    versions = [t["knowledge"]["version"] for t in http.get("/v1/conversations/cut/turns", headers=AUTH).json()["data"]]
    assert versions == [1] * (len(prompts) - 1) + [2, 2]


def test_without_an_admin_token_only_a_loopback_host_reads_the_documents(proxy, upstream, http):
    """DNS rebinding: a page whose name resolves to 127.0.0.1 must not read every tenant's notes."""
    assert http.get("/v1/knowledge/versions", headers={"Host": "attacker.example"}).status_code == 403
    assert http.get("/v1/knowledge/versions", params={"tenant": "anonymous"}).status_code == 200
