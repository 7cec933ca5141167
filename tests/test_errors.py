"""Bad input and upstream failures: OpenAI-shaped errors, and nothing stored or forwarded."""

from __future__ import annotations

import socket

import httpx
import pytest

from tests.conftest import ALICE, admin_get, live_messages, trajectory
from tests.fakes.fake_upstream import Reply

AUTH = {"Authorization": f"Bearer {ALICE}", "Content-Type": "application/json"}
OK_MESSAGES = [{"role": "user", "content": "hello"}]


def assert_openai_error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert {"message", "type", "code"} <= set(error)
    return error


def assert_nothing_stored(http: httpx.Client) -> None:
    listed = admin_get(http, "")
    assert listed.status_code == 200 and listed.json()["data"] == []


BAD_BODIES = {
    "not json": b"{not json",
    "json not an object": b'["a", "list"]',
    "messages missing": b'{"model": "m"}',
    "messages not a list": b'{"model": "m", "messages": {"role": "user"}}',
    "message not an object": b'{"model": "m", "messages": ["hi"]}',
    "unknown role": b'{"model": "m", "messages": [{"role": "wizard", "content": "x"}]}',
    "content wrong type": b'{"model": "m", "messages": [{"role": "user", "content": 42}]}',
    "content part without type": b'{"model": "m", "messages": [{"role": "user", "content": [{"text": "x"}]}]}',
    "name wrong type": b'{"model": "m", "messages": [{"role": "user", "content": "x", "name": 7}]}',
    "tool without call id": b'{"model": "m", "messages": [{"role": "tool", "content": "x"}]}',
    "tool_calls wrong type": b'{"model": "m", "messages": [{"role": "assistant", "tool_calls": "x"}]}',
    "tool call arguments not a string": (
        b'{"model": "m", "messages": [{"role": "assistant", "tool_calls": '
        b'[{"id": "c", "type": "function", "function": {"name": "f", "arguments": {}}}]}]}'
    ),
}


@pytest.mark.parametrize("name", BAD_BODIES)
def test_bad_body_is_a_400_and_changes_nothing(proxy, upstream, http, name):
    response = http.post("/v1/chat/completions", content=BAD_BODIES[name], headers=AUTH)
    assert_openai_error(response, 400)
    assert upstream.chat_requests() == []
    assert_nothing_stored(http)


# A bad message (second in the request) and the error that names it: (message, its message, its param).
BAD_MESSAGES = [
    ("hi", "messages[1] must be an object", "messages[1]"),
    ({"role": "wizard"}, ("messages[1].role must be one of ['assistant', 'developer', 'function', 'system', 'tool', "
                          "'user'], got 'wizard'"), "messages[1].role"),
    ({"role": "user", "content": 42}, "messages[1].content must be a string or an array of content parts",
     "messages[1].content"),
    ({"role": "user", "content": [{"text": "x"}]}, "messages[1].content parts must be objects with a 'type'",
     "messages[1].content"),
    ({"role": "user", "content": "x", "name": 7}, "messages[1].name must be a string", "messages[1].name"),
    ({"role": "tool", "content": "x"}, "messages[1].tool_call_id must be a string", "messages[1].tool_call_id"),
    ({"role": "assistant", "tool_calls": "x"}, "messages[1].tool_calls must be an array", "messages[1].tool_calls"),
    ({"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f"}}, {"id": "d", "function": {"name": 1}}]},
     "messages[1].tool_calls[1] must have a string 'id' and 'function' with string 'name' and 'arguments'",
     "messages[1].tool_calls[1]"),
]


@pytest.mark.parametrize(("message", "text", "param"), BAD_MESSAGES)
def test_a_bad_message_is_named_in_the_error(proxy, upstream, http, message, text, param):
    response = http.post("/v1/chat/completions", json={"model": "m", "messages": [OK_MESSAGES[0], message]}, headers=AUTH)
    error = assert_openai_error(response, 400)
    assert (error["message"], error["param"]) == (text, param)
    assert upstream.chat_requests() == []


BAD_IDS = ["x" * 129, "has space", "slash/inside", "../../etc/passwd", "..", "semi;colon", "ünïcode", ""]


@pytest.mark.parametrize("bad_id", BAD_IDS)
def test_bad_conversation_id_header_is_a_400(proxy, upstream, http, bad_id):
    response = http.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": OK_MESSAGES},
        headers={**AUTH, "X-Conversation-ID": bad_id.encode()},  # raw bytes: httpx sends them as they are
    )
    assert assert_openai_error(response, 400)["code"] == "invalid_conversation_id"
    assert upstream.chat_requests() == []
    assert_nothing_stored(http)


@pytest.mark.parametrize("bad_path_id", ["%2e%2e%2fsecrets", "a%20b", "x" * 129, "%2E%2E"])
def test_bad_conversation_id_in_path_is_a_400(proxy, upstream, http, bad_path_id):
    response = http.post(f"/c/{bad_path_id}/v1/chat/completions", json={"model": "m", "messages": OK_MESSAGES}, headers=AUTH)
    assert_openai_error(response, 400)
    assert upstream.chat_requests() == []
    assert_nothing_stored(http)


def test_body_over_the_limit_is_a_413(make_proxy, upstream):
    proxy = make_proxy(server={"max_body_mb": 0.01})
    with httpx.Client(base_url=proxy.url, auth=proxy.admin_auth) as http:
        big = {"model": "m", "messages": [{"role": "user", "content": "x" * 20_000}]}
        assert_openai_error(http.post("/v1/chat/completions", json=big, headers=AUTH), 413)
        assert upstream.chat_requests() == []
        assert_nothing_stored(http)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens here once the socket is closed


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_unreachable_is_a_502(make_proxy, stream):
    proxy = make_proxy(upstream_url=f"http://127.0.0.1:{_closed_port()}/v1")
    with httpx.Client(base_url=proxy.url, auth=proxy.admin_auth) as http:
        body = {"model": "m", "messages": OK_MESSAGES, "stream": stream}
        response = http.post("/v1/chat/completions", json=body, headers={**AUTH, "X-Conversation-ID": "down"})
        assert assert_openai_error(response, 502)["code"] == "upstream_unreachable"
        assert live_messages(http, "down") == []
        assert [m["status"] for m in trajectory(http, "down")] == ["failed"]


@pytest.mark.parametrize("stream", [False, True])
def test_upstream_silent_past_the_timeout_is_a_504(make_proxy, upstream, stream):
    proxy = make_proxy(upstream={"timeout_s": 0.3})
    hang = Reply.hang()
    upstream.enqueue(hang)
    with httpx.Client(base_url=proxy.url, timeout=30, auth=proxy.admin_auth) as http:
        body = {"model": "m", "messages": OK_MESSAGES, "stream": stream}
        response = http.post("/v1/chat/completions", json=body, headers={**AUTH, "X-Conversation-ID": "silent"})
        assert assert_openai_error(response, 504)["code"] == "upstream_timeout"
        assert live_messages(http, "silent") == []
    hang.release()


@pytest.mark.parametrize("status", [400, 401, 404, 429, 500, 503])
def test_upstream_error_passes_through_with_its_body(proxy, upstream, http, status):
    body = {"error": {"message": f"upstream says {status}", "type": "whatever", "code": "their_code"}}
    upstream.enqueue(Reply.error(status, body))
    response = http.post(
        "/v1/chat/completions", json={"model": "m", "messages": OK_MESSAGES}, headers={**AUTH, "X-Conversation-ID": "e"}
    )
    assert response.status_code == status
    assert response.json() == body
    assert live_messages(http, "e") == []


def test_missing_api_key_is_refused_by_the_upstream_and_passed_back(proxy, upstream, http):
    response = http.post("/v1/chat/completions", json={"model": "m", "messages": OK_MESSAGES})
    assert_openai_error(response, 401)


def test_unknown_history_mode_is_a_400(proxy, upstream, http):
    response = http.post(
        "/v1/chat/completions", json={"model": "m", "messages": OK_MESSAGES}, headers={**AUTH, "X-History": "sideways"}
    )
    assert_openai_error(response, 400)
    assert_nothing_stored(http)


def test_deeply_nested_json_is_a_clean_400(proxy, upstream, http):
    response = http.post("/v1/chat/completions", content=b"[" * 100_000 + b"]" * 100_000, headers=AUTH)
    assert_openai_error(response, 400)
    assert_nothing_stored(http)
