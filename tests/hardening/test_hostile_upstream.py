"""A hostile upstream, against a real proxy: replies without end, lines without end, replies that
trickle, silence mid-stream. Each is cut at its bound, with a clear error for the client, an
incomplete reply in the trajectory no larger than the bound, and the proxy's memory flat."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.upstream.sse import SSEParser
from tests.conftest import ALICE
from tests.fakes.fake_upstream import Reply
from tests.support.harness import peak_rss_kb

AUTH = {"Authorization": f"Bearer {ALICE}"}
MB = 1024 * 1024


def turn(http: httpx.Client, cid: str, *, stream: bool) -> tuple[int, list[dict[str, Any]], int]:
    """(status, the JSON events or the JSON body, bytes received) of one chat turn."""
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "go"}], "stream": stream}
    headers = {**AUTH, "X-Conversation-ID": cid}
    with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        raw = b"".join(response.iter_raw())
    if not stream or response.status_code != 200:
        return response.status_code, [json.loads(raw)], len(raw)
    events = []
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {") and line.endswith(b"}"):  # a cut line is no event
            try:
                events.append(json.loads(line[6:]))
            except ValueError:
                pass
    return response.status_code, events, len(raw)


def stored_reply(http: httpx.Client, cid: str) -> dict[str, Any] | None:
    data = http.get(f"/v1/conversations/{cid}/trajectory", params={"limit": 1000}).json()["data"]
    replies = [m for m in data if m["role"] == "assistant"]
    assert [m["status"] for m in data if m["role"] == "user"] == ["failed"]  # never joined the transcript
    assert http.get(f"/v1/conversations/{cid}/messages").json()["data"] == []
    return replies[0] if replies else None


def test_an_endless_stream_is_cut_at_max_reply_mb_and_memory_stays_flat(processes, upstream):
    """Issue 12: such an upstream grew the proxy from 508 MB to 4.9 GB in 15 s. Now the stream is
    cut at 32 MB (the default), the client gets an error event, the partial reply is kept as
    incomplete (at most 32 MB of it), and the proxy's peak memory grows by less than 250 MB (the
    partial reply is held a few times over while it is assembled, hashed and stored)."""
    (proc,) = processes()
    http = httpx.Client(base_url=f"http://127.0.0.1:{proc.port}", auth=proc.admin_auth, timeout=60)
    assert http.get("/healthz").status_code == 200
    assert turn(http, "warm-up", stream=False)[0] == 200  # its first turn loads the tokenizer (~48 MB): not measured
    peak_before = peak_rss_kb(proc)
    upstream.enqueue(Reply.endless())
    status, events, received = turn(http, "endless", stream=True)
    assert status == 200
    assert events[-1]["error"]["code"] == "upstream_reply_too_large", events[-1]
    assert "32 MB" in events[-1]["error"]["message"]
    assert 30 * MB < received < 33 * MB
    reply = stored_reply(http, "endless")
    assert reply is not None and reply["status"] == "incomplete"
    assert 30 * MB < len(reply["content"]) <= 32 * MB and set(reply["content"]) == {"x"}
    growth_mb = (peak_rss_kb(proc) - peak_before) / 1024
    assert growth_mb < 250, f"peak memory grew by {growth_mb:.0f} MB"  # measured: ~170 MB
    assert http.get("/healthz").status_code == 200


def test_a_line_that_never_ends_is_cut_at_max_sse_line_mb(processes, upstream):
    """Issue 12: SSE lines without a newline buffered without bound (and in quadratic time)."""
    (proc,) = processes(upstream={"max_sse_line_mb": 2})
    http = httpx.Client(base_url=f"http://127.0.0.1:{proc.port}", auth=proc.admin_auth, timeout=60)
    assert http.get("/healthz").status_code == 200
    peak_before = peak_rss_kb(proc)
    upstream.enqueue(Reply.endless(line_breaks=False))
    status, events, received = turn(http, "one-line", stream=True)
    assert status == 200
    assert events[-1]["error"]["code"] == "upstream_sse_line_too_long", events[-1]
    assert received < 3 * MB
    assert stored_reply(http, "one-line") is None  # no event ever completed: nothing to keep
    assert (peak_rss_kb(proc) - peak_before) / 1024 < 100


def test_an_endless_json_body_is_a_502_and_the_turn_failed(make_proxy, upstream):
    proxy = make_proxy(upstream={"max_reply_mb": 4})
    http = httpx.Client(base_url=proxy.url, timeout=60, auth=proxy.admin_auth)
    upstream.enqueue(Reply.endless())
    status, (body,), _ = turn(http, "endless-json", stream=False)
    assert status == 502
    assert body["error"]["code"] == "upstream_reply_too_large" and "4 MB" in body["error"]["message"]
    assert stored_reply(http, "endless-json") is None


@pytest.mark.parametrize("stream", [True, False])
def test_a_reply_that_trickles_is_cut_at_max_reply_s(make_proxy, upstream, stream):
    """Issue 12: a byte a second held the request and its conversation's lock for ever, since
    the timeout only fired on total silence."""
    proxy = make_proxy(upstream={"max_reply_s": 1, "timeout_s": 30})
    http = httpx.Client(base_url=proxy.url, timeout=60, auth=proxy.admin_auth)
    upstream.enqueue(Reply.endless(chunk_size=1, pace_s=0.05))
    status, events, _ = turn(http, "trickle", stream=stream)
    error = events[-1]["error"]
    assert status == (200 if stream else 504)
    assert error["code"] == "upstream_timeout" and "max_reply_s" in error["message"], error
    reply = stored_reply(http, "trickle")
    if stream:  # what did arrive is kept, as incomplete
        assert reply is not None and reply["status"] == "incomplete" and 0 < len(reply["content"]) <= 40
    else:
        assert reply is None
    # The conversation is free again: its next turn runs at once.
    upstream.enqueue(Reply.text("fine"))
    assert turn(http, "trickle", stream=False)[0] == 200


def test_silence_mid_stream_is_cut_at_timeout_s(make_proxy, upstream):
    proxy = make_proxy(upstream={"timeout_s": 0.5})
    http = httpx.Client(base_url=proxy.url, timeout=60, auth=proxy.admin_auth)
    paused = Reply.text("half and then nothing", pause_after_chunks=3)
    upstream.enqueue(paused)
    try:
        status, events, _ = turn(http, "silent", stream=True)
    finally:
        paused.release()
    assert status == 200
    assert events[-1]["error"]["code"] == "upstream_timeout" and "0.5s" in events[-1]["error"]["message"]
    reply = stored_reply(http, "silent")
    assert reply is not None and reply["status"] == "incomplete" and reply["content"] == "half and"


def test_a_client_that_stops_reading_is_no_silence_of_the_upstream(make_proxy, upstream):
    """While the proxy waits to write to a client that reads nothing (its socket buffers full),
    it is not reading the upstream: that time is not the upstream's silence (timeout_s)."""
    proxy = make_proxy(upstream={"timeout_s": 0.5})
    text = "".join(f"{i:07d} " for i in range(1_500_000))  # 12 MB of deltas: more than loopback buffers hold
    upstream.enqueue(Reply.text(text, chunk_size=60_000))
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "a long one"}], "stream": True}
    headers = {"Authorization": f"Bearer {ALICE}", "X-Conversation-ID": "slow-reader"}
    with httpx.stream("POST", f"{proxy.base_url}/chat/completions", json=body, headers=headers, timeout=60) as response:
        lines = response.iter_lines()
        first = next(lines)
        threading.Event().wait(2.0)  # the client reading nothing, four times timeout_s: the behaviour under test
        rest = list(lines)
    events = [json.loads(line[6:]) for line in [first, *rest] if line.startswith("data: {")]
    assert not any("error" in e for e in events)
    assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices")) == text


def test_a_declared_length_over_the_bound_is_refused_before_reading(make_proxy, raw_upstream_of):
    """A Content-Length over max_reply_mb is refused at once: none of the body is read."""
    declared = 10 * MB
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n{\"choices\": [" % declared
    )
    upstream_url = raw_upstream_of(head)
    proxy = make_proxy(upstream_url=upstream_url, upstream={"max_reply_mb": 1})
    http = httpx.Client(base_url=proxy.url, timeout=30, auth=proxy.admin_auth)
    status, (body,), _ = turn(http, "declared", stream=False)
    assert status == 502 and body["error"]["code"] == "upstream_reply_too_large"


@given(st.lists(st.binary(max_size=40), max_size=30), st.data())
def test_sse_parser_gives_the_same_payloads_however_the_bytes_are_split(pieces, data):
    events = [b"data: " + p.replace(b"\n", b"") + b"\n\n" for p in pieces]
    stream = b"".join(events) + b"data: unfinished"
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=20)))
    parser, got = SSEParser(), []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        got += parser.feed(stream[start:end])
    assert got == [p.replace(b"\n", b"").strip() for p in pieces]


@pytest.mark.parametrize(("reply", "status", "code"), [
    (Reply.endless(), 502, "upstream_reply_too_large"),
    (Reply.endless(chunk_size=1, pace_s=0.05), 504, "upstream_timeout"),
])
def test_the_responses_route_has_the_same_bounds(make_proxy, upstream, reply, status, code):
    proxy = make_proxy(upstream={"max_reply_mb": 4, "max_reply_s": 1})
    upstream.enqueue(reply)
    with httpx.Client(base_url=proxy.url, timeout=60, auth=proxy.admin_auth) as http:
        response = http.post(
            "/v1/responses", json={"model": "gpt-4o-mini", "input": "go"}, headers={**AUTH, "X-Conversation-ID": "r"}
        )
        assert response.status_code == status, response.text[:300]
        assert response.json()["error"]["code"] == code
        assert http.get("/v1/conversations/r/messages").json()["data"] == []
