"""What a summary carries besides the summarizer's text, through the proxy on the strict fake:
the user's own words (verbatim, carried forward, shortened to a ref past their budget), key facts
ranked by salience and carried forward, never noise, and summaries bounded in size."""

from __future__ import annotations

import json

from proxy.compaction.quotes import quote
from proxy.compaction.render import QUOTES_HEADER, SUMMARY_HEADER, render_summary
from proxy.config import CompactionSettings
from proxy.state import ENGINE
from proxy.store import KeyFact, QuotedMessage, Summary
from proxy.tokens import TokenCounter
from tests.compaction.test_compaction import Agent, agent_requests, foreground, summary_requests
from tests.fakes.fake_upstream import Reply, default_responder
from tests.fakes.responders import (
    KEEPS_NOTHING,
    READ_TOOL,
    REF,
    answers_at_length,
    by_kind,
    fixed_summary,
    is_summary_request,
)

LOG = "\n".join(
    f"2024-05-12T12:04:{i:02d}.403Z INFO [{i:05d}] order {10230 + i} done in {400 + i} ms cpu=0.{i:02d} "
    f"mem 12.5 MB at 12:04:{i:02d} addr 0x7ffd{i:04x} bytes de ad be ef {i:02x}"
    for i in range(40)
)


def summary_message(request: dict) -> str:
    assert request["messages"][1]["role"] == "system"
    return request["messages"][1]["content"]


def test_a_fact_only_in_an_old_assistant_message_survives_three_compactions(make_proxy, upstream):
    upstream.responder = by_kind(summarizer=fixed_summary())  # keeps nothing, every time
    agent = Agent(make_proxy(**foreground(strategy="turns", every_n_user_messages=2)), "survives")
    agent.say("task: find why invoices round wrong")
    agent.messages.append({"role": "assistant", "content": "The rounding happens in src/billing/rounding.py, "
                           "introduced by commit 3f9a2c1d7e; see ticket PAY-4821."})
    for i in range(12):
        agent.say(f"go on with step {i}")
    summaries = agent.trajectory()["summaries"]
    assert len(summaries) >= 4 and all(s["text"] == KEEPS_NOTHING for s in summaries)
    said = "The rounding happens in src/billing/rounding.py, introduced by commit 3f9a2c1d7e; see ticket PAY-4821."
    for summary in summaries:  # in every summary since the one that covered it
        assert said in summary["key_facts"]
    sent = agent_requests(upstream)[-1]["messages"]
    assert not any("The rounding happens" in (m.get("content") or "") for m in sent if m["role"] != "system")  # gone ...
    assert f"- {said}" in summary_message(agent_requests(upstream)[-1])  # ... but not what it said


def test_timestamps_measurements_and_our_markers_never_become_key_facts(make_proxy, upstream):
    upstream.responder = by_kind(summarizer=fixed_summary())
    agent = Agent(make_proxy(**foreground(strategy="turns", every_n_user_messages=2)), "noise")
    agent.say("task: check the order service")
    agent.tool_round(1, LOG)
    agent.tool_round(2, "x" * 12_000)  # shortened: its marker, with a ref and counts, goes upstream
    marker = next(m["content"] for m in agent_requests(upstream)[-1]["messages"] if "[context-proxy:" in (m["content"] or ""))
    ref = REF.search(marker).group(0)
    # A model repeating our marker and a made-up ref in its own words, as small models do.
    agent.messages.append({"role": "assistant", "content": f"Noted {marker} I will read ref {ref}, then "
                           f"[... 26000 more characters] in call_abc123def456ghi789 at 2024-05-12 12:04:46.403."})
    agent.say("look at services/orders/worker.py")
    agent.say("and then?")
    [summary, *_] = agent.trajectory()["summaries"]
    facts = summary["key_facts"]
    assert "services/orders/worker.py" not in facts  # a user's words: carried verbatim as such, not repeated
    noise = ("46.403", "403", "12:04", "26000", "12000", "2000", "8000", "10230", "0x7ffd", "12.5", ref, "call_abc123def456ghi789")
    assert not [f for f in facts if any(n in f for n in noise)], facts
    assert not [f for f in facts if f.isdigit()], facts  # a log's bare numbers are counters, not facts


def test_the_strongest_statements_keep_their_place_within_the_budget(make_proxy, upstream):
    upstream.responder = by_kind(summarizer=fixed_summary())
    # Room for about two statements: the least salient go.
    agent = Agent(make_proxy(**foreground(strategy="turns", every_n_user_messages=2, key_facts_chars=130)), "rank")
    agent.say("task: audit")
    agent.tool_round(1, "found lib/seen/only_once.py and lib/seen/twice.py")  # a short output: nothing stands out
    agent.tool_round(2, "\n".join(["ok"] * 20 + ["ERROR ledger totals differ by 4711 cents"] + ["ok"] * 20))
    agent.messages.append({"role": "assistant", "content": "I will edit app/named/by_me.py next."})
    agent.messages.append({"role": "assistant", "content": "Hmm, let me think."})
    agent.say("next")
    agent.say("and next")
    [summary] = agent.trajectory()["summaries"]
    assert summary["key_facts"] == ["ERROR ledger totals differ by 4711 cents", "I will edit app/named/by_me.py next."]


def test_every_user_message_after_the_task_reaches_the_upstream_verbatim(make_proxy, upstream):
    upstream.responder = by_kind(summarizer=fixed_summary())
    agent = Agent(make_proxy(**foreground(strategy="turns", every_n_user_messages=2)), "words")
    agent.say("task: ship the release")
    said = [
        "Decision: we stay on Python 3.11 and do not upgrade pydantic.",
        "Never touch legacy/auth.py,\nit is frozen until the audit.",  # several lines, kept as written
        *[f"step {i}" for i in range(8)],
    ]
    for text in said:
        agent.say(text)
    summaries = agent.trajectory()["summaries"]
    assert len(summaries) >= 3
    last = agent_requests(upstream)[-1]
    message = summary_message(last)
    in_window = [m["content"] for m in last["messages"][2:] if m["role"] == "user"]
    assert in_window[0] == "task: ship the release"  # the task is pinned, not quoted
    for text in said:
        assert f"\n- {text}" in message or text in in_window, text
    assert summaries[-1]["user_messages"][0]["text"] == said[0]  # carried forward from the first summary


def test_past_their_budget_the_oldest_user_messages_are_shortened_to_a_head_and_a_readable_ref(make_proxy, upstream):
    long_instruction = "Keep the public API of src/api/v2.py stable. " + "Details follow. " * 80
    read_back: list[str] = []

    def agent_model(body: dict) -> Reply:
        content = summary_message(body) if body["messages"][1]["role"] == "system" else ""
        offered = any(t["function"]["name"] == READ_TOOL for t in body.get("tools") or ())
        if body["messages"][-1]["role"] == "tool":
            read_back.append(body["messages"][-1]["content"])
            return Reply.text("read it")
        if offered and "the whole message is ref" in content and not read_back:
            ref = REF.search(content).group(0)
            return Reply.tool_calls([(READ_TOOL, json.dumps({"ref": ref, "offset": 0, "length": 8000}))])
        return default_responder(body)

    upstream.responder = by_kind(agent=agent_model, summarizer=fixed_summary())
    agent = Agent(make_proxy(**foreground(strategy="turns", every_n_user_messages=2, user_messages_chars=600)), "budget")
    agent.say("task: refactor")
    agent.say(long_instruction)
    for i in range(6):
        agent.say(f"short note {i}")
    [*_, summary] = agent.trajectory()["summaries"]
    oldest = summary["user_messages"][0]
    assert oldest["text"] == long_instruction[: len(oldest["text"])] and oldest["chars"] == len(long_instruction)
    assert oldest["ref"] is not None
    assert len(summary_message(agent_requests(upstream)[-1])) < 600 + 400  # the budget, plus the headers
    assert read_back and long_instruction[:200] in read_back[0]  # the ref reads the whole message back


def test_a_thousand_word_summary_is_cut_to_max_summary_tokens(make_proxy, upstream):
    upstream.responder = by_kind(summarizer=answers_at_length(1000))
    agent = Agent(make_proxy(**foreground(strategy="turns", every_n_user_messages=2, max_summary_tokens=120)), "long")
    for text in ("task", "two", "three", "four"):
        agent.say(text)
    [request] = summary_requests(upstream)
    assert request["max_tokens"] == 120 and "Stay under\n90 words" in request["messages"][0]["content"]  # asked for ...
    [summary] = agent.trajectory()["summaries"]
    tokens = TokenCounter().count({"role": "user", "content": summary["text"]}, "gpt-4o-mini")
    assert 60 < tokens <= 120  # ... and held to, though the model ignored it


def test_budget_summary_plus_kept_history_does_not_trigger_the_next_compaction(make_proxy, upstream, servers):
    upstream.responder = by_kind(summarizer=answers_at_length(900))  # ~5,000 characters, asked or not
    proxy = make_proxy(compaction={"strategy": "budget", "max_history_summary_length": 1500})
    agent = Agent(proxy, "verbose")
    agent.say("task: investigate")
    n = 0
    while not summary_requests(upstream):
        agent.tool_round(n, f"result {n} " + "x" * 500)
        servers.run(proxy.app[ENGINE].idle())  # after each reply, in the background
        n += 1
    agent.say("and now?")
    message = summary_message(agent_requests(upstream)[-1])
    assert len(message) < 1500
    servers.run(proxy.app[ENGINE].idle())
    # The summary and the history after it are under the limit: no compaction right after one.
    assert len(summary_requests(upstream)) == 1


def test_a_summary_record_written_before_its_parts_were_data_still_reads():
    old = {"text": "t", "first_seq": 1, "last_seq": 4, "strategy": "turns", "model": "m", "tokens_in": 1,
           "tokens_out": 1, "created_at": 0.0, "id": 3}
    summary = Summary.from_record(old)
    assert (summary.facts, summary.user_messages, summary.user_messages_omitted, summary.id) == ([], [], 0, 3)
    full = Summary("t", 1, 4, "turns", "m", 1, 1, facts=[KeyFact("a/b.py", 1, 0, 2)],
                   user_messages=[QuotedMessage(3, "hi", 2)], user_messages_omitted=2)
    assert Summary.from_record(json.loads(json.dumps(full.to_record()))) == full


def test_the_summarizer_request_is_the_agents_model_unless_named(make_proxy, upstream):
    upstream.responder = by_kind(summarizer=fixed_summary())
    proxy = make_proxy(**foreground(strategy="turns", every_n_user_messages=2), summarizer={"model": "gpt-4o"})
    agent = Agent(proxy, "named")
    for text in ("task", "two", "three", "four"):
        agent.say(text)
    assert [r["model"] for r in upstream.chat_requests() if is_summary_request(r)] == ["gpt-4o"]


def test_the_render_function_takes_the_windows_left_out_user_messages_within_the_same_budget():
    settings = CompactionSettings(user_messages_chars=500)
    summary = Summary("Did things.", 1, 4, "turns", "m", 1, 1, facts=[KeyFact("src/a.py", 1, 0, 3)],
                      user_messages=[QuotedMessage(3, "use src/a.py", 12)])
    alone = render_summary(summary, settings)
    assert alone.text == (
        SUMMARY_HEADER + "Did things.\n\nKey facts (kept verbatim from the summarized messages):\n- src/a.py\n\n"
        + QUOTES_HEADER + "\n\n- use src/a.py"
    ) and alone.refs == {}
    assert render_summary(summary, settings) == alone  # a pure function: the same bytes every turn
    left_out = [quote(9, "x" * 600), quote(12, "newest")]
    both = render_summary(summary, settings, left_out_user_messages=left_out, ref_for=lambda seq: f"out_{seq}_{'0' * 24}")
    assert both.refs == {9: "out_9_" + "0" * 24}  # the older long one, shortened to a head and its ref
    assert both.text.index("- use src/a.py") < both.text.index("- " + "x" * 240) < both.text.index("- newest")
    assert len(both.text) < len(alone.text) + 500
    without_summary = render_summary(None, settings, left_out_user_messages=left_out[1:], ref_for=str)
    assert without_summary.text.endswith("- newest") and render_summary(None, settings) is None
