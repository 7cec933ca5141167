"""/metrics after scripted traffic, parsed as Prometheus text; and the request log line."""

from __future__ import annotations

import json
import logging
import re

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.identity import ConversationKey
from proxy.metrics import MAX_ACTIVE_TRACKED, Metrics
from tests.conftest import ALICE, openai_client
from tests.fakes.fake_upstream import Reply
from tests.fakes.responders import by_kind, is_summary_request
from tests.support.harness import wait_until

BIG = "z" * 30_000


def scrape(proxy) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"{proxy.url}/metrics").text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_count_what_the_traffic_did(make_proxy, upstream):
    proxy = make_proxy(quota={"max_llm_calls": 3})
    client = openai_client(proxy, headers={"X-Conversation-ID": "metered"})
    call = {"id": "call_1", "type": "function", "function": {"name": "cat", "arguments": "{}"}}
    history = [{"role": "user", "content": "go"}, {"role": "assistant", "content": None, "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": BIG}]
    client.chat.completions.create(model="gpt-4o-mini", messages=history)
    ref = re.search(r"out_\d+_[0-9a-f]{24}", upstream.chat_requests()[-1]["messages"][2]["content"]).group(0)
    upstream.enqueue(Reply.tool_calls([("read_tool_output", json.dumps({"ref": ref, "offset": 0, "length": 10}))]), Reply.text("read it"))
    history += [{"role": "assistant", "content": "reply to: go"}, {"role": "user", "content": "read"}]
    client.chat.completions.create(model="gpt-4o-mini", messages=history)
    history += [{"role": "assistant", "content": "read it"}, {"role": "user", "content": "again"}]
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="gpt-4o-mini", messages=history)  # quota: 3 calls used
    httpx.post(f"{proxy.url}/v1/chat/completions", content=b"{", headers={"Authorization": f"Bearer {ALICE}", "Content-Type": "application/json"})

    samples = scrape(proxy)
    assert value(samples, "context_proxy_requests_total", route="/v1/chat/completions", status="200") == 2
    assert value(samples, "context_proxy_requests_total", route="/v1/chat/completions", status="429") == 1
    assert value(samples, "context_proxy_requests_total", route="/v1/chat/completions", status="400") == 1
    assert value(samples, "context_proxy_quota_rejections_total") == 1
    assert value(samples, "context_proxy_read_rounds_total") == 1
    assert value(samples, "context_proxy_tokens_saved_total", stage="truncation") > 5000
    assert value(samples, "context_proxy_tokens_sent_total") > 100
    assert value(samples, "context_proxy_usage_tokens_total", kind="prompt_tokens") > 0
    assert value(samples, "context_proxy_upstream_seconds_count") == 3
    assert value(samples, "context_proxy_added_seconds_count") == 3
    assert value(samples, "context_proxy_active_conversations") == 1
    assert value(samples, "context_proxy_failed_turns_total", source="proxy", status="429") == 1


def test_failed_turns_and_cache_reads_are_counted(make_proxy, upstream):
    proxy = make_proxy()
    upstream.enqueue(Reply.error(500, {"error": {"message": "upstream broke", "type": "server_error"}}))
    client = openai_client(proxy, headers={"X-Conversation-ID": "cached"})
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": "go"}])
    first = client.responses.create(model="gpt-4o-mini", input="a task", prompt_cache_key="cached")
    second = client.responses.create(model="gpt-4o-mini", input="more", previous_response_id=first.id, prompt_cache_key="cached")
    samples = scrape(proxy)
    assert value(samples, "context_proxy_failed_turns_total", source="upstream", status="500") == 1
    cached = first.usage.input_tokens_details.cached_tokens + second.usage.input_tokens_details.cached_tokens
    assert cached > 0 and value(samples, "context_proxy_usage_tokens_total", kind="cache_read_input_tokens") == cached
    assert value(samples, "context_proxy_usage_tokens_total", kind="input_tokens") == first.usage.input_tokens + second.usage.input_tokens


def test_one_json_log_line_per_request_without_secrets(proxy, upstream, caplog):
    caplog.set_level(logging.INFO, logger="proxy.access")
    openai_client(proxy, "sk-secret-log-check", headers={"X-Conversation-ID": "logged"}).chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}]
    )
    [record] = [r for r in caplog.records if r.name == "proxy.access" and r.path == "/v1/chat/completions"]
    assert (record.status, record.conversation) == (200, "logged")
    assert record.tokens_sent > 0 and record.upstream_ms > 0 and record.added_ms > 0 and record.llm_calls == 1
    from proxy.logs import JsonFormatter

    line = JsonFormatter().format(record)
    assert json.loads(line)["conversation"] == "logged"
    assert "sk-secret-log-check" not in line


def test_full_history_turns_are_counted_by_how_their_prompt_was_made(make_proxy, upstream, caplog):
    """A conversation's first turn has nothing kept to reuse, and keeps what the second reuses; turns that extend the previous request byte for byte take the fast path;
    one with an inbox note to deliver is declined (the previous work was kept, but the note must be
    placed by the whole pipeline); an edit of an old message leaves nothing to reuse."""
    caplog.set_level(logging.INFO, logger="proxy.access")
    proxy = make_proxy(server={"fast_path": True})
    client = openai_client(proxy, headers={"X-Conversation-ID": "fast-counted"})
    history = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "count to three"}]

    def turn(n: int) -> None:
        reply = client.chat.completions.create(model="gpt-4o-mini", messages=history)
        history.extend([{"role": "assistant", "content": reply.choices[0].message.content},
                        {"role": "user", "content": f"and then {n}"}])

    for n in range(4):
        turn(n)
    posted = httpx.post(f"{proxy.url}/v1/conversations/fast-counted/inbox", json={"content": "also count backwards"}, headers=proxy.admin_headers)
    assert posted.status_code in (200, 201), posted.text
    turn(4)
    history[1] = {"role": "user", "content": "count to four"}
    turn(5)
    samples = scrape(proxy)
    counted = {o: value(samples, "context_proxy_fast_path_turns_total", outcome=o) for o in ("taken", "declined", "none")}
    assert counted == {"none": 2.0, "taken": 3.0, "declined": 1.0}
    # And each turn's log line says it.
    logged = [r.fast_path for r in caplog.records if r.name == "proxy.access" and r.path == "/v1/chat/completions"]
    assert logged == ["none", "taken", "taken", "taken", "declined", "none"]




@pytest.mark.parametrize("wire", ["chat", "responses"])
def test_an_agent_that_names_no_conversation_takes_the_fast_path_and_every_other_turn_says_why_not(
    make_proxy, upstream, caplog, wire
) -> None:
    """The zero-code-change client: no conversation header, no session id, its id derived from its
    system prompt and task. From its second turn on its bodies are parsed only where new and its
    prompts made the fast way (the second finds the first, which no reply named yet, in an
    opening slot; its first reply names the run from then on)."""
    caplog.set_level(logging.INFO, logger="proxy.access")
    proxy = make_proxy(server={"fast_path": True})
    client = openai_client(proxy)
    history: list[dict] = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "count to three"}]
    for n in range(5):
        if wire == "chat":
            answer = client.chat.completions.create(model="gpt-4o-mini", messages=history).choices[0].message.content
        else:
            answer = client.responses.create(model="gpt-4o-mini", input=history).output_text
        history += [{"role": "assistant", "content": answer}, {"role": "user", "content": f"and then {n}"}]
    # Another parameter: the same run (named by its bytes up to its first reply), its last body
    # not extended.
    if wire == "chat":
        client.chat.completions.create(model="gpt-4o-mini", messages=history, temperature=0.5)
    else:
        client.responses.create(model="gpt-4o-mini", input=history, temperature=0.5)
    path = "/v1/chat/completions" if wire == "chat" else "/v1/responses"
    logged = [(r.fast_path, r.fast_path_reason) for r in caplog.records if r.name == "proxy.access" and r.path == path]
    assert logged == [("none", "no_previous_turn")] + [("taken", None)] * 4 + [("none", "body_not_extended")]
    assert value(scrape(proxy), "context_proxy_fast_path_not_taken_turns_total", reason="body_not_extended") == 1.0
    assert {r.conversation for r in caplog.records if r.name == "proxy.access" and r.path == path} == {
        next(r.conversation for r in caplog.records if r.name == "proxy.access" and r.path == path)
    }  # one derived conversation throughout


def _streamed_turn(proxy, upstream, conversation: str, history: list[dict], *, leave_at_finish: bool = False) -> str:
    """One streamed turn; with `leave_at_finish` the client hangs up once it has the finish
    chunk, while the proxy, whose upstream holds its connection open after the stream's end,
    is still waiting for the body's end: aiohttp cancels the proxy's handler then. Bodies are
    dumped alike turn after turn, so each extends the last one byte for byte."""
    held = Reply.text("streamed answer").held_open() if leave_at_finish else Reply.text("streamed answer")
    upstream.enqueue(held)
    body = json.dumps({"model": "gpt-4o-mini", "messages": history, "stream": True})
    headers = {"Authorization": f"Bearer {ALICE}", "X-Conversation-ID": conversation, "Content-Type": "application/json"}
    text = ""
    with httpx.stream("POST", f"{proxy.base_url}/chat/completions", content=body, headers=headers, timeout=30) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: {"):
                continue
            choices = json.loads(line[len("data: "):]).get("choices") or [{}]
            text += choices[0].get("delta", {}).get("content") or ""
            if leave_at_finish and choices[0].get("finish_reason"):
                break  # leaving: the response is closed unread
    if leave_at_finish:
        assert held.client_gone.wait(10)  # the proxy let go of the upstream: its handler ended
    return text


def _turns(proxy, conversation: str) -> int:
    return len(httpx.get(f"{proxy.url}/v1/conversations/{conversation}/turns", headers=proxy.admin_headers).json()["data"])


def test_a_stream_its_client_leaves_at_its_end_leaves_its_work_for_the_next_turn(make_proxy, upstream):
    """The turn left was whole (its items and its reply joined the live transcript), so the
    next turn, which extends its body, takes the fast path."""
    proxy = make_proxy(server={"fast_path": True})
    history = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "count to three"}]
    for n, leave in enumerate((False, True)):
        history += [{"role": "assistant", "content": _streamed_turn(proxy, upstream, "left-at-end", history, leave_at_finish=leave)},
                    {"role": "user", "content": f"and again {n}"}]
    wait_until(lambda: _turns(proxy, "left-at-end") == 2, what="the turn left at its end stored")
    taken = value(scrape(proxy), "context_proxy_fast_path_turns_total", outcome="taken")
    assert _streamed_turn(proxy, upstream, "left-at-end", history) == "streamed answer"
    assert value(scrape(proxy), "context_proxy_fast_path_turns_total", outcome="taken") == taken + 1


def test_a_stream_its_client_leaves_at_its_end_still_compacts_after_it(make_proxy, upstream):
    """Background compaction is scheduled by a turn that ended whole, its client gone or not."""
    proxy = make_proxy(compaction={"strategy": "turns", "every_n_user_messages": 2, "background": True})
    upstream.responder = by_kind()
    history = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "count to three"}]
    for n in range(2):
        history += [{"role": "assistant", "content": _streamed_turn(proxy, upstream, "left-then-compacted", history)},
                    {"role": "user", "content": f"go on {n}"}]
    assert not any(is_summary_request(b) for b in upstream.chat_requests())
    _streamed_turn(proxy, upstream, "left-then-compacted", history, leave_at_finish=True)  # two since the task: due
    wait_until(lambda: any(is_summary_request(b) for b in upstream.chat_requests()), what="a summary asked for")


def test_the_active_gauge_holds_a_bounded_memory_of_conversations_between_scrapes():
    """A client may name a new conversation on every request and nobody scrape for hours: what the
    gauge remembers stays at MAX_ACTIVE_TRACKED, and a conversation seen again counts once."""
    metrics = Metrics()
    for n in range(MAX_ACTIVE_TRACKED + 500):
        metrics.saw(ConversationKey("t", f"c{n}"))
    metrics.saw(ConversationKey("t", f"c{MAX_ACTIVE_TRACKED + 499}"))
    families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
    assert families["context_proxy_active_conversations"].samples[0].value == MAX_ACTIVE_TRACKED
    assert len(metrics._last_seen) == MAX_ACTIVE_TRACKED
