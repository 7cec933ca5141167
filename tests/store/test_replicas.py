"""Several replicas: two `python -m proxy serve` processes sharing one real Redis.

Whichever replica a turn lands on, every message is stored exactly once and in order, concurrent
turns of one conversation are serialized across replicas, one compaction runs at a time per
conversation, and the LLM-call quota is exact.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.conftest import ALICE, MakeProcesses
from tests.fakes.fake_upstream import Reply, default_responder
from tests.support.harness import ProxyProcess, chat, merge_sections, stored_form, wait_until
from tests.support.redis_server import RedisServer

AUTH = {"Authorization": f"Bearer {ALICE}"}
SYSTEM = {"role": "system", "content": "You are a coding agent."}
TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
    for name in ("read_file", "run_tests")
]
SUMMARIZER_MARK = "You maintain the working memory of an AI agent"


def tool_responder(body: dict) -> Reply:
    """Calls two tools when the newest message is a user message starting with 'use tools'."""
    last = body["messages"][-1]
    if last["role"] == "user" and str(last["content"]).startswith("use tools"):
        return Reply.tool_calls([("read_file", json.dumps({"path": last["content"]})), ("run_tests", "{}")])
    return default_responder(body)


def is_summary_request(body: dict) -> bool:
    first = body["messages"][0]
    return first["role"] == "system" and SUMMARIZER_MARK in str(first["content"])


MakeReplicas = Callable[..., list[ProxyProcess]]


@pytest.fixture
def replicas(processes: MakeProcesses, redis: RedisServer) -> MakeReplicas:
    """`replicas(n=2, **sections)`: n proxy processes on one Redis, in front of the fake upstream."""

    def make(n: int = 2, **sections: dict[str, Any]) -> list[ProxyProcess]:
        return processes(n, **merge_sections({"storage": {"backend": "redis", "redis_url": redis.url}}, sections))

    return make


def clients(procs: list[ProxyProcess]) -> list[httpx.Client]:
    return [httpx.Client(base_url=f"http://127.0.0.1:{p.port}", auth=p.admin_auth, timeout=30) for p in procs]


def trajectory_of(http: httpx.Client, cid: str) -> dict[str, Any]:
    response = http.get(f"/v1/conversations/{cid}/trajectory", params={"limit": 1000}, headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()


def live_of(http: httpx.Client, cid: str) -> list[dict[str, Any]]:
    response = http.get(f"/v1/conversations/{cid}/messages", params={"limit": 1000}, headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()["data"]


def assert_stored_exactly(https: list[httpx.Client], cid: str, transcript: list[dict[str, Any]]) -> None:
    """On every replica: each message once, in order, live, seqs 1..n, as the client has it."""
    for http in https:
        data = trajectory_of(http, cid)["data"]
        assert [m["status"] for m in data] == ["live"] * len(transcript)
        assert [m["seq"] for m in data] == list(range(1, len(transcript) + 1))
        assert [stored_form(m) for m in data] == transcript


# -- one conversation, alternating replicas ------------------------------------------------------


def test_full_history_turns_alternating_between_replicas_are_stored_once_in_order(replicas, upstream):
    upstream.responder = tool_responder
    https = clients(replicas())
    headers = {**AUTH, "X-Conversation-ID": "alt-full"}
    transcript: list[dict[str, Any]] = [SYSTEM]
    calls = 0
    for turn in range(6):
        text = f"use tools {turn}" if turn % 2 else f"turn {turn}"
        transcript.append({"role": "user", "content": text})
        while True:
            # Replica and streaming vary independently: each replica serves both kinds.
            http, stream = https[calls % 2], (calls // 2) % 2 == 1
            calls += 1
            result = chat(http, transcript, stream=stream, headers=headers, tools=TOOLS)
            assert result.ok, result.error
            assert upstream.chat_requests()[-1]["messages"] == transcript  # each replica saw the other's writes
            transcript.append(result.message)
            if "tool_calls" not in result.message:
                break
            for call in result.message["tool_calls"]:
                transcript.append({"role": "tool", "tool_call_id": call["id"], "content": f"output of {call['id']}"})
    assert calls > 6 and sum(1 for m in transcript if m["role"] == "tool") == 6
    assert_stored_exactly(https, "alt-full", transcript)


def test_proxy_history_turns_alternating_between_replicas_are_stored_once_in_order(replicas, upstream):
    upstream.responder = tool_responder
    https = clients(replicas())
    headers = {**AUTH, "X-Conversation-ID": "alt-proxy", "X-History": "proxy"}
    expected: list[dict[str, Any]] = [SYSTEM]
    calls = 0
    for turn in range(6):
        new = [{"role": "user", "content": f"use tools {turn}" if turn % 2 else f"turn {turn}"}]
        while new:
            http, stream = https[calls % 2], (calls // 2) % 2 == 1
            calls += 1
            result = chat(http, [SYSTEM, *new], stream=stream, headers=headers, tools=TOOLS)
            assert result.ok, result.error
            # The other replica's turns came from Redis: the upstream got the whole history.
            assert upstream.chat_requests()[-1]["messages"] == expected + new
            expected += [*new, result.message]
            new = [
                {"role": "tool", "tool_call_id": call["id"], "content": f"output of {call['id']}"}
                for call in result.message.get("tool_calls") or []
            ]
    assert_stored_exactly(https, "alt-proxy", expected)


# -- concurrent turns of one conversation on both replicas ----------------------------------------


def test_concurrent_proxy_history_turns_on_both_replicas_never_wait_and_keep_every_message_once(replicas, upstream):
    """Proxy-history turns of one conversation sent at once to both replicas, the first held by
    its upstream: the others answer meanwhile (no turn waits on another's upstream call, across
    replicas too), and every message is stored once, live, in one gapless log."""
    https = clients(replicas())
    headers = {**AUTH, "X-Conversation-ID": "race", "X-History": "proxy"}
    held = Reply.text("first, held", pause_after_chunks=0)
    upstream.enqueue(held)  # the first turn is upstream while the others come
    n = 8
    start = threading.Barrier(n - 1)

    def turn(i: int):
        if i > 0:
            start.wait(10)
        return chat(
            https[i % 2], [SYSTEM, {"role": "user", "content": f"concurrent {i}"}], stream=i % 4 == 1, headers=headers
        )

    with ThreadPoolExecutor(n) as pool:
        first = pool.submit(turn, 0)
        assert held.reached.wait(10)
        others = [pool.submit(turn, i) for i in range(1, n)]
        results = [f.result(30) for f in others]  # all of them while the first is still held
        assert not first.done()
        held.release()
        results.append(first.result(30))
    assert all(r.ok for r in results), [r.error for r in results]

    requests = upstream.chat_requests()
    assert len(requests) == n
    for i, sent in enumerate(requests):  # each went with the system prompt, the history it found, its own message
        assert sent["messages"][0] == SYSTEM and sent["messages"][-1]["role"] == "user"
        contents = [m["content"] for m in sent["messages"]]
        assert len(set(contents)) == len(contents), f"request {i} repeats a message"
    stored = trajectory_of(https[0], "race")["data"]
    assert [m["seq"] for m in stored] == list(range(1, 2 + 2 * n))
    assert [m["status"] for m in stored] == ["live"] * (1 + 2 * n)
    users = [m["content"] for m in stored if m["role"] == "user"]
    assert sorted(users) == sorted(f"concurrent {i}" for i in range(n))  # every message once
    assert len([m for m in stored if m["role"] == "assistant"]) == n
    assert trajectory_of(https[1], "race")["data"] == stored


def test_concurrent_full_history_requests_on_both_replicas_store_the_transcript_once(replicas, upstream):
    https = clients(replicas())
    headers = {**AUTH, "X-Conversation-ID": "same"}
    transcript = [SYSTEM, {"role": "user", "content": "the same request, several times at once"}]
    held = Reply.text("held reply", pause_after_chunks=0)
    upstream.enqueue(held)
    n = 6
    start = threading.Barrier(n)

    def send(i: int):
        if i > 0:
            start.wait(10)
        return chat(https[i % 2], transcript, stream=i % 2 == 1, headers=headers)

    with ThreadPoolExecutor(n) as pool:
        first = pool.submit(send, 0)
        assert held.reached.wait(10)
        others = [pool.submit(send, i) for i in range(1, n)]
        start.wait(10)
        held.release()
        results = [first.result(30)] + [f.result(30) for f in others]
    assert all(r.ok for r in results)
    # Each request after the first regenerates the reply: the earlier one is superseded, never duplicated.
    for http in https:
        stored = trajectory_of(http, "same")["data"]
        assert [m["seq"] for m in stored] == list(range(1, 3 + n))
        assert [stored_form(m) for m in stored[:2]] == transcript  # the client's messages exactly once
        assert [m["status"] for m in stored] == ["live", "live"] + ["superseded"] * (n - 1) + ["live"]
        assert all(m["role"] == "assistant" for m in stored[2:])
        assert [stored_form(m) for m in live_of(http, "same")] == transcript + [stored_form(stored[-1])]


# -- background compaction with both replicas -----------------------------------------------------


class SummarizerScript:
    """Summary requests: the first is held until released; every window the summarizer saw is kept."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.held = Reply.text("SUMMARY 1: the agent started the task.", pause_after_chunks=0)
        self.windows: list[str] = []
        self.in_flight: set[str] = set()
        self.overlaps: list[str] = []

    def __call__(self, body: dict) -> Reply:
        if not is_summary_request(body):
            return default_responder(body)
        window = body["messages"][1]["content"]
        with self.lock:
            if window in self.in_flight:
                self.overlaps.append(window)
            self.windows.append(window)
            first = len(self.windows) == 1
            if first:
                self.in_flight.add(window)  # in flight until released
            return self.held if first else Reply.text(f"SUMMARY {len(self.windows)}: more work done.")

    def release(self) -> None:
        with self.lock:
            self.in_flight.clear()
        self.held.release()


def test_background_compaction_runs_one_summary_at_a_time_across_replicas(replicas, upstream):
    script = SummarizerScript()
    upstream.responder = script
    a, b = clients(replicas(compaction={"strategy": "turns", "every_n_user_messages": 2}))
    headers = {**AUTH, "X-Conversation-ID": "compact"}
    transcript: list[dict[str, Any]] = [SYSTEM]

    def say(http: httpx.Client, text: str, **extra: str) -> None:
        transcript.append({"role": "user", "content": text})
        result = chat(http, transcript, headers={**headers, **extra})
        assert result.ok, result.error
        transcript.append(result.message)

    say(a, "task: fix issue 4711")
    say(b, "two")
    say(a, "three")  # due: A compacts in the background and the summarizer holds it
    assert script.held.reached.wait(10)
    say(b, "four")  # B's own background compaction finds the lease taken
    say(b, "five", **{"X-Compaction": "force"})  # B compacts in the foreground: refused while A's runs
    say(a, "six", **{"X-Compaction": "force"})
    assert len(script.windows) == 1, "a second summary of this conversation started while one was running"
    script.release()
    wait_until(lambda: trajectory_of(a, "compact")["summaries"], what="the held summary to be stored")

    for i, http in enumerate([b, a, b, a, b, a, a, b]):
        say(http, f"more {i}")
    # Background compactions may still run: wait until every summary the summarizer wrote is stored.
    summaries = wait_until(
        lambda: (s := trajectory_of(b, "compact")["summaries"]) and len(s) == len(script.windows) and s,
        what="every summary to be stored",
    )
    assert len(summaries) >= 3
    assert script.overlaps == []
    assert len(set(script.windows)) == len(script.windows)  # no window summarized twice
    last_seqs = [s["last_seq"] for s in sorted(summaries, key=lambda s: s["id"])]
    assert last_seqs == sorted(set(last_seqs)), f"summary windows overlap: {last_seqs}"
    record = trajectory_of(a, "compact")
    assert record["data"][-1]["seq"] == len(transcript)
    assert {m["status"] for m in record["data"]} <= {"live", "compacted"}
    assert [stored_form(m) for m in record["data"]] == transcript  # nothing lost, nothing twice
    assert [stored_form(m) for m in live_of(a, "compact")] == transcript


# -- the quota across replicas --------------------------------------------------------------------


def test_quota_is_exact_across_replicas(replicas, upstream):
    limit, n = 5, 12
    https = clients(replicas(quota={"max_llm_calls": limit}))
    headers = {**AUTH, "X-Conversation-ID": "metered", "X-History": "proxy"}
    start = threading.Barrier(n)

    def turn(i: int):
        start.wait(10)
        return chat(
            https[i % 2], [SYSTEM, {"role": "user", "content": f"call {i}"}], stream=i % 3 == 0, headers=headers
        )

    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(turn, range(n)))
    ok = [r for r in results if r.status == 200]
    refused = [r for r in results if r.status != 200]
    assert len(ok) == limit and all(r.ok for r in ok)
    assert {r.status for r in refused} == {429} and {r.error["code"] for r in refused} == {"llm_call_quota_exceeded"}
    assert sorted(r.headers["X-LLM-Calls-Remaining"] for r in ok) == [str(k) for k in range(limit)]
    assert len(upstream.chat_requests()) == limit
    for http in https:  # and it stays exhausted, whichever replica is asked
        again = chat(http, [SYSTEM, {"role": "user", "content": "one more"}], headers=headers)
        assert again.status == 429
        shown = http.get("/v1/conversations/metered", headers=AUTH).json()
        assert shown["llm_calls"] == limit and shown["message_count"] == 1 + 2 * limit
    assert len(upstream.chat_requests()) == limit
    other = chat(
        https[1], [SYSTEM, {"role": "user", "content": "hi"}], headers={**AUTH, "X-Conversation-ID": "another"}
    )
    assert other.ok  # the quota is per conversation
