"""The record holds the whole request: a Messages conversation's `system` and a Responses one's
`instructions`, and every format's tool definitions, kept once per conversation by hash, with the
turns that sent each version; shown in the admin API and the trajectory file, moved by export and
import, and sent again by proxy-history mode. Driven by the real anthropic and openai clients
against a real proxy on loopback and the strict fakes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.identity import ConversationKey, tenant_of
from proxy.prefix import PARSED, BodyCache
from proxy.request_parts import RequestParts, sent_parts
from proxy.state import ENGINE, TRAJECTORIES
from proxy.store import Conversation, RequestPart, part_hash, part_json
from tests.conftest import ALICE, MakeProxy, admin_get, openai_client
from tests.fakes.fake_upstream import FakeUpstream, Reply
from tests.support.claude_agent import ClaudeAgent
from tests.support.harness import ROOT, ProxyServer, write_config
from tests.support.messages_helpers import BUILD, MODEL, WEATHER, as_params, claude_client, messages_proxy

TERSE = [{"type": "text", "text": "You are a terse assistant. ✓"}]
VERBOSE = "You explain every step."
FUNCTIONS = [{"type": "function", "name": "exec_command", "description": "Run a command.", "strict": False,
              "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]


@pytest.fixture
def proxy(make_proxy: MakeProxy, upstream: FakeUpstream, tmp_path: Path) -> ProxyServer:
    return messages_proxy(make_proxy, upstream, storage={"trajectory_dir": str(tmp_path / "traj")})


def document(http: httpx.Client, conversation_id: str, part: str = "") -> dict[str, Any]:
    response = admin_get(http, f"/{conversation_id}{part}", limit=1000)
    assert response.status_code == 200, response.text
    return response.json()


def shown_parts(trajectory: dict[str, Any]) -> list[tuple[str, Any, list[int]]]:
    """(kind, value, turns) of each request part of a trajectory, in the order first kept."""
    return [(p["kind"], p["value"], p["turns"]) for p in trajectory["request_parts"]]


def ask(client, conversation: list[dict[str, Any]], text: str, **params: Any) -> None:
    """One Messages turn of a full-history client: the question, then the answer kept."""
    conversation.append({"role": "user", "content": text})
    answer = client.messages.create(model=MODEL, max_tokens=256, messages=conversation, **params)
    conversation.append(as_params(answer))


def test_a_messages_conversation_keeps_each_system_prompt_and_tools_list_once_with_its_turns(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client, tmp_path: Path, servers
) -> None:
    client = claude_client(proxy, headers={"X-Conversation-ID": "parts-m"})
    conversation: list[dict[str, Any]] = []
    ask(client, conversation, "What is the weather?", system=TERSE, tools=[WEATHER])
    first = document(http, "parts-m", "/trajectory")
    ask(client, conversation, "And tomorrow?", system=TERSE, tools=[WEATHER])
    second = document(http, "parts-m", "/trajectory")
    # The same system prompt and tools again: nothing new kept (the very records of the first turn).
    assert second["request_parts"] == [{**p, "turns": [1, 2]} for p in first["request_parts"]]
    assert shown_parts(second) == [("system", TERSE, [1, 2]), ("tools", [WEATHER], [1, 2])]

    ask(client, conversation, "Now explain.", system=VERBOSE, tools=[WEATHER, BUILD])
    trajectory = document(http, "parts-m", "/trajectory")
    assert shown_parts(trajectory) == [
        ("system", TERSE, [1, 2]), ("tools", [WEATHER], [1, 2]), ("system", VERBOSE, [3]), ("tools", [WEATHER, BUILD], [3]),
    ]
    records = trajectory["turns"]
    assert [(r["system_hash"], r["tools_hash"]) for r in records] == [
        (part_hash(TERSE), part_hash([WEATHER])), (part_hash(TERSE), part_hash([WEATHER])),
        (part_hash(VERBOSE), part_hash([WEATHER, BUILD])),
    ]
    # The conversation object carries the current ones; its transcript stays the messages.
    shown = document(http, "parts-m")
    assert (shown["system"], shown["tools"]) == (VERBOSE, [WEATHER, BUILD])
    assert [m["role"] for m in document(http, "parts-m", "/messages")["data"]] == ["user", "assistant"] * 3
    # ... and the trajectory file says the same.
    servers.run(proxy.app[ENGINE].idle())
    servers.run(proxy.app[TRAJECTORIES].idle())
    path = tmp_path / "traj" / tenant_of(ALICE) / "parts-m.json"
    assert shown_parts(json.loads(path.read_bytes())) == shown_parts(trajectory)


def test_proxy_history_sends_the_stored_system_prompt_when_the_request_has_none(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client
) -> None:
    client = claude_client(proxy, headers={"X-Conversation-ID": "parts-ph", "X-History": "proxy"})
    client.messages.create(model=MODEL, max_tokens=64, system=TERSE, tools=[WEATHER], messages=[{"role": "user", "content": "hi"}])
    client.messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "and again"}])
    sent = upstream.messages_requests()[-1]
    assert sent["system"] == TERSE
    assert "tools" not in sent  # tools are the client's to send: only the system prompt comes back
    assert [m["role"] for m in sent["messages"]] == ["user", "assistant", "user"]
    client.messages.create(model=MODEL, max_tokens=64, system=VERBOSE, messages=[{"role": "user", "content": "more"}])
    assert upstream.messages_requests()[-1]["system"] == VERBOSE  # the request's own wins
    client.messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "last"}])
    assert upstream.messages_requests()[-1]["system"] == VERBOSE  # the newest stored one
    assert shown_parts(document(http, "parts-ph", "/trajectory")) == [
        ("system", TERSE, [1, 2]), ("tools", [WEATHER], [1]), ("system", VERBOSE, [3, 4]),
    ]
    # Counting its tokens counts the prompt the proxy would send: the stored system prompt in it.
    client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "how long?"}])
    assert upstream.anthropic.count_tokens_requests()[-1]["system"] == VERBOSE


def test_a_responses_conversation_keeps_its_instructions_and_tools_and_proxy_history_restores_them(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client
) -> None:
    client = openai_client(proxy, headers={"X-Conversation-ID": "parts-r"})
    history: list[Any] = [{"role": "user", "content": "list the files"}]
    reply = client.responses.create(model="gpt-4o-mini", instructions="You are a coding agent.", tools=FUNCTIONS, input=history)
    history += [item.model_dump(exclude_none=True) for item in reply.output] + [{"role": "user", "content": "and now?"}]
    client.responses.create(model="gpt-4o-mini", instructions="You are a coding agent.", tools=FUNCTIONS, input=history)
    client.responses.create(model="gpt-4o-mini", instructions="You review code.", tools=FUNCTIONS, input=history)
    assert shown_parts(document(http, "parts-r", "/trajectory")) == [
        ("system", "You are a coding agent.", [1, 2]), ("tools", FUNCTIONS, [1, 2, 3]), ("system", "You review code.", [3]),
    ]
    shown = document(http, "parts-r")
    assert (shown["system"], shown["tools"]) == ("You review code.", FUNCTIONS)

    anchored = openai_client(proxy, headers={"X-Conversation-ID": "parts-r", "X-History": "proxy"})
    anchored.responses.create(model="gpt-4o-mini", input="one more")
    sent = upstream.responses_requests()[-1]
    assert sent["instructions"] == "You review code." and "tools" not in sent


def test_a_chat_conversation_keeps_its_tools_its_system_prompt_being_a_message(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client
) -> None:
    tools = [{"type": "function", "function": {"name": "sh", "parameters": {"type": "object", "properties": {}}}}]
    client = openai_client(proxy, headers={"X-Conversation-ID": "parts-c"})
    messages = [{"role": "system", "content": "You fix tests."}, {"role": "user", "content": "go"}]
    client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=tools)
    trajectory = document(http, "parts-c", "/trajectory")
    assert shown_parts(trajectory) == [("tools", tools, [1])]
    assert trajectory["turns"][0]["system_hash"] is None
    assert document(http, "parts-c")["system"] is None
    assert document(http, "parts-c", "/messages")["data"][0]["content"] == "You fix tests."


def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "proxy", *args], cwd=ROOT, capture_output=True, timeout=60, check=False)


def test_export_and_import_keep_them_and_import_checks_them(
    make_proxy: MakeProxy, upstream: FakeUpstream, redis, tmp_path: Path
) -> None:
    disk = make_proxy(data_dir=tmp_path / "disk", upstream={"anthropic_base_url": upstream.anthropic.base_url})
    client = claude_client(disk, headers={"X-Conversation-ID": "parts-x"})
    conversation: list[dict[str, Any]] = []
    ask(client, conversation, "first", system=TERSE, tools=[WEATHER])
    ask(client, conversation, "second", system=VERBOSE, tools=[WEATHER])
    with httpx.Client(base_url=disk.url, auth=disk.admin_auth) as http:
        before = document(http, "parts-x", "/trajectory")
    disk.stop()
    exported = cli("export", "--config", str(write_config(tmp_path / "disk.yaml", storage={"path": str(tmp_path / "disk")})), "parts-x")
    assert exported.returncode == 0, exported.stderr.decode()
    doc = json.loads(exported.stdout)
    assert [(p["kind"], p["value"]) for p in doc["request_parts"]] == [("system", TERSE), ("tools", [WEATHER]), ("system", VERBOSE)]

    redis_config = str(write_config(tmp_path / "redis.yaml", storage={"backend": "redis", "redis_url": redis.url}))
    spoiled = {**doc, "request_parts": [{**doc["request_parts"][0], "value": "not what the turns sent"}, *doc["request_parts"][1:]]}
    (tmp_path / "spoiled.json").write_text(json.dumps(spoiled))
    refused = cli("import", "--config", redis_config, str(tmp_path / "spoiled.json"))
    assert refused.returncode != 0 and "hash of its value" in refused.stderr.decode()
    (tmp_path / "parts.json").write_bytes(exported.stdout)
    imported = cli("import", "--config", redis_config, str(tmp_path / "parts.json"))
    assert imported.returncode == 0, imported.stderr.decode()
    assert cli("export", "--config", redis_config, "parts-x").stdout == exported.stdout  # byte for byte

    shared = messages_proxy(make_proxy, upstream, storage={"backend": "redis", "redis_url": redis.url})
    with httpx.Client(base_url=shared.url, auth=shared.admin_auth) as http:
        after = document(http, "parts-x", "/trajectory")
        assert after["request_parts"] == before["request_parts"]
        assert document(http, "parts-x")["system"] == VERBOSE
    # The conversation goes on there: the same prompt and tools again add nothing.
    ask(claude_client(shared, headers={"X-Conversation-ID": "parts-x"}), conversation, "third", system=VERBOSE, tools=[WEATHER])
    with httpx.Client(base_url=shared.url, auth=shared.admin_auth) as http:
        assert shown_parts(document(http, "parts-x", "/trajectory")) == [
            ("system", TERSE, [1]), ("tools", [WEATHER], [1, 2, 3]), ("system", VERBOSE, [2, 3]),
        ]


# -- the hot path: nothing hashed twice, nothing written twice -----------------------------------


def messages_body(n: int) -> bytes:
    """A Messages body of `n` user messages with a system prompt and tools, as a client sends it."""
    messages = [{"role": "user", "content": f"message {i}"} for i in range(n)]
    return json.dumps({"model": MODEL, "system": TERSE, "messages": messages, "tools": [WEATHER, BUILD]}).encode()


async def test_a_body_that_extends_the_last_one_reuses_its_parts_and_hashes() -> None:
    bodies, key = BodyCache(), ("tenant", "messages", "c")
    first_raw = messages_body(2)
    first = await bodies.full(key, first_raw, json.loads(first_raw), "messages")
    first_parts = sent_parts("messages", first.body, first)
    assert [(p.kind, p.hash) for p in first_parts] == [("system", part_hash(TERSE)), ("tools", part_hash([WEATHER, BUILD]))]
    bodies.remember(key, first, ["h1", "h2"])
    second = await bodies.extend(key, messages_body(3), "messages")
    assert second is not None and second.reused == 2
    second_parts = sent_parts("messages", second.body, second)
    assert all(a is b for a, b in zip(second_parts, first_parts, strict=True))  # the very parts: not hashed again
    # A body whose tools changed is parsed whole: its parts are its own.
    changed = json.loads(messages_body(3))
    changed["tools"] = [WEATHER]
    assert [p.hash for p in sent_parts("messages", changed)] == [part_hash(TERSE), part_hash([WEATHER])]
    assert sent_parts("chat", {"messages": [], "tools": []}) == []  # none sent: none kept
    # A body parsed anew (a conversation the body cache does not hold): equal values are the last turn's parts.
    body = json.loads(messages_body(4))
    previous = [RequestPart("system", "the-last-turns", TERSE), RequestPart("tools", "its-tools", [WEATHER, BUILD])]
    again = sent_parts("messages", body, previous=previous)
    assert [p.hash for p in again] == ["the-last-turns", "its-tools"]  # taken, not computed
    assert again[0].value is body["system"] and again[1].value is body["tools"]  # the earlier body's objects let go


def conversation_of(turns: int, created_at: float = 1.0) -> Conversation:
    return Conversation(ConversationKey("t", "c"), created_at, created_at, turns=turns)


def test_only_a_turn_whose_parts_changed_hands_them_to_the_store() -> None:
    remembered, key = RequestParts(), ConversationKey("t", "c")
    terse, tools = RequestPart("system", part_hash("a"), "a"), RequestPart("tools", part_hash([]), [])
    assert remembered.to_keep(key, [], None) is None  # nothing sent
    keep = remembered.to_keep(key, [terse, tools], conversation_of(0))
    assert keep is not None and keep.parts == [terse, tools]
    remembered.remember(key, keep.mark, keep.parts)  # what PartsToKeep.keep does once the store has them
    assert remembered.sent(key, "messages", {"system": "a", "tools": []}, None) == [terse]  # [] is no tools
    assert remembered.sent(key, "messages", {"system": "a"}, None)[0].hash == terse.hash
    assert remembered.to_keep(key, [terse, tools], conversation_of(1)) is None  # the previous turn's: nothing to write
    assert remembered.to_keep(key, [terse, tools], conversation_of(2)) is None
    verbose = RequestPart("system", part_hash("b"), "b")
    assert remembered.to_keep(key, [verbose, tools], conversation_of(3)) is not None
    # A turn this process did not see (another replica's), or the conversation made again: asked again.
    assert remembered.to_keep(key, [terse, tools], conversation_of(5)) is not None
    assert remembered.to_keep(key, [terse, tools], conversation_of(3, created_at=2.0)) is not None


def test_a_new_conversations_second_turn_hands_the_store_nothing_it_has() -> None:
    """Its first turn's parts were kept before the conversation existed, when its creation time
    was unknown; the turn's end says it (PartsToKeep.ended), so the next turn sending the same
    parts is known to be the conversation's next and writes none."""
    remembered, key = RequestParts(), ConversationKey("t", "c")
    terse = RequestPart("system", part_hash("a"), "a")
    keep = remembered.to_keep(key, [terse], None)
    assert keep is not None
    remembered.remember(key, keep.mark, keep.parts)  # PartsToKeep.keep, with the turn's first write
    assert remembered.to_keep(key, [terse], conversation_of(1)) is not None  # not known to be the same conversation
    keep.ended(conversation_of(0))  # the turn kept its record: the conversation as it stood before
    assert remembered.to_keep(key, [terse], conversation_of(1)) is None
    assert remembered.to_keep(key, [terse], conversation_of(1, created_at=2.0)) is not None  # made again meanwhile


def test_the_values_kept_to_compare_with_stay_within_their_memory() -> None:
    remembered = RequestParts(max_entries=100, max_bytes=80_000)
    tools = [{"name": f"tool_{i}", "description": "x" * 200} for i in range(20)]  # ~5 KB of JSON
    for n in range(30):
        key = ConversationKey("t", f"c{n}")
        part = RequestPart("tools", part_hash(tools), tools)
        remembered.remember(key, (1.0, 1), [part])
        assert remembered.held <= 80_000
    assert remembered.sent(ConversationKey("t", "c29"), "chat", {"tools": list(tools)}, None) == [part]  # the newest kept
    huge = [{"name": "t", "description": "x" * 20_000}]  # past an eighth of the budget: its hash only
    remembered.remember(ConversationKey("t", "big"), (1.0, 1), [RequestPart("tools", part_hash(huge), huge)])
    assert remembered.held <= 80_000
    assert remembered.to_keep(ConversationKey("t", "big"), [RequestPart("tools", part_hash(huge), huge)], conversation_of(1)) is None


def test_claude_codes_own_system_prompt_and_tools_are_in_its_record(
    make_proxy: MakeProxy, upstream: FakeUpstream, tmp_path: Path
) -> None:
    proxy = messages_proxy(make_proxy, upstream, context={"history_token_limit": 100_000})
    upstream.enqueue(
        Reply.tool_calls([("Bash", json.dumps({"command": "echo hi", "description": "Say hi"}))], reasoning="Run it."),
        Reply.text("It printed hi."),
    )
    with ClaudeAgent(proxy.url, tmp_path) as agent:
        assert agent.run("Run `echo hi` with Bash.")["result"] == "It printed hi."
    sent = upstream.messages_requests()
    with httpx.Client(base_url=proxy.url, auth=proxy.admin_auth) as http:
        (conversation,) = admin_get(http, "").json()["data"]
        trajectory = document(http, conversation["id"], "/trajectory")
        shown = document(http, conversation["id"])
    parts = {p["hash"]: p for p in trajectory["request_parts"]}
    for record, request in zip(trajectory["turns"], sent, strict=True):  # each turn names what it sent
        assert parts[record["system_hash"]]["value"] == request["system"]
        assert parts[record["tools_hash"]]["value"] == request["tools"]
    distinct = {json.dumps(r["system"], sort_keys=True) for r in sent} | {json.dumps(r["tools"], sort_keys=True) for r in sent}
    assert len(parts) == len(distinct)  # each kept once
    assert (shown["system"], shown["tools"]) == (sent[-1]["system"], sent[-1]["tools"])
    assert any(t["name"] == "Bash" for t in shown["tools"])


def test_conversations_that_send_the_same_parts_hold_one_copy_of_them() -> None:
    """An agent's sessions share their system prompt and tools: 1,000 conversations of it hold its
    tools once (each body its own objects), all still compare with them, and the value goes when
    the last conversation using it moves on."""
    remembered = RequestParts(max_entries=10_000, max_bytes=800_000)
    tools = [{"name": f"tool_{i}", "description": "x" * 200, "strict": True} for i in range(20)]
    one = len(part_json(tools)) * PARSED
    for n in range(1_000):
        own = json.loads(json.dumps(tools))
        remembered.remember(ConversationKey("t", f"c{n}"), (1.0, 1), [RequestPart("tools", part_hash(own), own)])
    assert remembered.held == one  # once: 1,000 copies would be 12 times the budget
    body = {"tools": json.loads(json.dumps(tools))}
    for n in (0, 999):
        (part,) = remembered.sent(ConversationKey("t", f"c{n}"), "chat", body, None)
        assert part.hash == part_hash(tools) and part.value is body["tools"]  # compared, its own value
    other = [{"name": "only_tool"}]
    for n in range(1_000):
        remembered.remember(ConversationKey("t", f"c{n}"), (1.0, 2), [RequestPart("tools", part_hash(other), other)])
    assert remembered.held == len(part_json(other)) * PARSED  # the first tools let go
