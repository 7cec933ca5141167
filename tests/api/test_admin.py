"""The admin API: list, show, messages, trajectory, delete; who may see what."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.conftest import ALICE, BOB, admin_get, leave_mid_stream, openai_client
from tests.fakes.fake_upstream import Reply

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
        # Loopback alone makes no admin.
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


def test_turn_records_say_what_went_upstream(make_proxy, upstream):
    proxy = make_proxy(context={"history_token_limit": 700}, quota={"max_llm_calls": 9})
    client = openai_client(proxy, headers={"X-Conversation-ID": "turns"})
    messages = [{"role": "system", "content": "s"}]
    for i in range(4):
        messages.append({"role": "user", "content": f"question {i} " + "word " * (30 if i < 3 else 550)})
        messages.append(client.chat.completions.create(model="m", messages=messages).choices[0].message.model_dump(include={"role", "content"}))
    with httpx.Client(base_url=proxy.url, auth=proxy.admin_auth) as http:
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


# -- readable conversations: titles, search, failures ----------------------------------------------


def start(proxy, task: str, key: str = ALICE, **headers: str) -> str:
    """A new conversation whose id is derived (nothing in it names the task); returns that id."""
    client = openai_client(proxy, key, headers=headers or None)
    reply = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=[{"role": "user", "content": task}])
    return reply.headers["X-Conversation-ID"]


def test_a_conversation_is_titled_by_its_task_its_header_or_a_patch(proxy, upstream, http):
    ledger = start(proxy, "<environment_context>\n  <cwd>/srv</cwd>\n</environment_context>\nreconcile the ledger")
    named = start(proxy, "import the nightly batch", **{"X-Conversation-Title": "Nightly import"})
    assert "x-conversation-title" not in upstream.requests[-1].headers  # ours: never forwarded
    shown = admin_get(http, f"/{ledger}").json()
    assert shown["title"] == shown["task"] == "reconcile the ledger"  # the agent's wrapped block left out
    assert (shown["model"], shown["turns"], shown["failures"], shown["last_error"]) == ("gpt-4o-mini", 1, 0, None)
    assert shown["client"].startswith("OpenAI Python SDK ")
    assert admin_get(http, f"/{named}").json()["title"] == "Nightly import"

    patched = http.patch(f"/v1/conversations/{ledger}", json={"title": "  Q3 books  "})
    assert patched.status_code == 200 and patched.json()["title"] == "Q3 books"
    assert admin_get(http, f"/{ledger}").json()["title"] == "Q3 books"
    assert http.patch(f"/v1/conversations/{ledger}", json={"title": None}).json()["title"] == "reconcile the ledger"


@pytest.mark.parametrize(
    ("body", "headers", "problem"),
    [
        ({"title": "x" * 201}, {}, "at most 200 characters"),
        ({"title": 7}, {}, "must be a string or null"),
        ({"title": "a\x07b"}, {}, "control characters"),
        ({"title": "t", "task": "t"}, {}, "only the title can be changed"),
        (None, {"Content-Type": "application/json"}, "not valid JSON"),
        (None, {"Content-Type": "text/plain"}, "application/json"),  # refused by the guard (415)
    ],
)
def test_a_bad_patch_is_refused_and_changes_nothing(proxy, upstream, http, body, headers, problem):
    cid = start(proxy, "the task")
    kwargs = {"json": body} if body is not None else {"content": b'{"title": '}
    answer = http.patch(f"/v1/conversations/{cid}", headers=headers, **kwargs)
    assert answer.status_code == (415 if "text/plain" in headers.values() else 400)
    assert problem in answer.json()["error"]["message"]
    assert admin_get(http, f"/{cid}").json()["title"] == "the task"


def test_only_its_own_tenant_can_rename_a_conversation(proxy, upstream, http):
    cid = start(proxy, "alice's task")
    assert http.patch(f"/v1/conversations/{cid}", json={"title": "bob's now"}, headers={"Authorization": f"Bearer {BOB}"}).status_code == 404
    assert http.patch("/v1/conversations/no-such-one", json={"title": "x"}).status_code == 404
    assert admin_get(http, f"/{cid}").json()["title"] == "alice's task"


def test_a_title_header_that_is_too_long_is_a_400_and_stores_nothing(proxy, upstream, http):
    response = http.post(
        "/v1/chat/completions",
        json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]},
        headers={"Authorization": f"Bearer {ALICE}", "X-Conversation-Title": "t" * 201},
    )
    assert response.status_code == 400 and "X-Conversation-Title" in response.json()["error"]["message"]
    assert admin_get(http, "").json()["data"] == [] and upstream.requests == []


def test_search_matches_every_word_in_title_task_model_or_client(proxy, upstream, http):
    ledger = start(proxy, "reconcile the quarterly ledger")
    notes = start(proxy, "write the release notes", **{"X-Conversation-Title": "Ledger-free notes"})
    other = start(proxy, "plan the offsite", BOB)
    assert [c["id"] for c in admin_get(http, "", q="LEDGER").json()["data"]] == [notes, ledger]
    assert [c["id"] for c in admin_get(http, "", q="quarterly ledger").json()["data"]] == [ledger]
    assert [c["id"] for c in admin_get(http, "", q="offsite gpt-4o-mini openai").json()["data"]] == [other]  # task, model, client
    assert admin_get(http, "", q="ledger", api_key=BOB).json()["data"] == []  # a client key searches its own only
    first = admin_get(http, "", q="ledger", limit=1).json()
    assert [c["id"] for c in first["data"]] == [notes] and first["has_more"] and first["next_after"] == notes
    second = admin_get(http, "", q="ledger", limit=1, after=first["next_after"]).json()
    assert [c["id"] for c in second["data"]] == [ledger] and not second["has_more"] and second["next_after"] is None
    assert admin_get(http, "", q="x" * 201).status_code == 400


def test_failed_turns_are_kept_with_their_error_and_listed_apart(make_proxy, upstream):
    proxy = make_proxy(quota={"max_llm_calls": 2})
    fine = start(proxy, "a task that goes well")
    upstream.enqueue(Reply.error(503, {"error": {"message": "The model is overloaded", "type": "server_error"}}))
    client = openai_client(proxy, headers={"X-Conversation-ID": "bumpy"})
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "try"}])
    client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "try"}])
    with pytest.raises(openai.RateLimitError):  # the quota: the proxy's own refusal
        client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "try again"}])
    with httpx.Client(base_url=proxy.url, auth=proxy.admin_auth) as http:
        records = http.get("/v1/conversations/bumpy/turns").json()["data"]
        assert [(r["status"], r["error"]) for r in records] == [
            ("failed", {"status": 503, "message": "The model is overloaded", "source": "upstream"}),
            ("live", None),
            ("failed", {"status": 429, "message": records[2]["error"]["message"], "source": "proxy"}),
        ]
        assert "quota.max_llm_calls" in records[2]["error"]["message"]
        assert records[1]["usage"]["input_tokens"] > 0 and records[1]["client"].startswith("OpenAI Python SDK ")
        shown = http.get("/v1/conversations/bumpy").json()
        assert shown["failures"] == 2 and shown["last_error"]["turn"] == 3 and shown["last_error"]["status"] == 429
        assert [c["id"] for c in http.get("/v1/conversations", params={"failed": "true"}).json()["data"]] == ["bumpy"]
        assert {c["id"] for c in http.get("/v1/conversations").json()["data"]} == {"bumpy", fine}
        assert http.get("/v1/conversations", params={"failed": "maybe"}).status_code == 400


def test_a_stream_that_breaks_off_keeps_its_error_with_the_turn(proxy, upstream, http):
    upstream.enqueue(Reply.text("a long answer that never ends well").failing_after(3))
    client = openai_client(proxy, headers={"X-Conversation-ID": "broken"})
    with pytest.raises(openai.APIError):
        for _ in client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "go"}], stream=True):
            pass
    [record] = admin_get(http, "/broken/turns").json()["data"]
    assert record["status"] == "failed" and record["error"]["source"] == "upstream"
    assert record["error"]["status"] == 502 and "stream" in record["error"]["message"]
    assert admin_get(http, "/broken").json()["failures"] == 1


def test_a_client_that_leaves_mid_stream_leaves_an_incomplete_turn_not_a_failure(proxy, upstream, http):
    reply, _ = leave_mid_stream(http, upstream, "walked-away", "a long answer the client stops reading")
    upstream.enqueue(Reply.text("ok"))  # the next turn waits for the first to end: its record is kept by then
    body = {"model": "m", "messages": [{"role": "user", "content": "go"}]}
    headers = {"Authorization": f"Bearer {ALICE}", "X-Conversation-ID": "walked-away"}
    assert http.post("/v1/chat/completions", json=body, headers=headers).status_code == 200
    reply.release()
    first, second = admin_get(http, "/walked-away/turns").json()["data"]
    # The turn's messages joined the transcript (the upstream took it); its reply is incomplete.
    assert first["status"] == second["status"] == "live" and second["error"] is None
    assert [m["status"] for m in admin_get(http, "/walked-away/trajectory").json()["data"]][:2] == ["live", "incomplete"]
    assert first["error"] == {"status": None, "message": "The client went away before the reply was complete", "source": "client"}
    shown = admin_get(http, "/walked-away").json()
    assert shown["failures"] == 0 and shown["last_error"] is None  # the client's choice, not a failure
    assert admin_get(http, "", failed="true").json()["data"] == []
