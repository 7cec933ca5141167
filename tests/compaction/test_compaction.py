"""History compaction: turns, budget and mask strategies, incremental summaries, key facts, chunking,
per-request control, background runs, failures, and the trajectory record."""

from __future__ import annotations

import json
from dataclasses import asdict

import httpx
import pytest

from proxy.state import COMPACTION, ENGINE
from proxy.store import StoredMessage
from proxy.tokens import TokenCounter
from proxy.tools.history_search import SEARCH_TOOL_SPEC
from proxy.tools.readback import READ_TOOL_SPEC
from tests.conftest import ALICE
from tests.fakes.fake_upstream import Reply, default_responder
from tests.fakes.responders import is_summary_request

SYSTEM = {"role": "system", "content": "You are a coding agent."}


def summary_requests(upstream) -> list[dict]:
    return [r for r in upstream.chat_requests() if is_summary_request(r)]


def agent_requests(upstream) -> list[dict]:
    return [r for r in upstream.chat_requests() if not is_summary_request(r)]


def responder(summary_text: str = "SUMMARY: the agent fixed things."):
    def respond(body: dict) -> Reply:
        if is_summary_request(body):
            return Reply.text(f"{summary_text} #{len(body['messages'][1]['content'])}")
        return default_responder(body)

    return respond


class Agent:
    """A full-history client that keeps its transcript, over raw HTTP (headers visible)."""

    def __init__(self, proxy, cid: str, model: str = "gpt-4o-mini", **headers: str) -> None:
        self.http = httpx.Client(base_url=proxy.url, timeout=30, auth=proxy.admin_auth)
        self.cid, self.model, self.headers = cid, model, headers
        self.messages: list[dict] = [SYSTEM]
        self.last: httpx.Response | None = None

    def say(self, text: str, **headers: str) -> httpx.Response:
        self.messages.append({"role": "user", "content": text})
        return self._send(headers)

    def tool_round(self, n: int, output: str) -> httpx.Response:
        call = f"call_{n}"
        self.messages += [
            {"role": "assistant", "content": None, "tool_calls": [{"id": call, "type": "function", "function": {"name": "sh", "arguments": json.dumps({"cmd": f"step {n}"})}}]},
            {"role": "tool", "tool_call_id": call, "content": output},
        ]
        return self._send({})

    def _send(self, headers: dict) -> httpx.Response:
        self.last = self.http.post(
            "/v1/chat/completions",
            json={"model": self.model, "messages": self.messages},
            headers={"Authorization": f"Bearer {ALICE}", "X-Conversation-ID": self.cid, **self.headers, **headers},
        )
        assert self.last.status_code == 200, self.last.text
        self.messages.append({"role": "assistant", "content": self.last.json()["choices"][0]["message"]["content"]})
        return self.last

    def trajectory(self) -> dict:
        return self.http.get(f"/v1/conversations/{self.cid}/trajectory", params={"limit": 1000}).json()


def foreground(**compaction) -> dict:
    return {"compaction": {"background": False, **compaction}}


def test_turns_summarizes_every_n_user_messages_and_pins_the_task(make_proxy, upstream):
    upstream.responder = responder()
    agent = Agent(make_proxy(**foreground(strategy="turns", every_n_user_messages=3)), "turns")
    for text in ("task: fix bug 4711 in src/app.py", "u2", "u3"):
        agent.say(text)
    assert summary_requests(upstream) == []
    response = agent.say("u4")  # 3 user messages since the (absent) last summary: compact first
    [summarizer_call] = summary_requests(upstream)
    window_text = summarizer_call["messages"][1]["content"]
    assert "Previous summary: (none yet)" in window_text and "u2" in window_text and "u3" not in window_text
    sent = agent_requests(upstream)[-1]["messages"]
    assert sent[0] == SYSTEM and sent[1]["role"] == "system" and "SUMMARY: the agent fixed things." in sent[1]["content"]
    assert [m["content"] for m in sent[2:]] == ["task: fix bug 4711 in src/app.py", "u3", "reply to: u3", "u4"]
    assert response.headers["X-Context-Messages-Left-Out"] == "3"

    agent.say("u5")
    agent.say("u6")  # u3 stayed after the boundary, counted already: u4 and u5 are only two new ones
    assert len(summary_requests(upstream)) == 1
    agent.say("u7")  # u4, u5, u6: three new user messages
    second = summary_requests(upstream)[-1]["messages"][1]["content"]
    # Incremental: the previous summary plus only the messages since; nothing older resent.
    assert "SUMMARY: the agent fixed things." in second and "u4" in second and "u2" not in second
    assert len(summary_requests(upstream)) == 2
    for text in ("u8", "u9", "u10"):
        agent.say(text)
    assert len(summary_requests(upstream)) == 3  # every 3 user messages, not every 2


def test_budget_window_is_expanded_so_a_call_never_splits_from_its_result(make_proxy, upstream):
    upstream.responder = responder()
    proxy = make_proxy(quota={"max_llm_calls": 50}, **foreground(strategy="budget", max_history_summary_length=1500, compaction_percent=50))
    agent = Agent(proxy, "budget")
    agent.say("task: investigate")
    for n in range(4):
        agent.tool_round(n, f"result {n} " + "x" * 500)
    call = summary_requests(upstream)[0]
    record = agent.trajectory()
    summary = record["summaries"][0]
    by_seq = {m["seq"]: m for m in record["data"]}
    assert not by_seq[summary["last_seq"]].get("tool_calls")  # never ends on a call ...
    assert by_seq[summary["last_seq"] + 1]["role"] != "tool"  # ... nor before one of its results
    prompt = call["messages"][1]["content"]
    assert "Recent context after these messages" in prompt and "LLM call quota:" in prompt
    statuses = [m["status"] for m in record["data"][: summary["last_seq"]]]
    assert statuses == ["live", "live"] + ["compacted"] * (summary["last_seq"] - 2)  # system and task: still sent


def test_mask_replaces_old_tool_outputs_with_readable_placeholders(make_proxy, upstream):
    agent = Agent(make_proxy(compaction={"strategy": "mask", "keep_tool_outputs": 2, "mask_batch": 1}), "mask")
    agent.say("task")
    for n in range(4):
        agent.tool_round(n, f"output number {n}")
    sent = [m for m in agent_requests(upstream)[-1]["messages"] if m["role"] == "tool"]
    assert [m["content"].startswith("[context-proxy: older tool output omitted") for m in sent] == [True, True, False, False]
    assert "read_tool_output" in [t["function"]["name"] for t in agent_requests(upstream)[-1]["tools"]]
    assert summary_requests(upstream) == []  # mask needs no LLM


def test_mask_masks_in_batches_so_prompts_extend_between_them(make_proxy, upstream):
    agent = Agent(make_proxy(compaction={"strategy": "mask", "keep_tool_outputs": 2, "mask_batch": 3}), "batches")
    agent.say("task")
    masked_counts, prompts = [], []
    for n in range(12):
        agent.tool_round(n, f"output number {n}")
        sent = agent_requests(upstream)[-1]["messages"]
        prompts.append([json.dumps(m, sort_keys=True) for m in sent])
        masked_counts.append(sum(m["role"] == "tool" and m["content"].startswith("[context-proxy: older") for m in sent))
    # Never more than keep + batch - 1 whole outputs, never fewer than keep; masking moves in steps.
    whole = [n + 1 - masked for n, masked in enumerate(masked_counts)]
    assert all(min(n + 1, 2) <= w <= 4 for n, w in enumerate(whole))
    assert masked_counts == sorted(masked_counts) and len(set(masked_counts)) <= 5
    extends = [b[: len(a)] == a for a, b in zip(prompts, prompts[1:])]
    assert extends.count(False) == len(set(masked_counts)) - 1  # the prompt changes only when a batch is masked


def test_lost_statements_come_back_as_key_facts(make_proxy, upstream):
    upstream.responder = responder("The agent worked on the server.")
    agent = Agent(make_proxy(**foreground(strategy="turns", every_n_user_messages=3)), "facts")
    agent.say("task: make the server configurable")
    said = ("I will edit src/server/main.py to listen on port 8080, as https://docs.example.com/cfg says, "
            "and bump version 2.4.1.")
    agent.messages.append({"role": "assistant", "content": said})
    agent.say("third")
    agent.say("fourth")
    agent.say("next")
    [summary] = agent.trajectory()["summaries"]
    assert summary["text"].startswith("The agent worked on the server.")  # the summarizer's own text, apart
    assert summary["key_facts"] == [said]  # the sentence that carries them, not its bare tokens
    sent = agent_requests(upstream)[-1]["messages"][1]["content"]
    assert f"Key facts (kept verbatim from the summarized messages):\n- {said}" in sent


def test_a_window_too_big_for_the_summarizer_is_summarized_in_chunks(make_proxy, upstream):
    upstream.responder = responder()
    agent = Agent(make_proxy(**foreground(strategy="turns", every_n_user_messages=3, max_summarizer_input_tokens=1000)), "chunks")
    for i in range(3):
        agent.say(f"part {i}: " + "lorem ipsum dolor sit amet " * 60)
    agent.say("now")
    calls = summary_requests(upstream)
    assert len(calls) >= 2
    assert "Previous summary: (none yet)" in calls[0]["messages"][1]["content"]
    assert "SUMMARY: the agent fixed things." in calls[1]["messages"][1]["content"]  # folded chunk by chunk
    assert len(agent.trajectory()["summaries"]) == 1


def test_force_and_skip_per_request(make_proxy, upstream, servers):
    upstream.responder = responder()
    proxy = make_proxy(compaction={"strategy": "turns", "every_n_user_messages": 2})
    agent = Agent(proxy, "control")
    agent.say("task")
    agent.say("b")
    agent.say("c", **{"X-Compaction": "skip"})  # due, but skipped
    servers.run(proxy.app[ENGINE].idle())
    assert summary_requests(upstream) == []
    forced = agent.say("d", **{"X-Compaction": "force"})
    assert len(summary_requests(upstream)) == 1
    assert int(forced.headers["X-Context-Messages-Left-Out"]) > 0
    again = agent.http.post(
        "/v1/chat/completions",
        json={"model": "gpt-4o-mini", "messages": agent.messages},
        headers={"Authorization": f"Bearer {ALICE}", "X-Conversation-ID": "control", "X-Compaction": "force"},
    )
    assert again.status_code == 200
    assert len(summary_requests(upstream)) == 1  # the same window is never compacted twice in a row
    bad = agent.http.post("/v1/chat/completions", json={"model": "m", "messages": agent.messages},
                          headers={"Authorization": f"Bearer {ALICE}", "X-Compaction": "sometimes"})
    assert bad.status_code == 400


def test_background_compaction_does_not_hold_the_reply(make_proxy, upstream, servers):
    proxy = make_proxy(compaction={"strategy": "turns", "every_n_user_messages": 2})
    gate = Reply.text("SUMMARY in the background", pause_after_chunks=0)  # held until released

    def respond(body: dict) -> Reply:
        return gate if is_summary_request(body) else default_responder(body)

    upstream.responder = respond
    agent = Agent(proxy, "bg")
    agent.say("task")
    agent.say("second")
    agent.say("third")  # its reply triggers a compaction after it
    assert gate.reached.wait(10)  # the summarizer is being held right now ...
    fourth = agent.say("fourth")  # ... and the next turn is answered meanwhile, without the summary
    assert "SUMMARY" not in json.dumps(agent_requests(upstream)[-1]["messages"])
    assert fourth.status_code == 200
    gate.release()
    servers.run(proxy.app[ENGINE].idle())
    agent.say("fifth")
    assert "SUMMARY in the background" in json.dumps(agent_requests(upstream)[-1]["messages"])


@pytest.mark.parametrize("failure", [
    Reply.error(500, {"error": {"message": "down", "type": "server_error", "code": None}}),
    Reply.text("   "),  # junk: an empty summary
])
def test_a_failing_summarizer_loses_nothing_and_retries_later_not_on_the_next_turn(make_proxy, upstream, failure):
    proxy = make_proxy(**foreground(strategy="turns", every_n_user_messages=2, retry_backoff_s=0))
    failed_once = []

    def respond(body: dict) -> Reply:
        if is_summary_request(body):
            if not failed_once:
                failed_once.append(True)
                return failure
            return Reply.text("SUMMARY after retry")
        return default_responder(body)

    upstream.responder = respond
    agent = Agent(proxy, "fails")
    for text in ("task", "two", "three", "four"):  # at "four" a compaction is due: the summarizer fails
        agent.say(text)
    assert proxy.app[COMPACTION].failures == 1
    assert agent.trajectory()["summaries"] == []
    assert [m["status"] for m in agent.trajectory()["data"]] == ["live"] * 9
    agent.say("five")  # backing off: no summarizer call on the turn right after a failure
    assert len(summary_requests(upstream)) == 1
    agent.say("six")  # retried
    assert len(summary_requests(upstream)) == 2
    assert [s["text"] for s in agent.trajectory()["summaries"]][0].startswith("SUMMARY after retry")


def test_the_window_trims_while_no_summary_is_ready(make_proxy, upstream):
    proxy = make_proxy(context={"history_token_limit": 120}, compaction={"strategy": "turns", "every_n_user_messages": 50})
    agent = Agent(proxy, "trim")
    for i in range(12):
        response = agent.say(f"message {i} " + "word " * 20)
    # The limit, plus the system prompt; the recall tools go too (the window left messages out).
    recall_tools = TokenCounter().count_texts(
        [json.dumps({"type": "function", "function": asdict(spec)}) for spec in (READ_TOOL_SPEC, SEARCH_TOOL_SPEC)], "m"
    )
    assert int(response.headers["X-Context-Tokens-Sent"]) <= 120 + 40 + recall_tools
    assert int(response.headers["X-Context-Messages-Left-Out"]) > 10


def test_custom_compactor_class(make_proxy, upstream):
    proxy = make_proxy(**foreground(strategy="turns", every_n_user_messages=1, compactor_class="tests.support.custom_compactor.FixedCompactor"))
    agent = Agent(proxy, "custom")
    agent.say("task")
    agent.say("two")
    assert "CUSTOM SUMMARY" in json.dumps(agent_requests(upstream)[-1]["messages"])


def test_trajectory_is_the_whole_replayable_record(make_proxy, upstream):
    upstream.responder = responder()
    agent = Agent(make_proxy(**foreground(strategy="turns", every_n_user_messages=2)), "record")
    agent.say("task")
    agent.tool_round(1, "y" * 12_000)
    agent.say("second")
    agent.say("third")
    record = agent.trajectory()
    [summary] = record["summaries"]
    assert summary["tokens_in"] > 0 and summary["model"] == "gpt-4o-mini" and summary["strategy"] == "turns"
    statuses = {m["seq"]: m["status"] for m in record["data"]}
    assert statuses[1] == statuses[2] == "live"  # the system prompt and the pinned task are still sent
    assert [statuses[s] for s in range(3, summary["last_seq"] + 1)] == ["compacted"] * (summary["last_seq"] - 2)
    tool = next(m for m in record["data"] if m["role"] == "tool")
    assert tool["content"] == "y" * 12_000 and tool["ref"].startswith("out_")
    full = agent.http.get(f"/v1/conversations/record/tool_outputs/{tool['ref']}").json()
    assert full["content"] == "y" * 12_000


def stored(seq: int, role: str, **fields) -> StoredMessage:
    return StoredMessage(seq, {"role": role, "content": fields.pop("content", f"m{seq}"), **fields}, "h", "live", 0.0)


def as_entries(messages: list[StoredMessage]) -> list:
    from proxy.compaction.windows import entries
    from proxy.dialects.chat import CHAT

    return entries(CHAT.codec, messages)


def test_budget_window_expands_forward_past_a_calls_results():
    from proxy.compaction.windows import budget_window
    from proxy.config import CompactionSettings, TruncationSettings

    call = {"tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}], "content": None}
    messages = as_entries([
        stored(1, "user"), stored(2, "assistant", **call), stored(3, "tool", tool_call_id="c"),
        stored(4, "tool", tool_call_id="c"), stored(5, "tool", tool_call_id="c"), stored(6, "assistant"),
        stored(7, "user"), stored(8, "assistant"),
    ])
    settings = CompactionSettings(strategy="budget", compaction_percent=40)  # 40% of 8 = 4: inside the results
    window = budget_window(messages, settings, TruncationSettings(), force=True)
    assert [m.seq for m in window] == [1, 2, 3, 4, 5]
    assert budget_window(messages[:2], settings, TruncationSettings(), force=True) == []  # two or fewer: skipped
    assert budget_window(messages, settings, TruncationSettings(), force=False) == []  # under the budget
