"""What a web page can make a browser send, against a real proxy on loopback: DNS rebinding
(a foreign Host), cross-site "simple" requests (text/plain POSTs, no preflight), preflights, and
CORS for the origins the settings name. Nothing refused is stored or forwarded."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest
from aiohttp import web

from tests.conftest import ALICE
from tests.support.harness import LoopThread

AUTH = {"Authorization": f"Bearer {ALICE}"}
CHAT = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "a page's words"}]}
EVIL = "http://attacker.example:8080"


def seed(http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", json=CHAT, headers={**AUTH, "X-Conversation-ID": "mine"})
    assert response.status_code == 200, response.text


def conversations(http: httpx.Client) -> list[str]:
    return [c["id"] for c in http.get("/v1/conversations").json()["data"]]


def assert_refused(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert "a page's words" not in response.text and "mine" not in response.text


def test_a_rebinding_page_reads_no_tenant(proxy, upstream, http):
    """Issue 12: with no admin token, GET /v1/conversations with Host: attacker.example from
    loopback answered every tenant's conversations."""
    seed(http)
    for path in ("/v1/conversations", "/v1/conversations/mine/messages", "/metrics", "/ui/", "/healthz"):
        assert_refused(http.get(path, headers={"Host": "attacker.example:8080"}), 403, "host_not_allowed")
        assert http.get(path, headers={"Host": f"localhost:{proxy.port}"}).status_code == 200, path
    # Listening on loopback, no other name reaches the proxy legitimately: no route serves one.
    before = len(upstream.requests)
    for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("POST", "/v1/embeddings")):
        response = http.request(method, path, json=CHAT, headers={**AUTH, "Host": "attacker.example"})
        assert_refused(response, 403, "host_not_allowed")
    assert len(upstream.requests) == before
    assert conversations(http) == ["mine"]


def test_allowed_hosts_names_more_hosts(make_proxy):
    proxy = make_proxy(server={"allowed_hosts": ["proxy.internal"]})
    with httpx.Client(base_url=proxy.url, auth=proxy.admin_auth) as http:
        assert http.get("/v1/conversations", headers={"Host": "proxy.internal:8080"}).status_code == 200
        assert http.get("/v1/conversations", headers={"Host": "[::1]:8080"}).status_code == 200
        assert http.get("/v1/conversations", headers={"Host": "127.0.0.2"}).status_code == 200
        assert_refused(http.get("/v1/conversations", headers={"Host": "other.internal"}), 403, "host_not_allowed")


def test_on_a_public_address_only_the_token_less_admin_checks_the_host(make_proxy):
    """Bound to 0.0.0.0 (Docker), clients name the proxy as they like; only the token-less admin
    API, /ui and /metrics, which serve loopback clients every tenant, insist on localhost."""
    proxy = make_proxy(server={"host": "0.0.0.0"})  # the setting only: the test server still binds loopback
    with httpx.Client(base_url=proxy.url, auth=proxy.admin_auth) as http:
        assert http.post("/v1/chat/completions", json=CHAT, headers={**AUTH, "Host": "proxy:8080"}).status_code == 200
        assert_refused(http.get("/v1/conversations", headers={"Host": "proxy:8080"}), 403, "host_not_allowed")
    tokened = make_proxy(server={"host": "0.0.0.0"}, admin={"token": "admin-token-0123456789"})
    with httpx.Client(base_url=tokened.url) as http:
        response = http.get(
            "/v1/conversations", headers={"Host": "proxy:8080", "Authorization": "Bearer admin-token-0123456789"}
        )
        assert response.status_code == 200


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/c/page-conv/v1/chat/completions"])
def test_a_cross_site_text_plain_post_is_neither_stored_nor_forwarded(proxy, upstream, http, path):
    """Issue 12: a text/plain POST from another origin (no preflight) was parsed as JSON, stored
    and forwarded with the proxy's upstream.api_key."""
    seed(http)
    before = len(upstream.requests)
    text_plain = {"Content-Type": "text/plain;charset=UTF-8"}
    body = json.dumps(CHAT)
    assert_refused(http.post(path, content=body, headers={**text_plain, "Origin": EVIL}), 403, "cross_origin_refused")
    assert_refused(http.post(path, content=body, headers={**AUTH, **text_plain}), 415, "unsupported_media_type")
    assert_refused(http.post(path, json=CHAT, headers={**AUTH, "Origin": "null"}), 403, "cross_origin_refused")
    assert len(upstream.requests) == before
    assert conversations(http) == ["mine"]
    # The proxy's own origin is no cross-site request.
    same = http.post(path, json=CHAT, headers={**AUTH, "Origin": proxy.url, "X-Conversation-ID": "same"})
    assert same.status_code == 200, same.text


@pytest.mark.parametrize(
    "path",
    ["/v1/responses", "/v1/messages", "/v1/messages/count_tokens", "/c/x/v1/responses", "/chat/completions"],
)
def test_every_managed_route_wants_json(proxy, upstream, http, path):
    before = len(upstream.requests)
    for response in (
        http.post(path, content=b"{}", headers={**AUTH, "Content-Type": "text/plain"}),
        http.post(path, content=b"{}", headers=AUTH),  # none at all
    ):
        if "/messages" in path:  # in the shape of the client's API: Anthropic's has no code
            assert response.status_code == 415 and response.json()["type"] == "error", response.text
            assert response.json()["error"]["message"].startswith("Content-Type must be application/json")
        else:
            assert_refused(response, 415, "unsupported_media_type")
    assert len(upstream.requests) == before


def test_admin_posts_want_json_and_passthrough_uploads_are_untouched(proxy, upstream, http):
    response = http.post("/v1/conversations/mine/inbox", content=b"hi", headers={"Content-Type": "text/plain"})
    assert_refused(response, 415, "unsupported_media_type")
    upload = http.post("/v1/files", files={"file": ("a.jsonl", b'{"x": 1}\n')}, data={"purpose": "batch"}, headers=AUTH)
    assert upload.status_code == 200, upload.text
    assert upload.json()["headers_seen"]["content-type"].startswith("multipart/form-data")


def test_cross_origin_deletes_and_reads_are_refused(proxy, upstream, http):
    seed(http)
    assert_refused(http.delete("/v1/conversations/mine", headers={"Origin": EVIL}), 403, "cross_origin_refused")
    assert_refused(http.get("/v1/conversations", headers={"Origin": EVIL}), 403, "cross_origin_refused")
    assert_refused(http.get("/v1/models", headers={**AUTH, "Origin": EVIL}), 403, "cross_origin_refused")
    assert conversations(http) == ["mine"]


def test_options_of_our_routes_are_ours_and_grant_no_cors(proxy, upstream, http):
    """Issue 12: OPTIONS on admin routes went to the upstream, so an upstream allowing CORS let
    a page DELETE conversations."""
    before = len(upstream.requests)
    for path in ("/v1/conversations/mine", "/v1/chat/completions", "/ui/", "/metrics", "/v1/models"):
        preflight = http.options(
            path, headers={"Origin": "http://localhost:3000", "Access-Control-Request-Method": "DELETE"}
        )
        assert preflight.status_code == 403  # an origin nobody named: refused outright
        plain = http.options(path)
        assert plain.status_code == 204 or path == "/v1/models", (path, plain.status_code)
        assert not [h for h in plain.headers if h.lower().startswith("access-control-")]
    assert [r.path for r in upstream.requests[before:]] == ["/v1/models"]  # not ours: its OPTIONS goes on


def test_cors_origins_get_cors_and_an_upstreams_own_cors_is_dropped(make_proxy, cors_upstream):
    page = "http://localhost:3000"
    proxy = make_proxy(upstream_url=cors_upstream, server={"cors_origins": [page]})
    with httpx.Client(base_url=proxy.url, auth=proxy.admin_auth) as http:
        preflight = http.options(
            "/v1/conversations",
            headers={"Origin": page, "Access-Control-Request-Method": "GET", "Access-Control-Request-Headers": "authorization"},
        )
        assert preflight.status_code == 204
        assert preflight.headers["access-control-allow-origin"] == page
        assert "authorization" in preflight.headers["access-control-allow-headers"]
        listed = http.get("/v1/conversations", headers={"Origin": page})
        assert listed.status_code == 200 and listed.headers["access-control-allow-origin"] == page
        passed = http.get("/v1/models", headers={**AUTH, "Origin": page})
        assert passed.status_code == 200 and passed.headers["access-control-allow-origin"] == page
        without = http.get("/v1/models", headers=AUTH)  # the upstream's "*" never reaches a browser
        assert without.status_code == 200 and "access-control-allow-origin" not in without.headers


@pytest.fixture
def cors_upstream(servers: LoopThread) -> Iterator[str]:
    """An upstream that allows every origin (as OpenAI's API does)."""

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []}, headers={"Access-Control-Allow-Origin": "*"})

    async def start() -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/v1/models", models)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner

    runner = servers.run(start())
    yield f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    servers.run(runner.cleanup())


def raw_request(port: int, request: bytes) -> bytes:
    """Send raw bytes, return the whole answer (the server closes: Connection: close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize("path", [b"/v1/chat/completions", b"/v1/conversations", b"/v1/models"])
def test_a_non_utf8_authorization_is_a_401_not_a_500(proxy, upstream, path):
    """Issue 12: a non-UTF-8 Authorization header was a 500."""
    before = len(upstream.requests)
    answer = raw_request(
        proxy.port,
        b"POST " + path + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer sk-\xff\xfe\xfd\r\n"
        b"Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
    )
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert b'"invalid_api_key"' in answer
    other = raw_request(
        proxy.port,
        b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Note: \xc3\x28\r\nConnection: close\r\n\r\n",
    )
    assert other.startswith(b"HTTP/1.1 400") and b'"invalid_header"' in other
    assert len(upstream.requests) == before
