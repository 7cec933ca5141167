"""The fast path (proxy/engine/fastpath.py) changes what a turn costs, never what goes upstream.

One long randomized agent run (tool outputs long and short, window cuts, summaries, inbox notes,
profile switches, read-back rounds, streamed turns (in runs, as a client keeps to one), edits of old messages,
reordering, regenerated turns) goes through the real proxy twice: with the fast path, then with
it off. The strict fake records every upstream request's bytes; the two runs must be identical,
byte for byte (but for the time an inbox note names). Both proxies use one store (the
conversation deleted in between), so refs, which are signed with the store's secret, are the
same too. The run is made in each wire format the proxy manages: Chat Completions and Responses
by the `openai` client, Anthropic Messages by the `anthropic` client, whose agent answers the
model's own tool_use blocks (its messages alternate, as the real API wants), and the Gemini API
by `google-genai` (whose streamed turns differ from the JSON ones only in the URL: a body that
extends the last one may switch).

`FAST_PATH_SEED=n` makes another run (each seed its own history). Streamed turns end as the
clients end them: the openai client hangs up at `[DONE]`, and aiohttp then cancels the proxy's
handler while the turn's last writes land. Before the engine finished a turn whole (`whole` in
proxy/engine/engine.py), that lost a window cut now and then, and the two runs differed.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import types

from proxy.state import ENGINE
from tests.conftest import openai_client
from tests.fakes.fake_upstream import Reply, ToolCall, last_user_text
from tests.fakes.responders import SUMMARIZER_MARK, TOOL_SUMMARY_MARK, is_summary_request, is_tool_summary_request
from tests.support.messages_helpers import MODEL as CLAUDE_MODEL
from tests.support.messages_helpers import as_params, claude_client

CONVERSATION = "fast-path-run"
SEED = int(os.environ.get("FAST_PATH_SEED", "16"))
# Enough for window cuts and summaries in every format. The openai client transforms its params
# in Python, O(history) a request: the test's time grows with the square of its turns.
TURNS = 64
TOOLS_CHAT = [{"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {}}}}]
TOOLS_RESPONSES = [{"type": "function", "name": "run", "parameters": {"type": "object", "properties": {}}}]
TOOLS_MESSAGES = [{"name": "run", "description": "Run a step", "input_schema": {"type": "object", "properties": {}}}]
SYSTEM = "You are a coding agent."
TASK = "Fix the failing test."
REF = re.compile(r"out_\d+_[0-9a-f]{24}")
# An inbox note says when it was posted, the fake Gemini API signs each call it makes afresh:
# the things two runs can't share.
POSTED_AT = re.compile(rb"written at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")
SIGNATURE = re.compile(rb'"thoughtSignature":"[^"]*"')
UPSTREAM_PATHS = ("/chat/completions", "/responses", "/messages", ":generateContent", ":streamGenerateContent")
GEMINI_MODEL = "gemini-2.5-flash"
RUN_DECLARATION = types.FunctionDeclaration(name="run", description="Run a step", parameters_json_schema={"type": "object", "properties": {}})
SETTINGS: dict[str, dict[str, Any]] = {
    "context": {"history_token_limit": 4000, "window_refill": 0.5},
    "compaction": {"strategy": "turns", "every_n_user_messages": 6, "background": False},
    "quota": {"max_llm_calls": 100_000},
    "profiles": {"tight": {"context": {"history_token_limit": 2500}}},
}


def transcript(body: dict) -> list[Any]:
    return body.get("messages") or body.get("input") or body.get("contents") or []


def system_text(body: dict) -> str:
    """A Gemini request's system instruction, as text."""
    parts = (body.get("systemInstruction") or {}).get("parts") or []
    return "".join(str(p.get("text") or "") for p in parts if isinstance(p, dict))


def last_output(body: dict) -> str:
    """The text the request's last item holds (a read-back answer's, when it is one); of a
    Messages user message, its first tool_result's; of a Gemini content, its first response's."""
    last = (transcript(body) or [{}])[-1]
    if not isinstance(last, dict):
        return ""
    if "parts" in last:
        response = (last["parts"] or [{}])[0].get("functionResponse") or {}
        return str((response.get("response") or {}).get("output") or "")
    content = last.get("content")
    if isinstance(content, list):  # Messages: a user message whose first block is a tool_result
        first = content[0] if content and isinstance(content[0], dict) else {}
        return str(first.get("content") or "") if first.get("type") == "tool_result" else ""
    return str(content or last.get("output") or "")


def responder(body: dict) -> Reply:
    """Deterministic answers: a summary for the summarizer, sometimes a read of a shortened
    output (when the prompt offers the read tool and names a ref), else text; in Messages, most
    answers also call the agent's `run` tool (its id made from the prompt: unique in a history, the
    same in both runs)."""
    if "messages" in body and (is_summary_request(body) or is_tool_summary_request(body)):
        return Reply.text("summary: the agent ran tools and kept going")
    if "contents" in body and (SUMMARIZER_MARK in system_text(body) or TOOL_SUMMARY_MARK in system_text(body)):
        return Reply.text("summary: the agent ran tools and kept going")
    text = json.dumps(transcript(body))
    offered = "read_tool_output" in json.dumps(body.get("tools") or [])
    refs = REF.findall(text)
    answered_read = "characters" in last_output(body)[:80]
    if offered and refs and len(text) % 4 == 0 and not answered_read:
        call = ToolCall(f"call_read_{len(text)}", "read_tool_output", json.dumps({"ref": refs[-1], "offset": 0, "length": 300}))
        return Reply("message", calls=[call])
    content = f"reply {len(text) % 997} to: {last_user_text(body)[:40]}"
    if "system" in body and len(text) % 5:  # Messages (its system prompt is top level): the model calls a tool
        name = hashlib.sha256(POSTED_AT.sub(b"", text.encode())).hexdigest()[:16]
        return Reply("message", content=content, calls=[ToolCall(f"call_run_{name}", "run", "{}")])
    return Reply.text(content)


class Run:
    """One client's run, the same for a given seed: `change()` changes the history, `request()`
    asks and appends the answer. The client makes its own tool steps (a call and its result)."""

    def __init__(self, seed: int, dialect: str) -> None:
        self.rng = random.Random(seed)
        self.dialect = dialect
        self.history: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, self.user(TASK)]
        self.calls = 0
        self.streaming = False

    @staticmethod
    def user(text: str) -> dict[str, Any]:
        return {"role": "user", "content": text}

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

    def change(self) -> None:
        r = self.rng.random()
        if r < 0.06 and len(self.history) > 6:  # an edit of an old message
            self.edit()
        elif r < 0.1 and len(self.history) > 6:  # reordering: two of the client's text messages swap
            texts = self.texts()
            if len(texts) >= 2:
                i, j = self.rng.sample(texts[-6:], 2)
                self.history[i], self.history[j] = self.history[j], self.history[i]
        elif r < 0.14 and len(self.history) > 6:  # a regenerated turn: the last reply and step go
            del self.history[-3:]
        elif r < 0.3:
            self.history.append(self.user(f"now step {self.calls}, please"))
        elif r < 0.33 and self.dialect in ("chat", "responses"):  # an instruction mid-conversation: not history to the window
            self.history.append({"role": "system", "content": f"From step {self.calls} on, be brief."})
        self.history += self.tool_step(self.output())

    def edit(self) -> None:
        i = self.rng.randrange(2, len(self.history) - 1)
        item = self.history[i]
        key = "content" if isinstance(item.get("content"), str) else "output" if "output" in item else None
        if key is not None:
            self.history[i] = {**item, key: item[key] + " (edited)"}

    def texts(self) -> list[int]:
        """Where the client's text messages are (their task and instructions aside)."""
        return [i for i, m in enumerate(self.history[2:], 2) if m.get("role") in ("user", "assistant") and m.get("content")]

    def streams(self) -> bool:
        """Whether this turn is streamed: in runs of turns, as a client keeps to one (Claude Code
        streams all), about half of them. A turn that changes it changes the body's `stream`
        field, so it can't extend the last one."""
        if self.rng.random() < 0.2:
            self.streaming = not self.streaming
        return self.streaming

    def request(self, client: Any, stream: bool, headers: dict[str, str]) -> None:
        if self.dialect == "chat":
            if stream:
                chunks = client.chat.completions.create(
                    model="gpt-4o-mini", messages=self.history, tools=TOOLS_CHAT, stream=True, extra_headers=headers)
                text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            else:
                reply = client.chat.completions.create(model="gpt-4o-mini", messages=self.history, tools=TOOLS_CHAT,
                                                       extra_headers=headers)
                text = reply.choices[0].message.content or ""
        elif stream:
            with client.responses.stream(model="gpt-4o-mini", input=self.history, tools=TOOLS_RESPONSES,
                                         extra_headers=headers) as events:
                text = events.get_final_response().output_text
        else:
            text = client.responses.create(model="gpt-4o-mini", input=self.history, tools=TOOLS_RESPONSES,
                                           extra_headers=headers).output_text
        self.history.append({"role": "assistant", "content": text})


BREAKPOINT = {"type": "ephemeral"}


def with_breakpoint(message: dict[str, Any]) -> dict[str, Any]:
    """`message` as Claude Code marks it: a cache breakpoint on its last block (a string becomes
    a text block); a thinking block can't carry one."""
    content = message["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    if not blocks or blocks[-1].get("type") in ("thinking", "redacted_thinking"):
        return message
    blocks[-1] = {**blocks[-1], "cache_control": BREAKPOINT}
    return {**message, "content": blocks}


class MessagesRun(Run):
    """The run as an Anthropic client makes it: the system prompt top level, and messages that
    alternate, the model's tool_use blocks answered by the next user message's tool_results
    (the user's own words, when it has some, after them). Like Claude Code, it moves a cache
    breakpoint to the newest message on most turns, on some to the newest two (the messages
    that held one last time come back without it, or as a string again), on a few it sends none."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed, "messages")
        self.history = [self.user(TASK)]
        self.breakpoints = random.Random(seed + 2)

    def marked(self) -> list[dict[str, Any]]:
        r = self.breakpoints.random()
        marks = 0 if r < 0.15 else 2 if r < 0.4 else 1
        cut = len(self.history) - marks
        return [*self.history[:cut], *map(with_breakpoint, self.history[cut:])]

    def change(self) -> None:
        r = self.rng.random()
        if r < 0.06 and len(self.history) > 6:  # an edit of an old message: the user's words or a tool result
            i = self.rng.randrange(1, len(self.history) - 1)
            item = self.history[i]
            content = item["content"]
            if isinstance(content, str):
                self.history[i] = {**item, "content": content + " (edited)"}
            elif item["role"] == "user" and content[0].get("type") == "tool_result":
                edited = {**content[0], "content": content[0]["content"] + " (edited)"}
                self.history[i] = {**item, "content": [edited, *content[1:]]}
        elif r < 0.1 and len(self.history) > 6:  # reordering: two of the user's messages swap
            texts = [i for i, m in enumerate(self.history[1:], 1) if isinstance(m["content"], str)]
            if len(texts) >= 2:
                i, j = self.rng.sample(texts[-6:], 2)
                self.history[i], self.history[j] = self.history[j], self.history[i]
        elif r < 0.14 and len(self.history) > 6:  # a regenerated turn: the last reply and what it answered go
            del self.history[-2:]
        if self.history[-1]["role"] == "user":  # the first turn: the task is yet to be answered
            return
        words = f"now step {self.calls}, please" if 0.14 <= r < 0.3 else None
        calls = [b["id"] for b in self.history[-1]["content"] if b["type"] == "tool_use"]
        if not calls:
            self.history.append(self.user(words or f"go on with step {self.calls}"))
            return
        self.calls += 1
        results = [{"type": "tool_result", "tool_use_id": c, "content": self.output()} for c in calls]
        self.history.append({"role": "user", "content": [*results, *([{"type": "text", "text": words}] if words else [])]})

    def request(self, client: Any, stream: bool, headers: dict[str, str]) -> None:
        params = {"model": CLAUDE_MODEL, "max_tokens": 1024, "system": SYSTEM, "messages": self.marked(),
                  "tools": TOOLS_MESSAGES, "extra_headers": headers}
        if stream:
            with client.messages.stream(**params) as events:
                reply = events.get_final_message()
        else:
            reply = client.messages.create(**params)
        self.history.append(as_params(reply))


class GeminiRun(Run):
    """The run as a google-genai client makes it: the system instruction in its config, and the
    agent's own `run` calls, each right after a user content (the API refuses a call after a model
    content) and answered by the next user content's functionResponse."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed, "gemini")
        self.history: list[types.Content] = [self.user(TASK)]  # type: ignore[assignment]
        self.clients: dict[tuple[tuple[str, str], ...], genai.Client] = {}

    @staticmethod
    def user(text: str) -> types.Content:  # type: ignore[override]
        return types.Content(role="user", parts=[types.Part(text=text)])

    def tool_step(self, output: str) -> list[types.Content]:  # type: ignore[override]
        self.calls += 1
        before = [] if self.history[-1].role == "user" else [self.user(f"go on with step {self.calls}")]
        return [
            *before,
            types.Content(role="model", parts=[types.Part.from_function_call(name="run", args={})]),
            types.Content(role="user", parts=[types.Part.from_function_response(name="run", response={"output": output})]),
        ]

    def edit(self) -> None:
        texts = self.texts()
        if texts:
            i = self.rng.choice(texts)
            self.history[i] = self.user(f"{self.history[i].parts[0].text} (edited)")

    def texts(self) -> list[int]:
        """Where the user's text contents are (a call must follow one: the model's stay put)."""
        return [i for i, c in enumerate(self.history[1:], 1) if c.role == "user" and c.parts and c.parts[0].text]

    def request(self, client: Any, stream: bool, headers: dict[str, str]) -> None:
        """`client`: the proxy's base URL and the headers every request names."""
        url, named = client
        key = tuple(sorted({**named, **headers}.items()))
        if key not in self.clients:
            options = types.HttpOptions(base_url=url, api_version="v1beta", headers=dict(key), timeout=60_000)
            self.clients[key] = genai.Client(api_key="test-key", http_options=options)
        models = self.clients[key].models
        config = types.GenerateContentConfig(system_instruction=SYSTEM, tools=[types.Tool(function_declarations=[RUN_DECLARATION])])
        if stream:
            text = "".join(c.text or "" for c in models.generate_content_stream(model=GEMINI_MODEL, contents=self.history, config=config))
        else:
            text = models.generate_content(model=GEMINI_MODEL, contents=self.history, config=config).text or ""
        self.history.append(types.Content(role="model", parts=[types.Part(text=text)]))


# What a turn record says the pipeline did: the same whichever way the prompt was made.
RECORDED = ("sent_seqs", "tokens_sent", "tokens_sent_total", "messages_left_out", "truncated", "masked", "summary_id",
            "repairs", "read_rounds", "status", "new_seqs")


def drive(proxy: Any, upstream: Any, dialect: str, turns: int) -> tuple[list[bytes], list[dict[str, Any]]]:
    """The run, through `proxy`: the bytes of every upstream request it made, and its turn records."""
    upstream.responder = responder
    run = MessagesRun(SEED) if dialect == "messages" else GeminiRun(SEED) if dialect == "gemini" else Run(SEED, dialect)
    conversation = {"X-Conversation-ID": CONVERSATION}
    client: Any
    if dialect == "gemini":
        client = (proxy.url, conversation)
    else:
        client = claude_client(proxy, headers=conversation) if dialect == "messages" else openai_client(proxy, headers=conversation)
    inbox_rng = random.Random(SEED + 1)
    with httpx.Client(base_url=proxy.url, timeout=30, auth=proxy.admin_auth) as http:
        for turn in range(turns):
            run.change()
            if turn > 2 and inbox_rng.random() < 0.05:
                posted = http.post(f"/v1/conversations/{CONVERSATION}/inbox", json={"content": f"note {turn}"})
                assert posted.status_code in (200, 201), posted.text
            headers = {"X-Context-Profile": "tight"} if 30 <= turn < 42 else {}
            run.request(client, stream=run.streams(), headers=headers)
        records = http.get(f"/v1/conversations/{CONVERSATION}/turns", params={"limit": 1000}).json()["data"]
        assert http.delete(f"/v1/conversations/{CONVERSATION}").status_code == 200
    # Each with its path: Gemini's model and whether it streams are in the URL.
    sent = [r.path.encode() + b" " + SIGNATURE.sub(b'"thoughtSignature":"<signed>"', POSTED_AT.sub(b"written at <then>", r.raw))
            for r in upstream.requests if r.path.endswith(UPSTREAM_PATHS)]
    return sent, [{k: record[k] for k in RECORDED} for record in records]


@pytest.mark.parametrize("dialect", ["chat", "responses", "messages", "gemini"])
def test_the_fast_path_sends_what_the_whole_pipeline_sends_byte_for_byte(make_proxy, upstream, tmp_path: Path, dialect):
    data = tmp_path / "store"
    settings = {**SETTINGS, "upstream": {"anthropic_base_url": upstream.anthropic.base_url, "gemini_base_url": upstream.gemini.base_url}}
    fast = make_proxy(data_dir=data, server={"fast_path": True}, **settings)
    sent_fast, records_fast = drive(fast, upstream, dialect, TURNS)
    fastpath = fast.app[ENGINE].fastpath
    taken, resent, spliced, declined = fastpath.taken, fastpath.resent, fastpath.spliced, fastpath.declined
    resumed = fastpath.resumed
    fast.stop()
    upstream.reset()
    full = make_proxy(data_dir=data, server={"fast_path": False}, **settings)
    sent_full, records_full = drive(full, upstream, dialect, TURNS)
    assert full.app[ENGINE].fastpath.taken == 0

    for i, (a, b) in enumerate(zip(sent_fast, sent_full, strict=False)):
        at = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
        assert a == b, f"upstream request {i} differs at {at}: {a[max(at - 300, 0):at + 100]!r} / {b[max(at - 300, 0):at + 100]!r}"
    assert len(sent_fast) == len(sent_full) > TURNS
    for i, (a, b) in enumerate(zip(records_fast, records_full, strict=True)):  # and the turns' records tell the same
        assert a == b, f"turn {i + 1}: {a} / {b}"
    assert len(records_fast) == TURNS
    # The run took the fast path on many turns (summaries in force included), and the whole one
    # wherever it had to (a cut, a new summary, an inbox note, an edit, a regenerated turn...).
    assert TURNS // 8 <= taken < TURNS, taken
    # Some turns declined once their new items were made (a cut...): the whole pipeline ran on the
    # memo's items and the new ones, not on items made again, and sent the same bytes all the same.
    assert declined > 0, declined
    # Mostly (a cut) the stages before the one that declined kept their runs, and the report
    # their figures: the records above tell the same as the whole pipeline's.
    assert 0 < resumed <= declined, (resumed, declined)
    assert taken // 2 <= spliced <= taken, (spliced, taken)  # the upstream body too, mostly
    if dialect == "messages":  # most of them after a breakpoint moved: the last messages sent again changed
        assert resent >= taken // 2, (resent, taken)
    if dialect == "gemini":  # streamed and JSON turns: a body made of the last one's bytes goes to this turn's URL
        assert {r.split(b" ", 1)[0].rsplit(b":", 1)[-1] for r in sent_fast} >= {b"generateContent", b"streamGenerateContent"}


# -- Claude Code's moving breakpoint, turn by turn -------------------------------------------------

SYSTEM_MARKED = [{"type": "text", "text": f"system part {i}", "cache_control": BREAKPOINT} for i in range(3)]


def claude_turns(proxy: Any, upstream: Any) -> tuple[list[bytes], list[str]]:
    """A scripted Claude Code-like run: which way each turn's prompt was made, and every
    upstream request's bytes. Each turn answers the model's tool call; the breakpoints move."""
    upstream.responder = lambda body: Reply(
        "message", content="on it", calls=[ToolCall(f"call_{len(body['messages'])}", "run", "{}")]
    )
    client = claude_client(proxy, headers={"X-Conversation-ID": "claude-turns"})
    engine = proxy.app[ENGINE]
    history: list[dict[str, Any]] = [Run.user(TASK)]
    ways: list[str] = []

    def ask(messages: list[dict[str, Any]], system: Any = SYSTEM) -> None:
        taken, resent = engine.fastpath.taken, engine.fastpath.resent
        reply = client.messages.create(model=CLAUDE_MODEL, max_tokens=1024, system=system, messages=messages,
                                       tools=TOOLS_MESSAGES)
        fast = engine.fastpath
        ways.append("resent" if fast.resent > resent else "extended" if fast.taken > taken else "whole")
        history.append(as_params(reply))
        call = next(b for b in history[-1]["content"] if b["type"] == "tool_use")
        result = {"type": "tool_result", "tool_use_id": call["id"], "content": f"ran {len(history)}"}
        history.append({"role": "user", "content": [result]})

    def newest(marks: int) -> list[dict[str, Any]]:
        return [*history[: len(history) - marks], *map(with_breakpoint, history[len(history) - marks :])]

    ask(newest(1))  # the first turn
    ask(newest(1))  # the task came back as a string: no separator before it (the whole path)
    ask(newest(2))
    ask(newest(1))
    ask(history)  # no breakpoint: the last one's message lost it
    ask(newest(1))  # a plain append
    sent_last = history[-3]  # the message that held the breakpoint, edited besides: not the same message
    history[-3] = {**sent_last, "content": [{**sent_last["content"][0], "content": "ran (edited)"}]}
    ask(newest(1))
    ask(newest(1))
    ask(newest(2), SYSTEM_MARKED)  # five breakpoints: the proxy takes one off
    ask(newest(2), SYSTEM_MARKED)
    ask(newest(1), SYSTEM_MARKED)
    ask(newest(1), SYSTEM_MARKED)
    sent = [r.raw for r in upstream.requests if r.path.endswith("/messages")]
    return sent, ways


def test_claude_codes_moving_breakpoint_takes_the_fast_path_with_the_same_bytes(make_proxy, upstream, tmp_path):
    """Last messages sent again with their breakpoint moved (or a string become a block) take
    the fast path; one whose content changed besides is another message: the whole path. Either
    way, and when the proxy has to take a breakpoint off, the upstream gets the same bytes as
    from the whole pipeline."""
    data = tmp_path / "store"
    settings = {**SETTINGS, "upstream": {"anthropic_base_url": upstream.anthropic.base_url}, "quota": {}}
    fast = make_proxy(data_dir=data, server={"fast_path": True}, **settings)
    sent_fast, ways = claude_turns(fast, upstream)
    spliced = fast.app[ENGINE].fastpath.spliced
    fast.stop()
    upstream.reset()
    full = make_proxy(data_dir=data, server={"fast_path": False}, **settings)
    sent_full, _ = claude_turns(full, upstream)
    assert sent_fast == sent_full
    assert ways == ["whole", "whole", "resent", "resent", "resent", "extended", "whole", "resent", "whole", "resent",
                    "resent", "resent"]
    # Made of the last one's bytes from the fourth turn on (the third's new items join the task's
    # unit: the body is made whole), but for the whole path's turns and after a breakpoint was taken off.
    assert spliced == 5


def test_the_tokens_a_bodys_tools_make_follow_its_tools_on_the_fast_path(proxy, upstream) -> None:
    """What a body sends besides its transcript is counted once for the requests that extend it
    (the same bytes there), and again as soon as it changes: a tool added mid-run weighs on the
    very turn that adds it."""
    from tests.test_metrics import scrape, value

    client = openai_client(proxy)  # names no conversation: the run is known by its bytes
    tools = [{"type": "function", "function": {"name": "ls", "description": "List a directory.",
                                               "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
    big = {"type": "function", "function": {"name": "lint", "description": " ".join(f"rule{i} forbids pattern{i};" for i in range(400)),
                                            "parameters": {"type": "object", "properties": {}}}}
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You fix builds."}, {"role": "user", "content": "fix it"}]
    sent = []
    for turn, offered in enumerate([tools, tools, tools, tools, [*tools, big], [*tools, big]]):
        upstream.enqueue(Reply.text(f"step {turn} done"))
        raw = client.chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=messages, tools=offered)
        sent.append(int(raw.headers["X-Context-Tokens-Sent"]))
        messages += [{"role": "assistant", "content": f"step {turn} done"}, {"role": "user", "content": f"go on {turn}"}]
    grown = [b - a for a, b in zip(sent, sent[1:])]
    assert all(0 < g < 30 for g in grown[:3]), grown  # the same tools: each turn adds its two messages
    assert grown[3] > 1_500, grown  # the big tool counts on the turn that adds it
    assert 0 < grown[4] < 30, grown  # and is not counted twice on the next
    samples = scrape(proxy)
    assert value(samples, "context_proxy_fast_path_turns_total", outcome="taken") >= 3  # the memo's path was taken
