"""Issue 12's small ones, each against a real proxy: paths that climb out of the base URL,
`%3F` turned into a query, headers named in `Connection:`, credentials in `base_url`, and
admin paths no route of ours serves (they went upstream with the caller's Authorization)."""

from __future__ import annotations

import socket

import httpx
import pytest

from tests.conftest import ALICE
from tests.support.harness import ProxyProcess, wait_until, write_config

AUTH = {"Authorization": f"Bearer {ALICE}"}
TOKEN = "admin-token-5f0e9d2c7b1a4e38"


def raw_get(port: int, target: bytes) -> bytes:
    """GET `target` exactly as written (clients normalise `..` away before sending)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"GET " + target + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer " + ALICE.encode()
            + b"\r\nConnection: close\r\n\r\n"
        )
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    "target",
    [
        b"/v1/../../secret",
        b"/v1/files/../../secret",
        b"/v1/%2e%2e/%2E%2e/secret",
        b"/v1/files/..%2F..%2Fsecret",
        b"/v1/files/..;/..;/secret",
        b"/v1/files/..%5C..%5Csecret",
        b"/c/conv-1/v1/%2e%2e/%2e%2e/secret",
        b"http://evil.example/v1/models",
    ],
)
def test_a_passthrough_path_never_leaves_the_base_path(proxy, upstream, target):
    answer = raw_get(proxy.port, target)
    # (an absolute URL names another host, which the Host check refuses first)
    assert answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 403")), answer[:300]
    assert b'"invalid_path"' in answer or b'"host_not_allowed"' in answer
    assert upstream.requests == []


def test_an_encoded_question_mark_stays_in_the_path(proxy, upstream):
    answer = raw_get(proxy.port, b"/v1/files/report%3Fdownload=1/content?purpose=batch")
    assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    (seen,) = upstream.requests
    assert seen.path == "/v1/files/report?download=1/content"  # decoded by the fake: it came encoded
    assert seen.query == {"purpose": "batch"}
    dotted = raw_get(proxy.port, b"/v1/files/file-..x/a.b..c")  # dots inside a segment are fine
    assert dotted.startswith(b"HTTP/1.1 200"), dotted[:300]


def test_headers_named_in_connection_are_not_forwarded_either_way(make_proxy, upstream, raw_upstream_of):
    proxy = make_proxy()
    with httpx.Client(base_url=proxy.url, auth=proxy.admin_auth) as http:
        response = http.get(
            "/v1/files", headers={**AUTH, "Connection": "keep-alive, X-Hop-Secret", "X-Hop-Secret": "for the proxy"}
        )
    assert response.status_code == 200
    seen = upstream.requests[-1].headers
    assert "x-hop-secret" not in seen and seen["authorization"]
    body = b'{"object": "list", "data": []}'
    reply = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive, X-Upstream-Hop\r\n"
        b"X-Upstream-Hop: internal\r\nX-Kept: yes\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    relay = make_proxy(upstream_url=raw_upstream_of(reply))
    with httpx.Client(base_url=relay.url) as http:
        response = http.get("/v1/models", headers=AUTH)
    assert response.status_code == 200 and response.headers["x-kept"] == "yes"
    assert "x-upstream-hop" not in response.headers


def test_credentials_in_base_url_are_sent_as_basic_auth_and_never_logged(tmp_path, upstream):
    password = "s3cret-Upstream-Pass"
    base = upstream.base_url.replace("http://", f"http://gateway-user:{password}@")
    config = write_config(tmp_path / "config.yaml", upstream={"base_url": base}, storage={"path": str(tmp_path / "d")})
    proc = ProxyProcess(config, tmp_path / "proxy.log").start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{proc.port}", auth=proc.admin_auth, timeout=30) as http:
            http.post("/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": [
                {"role": "user", "content": "hi"}]}, headers=AUTH)
            http.get("/v1/models", headers=AUTH)
        assert len(upstream.requests) == 2
        assert all(r.headers["authorization"].startswith("Basic ") for r in upstream.requests)
        wait_until(lambda: proc.log_path.read_text().count('"request"') >= 2, what="the request log lines")
    finally:
        proc.stop()
    log = proc.log_path.read_text()
    assert password not in log and "gateway-user" not in log
    assert '"upstream": "http://***@127.0.0.1:' in log


def test_credentials_never_reach_an_unreachable_upstreams_error(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    base = f"http://user:s3cret-Pass@127.0.0.1:{port}/v1"
    config = write_config(tmp_path / "config.yaml", upstream={"base_url": base}, storage={"path": str(tmp_path / "d")})
    proc = ProxyProcess(config, tmp_path / "proxy.log").start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{proc.port}", auth=proc.admin_auth, timeout=30) as http:
            response = http.get("/v1/models", headers=AUTH)
        assert response.status_code == 502 and "s3cret" not in response.text
    finally:
        proc.stop()
    assert "s3cret" not in proc.log_path.read_text()


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/conversations/c1/unknown"),
        ("GET", "/v1/conversations/c1/messages/extra"),
        ("POST", "/v1/conversations"),
        ("PUT", "/v1/conversations/c1"),
        ("DELETE", "/v1/conversations"),
        ("POST", "/healthz"),
        ("DELETE", "/metrics"),
    ],
)
def test_unknown_paths_under_our_own_prefixes_are_ours_to_404(make_proxy, upstream, method, path):
    """Issue 12: an unknown path under /v1/conversations/ went upstream with its Authorization:
    the admin token left the machine."""
    proxy = make_proxy(admin={"token": TOKEN})
    with httpx.Client(base_url=proxy.url, auth=proxy.admin_auth) as http:
        response = http.request(method, path, json={}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 404, response.text
    assert response.json()["error"]["code"] == "not_found"
    assert upstream.requests == []


def test_base_url_credentials_and_api_key_together_stop_start_up():
    from proxy.config import ConfigError, load_settings

    with pytest.raises(ConfigError, match="upstream: .*credentials"):
        load_settings(None, upstream={"base_url": "http://u:p@gateway/v1", "api_key": "sk-x"})
