"""Paths the proxy does not handle go upstream untouched; nothing about them is stored."""

from __future__ import annotations

from tests.conftest import ALICE, admin_get, openai_client


def test_models_pass_through_with_the_sdk(proxy, upstream):
    models = openai_client(proxy).models.list()
    assert "gpt-4o-mini" in [m.id for m in models.data]
    assert upstream.requests[-1].path == "/v1/models"


def test_any_other_path_method_query_and_body_pass_through(proxy, upstream, http):
    response = http.post(
        "/v1/embeddings?dimensions=3&x=%2F",
        content=b'{"input": "abc", "model": "e"}',
        headers={"Authorization": f"Bearer {ALICE}", "Content-Type": "application/json", "X-Custom": "kept"},
    )
    assert response.status_code == 200
    seen = upstream.requests[-1]
    assert (seen.method, seen.path) == ("POST", "/v1/embeddings")
    assert response.json()["query"] == {"dimensions": "3", "x": "/"}
    assert response.json()["body"] == '{"input": "abc", "model": "e"}'
    assert seen.headers["x-custom"] == "kept"
    assert seen.headers["authorization"] == f"Bearer {ALICE}"
    assert admin_get(http, "").json()["data"] == []


def test_conversation_prefix_is_stripped_for_other_paths(proxy, upstream, http):
    client = openai_client(proxy, base_url=f"{proxy.url}/c/my-run/v1")
    assert client.models.list().data
    assert upstream.requests[-1].path == "/v1/models"


def test_upstream_error_status_passes_through(proxy, upstream, http):
    response = http.get("/v1/models")  # no key: the upstream refuses
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


def test_fixed_upstream_key_replaces_the_clients(make_proxy, upstream):
    proxy = make_proxy(upstream={"api_key": "sk-upstream-own"})
    openai_client(proxy, "sk-client").chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert upstream.requests[-1].headers["authorization"] == "Bearer sk-upstream-own"
