"""The admin API: list, show, messages, trajectory, delete; who may see what."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import ALICE, BOB, admin_get, openai_client

TOKEN = "admin-token-for-tests"


def make_conversations(proxy, key: str, ids: list[str]) -> None:
    for cid in ids:
        client = openai_client(proxy, key, headers={"X-Conversation-ID": cid})
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": f"hello {cid}"}])


def test_list_show_messages_trajectory_delete(proxy, upstream, http):
    make_conversations(proxy, ALICE, ["c1", "c2", "c3"])
    listed = admin_get(http, "").json()
    assert listed["object"] == "list" and listed["has_more"] is False
    assert [c["id"] for c in listed["data"]] == ["c3", "c2", "c1"]  # newest first

    shown = admin_get(http, "/c2").json()
    assert shown["id"] == "c2" and shown["object"] == "conversation" and shown["message_count"] == 2

    messages = admin_get(http, "/c2/messages").json()
    assert [(m["seq"], m["role"], m["content"]) for m in messages["data"]] == [
        (1, "user", "hello c2"), (2, "assistant", "reply to: hello c2"),
    ]
    assert all("created_at" in m and "status" not in m for m in messages["data"])
    trajectory = admin_get(http, "/c2/trajectory").json()
    assert [m["status"] for m in trajectory["data"]] == ["live", "live"]
    assert trajectory["summaries"] == []

    deleted = http.delete("/v1/conversations/c2")
    assert deleted.json() == {"id": "c2", "object": "conversation.deleted", "deleted": True}
    assert admin_get(http, "/c2").status_code == 404
    assert [c["id"] for c in admin_get(http, "").json()["data"]] == ["c3", "c1"]


def test_cursor_pagination(proxy, upstream, http):
    make_conversations(proxy, ALICE, [f"p{i}" for i in range(5)])
    first = admin_get(http, "", limit=2).json()
    assert [c["id"] for c in first["data"]] == ["p4", "p3"] and first["has_more"] is True
    second = admin_get(http, "", limit=2, after=first["last_id"]).json()
    assert [c["id"] for c in second["data"]] == ["p2", "p1"] and second["has_more"] is True
    third = admin_get(http, "", limit=2, after=second["last_id"]).json()
    assert [c["id"] for c in third["data"]] == ["p0"] and third["has_more"] is False

    msgs = admin_get(http, "/p0/messages", limit=1).json()
    assert [m["seq"] for m in msgs["data"]] == [1] and msgs["has_more"] is True
    rest = admin_get(http, "/p0/messages", limit=1, after=msgs["last_id"]).json()
    assert [m["seq"] for m in rest["data"]] == [2] and rest["has_more"] is False


@pytest.mark.parametrize("query", [{"limit": "0"}, {"limit": "x"}, {"limit": "1001"}])
def test_bad_pagination_is_a_400(proxy, upstream, http, query):
    make_conversations(proxy, ALICE, ["q"])
    assert admin_get(http, "/q/messages", **query).status_code == 400


def test_admin_token_is_required_when_set(make_proxy, upstream):
    proxy = make_proxy(admin={"token": TOKEN})
    make_conversations(proxy, ALICE, ["secured"])
    with httpx.Client(base_url=proxy.url) as http:
        # Loopback alone no longer makes an admin once a token is set.
        assert admin_get(http, "").status_code == 401
        assert admin_get(http, "", "wrong-token").json()["data"] == []  # any other Bearer is a client key
        assert [c["id"] for c in admin_get(http, "", TOKEN).json()["data"]] == ["secured"]
        assert [c["id"] for c in admin_get(http, "", ALICE).json()["data"]] == ["secured"]
        assert admin_get(http, "/secured", BOB).status_code == 404


def test_client_key_sees_only_its_own_conversations(proxy, upstream, http):
    make_conversations(proxy, ALICE, ["a1", "a2"])
    make_conversations(proxy, BOB, ["b1"])
    assert [c["id"] for c in admin_get(http, "", ALICE).json()["data"]] == ["a2", "a1"]
    assert [c["id"] for c in admin_get(http, "", BOB).json()["data"]] == ["b1"]
    assert admin_get(http, "/b1/messages", ALICE).status_code == 404
    assert len(admin_get(http, "").json()["data"]) == 3  # loopback admin sees every tenant


def test_same_id_in_two_tenants_needs_a_tenant_for_the_admin(proxy, upstream, http):
    make_conversations(proxy, ALICE, ["shared-name"])
    make_conversations(proxy, BOB, ["shared-name"])
    assert admin_get(http, "/shared-name").status_code == 400
    tenant = admin_get(http, "", ALICE).json()["data"][0]["tenant"]
    shown = admin_get(http, "/shared-name", tenant=tenant)
    assert shown.status_code == 200 and shown.json()["tenant"] == tenant


@pytest.mark.parametrize(
    "remote, token_set, expected",
    [("127.0.0.1", False, "admin"), ("::1", False, "admin"), ("10.1.2.3", False, 401), ("10.1.2.3", True, 401)],
)
def test_no_bearer_is_admin_only_from_loopback_without_a_token(remote, token_set, expected):
    from aiohttp.test_utils import make_mocked_request

    from proxy.api.admin import ALL_TENANTS, caller_scope
    from proxy.config import load_settings
    from proxy.errors import Unauthorized
    from proxy.state import SETTINGS

    app = {SETTINGS: load_settings(None, admin={"token": TOKEN if token_set else None})}
    request = make_mocked_request("GET", "/v1/conversations", app=app).clone(remote=remote)
    if expected == "admin":
        assert caller_scope(request) is ALL_TENANTS
    else:
        with pytest.raises(Unauthorized):
            caller_scope(request)


def test_turn_records_say_what_went_upstream(make_proxy, upstream):
    proxy = make_proxy(context={"history_token_limit": 400}, quota={"max_llm_calls": 9})
    client = openai_client(proxy, headers={"X-Conversation-ID": "turns"})
    messages = [{"role": "system", "content": "s"}]
    for i in range(4):
        messages.append({"role": "user", "content": f"question {i} " + "word " * (30 if i < 3 else 200)})
        messages.append(client.chat.completions.create(model="m", messages=messages).choices[0].message.model_dump(include={"role", "content"}))
    with httpx.Client(base_url=proxy.url) as http:
        records = http.get("/v1/conversations/turns/turns").json()["data"]
    assert [r["turn"] for r in records] == [1, 2, 3, 4]
    assert [r["llm_calls"] for r in records] == [1, 2, 3, 4]
    assert records[0]["sent_seqs"] == [1, 2] and records[0]["messages_left_out"] == 0
    # The window dropped old turns but pinned the task (seq 2); the dropped questions went into a note.
    assert records[3]["sent_seqs"][:2] == [1, 2] and 4 not in records[3]["sent_seqs"]
    assert records[3]["messages_left_out"] > 0
    note = upstream.chat_requests()[-1]["messages"][1]
    assert note["role"] == "system" and "question 1" in note["content"]
    assert all(r["status"] == "live" and r["reply_seq"] for r in records)
