"""Conversation identity (header, path, derived) and tenant isolation."""

from __future__ import annotations

import logging

from tests.conftest import ALICE, BOB, admin_get, live_messages, openai_client, trajectory
from tests.fakes.fake_upstream import Reply

SYSTEM = {"role": "system", "content": "You are an agent."}


def run_two_turns(client, first_user: str = "task: fix the bug") -> str:
    messages = [SYSTEM, {"role": "user", "content": first_user}]
    raw = client.chat.completions.with_raw_response.create(model="m", messages=messages)
    cid = raw.headers["X-Conversation-ID"]
    messages += [raw.parse().choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "next"}]
    again = client.chat.completions.with_raw_response.create(model="m", messages=messages)
    assert again.headers["X-Conversation-ID"] == cid
    return cid


def test_header_names_the_conversation(proxy, upstream, http):
    cid = run_two_turns(openai_client(proxy, headers={"X-Conversation-ID": "by-header"}))
    assert cid == "by-header"
    assert len(live_messages(http, "by-header")) == 5


def test_base_url_path_names_the_conversation(proxy, upstream, http):
    client = openai_client(proxy, base_url=f"{proxy.url}/c/by-path/v1")
    assert run_two_turns(client) == "by-path"
    assert len(live_messages(http, "by-path")) == 5


def test_header_wins_over_path(proxy, upstream, http):
    client = openai_client(proxy, base_url=f"{proxy.url}/c/by-path/v1", headers={"X-Conversation-ID": "by-header"})
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert admin_get(http, "/by-header").status_code == 200
    assert admin_get(http, "/by-path").status_code == 404


def test_configured_header_name_is_used(make_proxy, upstream):
    proxy = make_proxy(conversation={"id_header": "X-Session"})
    client = openai_client(proxy, headers={"X-Session": "custom"})
    raw = client.chat.completions.with_raw_response.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert raw.headers["X-Conversation-ID"] == "custom"
    # Our header is for the proxy only: it never reaches the upstream.
    assert "x-session" not in upstream.requests[-1].headers


def test_derived_id_is_stable_per_run_and_distinct_between_runs(proxy, upstream, http):
    client = openai_client(proxy)
    first_run = run_two_turns(client, "task: fix the bug")
    second_run = run_two_turns(client, "task: write docs")
    assert first_run != second_run
    assert first_run.startswith("auto-") and second_run.startswith("auto-")
    assert len(live_messages(http, first_run)) == 5
    assert len(live_messages(http, second_run)) == 5


def test_two_keys_running_the_same_agent_stay_apart(proxy, upstream, http):
    """Same system prompt and task under two keys: two conversations, each visible only to its key."""
    alice, bob = openai_client(proxy, ALICE), openai_client(proxy, BOB)
    same = [SYSTEM, {"role": "user", "content": "same"}]
    upstream.enqueue(Reply.text("for alice"))
    a = alice.chat.completions.with_raw_response.create(model="m", messages=same).headers["X-Conversation-ID"]
    upstream.enqueue(Reply.text("for bob"))
    b = bob.chat.completions.with_raw_response.create(model="m", messages=same).headers["X-Conversation-ID"]
    assert a != b  # the tenant is part of the derivation
    assert live_messages(http, a, ALICE)[-1]["content"] == "for alice"
    assert live_messages(http, b, BOB)[-1]["content"] == "for bob"
    assert admin_get(http, f"/{a}", BOB).status_code == 404
    assert admin_get(http, f"/{b}", ALICE).status_code == 404
    assert len(admin_get(http, "").json()["data"]) == 2  # the admin sees both


def test_two_keys_sending_the_same_id_stay_apart(proxy, upstream, http):
    for key, text in ((ALICE, "alice's turn"), (BOB, "bob's turn")):
        client = openai_client(proxy, key, headers={"X-Conversation-ID": "same-id"})
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": text}])
    assert [m["content"] for m in live_messages(http, "same-id", ALICE)] == ["alice's turn", "reply to: alice's turn"]
    assert [m["content"] for m in live_messages(http, "same-id", BOB)] == ["bob's turn", "reply to: bob's turn"]


def test_a_key_cannot_read_or_extend_another_keys_conversation(proxy, upstream, http):
    alice = openai_client(proxy, ALICE, headers={"X-Conversation-ID": "alice-private"})
    alice.chat.completions.create(model="m", messages=[{"role": "user", "content": "my secret plan"}])

    # Reading: every admin endpoint answers 404 to another key, and the list does not show it.
    for path in ("/alice-private", "/alice-private/messages", "/alice-private/trajectory"):
        assert admin_get(http, path, BOB).status_code == 404
    assert admin_get(http, "", BOB).json()["data"] == []
    assert http.delete("/v1/conversations/alice-private", headers={"Authorization": f"Bearer {BOB}"}).status_code == 404

    # Extending: Bob sending Alice's id in proxy-history mode gets a conversation of his own.
    bob = openai_client(proxy, BOB, headers={"X-Conversation-ID": "alice-private", "X-History": "proxy"})
    bob.chat.completions.create(model="m", messages=[{"role": "user", "content": "what was the plan?"}])
    assert upstream.chat_requests()[-1]["messages"] == [{"role": "user", "content": "what was the plan?"}]
    assert [m["content"] for m in live_messages(http, "alice-private", ALICE)] == [
        "my secret plan", "reply to: my secret plan",
    ]
    assert len(trajectory(http, "alice-private", ALICE)) == 2


def test_a_new_run_of_the_same_agent_and_task_is_a_new_conversation(proxy, upstream, http):
    client = openai_client(proxy)
    task = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "fix issue 7"}]

    def turn(history: list[dict]) -> tuple[str, list[dict]]:
        raw = client.chat.completions.with_raw_response.create(model="m", messages=history)
        reply = raw.parse().choices[0].message
        return raw.headers["X-Conversation-ID"], [*history, {"role": "assistant", "content": reply.content}]

    first_id, first = turn(task)
    first_id_again, first = turn([*first, {"role": "user", "content": "and test it"}])
    assert first_id_again == first_id and first_id.startswith("auto-")
    second_id, second = turn(task)  # the same agent, started again on the same task
    assert second_id == f"{first_id}.2"
    assert [m["status"] for m in trajectory(http, first_id)] == ["live"] * 5  # the first run is intact
    back_id, _ = turn([*first, {"role": "user", "content": "one more thing"}])  # the first run goes on
    assert back_id == first_id
    again_id, _ = turn([*second, {"role": "user", "content": "continue"}])
    assert again_id == second_id
    third_id, _ = turn(task)
    assert third_id == f"{first_id}.3"
    assert len(live_messages(http, first_id)) == 7 and len(live_messages(http, second_id)) == 5


def test_a_run_extended_past_its_first_user_message_is_named_by_it(make_proxy, upstream, tmp_path, caplog):
    """A run's derived id is kept with the body it came from, for the request that extends it;
    one whose basis changed on the way (its first request had no user message yet) is named as
    a fresh request of the same messages is, by a proxy that never saw the first."""
    caplog.set_level(logging.INFO, logger="proxy.access")
    client = openai_client(make_proxy(server={"fast_path": True}))

    def turn(messages: list[dict]) -> tuple[str, list[dict]]:
        raw = client.chat.completions.with_raw_response.create(model="m", messages=messages)
        return raw.headers["X-Conversation-ID"], [*messages, {"role": "assistant", "content": raw.parse().choices[0].message.content}]

    opened, history = turn([SYSTEM, {"role": "assistant", "content": "What shall I do?"}])
    tasked, history = turn([*history, {"role": "user", "content": "task: fix the bug"}])
    went_on, _ = turn([*history, {"role": "user", "content": "next"}])
    reasons = [r.fast_path_reason for r in caplog.records if r.name == "proxy.access"]
    assert "body_not_extended" not in reasons  # each body extended the one before
    fresh = openai_client(make_proxy(data_dir=tmp_path / "elsewhere")).chat.completions.with_raw_response.create(
        model="m", messages=history[:-1]
    )
    assert opened != tasked == went_on == fresh.headers["X-Conversation-ID"]
