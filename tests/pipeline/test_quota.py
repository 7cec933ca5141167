"""The LLM-call quota: figures in tool messages, fixed at first forwarding; reject and warn."""

from __future__ import annotations

import json

from tests.conftest import ALICE, live_messages


def ask(http, cid: str, messages: list[dict]):
    return http.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": messages},
        headers={"Authorization": f"Bearer {ALICE}", "X-Conversation-ID": cid},
    )


def tool_turn(n: int, content: str) -> list[dict]:
    call = f"call_{n}"
    return [
        {"role": "assistant", "content": None, "tool_calls": [{"id": call, "type": "function", "function": {"name": "probe", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": call, "content": content},
    ]


def test_tool_messages_carry_the_figures_of_their_first_forwarding(make_proxy, upstream):
    proxy = make_proxy(quota={"max_llm_calls": 5})
    import httpx

    with httpx.Client(base_url=proxy.url, auth=proxy.admin_auth) as http:
        history = [{"role": "user", "content": "go"}] + tool_turn(1, json.dumps({"status": "ok"}))
        first = ask(http, "q", history)
        assert first.headers["X-LLM-Calls-Remaining"] == "4"
        sent = upstream.chat_requests()[-1]["messages"][2]["content"]
        assert json.loads(sent) == {"status": "ok", "_quota_info": {"used": 1, "remaining": 4, "limit": 5}}

        history += [{"role": "assistant", "content": "reply to: go"}] + tool_turn(2, "plain text output")
        ask(http, "q", history)
        sent_messages = upstream.chat_requests()[-1]["messages"]
        assert sent_messages[2]["content"] == sent  # the same bytes as on its first forwarding
        assert sent_messages[5]["content"] == "plain text output\n\n[You have 3 LLM calls remaining (used 2 of 5).]"
        # What is stored is what the client sent.
        assert live_messages(http, "q")[2]["content"] == json.dumps({"status": "ok"})


def test_exhausted_quota_rejects_with_429_and_stores_nothing_live(make_proxy, upstream):
    proxy = make_proxy(quota={"max_llm_calls": 2})
    import httpx

    with httpx.Client(base_url=proxy.url, auth=proxy.admin_auth) as http:
        history = [{"role": "user", "content": "one"}]
        for text in ("two", "three"):
            assert ask(http, "r", history).status_code == 200
            history += [{"role": "assistant", "content": f"reply to: {history[-1]['content']}"}, {"role": "user", "content": text}]
        before = live_messages(http, "r")
        calls_before = len(upstream.chat_requests())
        rejected = ask(http, "r", history)
        assert rejected.status_code == 429
        assert rejected.json()["error"]["code"] == "llm_call_quota_exceeded"
        assert len(upstream.chat_requests()) == calls_before
        assert live_messages(http, "r") == before


def test_warn_forwards_with_a_warning(make_proxy, upstream):
    proxy = make_proxy(quota={"max_llm_calls": 1, "on_exhausted": "warn"})
    import httpx

    with httpx.Client(base_url=proxy.url, auth=proxy.admin_auth) as http:
        history = [{"role": "user", "content": "one"}]
        assert "X-Quota-Warning" not in ask(http, "w", history).headers
        history += [{"role": "assistant", "content": "reply to: one"}, {"role": "user", "content": "two"}] + []
        second = ask(http, "w", history)
        assert second.status_code == 200
        assert "quota exhausted" in second.headers["X-Quota-Warning"]
        assert second.headers["X-LLM-Calls-Remaining"] == "0"


def test_truncation_marker_tells_the_calls_remaining(make_proxy, upstream):
    proxy = make_proxy(quota={"max_llm_calls": 10})
    import httpx

    with httpx.Client(base_url=proxy.url, auth=proxy.admin_auth) as http:
        ask(http, "tq", [{"role": "user", "content": "go"}] + tool_turn(1, "x" * 20_000))
        sent = upstream.chat_requests()[-1]["messages"][2]["content"]
        assert "You have 9 LLM calls remaining (used 1 of 10).]" in sent
        assert "_quota_info" not in sent
