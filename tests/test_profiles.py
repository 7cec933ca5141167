"""Profiles: per-agent settings for every stage, picked by header or by the model's entry."""

from __future__ import annotations

import httpx

from tests.conftest import ALICE

PROFILES = {
    "scout": {"context": {"history_token_limit": 200}, "truncation": {"max_tool_response_length": 500, "preview_length": 100}},
    "builder": {"context": {"history_token_limit": 50_000}, "quota": {"max_llm_calls": 7}},
}


def long_transcript(turns: int = 40) -> list[dict]:
    messages: list[dict] = [{"role": "system", "content": "agent"}]
    for i in range(turns):
        messages += [{"role": "user", "content": f"question {i} " + "detail " * 20}, {"role": "assistant", "content": f"answer {i} " + "words " * 20}]
    messages.append({"role": "user", "content": "last question"})
    return messages


def post(http: httpx.Client, headers: dict, model: str = "gpt-4o-mini", messages: list[dict] | None = None) -> httpx.Response:
    return http.post(
        "/v1/chat/completions",
        json={"model": model, "messages": messages or long_transcript()},
        headers={"Authorization": f"Bearer {ALICE}", **headers},
    )


def test_two_agents_with_different_limits_through_one_proxy(make_proxy, upstream):
    proxy = make_proxy(profiles=PROFILES, models={"scout-model": {"profile": "scout"}})
    with httpx.Client(base_url=proxy.url, auth=proxy.admin_auth) as http:
        scout = post(http, {"X-Context-Profile": "scout", "X-Conversation-ID": "a"})
        scout_sent = upstream.chat_requests()[-1]["messages"]
        builder = post(http, {"X-Context-Profile": "builder", "X-Conversation-ID": "b"})
        builder_sent = upstream.chat_requests()[-1]["messages"]
        by_model = post(http, {"X-Conversation-ID": "c"}, model="scout-model")
        by_model_sent = upstream.chat_requests()[-1]["messages"]

    assert len(builder_sent) == 82 and builder.headers["X-Context-Messages-Left-Out"] == "0"
    assert len(scout_sent) < 10 and int(scout.headers["X-Context-Messages-Left-Out"]) > 70
    # The scout's prompt: its newest messages and, as it left messages out, the recall tools (~210 tokens).
    assert int(scout.headers["X-Context-Tokens-Sent"]) < 500 < int(builder.headers["X-Context-Tokens-Sent"])
    assert builder.headers["X-LLM-Calls-Remaining"] == "6" and "X-LLM-Calls-Remaining" not in scout.headers
    assert by_model_sent == scout_sent and by_model.status_code == 200


def test_unknown_profile_is_a_400_and_stores_nothing(make_proxy, upstream):
    proxy = make_proxy(profiles=PROFILES)
    with httpx.Client(base_url=proxy.url, auth=proxy.admin_auth) as http:
        response = post(http, {"X-Context-Profile": "ghost"})
        assert response.status_code == 400 and response.json()["error"]["code"] == "unknown_profile"
        assert http.get("/v1/conversations").json()["data"] == []
    assert upstream.chat_requests() == []


def test_model_entry_sets_its_own_limit(make_proxy, upstream):
    proxy = make_proxy(models={"tiny": {"history_token_limit": 100}})
    with httpx.Client(base_url=proxy.url, auth=proxy.admin_auth) as http:
        response = post(http, {}, model="tiny")
    # The newest messages only, and the recall tools (~210 tokens) since messages were left out.
    assert int(response.headers["X-Context-Tokens-Sent"]) < 400
    assert int(response.headers["X-Context-Messages-Left-Out"]) > 70
