"""The summarizer's requests on the strict fake: they fit the model, one refused as too long is split
at once, an echo is no summary, failures back off (across replicas too), and with
`yield_to_agent` a summary never holds up an agent's request."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from proxy.config import ConfigError, SummarizerSettings, load_settings
from proxy.dialects.chat import CHAT
from proxy.dialects.formats import DIALECTS
from proxy.dialects.gemini import GEMINI
from proxy.dialects.messages import MESSAGES
from proxy.inflight import InFlight
from proxy.state import COMPACTION, ENGINE, SUMMARIZER
from proxy.summarizer import Completion, Summarizer
from proxy.tokens import TokenCounter
from tests.compaction.test_compaction import Agent, agent_requests, foreground, summary_requests
from tests.conftest import ALICE
from tests.fakes.fake_upstream import Reply, default_responder
from tests.fakes.responders import by_kind, echoes_prompt, fixed_summary, is_summary_request, refuses_over
from tests.support.harness import wait_until

LOCAL = "local-coder"  # a model tiktoken does not know: its tokenizer may count more than ours


def statuses(upstream) -> list[int]:
    return [r.status_sent for r in upstream.requests if r.path.endswith("/chat/completions")]


def test_summarizer_requests_fit_a_small_local_model_with_a_margin(make_proxy, upstream):
    window = 8192
    upstream.responder = refuses_over(window, by_kind(summarizer=fixed_summary()))  # counts more than tiktoken
    proxy = make_proxy(
        models={LOCAL: {"context_window": window}},
        context={"history_token_limit": 1500},
        **foreground(strategy="turns", every_n_user_messages=3, max_summary_tokens=256),
    )
    agent = Agent(proxy, "fits", model=LOCAL)
    agent.say("task: read the logs")
    for n in range(7):
        for k in range(4):
            agent.tool_round(10 * n + k, f"log {n}.{k}: " + "lorem ipsum dolor sit amet, consectetur adipiscing " * 90)
        agent.say(f"next {n}")
    calls = summary_requests(upstream)
    assert len(agent.trajectory()["summaries"]) >= 2
    assert 400 not in statuses(upstream)  # not one request refused for length
    assert proxy.app[COMPACTION].failures == 0
    counter = TokenCounter()
    for call in calls:
        assert call["model"] == LOCAL and call["max_tokens"] == 256
        ours = sum(counter.count_many(call["messages"], LOCAL))
        assert ours + call["max_tokens"] <= window * 0.7  # our count leaves room for a tokenizer that counts more


def test_a_request_refused_as_too_long_is_split_and_sent_again_at_once(make_proxy, upstream):
    upstream.responder = by_kind(summarizer=refuses_over(1700, fixed_summary()))  # a window nobody told us of
    proxy = make_proxy(**foreground(strategy="turns", every_n_user_messages=3, max_summary_tokens=200))
    agent = Agent(proxy, "split")
    for i in range(3):
        agent.say(f"part {i}: " + "lorem ipsum dolor sit amet " * 120)
    agent.messages.append({"role": "user", "content": "now"})
    agent.http.post("/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": agent.messages},
                    headers={"Authorization": f"Bearer {ALICE}", "X-Conversation-ID": "split"})
    codes = [r.status_sent for r in upstream.requests if is_summary_request(r.body)]
    assert codes[0] == 400 and codes[-1] == 200 and len(codes) >= 3  # refused, split, folded in the same turn
    assert len(agent.trajectory()["summaries"]) == 1 and proxy.app[COMPACTION].failures == 0


def test_an_answer_that_echoes_the_prompt_is_no_summary_and_is_retried_later(make_proxy, upstream):
    replies = iter([echoes_prompt(), fixed_summary("SUMMARY: a real one")])
    current = {"summarizer": next(replies)}

    def summarizer(body: dict) -> Reply:
        reply = current["summarizer"](body)
        current["summarizer"] = next(replies, current["summarizer"])
        return reply

    upstream.responder = by_kind(summarizer=summarizer)
    proxy = make_proxy(**foreground(strategy="turns", every_n_user_messages=2, retry_backoff_s=0))
    agent = Agent(proxy, "echo")
    for text in ("task: tidy up", "the first instruction is to rename the module carefully", "three", "four"):
        agent.say(text)
    assert proxy.app[COMPACTION].failures == 1 and agent.trajectory()["summaries"] == []
    agent.say("five")
    assert len(summary_requests(upstream)) == 1  # not retried on the very next turn
    agent.say("six")
    [summary] = agent.trajectory()["summaries"]
    assert summary["text"] == "SUMMARY: a real one"


def test_after_a_failure_other_replicas_back_off_too(make_proxy, upstream, redis):
    upstream.responder = by_kind(summarizer=lambda body: Reply.error(500, {"error": {"message": "down", "type": "server_error"}}))
    shared = {"storage": {"backend": "redis", "redis_url": redis.url}}
    settings = foreground(strategy="turns", every_n_user_messages=2, retry_backoff_s=600)
    one, two = make_proxy(**shared, **settings), make_proxy(**shared, **settings)
    agent = Agent(one, "replicas")
    for text in ("task", "two", "three", "four"):  # compaction due at "four": fails on replica one
        agent.say(text)
    assert len(summary_requests(upstream)) == 1
    agent.http = httpx.Client(base_url=two.url, timeout=30)  # the load balancer sends the next turns to two
    for text in ("five", "six", "seven"):
        agent.say(text)
    assert len(summary_requests(upstream)) == 1  # two waits out the backoff one set
    assert two.app[COMPACTION].failures == 0


def _send(proxy, cid: str, text: str) -> httpx.Response:
    with httpx.Client(base_url=proxy.url, timeout=30, auth=proxy.admin_auth) as http:
        return http.post("/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}]},
                         headers={"Authorization": f"Bearer {ALICE}", "X-Conversation-ID": cid})


def test_with_yield_to_agent_a_summary_waits_for_the_agents_request_in_flight(make_proxy, upstream, servers):
    held = Reply.text("the other agent's answer", pause_after_chunks=0)

    def agent_model(body: dict) -> Reply:
        return held if body["messages"][-1]["content"] == "hold me" else default_responder(body)

    upstream.responder = by_kind(agent=agent_model, summarizer=fixed_summary())
    proxy = make_proxy(compaction={"strategy": "turns", "every_n_user_messages": 2}, summarizer={"yield_to_agent": True})
    inflight = proxy.app[SUMMARIZER].inflight
    with ThreadPoolExecutor(1) as pool:
        other = pool.submit(_send, proxy, "other", "hold me")  # an agent request in flight on the same upstream
        assert held.reached.wait(10)
        agent = Agent(proxy, "yields")
        for text in ("task", "two", "three"):  # after "three"'s reply a compaction is due, in the background
            agent.say(text)
        wait_until(lambda: inflight.waiting == 1, what="the summary to wait for the upstream")
        assert summary_requests(upstream) == []
        held.release()
        assert other.result(10).status_code == 200
    servers.run(proxy.app[ENGINE].idle())
    assert len(summary_requests(upstream)) == 1 and len(agent.trajectory()["summaries"]) == 1


def test_with_yield_to_agent_an_agents_request_stops_a_running_summary(make_proxy, upstream, servers):
    first_summary = Reply.text("never sent: stopped for the agent", pause_after_chunks=0)
    summaries = iter([first_summary])

    def summarizer(body: dict) -> Reply:
        return next(summaries, Reply.text("SUMMARY made once the upstream was free"))

    upstream.responder = by_kind(summarizer=summarizer)
    proxy = make_proxy(compaction={"strategy": "turns", "every_n_user_messages": 2}, summarizer={"yield_to_agent": True})
    agent = Agent(proxy, "stops")
    for text in ("task", "two", "three"):
        agent.say(text)
    assert first_summary.reached.wait(10)  # the summary is being written ...
    agent.say("four")  # ... when the agent asks: the summary is stopped, the agent answered at once
    assert first_summary.client_gone.wait(10)
    servers.run(proxy.app[ENGINE].idle())
    assert proxy.app[SUMMARIZER].inflight.preemptions == 1
    [summary] = agent.trajectory()["summaries"]
    assert summary["text"] == "SUMMARY made once the upstream was free"
    assert len(agent_requests(upstream)) == 4


@pytest.mark.parametrize("yaml_value", ["off", "false", "no", "'off'"])
def test_yaml_reads_an_unquoted_off_as_the_off_strategy(tmp_path, yaml_value):
    config = tmp_path / "c.yaml"
    config.write_text(f"compaction:\n  strategy: {yaml_value}\nprofiles:\n  quiet:\n    compaction:\n      strategy: {yaml_value}\n")
    settings = load_settings(config)
    assert settings.compaction.strategy == "off" and settings.profile("quiet").compaction.strategy == "off"


def test_a_true_strategy_is_still_a_clear_error(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("compaction:\n  strategy: on\n")
    with pytest.raises(ConfigError, match="compaction.strategy"):
        load_settings(config)


def test_a_summary_is_asked_in_its_conversations_format_where_the_clients_key_opens_no_other():
    def summarizer(**settings):
        return Summarizer(SummarizerSettings(**settings), route=lambda model: None, dialects=DIALECTS, inflight=InFlight())

    own = summarizer()
    assert [own.format_for(name) for name in ("chat", "responses", "messages", "gemini", "unknown")] == [
        CHAT, CHAT, MESSAGES, GEMINI, CHAT
    ]
    assert summarizer(model="a-summarizer").format_for("messages") is CHAT  # `summarizer.model` is asked in chat


def test_each_format_makes_the_summary_request_and_reads_its_answer():
    assert CHAT.summary_request("gpt-4o-mini", "sys", "user", 300) == {
        "model": "gpt-4o-mini", "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "user"}],
        "max_tokens": 300,
    }
    assert CHAT.summary_request("openai/gpt-5-mini", "s", "u", 300)["max_completion_tokens"] == 300  # reasoning model
    chat = {"choices": [{"message": {"content": " gist \n"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 90, "completion_tokens": 30}}
    assert CHAT.summary_reply(chat) == Completion("gist", 90, 30, cut=True)
    assert CHAT.summary_reply({"choices": [{"message": {"content": None}}]}).text == ""  # no summary

    assert MESSAGES.summary_request("claude-x", "sys", "user", 300) == {
        "model": "claude-x", "max_tokens": 300, "system": "sys", "messages": [{"role": "user", "content": "user"}],
    }
    usage = {"input_tokens": 5, "cache_read_input_tokens": 80, "cache_creation_input_tokens": 10, "output_tokens": 30}
    content = [{"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "gist"}]
    message = {"content": content, "stop_reason": "end_turn", "usage": usage}
    assert MESSAGES.summary_reply(message) == Completion("gist", 95, 30)  # cache reads and writes are input too

    request = GEMINI.summary_request("gemini-x", "sys", "user", 300)
    assert request.path == "/v1beta/models/gemini-x:generateContent"
    assert request == {
        "systemInstruction": {"parts": [{"text": "sys"}]},
        "contents": [{"role": "user", "parts": [{"text": "user"}]}],
        "generationConfig": {"maxOutputTokens": 300},
    }
    candidate = {"content": {"parts": [{"text": "plan", "thought": True}, {"text": "gist"}]}, "finishReason": "MAX_TOKENS"}
    usage = {"promptTokenCount": 90, "candidatesTokenCount": 30, "thoughtsTokenCount": 12}
    assert GEMINI.summary_reply({"candidates": [candidate], "usageMetadata": usage}) == Completion("gist", 90, 42, cut=True)
