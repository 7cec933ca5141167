"""A security review, as tests: tenant isolation across replicas, unguessable refs and ids, the
admin API's auth, secrets that must never be stored or logged, and hostile request bodies.
"""

from __future__ import annotations

import gzip
import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis as redis_sync

from proxy.messages import MAX_DEPTH, too_deep
from tests.conftest import ALICE, BOB
from tests.fakes.fake_upstream import FakeUpstream, Reply, default_responder
from tests.support.harness import ProxyProcess, chat, peak_rss_kb, stored_form

TOKEN = "admin-token-7d1c0b9e55aa41f3"
SYSTEM = {"role": "system", "content": "You are a coding agent."}
ALICE_DATA = "ALICE-CONFIDENTIAL-" * 800  # 15,200 characters: shortened upstream, kept whole in the store


JSON = {"Content-Type": "application/json"}


def auth(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def tool_transcript(task: str, output: str, call_id: str = "call_1") -> list[dict[str, Any]]:
    """A transcript ending in a tool result, as a full-history client sends it."""
    return [
        SYSTEM,
        {"role": "user", "content": task},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "cat", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": call_id, "content": output},
    ]




def client(proc: ProxyProcess) -> httpx.Client:
    return httpx.Client(base_url=f"http://127.0.0.1:{proc.port}", timeout=30)


def ref_of(http: httpx.Client, cid: str, key: str | None) -> str:
    data = http.get(f"/v1/conversations/{cid}/trajectory", headers=auth(key)).json()["data"]
    return next(m["ref"] for m in data if m["role"] == "tool")


# -- tenants -----------------------------------------------------------------------------------------


def test_another_key_can_neither_read_nor_extend_a_conversation_on_any_replica(processes, upstream, redis):
    a, b = map(client, processes(2, storage={"backend": "redis", "redis_url": redis.url}, admin={"token": TOKEN}))
    transcript = tool_transcript("alice's task", ALICE_DATA)
    first = chat(a, transcript, headers={**auth(ALICE), "X-Conversation-ID": "private"})
    assert first.ok
    transcript.append(first.message)
    ref = ref_of(a, "private", ALICE)
    tenant = a.get("/v1/conversations", headers=auth(ALICE)).json()["data"][0]["tenant"]
    assert b.get(f"/v1/conversations/private/tool_outputs/{ref}", headers=auth(ALICE)).json()["content"] == ALICE_DATA

    for http in (a, b):
        assert [c["id"] for c in http.get("/v1/conversations", headers=auth(BOB)).json()["data"]] == []
        for path in ("", "/messages", "/trajectory", "/turns", f"/tool_outputs/{ref}"):
            for query in ({}, {"tenant": tenant}):
                response = http.get(f"/v1/conversations/private{path}", headers=auth(BOB), params=query)
                assert response.status_code == 404, (path, query, response.text)
                assert "ALICE" not in response.text
        assert http.delete("/v1/conversations/private", headers=auth(BOB)).status_code == 404
        for path in ("", "/messages"):  # no Bearer at all: not the admin, since a token is set
            assert http.get(f"/v1/conversations/private{path}").status_code == 401

    # Bob "extending" Alice's id writes to a conversation of his own, and sees nothing of hers.
    bobs = chat(
        b,
        [SYSTEM, {"role": "user", "content": "bob here"}],
        headers={**auth(BOB), "X-Conversation-ID": "private", "X-History": "proxy"},
    )
    assert bobs.ok
    assert upstream.chat_requests()[-1]["messages"] == [SYSTEM, {"role": "user", "content": "bob here"}]
    via_path = b.post(
        "/c/private/v1/chat/completions",
        headers=auth(BOB),
        json={"model": "m", "messages": [SYSTEM, {"role": "user", "content": "bob again"}]},
    )
    assert via_path.status_code == 200
    assert "ALICE" not in json.dumps(upstream.chat_requests()[-1])
    for http in (a, b):
        stored = http.get("/v1/conversations/private/messages", headers=auth(ALICE), params={"limit": 1000}).json()[
            "data"
        ]
        assert [stored_form(m) for m in stored] == transcript  # Alice's conversation is as she left it
        bob_sees = http.get("/v1/conversations/private/messages", headers=auth(BOB)).json()["data"]
        assert "ALICE" not in json.dumps(bob_sees) and bob_sees[0]["content"] == SYSTEM["content"]
    listed = a.get("/v1/conversations", headers=auth(TOKEN)).json()["data"]
    assert [c["id"] for c in listed] == ["private", "private"] and len(
        {c["tenant"] for c in listed}
    ) == 2  # the admin sees both


# -- refs and ids --------------------------------------------------------------------------------------


def test_refs_are_bound_to_their_conversation_and_tenant(processes, upstream):
    (proc,) = processes()
    http = client(proc)
    for cid, text in (("x", ALICE_DATA), ("y", "Y-OUTPUT " * 2000)):
        assert chat(http, tool_transcript("task", text), headers={**auth(ALICE), "X-Conversation-ID": cid}).ok
    assert chat(http, tool_transcript("task", ALICE_DATA), headers={**auth(BOB), "X-Conversation-ID": "x"}).ok
    ref_x, ref_y, bob_x = ref_of(http, "x", ALICE), ref_of(http, "y", ALICE), ref_of(http, "x", BOB)
    assert len({ref_x, ref_y, bob_x}) == 3  # same seq, different conversation or tenant: different refs

    def read(cid: str, ref: str, key: str = ALICE) -> httpx.Response:
        return http.get(f"/v1/conversations/{cid}/tool_outputs/{ref}", headers=auth(key))

    assert read("x", ref_x).json()["content"] == ALICE_DATA
    seq, mac = ref_x.split("_")[1:]
    flipped = mac[:-1] + ("0" if mac[-1] != "0" else "1")
    # Every ref one character away from a real one, and other guesses.
    alphabet = "0123456789abcdef_tuoX"
    forged = [ref_x[:i] + next(c for c in alphabet if c != ref_x[i]) + ref_x[i + 1 :] for i in range(len(ref_x))]
    forged += [
        f"out_{seq}_{flipped}",
        f"out_{int(seq) + 1}_{mac}",  # another seq under the same MAC
        f"out_{seq}_{mac[:-1]}",  # a MAC cut short
        f"out_{seq}_{mac.upper()}",
        f"out_{seq}_" + "0" * 24,
        "out_1_" + "f" * 24,
        "x" * 2000,
        "..%2F..%2Fetc%2Fpasswd",
    ]
    for ref in forged:
        response = read("x", ref)
        assert response.status_code == 404, (ref, response.status_code)
        assert "ALICE" not in response.text
    assert read("y", ref_x).status_code == 404  # another conversation's ref
    assert read("x", ref_x, BOB).status_code == 404  # Bob's "x" is not Alice's
    assert read("x", bob_x, BOB).status_code == 200 and read("x", bob_x).status_code == 404

    # A model told another conversation's ref gets nothing from read_tool_output either.
    def respond(body: dict) -> Reply:
        offered = any(t["function"]["name"] == "read_tool_output" for t in body.get("tools") or [])
        if offered and body["messages"][-1].get("tool_call_id") == "call_1":
            return Reply.tool_calls([("read_tool_output", json.dumps({"ref": ref_x, "offset": 0, "length": 100}))])
        return default_responder(body)

    upstream.responder = respond
    assert chat(
        http, tool_transcript("task", "Y-OUTPUT " * 2000), headers={**auth(ALICE), "X-Conversation-ID": "y2"}
    ).ok
    answer = upstream.chat_requests()[-1]["messages"][-1]
    assert answer["role"] == "tool" and "ALICE" not in answer["content"] and "no stored output" in answer["content"]


def test_derived_conversation_ids_differ_per_tenant(processes, upstream):
    (proc,) = processes()
    http = client(proc)
    same = [SYSTEM, {"role": "user", "content": "the same first message"}]
    ids = {}
    for key, messages in ((ALICE, same), (BOB, same), (ALICE, [*same, {"role": "assistant", "content": "reply to: the same first message"}, {"role": "user", "content": "next"}])):
        response = http.post("/v1/chat/completions", json={"model": "m", "messages": messages}, headers=auth(key))
        assert response.status_code == 200
        ids.setdefault(key, set()).add(response.headers["X-Conversation-ID"])
    assert len(ids[ALICE]) == 1 and ids[ALICE] != ids[BOB]  # stable per tenant, different across tenants
    for cid in ids[ALICE] | ids[BOB]:
        assert cid.startswith("auto-") and len(cid) == len("auto-") + 32  # 128 bits: not guessable
    assert http.get(f"/v1/conversations/{next(iter(ids[ALICE]))}", headers=auth(BOB)).status_code == 404


# -- the admin API's auth ----------------------------------------------------------------------------------


ADMIN_CALLS = [
    ("GET", "/v1/conversations"),
    ("GET", "/v1/conversations/c"),
    ("GET", "/v1/conversations/c/messages"),
    ("GET", "/v1/conversations/c/trajectory"),
    ("GET", "/v1/conversations/c/turns"),
    ("GET", "/v1/conversations/c/tool_outputs/REF"),
    ("DELETE", "/v1/conversations/c"),
]


def test_admin_api_refuses_without_the_token_once_one_is_set_even_from_loopback(processes, upstream):
    (proc,) = processes(admin={"token": TOKEN})
    http = client(proc)
    assert chat(http, tool_transcript("task", "output"), headers={**auth(ALICE), "X-Conversation-ID": "c"}).ok
    ref = ref_of(http, "c", ALICE)
    refused = [
        {},
        {"Authorization": "Basic " + TOKEN},
        {"Authorization": "Bearer"},
        {"Authorization": TOKEN},
        {"X-Admin-Token": TOKEN},
        {"Cookie": f"token={TOKEN}"},
    ]
    for method, path in ADMIN_CALLS:
        path = path.replace("REF", ref)
        for headers in refused:
            response = http.request(method, path, headers=headers, params={"token": TOKEN})
            assert response.status_code == 401, (method, path, headers, response.status_code)
            assert response.json()["error"]["code"] == "invalid_api_key"
        for wrong in (TOKEN.upper(), TOKEN[:-1], TOKEN + "x", "x" + TOKEN):  # any other Bearer is a client key
            response = http.request(method, path, headers=auth(wrong))
            assert response.status_code in (200, 404)
            assert "output" not in response.text and '"c"' not in response.text
        if method == "GET":
            assert http.get(path, headers=auth(TOKEN)).status_code == 200
    assert http.delete("/v1/conversations/c", headers=auth(TOKEN)).status_code == 200


def mocked_admin_request(remote: str, token: str | None, headers: dict[str, str] | None = None) -> Any:
    from aiohttp.test_utils import make_mocked_request

    from proxy.admin_token import AdminToken
    from proxy.config import load_settings
    from proxy.state import ADMIN_TOKEN, SETTINGS

    # Unset, the proxy makes a token of its own (proxy/admin_token.py): here, a stand-in for it.
    app = {SETTINGS: load_settings(None, admin={"token": token}), ADMIN_TOKEN: AdminToken(token or "made-by-the-proxy", None)}
    return make_mocked_request("GET", "/v1/conversations", headers=headers or {}, app=app).clone(remote=remote)


@pytest.mark.parametrize(
    "remote", ["10.1.2.3", "192.168.0.7", "172.17.0.1", "2001:db8::1", "::ffff:10.0.0.1", "", "unix-socket"]
)
def test_no_client_is_an_admin_for_where_it_connects_from(remote):
    """Issue 32: loopback alone granted every tenant to every local user's process."""
    from proxy.api.admin import ALL_TENANTS, caller_scope
    from proxy.errors import Unauthorized

    for token in (None, TOKEN):
        for where in (remote, "127.0.0.1", "::1"):
            with pytest.raises(Unauthorized):
                caller_scope(mocked_admin_request(where, token))
    assert caller_scope(mocked_admin_request("127.0.0.1", None, {"Authorization": "Bearer made-by-the-proxy"})) is ALL_TENANTS
    assert caller_scope(mocked_admin_request(remote, TOKEN, {"Authorization": f"Bearer {TOKEN}"})) is ALL_TENANTS


@pytest.mark.parametrize(
    "header",
    [
        {"X-Forwarded-For": "203.0.113.9"},
        {"Forwarded": "for=203.0.113.9;proto=https"},
        {"X-Real-IP": "203.0.113.9"},
    ],
)
def test_a_request_relayed_by_a_local_reverse_proxy_is_not_a_loopback_admin(header):
    """Behind nginx (or any load balancer) on the same host, every client connects from loopback:
    without this, the admin API of a token-less proxy is open to the whole internet."""
    from proxy.api.admin import caller_scope
    from proxy.errors import Unauthorized

    with pytest.raises(Unauthorized):
        caller_scope(mocked_admin_request("127.0.0.1", None, header))


# -- secrets are never stored or logged -----------------------------------------------------------------------

CLIENT_KEY = "sk-proj-SECRETclientKEY-4f9a2b7c1d8e"
UPSTREAM_KEY = "sk-upstream-SECRET-0b3e8f6a9c2d"


def readback_responder(body: dict) -> Reply:
    """Reads a shortened output once (the proxy answers that itself), then answers."""
    offered = any(t["function"]["name"] == "read_tool_output" for t in body.get("tools") or [])
    last = body["messages"][-1]
    if offered and last["role"] == "tool" and last["tool_call_id"] == "call_1":
        ref = last["content"].split('stored as ref "')[1].split('"')[0]
        return Reply.tool_calls([("read_tool_output", json.dumps({"ref": ref, "offset": 0, "length": 50}))])
    return default_responder(body)


def traffic(https: list[httpx.Client], upstream: FakeUpstream) -> None:
    """Every kind of request, ending well and badly, on every process."""
    upstream.responder = readback_responder
    key = auth(CLIENT_KEY)
    for i, http in enumerate(https):
        cid = {"X-Conversation-ID": f"conv-{i}"}
        transcript = tool_transcript("task", "LONG OUTPUT " * 1500)
        result = chat(http, transcript, headers={**key, **cid})  # truncation and a read_tool_output round
        assert result.ok, result.error
        transcript += [result.message, {"role": "user", "content": "more"}]
        assert chat(http, transcript, headers={**key, **cid}, stream=True).ok
        assert chat(
            http,
            [SYSTEM, {"role": "user", "content": "proxy mode"}],
            headers={**key, "X-Conversation-ID": f"ph-{i}", "X-History": "proxy"},
        ).ok
        assert chat(http, [{"role": "user", "content": f"derived {i}"}], headers=key).ok
        upstream.enqueue(
            Reply.error(
                401,
                {"error": {"message": "Incorrect API key", "type": "invalid_request_error", "code": "invalid_api_key"}},
            )
        )
        assert chat(http, transcript, headers={**key, **cid}).status == 401
        for body in (b"{not json", b'{"model": "m"}', b'{"model":"m","messages":[{"role":"wizard"}]}'):
            assert http.post("/v1/chat/completions", content=body, headers={**key, **JSON}).status_code == 400
        assert (
            http.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": transcript},
                headers={**key, "X-Context-Profile": "nope"},
            ).status_code
            == 400
        )
        assert (
            http.post(
                "/v1/chat/completions",
                json={"model": "m", "messages": transcript},
                headers={**key, "X-Conversation-ID": "bad id!"},
            ).status_code
            == 400
        )
        assert http.get("/v1/models", headers=key).status_code == 200
        assert http.post("/v1/embeddings", json={"input": "x", "model": "e"}, headers=key).status_code == 200
        ref = ref_of(http, f"conv-{i}", TOKEN)
        for bearer in (TOKEN, CLIENT_KEY, "wrong-token"):
            http.get("/v1/conversations", headers=auth(bearer))
            http.get(f"/v1/conversations/conv-{i}/trajectory", headers=auth(bearer))
            http.get(f"/v1/conversations/conv-{i}/tool_outputs/{ref}", headers=auth(bearer))
            http.get("/v1/conversations/nope", headers=auth(bearer))
        assert http.get("/v1/conversations").status_code == 401
        assert http.delete(f"/v1/conversations/ph-{i}", headers=auth(TOKEN)).status_code == 200
        http.get("/metrics")
        http.get("/healthz")


def assert_no_secret(blob: bytes, where: str, secrets: list[str]) -> None:
    for secret in secrets:
        assert secret.encode() not in blob, f"{secret[:12]}... found in {where}"


def assert_logs_clean(procs: list[ProxyProcess], secrets: list[str]) -> None:
    for proc in procs:
        assert proc.stop() == 0
        text = proc.log_path.read_bytes()
        assert_no_secret(text, str(proc.log_path), secrets)
        lines = [json.loads(line) for line in text.splitlines() if line.startswith(b"{")]
        assert sum(1 for e in lines if e.get("msg") == "request") >= 20  # there was traffic, logged
        assert any(e.get("level") == "debug" for e in lines) or any(e.get("status") == 401 for e in lines)


def test_no_secret_reaches_redis_or_the_logs(processes, upstream, redis):
    procs = processes(
        2, storage={"backend": "redis", "redis_url": redis.url}, admin={"token": TOKEN}, logging={"level": "DEBUG"}
    )
    traffic([client(p) for p in procs], upstream)
    assert any(
        r.headers.get("authorization") == f"Bearer {CLIENT_KEY}" for r in upstream.requests
    )  # forwarded, as designed
    secrets = [CLIENT_KEY, TOKEN]
    r = redis_sync.Redis(port=redis.port)
    keys = list(r.scan_iter(count=1000))
    assert len(keys) > 10, "Redis holds nothing: this test would prove nothing"
    for key in keys:
        kind = r.type(key).decode()
        if kind == "string":
            value = r.get(key) or b""
        elif kind == "hash":
            value = b"\0".join(k + b"=" + v for k, v in r.hgetall(key).items())
        elif kind == "zset":
            value = b"\0".join(m for m, _ in r.zrange(key, 0, -1, withscores=True))
        elif kind == "set":
            value = b"\0".join(r.smembers(key))
        elif kind == "list":
            value = b"\0".join(r.lrange(key, 0, -1))
        else:
            pytest.fail(f"unexpected Redis type {kind} at {key!r}")
        assert_no_secret(key + b"\0" + value, f"Redis key {key!r}", secrets)
    assert_logs_clean(procs, secrets)


def test_no_secret_reaches_the_disk_store_or_the_logs(processes, upstream, tmp_path):
    procs = processes(1, admin={"token": TOKEN}, logging={"level": "DEBUG"}, upstream={"api_key": UPSTREAM_KEY})
    traffic([client(p) for p in procs], upstream)
    chat_calls = [r for r in upstream.requests if r.path == "/v1/chat/completions"]
    assert chat_calls and {r.headers.get("authorization") for r in chat_calls} == {f"Bearer {UPSTREAM_KEY}"}
    secrets = [CLIENT_KEY, TOKEN, UPSTREAM_KEY]
    assert_logs_clean(procs, secrets)  # stopped first: everything flushed to disk
    files = [p for p in (tmp_path / "data").rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in files) > 10_000, "the store wrote nothing: this test would prove nothing"
    for path in files:
        assert_no_secret(path.read_bytes(), str(path), secrets)
    configs = list(tmp_path.glob("config-*.yaml"))
    assert configs  # (the config file holds the token, by the operator's choice: it is no store)


# -- hostile bodies ----------------------------------------------------------------------------------------


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bodies_over_the_limit_are_a_413_however_they_are_sent(processes, upstream):
    (proc,) = processes(server={"max_body_mb": 0.25})
    http = client(proc)
    big = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 400_000}]}).encode()

    def chunked() -> Iterator[bytes]:
        for i in range(0, len(big), 16_384):
            yield big[i : i + 16_384]

    bomb = gzip.compress(b'{"model": "m", "messages": [{"role": "user", "content": "' + b"0" * 200_000_000 + b'"}]}', 1)
    assert len(bomb) < 1_000_000
    # A proxy's first turn loads its tokenizer (~48 MB, on first need): before the measuring.
    assert chat(http, [{"role": "user", "content": "warm up"}], headers=auth(ALICE)).ok
    upstream.reset()
    before = http.get("/v1/conversations", headers=proc.admin_headers).json()["data"]
    peak_before = peak_rss_kb(proc)
    attempts = {
        "content-length": http.post("/v1/chat/completions", content=big, headers={**auth(ALICE), **JSON}),
        "chunked": http.post("/v1/chat/completions", content=chunked(), headers={**auth(ALICE), **JSON}),
        "gzip bomb": http.post(
            "/v1/chat/completions", content=bomb, headers={**auth(ALICE), **JSON, "Content-Encoding": "gzip"}
        ),
        "passthrough": http.post("/v1/embeddings", content=big, headers=auth(ALICE)),
    }
    for how, response in attempts.items():
        assert response.status_code == 413, (how, response.status_code)
        assert response.json()["error"]["code"] == "request_too_large"
    assert upstream.requests == []
    assert http.get("/v1/conversations", headers=proc.admin_headers).json()["data"] == before
    assert chat(http, [{"role": "user", "content": "still fine"}], headers=auth(ALICE)).ok
    grown = peak_rss_kb(proc) - peak_before
    assert grown < 50_000, f"peak memory grew {grown} kB: the gzip bomb was inflated past the limit"


def nested(depth: int, kind: str) -> str:
    return "[" * depth + "]" * depth if kind == "list" else '{"a":' * depth + "1" + "}" * depth


def chat_body(messages: str = '[{"role":"user","content":"x"}]', **fields: str) -> bytes:
    """A chat request body with raw JSON for its messages and extra fields."""
    extra = "".join(f',"{name}":{value}' for name, value in fields.items())
    return ('{"model":"m","messages":' + messages + extra + "}").encode()


def hostile_bodies() -> dict[str, bytes]:
    bodies = {
        "100k nested lists": nested(100_000, "list").encode(),
        "100k nested objects": nested(100_000, "object").encode(),
        "100k nested in a message": chat_body('[{"role":"user","content":' + nested(100_000, "list") + "}]"),
    }
    # Just under the parser's own limit: parsed fine, then copied, hashed, stored and sent upstream.
    for depth in (200, 500, 700, 900, 960, 980):
        inner = nested(depth, "object")
        bodies[f"{depth} deep in metadata"] = chat_body(metadata=inner)
        bodies[f"{depth} deep in a content part"] = chat_body(
            '[{"role":"user","content":[{"type":"text","text":"x","extra":' + inner + "}]}]"
        )
        bodies[f"{depth} deep in tool parameters"] = chat_body(
            tools='[{"type":"function","function":{"name":"f","parameters":' + inner + "}}]"
        )
    return bodies


def test_nesting_is_counted_level_by_level_dicts_and_lists_alike():
    for limit in (1, 2, MAX_DEPTH - 2, MAX_DEPTH):
        for kind in ("list", "object"):
            assert not too_deep(json.loads(nested(limit, kind)), limit)
            assert too_deep(json.loads(nested(limit + 1, kind)), limit)
        mixed = [{"a": [{"b": 1}, "x"]}, 2]  # four levels, the deepest not the first child
        assert too_deep(mixed, 3) and not too_deep(mixed, 4)
    assert not too_deep("a string", 1) and too_deep("a string", 0)


@pytest.mark.parametrize("backend", ["diskcache", "redis"])
def test_deeply_nested_json_is_a_clean_4xx_never_a_500(processes, backend, request):
    # An upstream nobody listens on: what comes back is the proxy's own doing (502 = it got that far).
    storage = {"backend": "redis", "redis_url": request.getfixturevalue("redis").url} if backend == "redis" else {}
    (proc,) = processes(upstream={"base_url": f"http://127.0.0.1:{closed_port()}/v1"}, storage=storage)
    http = client(proc)
    failures = {}
    for name, body in hostile_bodies().items():
        response = http.post("/v1/chat/completions", content=body, headers={**auth(ALICE), **JSON, "X-Conversation-ID": "nest"})
        error = response.json()["error"]
        assert error["message"] and error["type"]
        if response.status_code not in (400, 502):
            failures[name] = (response.status_code, error["code"])
    assert proc.proc.poll() is None and http.get("/healthz").status_code == 200  # alive and well
    assert failures == {}, f"bodies nested deep but parseable crash the proxy: {failures}"
