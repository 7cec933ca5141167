"""Stable rewrites: what was already sent upstream is sent again byte for byte, so prompt caches hit."""

from __future__ import annotations

import json

from tests.conftest import openai_client

TOOLS = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {}}}}]


def test_thirty_turns_resend_identical_bytes_for_the_seen_part(make_proxy, upstream):
    proxy = make_proxy(quota={"max_llm_calls": 500}, context={"history_token_limit": 1_000_000})
    client = openai_client(proxy, headers={"X-Conversation-ID": "stable"})
    history: list[dict] = [{"role": "system", "content": "agent"}, {"role": "user", "content": "task"}]
    previous: list[bytes] = []
    for turn in range(30):
        call_id = f"call_{turn}"
        output = (f"output {turn} " * (2000 if turn % 3 == 0 else 5)).strip()  # every third one is truncated
        payload = json.dumps({"turn": turn, "ok": True}) if turn % 3 == 1 else output
        history += [
            {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": call_id, "content": payload},
        ]
        reply = client.chat.completions.create(model="gpt-4o-mini", messages=history, tools=TOOLS)
        history.append({"role": "assistant", "content": reply.choices[0].message.content})
        history.append({"role": "user", "content": f"continue {turn}"})
        sent = [json.dumps(m, sort_keys=True).encode() for m in upstream.chat_requests()[-1]["messages"]]
        assert sent[: len(previous)] == previous, f"turn {turn} changed bytes already sent"
        assert len(sent) > len(previous)
        previous = sent
    rewritten = [m for m in upstream.chat_requests()[-1]["messages"] if m["role"] == "tool"]
    assert sum("out_" in m["content"] for m in rewritten) == 10
    assert sum("_quota_info" in m["content"] for m in rewritten) == 10


def test_between_two_cuts_of_the_window_every_prompt_extends_the_last(make_proxy, upstream):
    """With a window that cuts in steps, twenty and more turns in a row send the previous prompt's
    bytes first; a cut happens only when the limit is reached, and then the window is refilled
    only halfway."""
    proxy = make_proxy(context={"history_token_limit": 4000, "window_refill": 0.5})
    client = openai_client(proxy, headers={"X-Conversation-ID": "steps"})
    history: list[dict] = [{"role": "system", "content": "agent"}, {"role": "user", "content": "task"}]
    prompts: list[list[bytes]] = []
    for turn in range(70):
        call_id = f"call_{turn}"
        history.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "run", "arguments": "{}"}}]})
        history.append({"role": "tool", "tool_call_id": call_id, "content": f"output {turn} " * 40})
        reply = client.chat.completions.create(model="gpt-4o-mini", messages=history, tools=TOOLS)
        history.append({"role": "assistant", "content": reply.choices[0].message.content})
        prompts.append([json.dumps(m, sort_keys=True).encode() for m in upstream.chat_requests()[-1]["messages"]])
    extends = [later[: len(earlier)] == earlier for earlier, later in zip(prompts, prompts[1:])]
    runs, run = [], 0
    for extended in extends:
        run = run + 1 if extended else 0
        runs.append(run)
    cuts = extends.count(False)
    assert 2 <= cuts <= 5  # the limit was reached a few times, not every turn
    assert max(runs) >= 20
    assert sum(extends) / len(extends) >= 0.9
