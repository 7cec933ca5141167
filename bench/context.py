"""Context economy: what each configuration sends upstream over a generated 300-step coding-agent run
with planted facts, what that costs at prompt-cache prices, how stable the prompts' prefixes
stay, and which planted facts still reach the upstream at the end.

    .venv/bin/python -m bench.context [--steps 300] [--seed 7] [--only turns,budget] [--wire chat,responses]
                                      [--refill 0.4,0.6,1]

The proxy runs in-process on loopback in front of the strict fake upstream of the test suite,
which plays the agent's model (the run's scripted steps, with a few reads of shortened outputs,
one repeated and one with a made-up ref) and a summarizer that writes the same text whatever it
is given (keeps nothing: the worst case, which small models approach). Compactions run in the
background after each reply, as by default; the bench waits for each before the next step.

Figures (agent requests as the upstream received them, read-back rounds included; tokens by
tiktoken over messages and tool schemas):
- tokens: every agent prompt's tokens, summed;
- cost: each prompt's tokens that continue an earlier prompt the provider's cache still holds
  byte for byte (same tools, then the same leading messages) at a tenth, the rest at full price,
  plus every summarizer call (input and output) at full price; and its share of the naive run's
  cost (the whole transcript every time, each prompt continuing the last). The cache holds the
  prompt just before, and for a step's first prompt every prompt of the step before: a read-back
  round's prompt and the one it continued (the proxy does not replay its rounds, so the next
  step extends the latter);
- prefix: the share of agent prompts that extend one the cache holds, over those with the same
  summary note as one of them (a new summary, or the window's note changing at a cut, starts a
  new prefix: counted apart as "summary");
- facts: of the planted facts whose message left the prompt, the share that still reaches the
  upstream in the last prompt, by kind (see bench/agent_run.py for how each kind is planted);
- reachable: of those, the share in the last prompt or found by search_history in its top 5 (asked
  through GET .../search, the same search) with the fact's sentence minus its value as the query;
- key facts: the last summary's key-fact lines, their tokens, and the share of them that carry a
  planted fact; summary tokens: the last prompt's summary message (key facts and quotes included);
- max prompt, over limit: the largest agent prompt without its system messages (tool schemas and
  read-back rounds included), and how many were over the default history_token_limit;
- refused: upstream requests the strict fake refused as the real API would (left out of the
  figures above: not billed, nothing cached); failed: steps the client got no 200 for (the run
  then goes on as scripted).

The client side and the reading of the upstream's requests sit behind `Wire` (one per wire
format: Chat Completions, the Responses API as Codex sends it, Anthropic Messages as Claude Code
sends it, the Gemini API as Gemini CLI sends it), so the same run goes over each (`--wire`), one
table per wire format.
"""

from __future__ import annotations

import argparse
import bisect
import json
import logging
import statistics
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx

from bench.agent_run import KINDS, Run, Step, generate_run, occurs
from proxy.state import COMPACTION
from proxy.tokens import TokenCounter
from tests.fakes.fake_upstream import FakeUpstream, Reply, ToolCall
from tests.support.harness import LoopThread, ProxyServer, proxy_settings
from tests.fakes.responders import READ_TOOL, REF, SUMMARIZER_MARK, TOOL_SUMMARY_MARK, is_summary_request, is_tool_summary_request

MODEL = "gpt-4o-mini"
KEY = "sk-bench-context"
CACHED_PRICE = 0.1  # cached input tokens cost a tenth at OpenAI and Anthropic
SUMMARY_TEXT = "Goal: keep the service green.\nWork done: edited modules, ran tests, fixed failures."
DEFAULT_LIMIT = 10_000  # context.history_token_limit's default

CONFIGS: dict[str, dict[str, Any]] = {
    "truncation only": {},
    "turns": {"compaction": {"strategy": "turns"}},
    "budget": {"compaction": {"strategy": "budget"}},
    "mask": {"compaction": {"strategy": "mask"}},
}
# Steps at which the model reads a shortened output back (when one is in its prompt): once, the
# same range three times in a row, or a ref it made up.
READS_EVERY, REPEATS_EVERY, INVENTS_EVERY = 23, 61, 89


Message = dict[str, Any]


@dataclass
class Prompt:
    """One request as the upstream received it, in a neutral form (chat messages and tools)."""

    messages: list[Message]
    tools: list[dict[str, Any]]
    summary: bool  # a summarizer's request, not the agent's
    output: str = ""  # what the upstream answered (for a summarizer call: what it cost to write)
    refused: bool = False  # the strict fake refused it as the real API would (4xx)
    request: int = 0  # its place among every request the upstream received
    step: int = 0  # the run's step it was made in (set by run_config)


class Wire(Protocol):
    """One wire format, both sides: how the client asks the proxy, and how the upstream's requests read."""

    name: str

    def ask(self, http: httpx.Client, run: Run, transcript: list[Message]) -> tuple[int, Message | None]:
        """Send the transcript (chat-shaped) with the run's tools; (status, the assistant's message)."""

    def prompts(self, upstream: FakeUpstream) -> list[Prompt]:
        """Every request the upstream received, in order."""


class ChatWire:
    name = "chat completions"

    def ask(self, http: httpx.Client, run: Run, transcript: list[Message]) -> tuple[int, Message | None]:
        response = http.post(
            "/v1/chat/completions",
            json={"model": MODEL, "messages": transcript, "tools": run.tools},
            headers={"Authorization": f"Bearer {KEY}", "X-Conversation-ID": "bench"},
        )
        if response.status_code != 200:
            return response.status_code, None
        message = response.json()["choices"][0]["message"]
        return 200, {k: v for k, v in message.items() if v is not None and k in ("role", "content", "tool_calls")}

    def prompts(self, upstream: FakeUpstream) -> list[Prompt]:
        out = []
        for index, record in enumerate(upstream.requests):
            body = record.body
            if not record.path.endswith("/chat/completions") or not isinstance(body, dict) or "messages" not in body:
                continue
            summary = is_summary_request(body) or is_tool_summary_request(body)
            refused = 400 <= record.status_sent < 500
            out.append(Prompt(body["messages"], body.get("tools") or [], summary, SUMMARY_TEXT if summary else "", refused, index))
        return out


class ResponsesWire:
    """The same run over the Responses API as Codex sends it: every item resent (`store: false`),
    the system prompt as the first `developer` message, flat function tools."""

    name = "responses"

    def ask(self, http: httpx.Client, run: Run, transcript: list[Message]) -> tuple[int, Message | None]:
        response = http.post(
            "/v1/responses",
            json={"model": MODEL, "input": [item for m in transcript for item in to_items(m)],
                  "tools": [flat_tool(t) for t in run.tools], "store": False},
            headers={"Authorization": f"Bearer {KEY}", "X-Conversation-ID": "bench"},
        )
        if response.status_code != 200:
            return response.status_code, None
        return 200, from_output(response.json()["output"])

    def prompts(self, upstream: FakeUpstream) -> list[Prompt]:
        out = []
        for index, record in enumerate(upstream.requests):
            body = record.body
            if not isinstance(body, dict):
                continue
            refused = 400 <= record.status_sent < 500
            if record.path.endswith("/chat/completions") and (is_summary_request(body) or is_tool_summary_request(body)):
                out.append(Prompt(body["messages"], [], True, SUMMARY_TEXT, refused, index))  # summarizers speak chat
            elif record.path.endswith("/responses") and "input" in body:
                messages, tools = neutral(body)
                out.append(Prompt(messages, tools, False, "", refused, index))
        return out


def to_items(message: Message) -> list[Message]:
    """A chat message as the Responses items a client sends for it."""
    role = message["role"]
    if role == "system":
        return [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": message["content"]}]}]
    if role == "user":
        return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": message["content"]}]}]
    if role == "tool":
        return [{"type": "function_call_output", "call_id": message["tool_call_id"], "output": message["content"]}]
    items: list[Message] = []
    if message.get("content"):
        items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": message["content"]}]})
    for call in message.get("tool_calls") or ():
        items.append({"type": "function_call", "call_id": call["id"], "name": call["function"]["name"],
                      "arguments": call["function"]["arguments"]})
    return items


def from_output(output: list[Message]) -> Message:
    """A response's output items as the chat message the run keeps (its ids are the client's to drop:
    Codex sends back what it needs, as chat-shaped replay does)."""
    text = "".join(part.get("text", "") for item in output if item.get("type") == "message" for part in item["content"])
    calls = [{"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
             for item in output if item.get("type") == "function_call"]
    message: Message = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = calls
    return {k: v for k, v in message.items() if v is not None}


def flat_tool(tool: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", **tool["function"]}


def neutral(body: dict[str, Any]) -> tuple[list[Message], list[dict[str, Any]]]:
    """A request of any wire format as chat messages and chat-shaped tools: the bench's one
    reading of a prompt (a function call joins the assistant message before it, as chat has it;
    an Anthropic `system` comes first, a block a message)."""
    if "contents" in body:  # Gemini
        system = [{"role": "system", "content": p["text"]} for p in (body.get("systemInstruction") or {}).get("parts", [])]
        tools = [{"type": "function", "function": {"name": d["name"], "description": d.get("description", ""),
                                                   "parameters": d.get("parametersJsonSchema") or {}}}
                 for t in body.get("tools") or () for d in t.get("functionDeclarations") or ()]
        return system + [m for content in body["contents"] for m in from_gemini(content)], tools
    if "messages" in body and "max_tokens" in body and "system" in body:  # Anthropic Messages
        system = body["system"]
        blocks = [{"type": "text", "text": system}] if isinstance(system, str) else system
        messages = [{"role": "system", "content": b["text"]} for b in blocks]
        messages += [m for message in body["messages"] for m in from_anthropic(message)]
        tools = [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                   "parameters": t["input_schema"]}} for t in body.get("tools") or ()]
        return messages, tools
    if "messages" in body:
        return body["messages"], body.get("tools") or []
    messages: list[Message] = []
    for item in body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]:
        kind = item.get("type", "message")
        if kind == "message":
            content = item["content"]
            text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
            role = {"developer": "system"}.get(item["role"], item["role"])
            messages.append({"role": role, "content": text})
        elif kind == "function_call":
            call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item["output"]
            messages.append({"role": "tool", "tool_call_id": item["call_id"],
                             "content": output if isinstance(output, str) else json.dumps(output)})
        else:
            messages.append({"role": "other", "content": json.dumps(item)})
    tools = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
             for t in body.get("tools") or () if t.get("type") == "function"]
    return messages, tools


class MessagesWire:
    """The same run over Anthropic Messages as Claude Code sends it: the system prompt on top, tool
    calls as `tool_use` blocks, each step's results in one user message; the summarizer is asked
    at the Anthropic API too (the request's own model, in Messages)."""

    name = "messages"

    def ask(self, http: httpx.Client, run: Run, transcript: list[Message]) -> tuple[int, Message | None]:
        response = http.post(
            "/v1/messages",
            json={"model": MODEL, "max_tokens": 4096, "system": [{"type": "text", "text": transcript[0]["content"]}],
                  "messages": to_anthropic(transcript[1:]), "tools": [anthropic_tool(t) for t in run.tools]},
            headers={"x-api-key": KEY, "anthropic-version": "2023-06-01", "X-Conversation-ID": "bench"},
        )
        if response.status_code != 200:
            return response.status_code, None
        return 200, from_anthropic({"role": "assistant", "content": response.json()["content"]})[0]

    def prompts(self, upstream: FakeUpstream) -> list[Prompt]:
        out = []
        for index, record in enumerate(upstream.requests):
            body = record.body
            if record.path != "/v1/messages" or not isinstance(body, dict) or "messages" not in body:
                continue
            summary = is_summary_request(body) or is_tool_summary_request(body)
            refused = 400 <= record.status_sent < 500
            messages, tools = neutral(body)
            out.append(Prompt(messages, tools, summary, SUMMARY_TEXT if summary else "", refused, index))
        return out


def anthropic_id(call_id: str) -> str:
    """A chat call id as the tool_use id the fake gives the same scripted call (and back)."""
    return "toolu_" + call_id.removeprefix("call_")


def chat_id(tool_use_id: str) -> str:
    return "call_" + tool_use_id.removeprefix("toolu_")


def anthropic_tool(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool["function"]
    return {"name": fn["name"], "description": fn.get("description", ""), "input_schema": fn["parameters"]}


def to_anthropic(messages: list[Message]) -> list[Message]:
    """Chat messages (after the system prompt) as Anthropic messages: a step's tool results, and a
    user message right after them, make one user message."""
    out: list[Message] = []
    for message in messages:
        role = message["role"]
        if role == "assistant":
            blocks: list[Message] = [{"type": "text", "text": message["content"]}] if message.get("content") else []
            blocks += [{"type": "tool_use", "id": anthropic_id(c["id"]), "name": c["function"]["name"],
                        "input": json.loads(c["function"]["arguments"])} for c in message.get("tool_calls") or ()]
            out.append({"role": "assistant", "content": blocks})
            continue
        if role == "tool":
            block: Message = {"type": "tool_result", "tool_use_id": anthropic_id(message["tool_call_id"]), "content": message["content"]}
        else:
            block = {"type": "text", "text": message["content"]}
        if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
            out[-1]["content"].append(block)
        else:
            out.append({"role": "user", "content": message["content"] if role == "user" else [block]})
    return out


def _text(content: Any) -> str:
    return content if isinstance(content, str) else "".join(b.get("text", "") for b in content if b.get("type") == "text")


def from_anthropic(message: Message) -> list[Message]:
    """One Anthropic message as the chat messages it stands for (the run's own shapes, so a message
    still in the prompt as it was written compares equal)."""
    content = message["content"]
    if message["role"] == "assistant":
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        calls = [{"id": chat_id(b["id"]), "type": "function", "function": {"name": b["name"], "arguments": json.dumps(b["input"])}}
                 for b in blocks if b.get("type") == "tool_use"]
        out: Message = {"role": "assistant", "content": _text(blocks) or None}
        if calls:
            out["tool_calls"] = calls
        return [{k: v for k, v in out.items() if v is not None}]
    if isinstance(content, str):
        return [{"role": message["role"], "content": content}]
    results = [{"role": "tool", "tool_call_id": chat_id(b["tool_use_id"]), "content": _text(b.get("content") or "")}
               for b in content if b.get("type") == "tool_result"]
    rest = [b for b in content if b.get("type") != "tool_result"]
    return results + ([{"role": message["role"], "content": _text(rest)}] if rest else [])


class GeminiWire:
    """The same run over the Gemini API as Gemini CLI sends it: the system prompt as
    `systemInstruction`, calls as `functionCall` parts with their ids, each step's results as
    `functionResponse` parts of one user content; the summarizer is asked at the Gemini API too
    (the request's own model, in Gemini's format). The fake gives its calls the scripted ids."""

    name = "gemini"

    def prepare(self, upstream: FakeUpstream) -> None:
        upstream.gemini.call_ids = True

    def ask(self, http: httpx.Client, run: Run, transcript: list[Message]) -> tuple[int, Message | None]:
        response = http.post(
            f"/v1beta/models/{MODEL}:generateContent",
            json={"contents": to_gemini(transcript[1:]), "systemInstruction": {"parts": [{"text": transcript[0]["content"]}]},
                  "tools": [{"functionDeclarations": [gemini_declaration(t) for t in run.tools]}]},
            headers={"x-goog-api-key": KEY, "X-Conversation-ID": "bench"},
        )
        if response.status_code != 200:
            return response.status_code, None
        return 200, from_gemini(response.json()["candidates"][0]["content"])[0]

    def prompts(self, upstream: FakeUpstream) -> list[Prompt]:
        out = []
        for index, record in enumerate(upstream.requests):
            body = record.body
            if ":generateContent" not in record.path or not isinstance(body, dict) or "contents" not in body:
                continue
            summary = is_gemini_summary(body)
            refused = 400 <= record.status_sent < 500
            messages, tools = neutral(body)
            out.append(Prompt(messages, tools, summary, SUMMARY_TEXT if summary else "", refused, index))
        return out


def is_gemini_summary(body: dict[str, Any]) -> bool:
    system = "".join(p.get("text", "") for p in (body.get("systemInstruction") or {}).get("parts", []))
    return SUMMARIZER_MARK in system or TOOL_SUMMARY_MARK in system


def gemini_declaration(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool["function"]
    return {"name": fn["name"], "description": fn.get("description", ""), "parametersJsonSchema": fn["parameters"]}


def to_gemini(messages: list[Message]) -> list[Message]:
    """Chat messages (after the system prompt) as Gemini contents: a step's tool results make one
    user content (a user message after them is a content of its own, as Gemini CLI sends it)."""
    out: list[Message] = []
    names: dict[str, str] = {}
    for message in messages:
        role = message["role"]
        if role == "assistant":
            parts: list[Message] = [{"text": message["content"]}] if message.get("content") else []
            for c in message.get("tool_calls") or ():
                names[c["id"]] = c["function"]["name"]
                parts.append({"functionCall": {"id": c["id"], "name": c["function"]["name"], "args": json.loads(c["function"]["arguments"])}})
            out.append({"role": "model", "parts": parts})
        elif role == "tool":
            part = {"functionResponse": {"id": message["tool_call_id"], "name": names.get(message["tool_call_id"], "tool"),
                                         "response": {"output": message["content"]}}}
            if out and out[-1]["role"] == "user" and "functionResponse" in out[-1]["parts"][-1]:
                out[-1]["parts"].append(part)
            else:
                out.append({"role": "user", "parts": [part]})
        else:
            out.append({"role": "user", "parts": [{"text": message["content"]}]})
    return out


def from_gemini(content: Message) -> list[Message]:
    """One Gemini content as the chat messages it stands for (the run's own shapes)."""
    parts = [p for p in content.get("parts") or () if not p.get("thought")]
    text = "".join(p["text"] for p in parts if isinstance(p.get("text"), str))
    if content.get("role") == "model":
        calls = [{"id": p["functionCall"].get("id") or p["functionCall"]["name"], "type": "function",
                  "function": {"name": p["functionCall"]["name"], "arguments": json.dumps(p["functionCall"].get("args") or {})}}
                 for p in parts if "functionCall" in p]
        out: Message = {"role": "assistant", "content": text or None}
        if calls:
            out["tool_calls"] = calls
        return [{k: v for k, v in out.items() if v is not None}]
    results = [{"role": "tool", "tool_call_id": p["functionResponse"].get("id") or p["functionResponse"]["name"],
                "content": str((p["functionResponse"].get("response") or {}).get("output", ""))}
               for p in parts if "functionResponse" in p]
    return results + ([{"role": "user", "content": text}] if text else [])


WIRES: dict[str, type[ChatWire | ResponsesWire | MessagesWire | GeminiWire]] = {
    "chat": ChatWire, "responses": ResponsesWire, "messages": MessagesWire, "gemini": GeminiWire,
}


class ScriptedModel:
    """The agent's model as the fake upstream plays it: the current step's answer, after the reads
    the step calls for; and the summarizer that keeps nothing."""

    def __init__(self) -> None:
        self.step: Step | None = None
        self.reads = 0  # read_tool_output calls to make before answering this step
        self.ref: str | None = None  # a made-up ref to read, instead of a real one
        self.made = 0

    def __call__(self, body: dict) -> Reply:
        if "messages" in body and (is_summary_request(body) or is_tool_summary_request(body)) or is_gemini_summary(body):
            return Reply.text(SUMMARY_TEXT)
        messages, tools = neutral(body)
        offered = any((t.get("function") or {}).get("name") == READ_TOOL for t in tools)
        refs = REF.findall(json.dumps(messages[-12:]))
        if self.made < self.reads and offered and (refs or self.ref):
            self.made += 1
            arguments = json.dumps({"ref": self.ref or refs[-1], "offset": 2000, "length": 8000})
            return Reply("message", calls=[ToolCall(f"call_read_{self.made}", READ_TOOL, arguments)])
        assert self.step is not None
        return Reply("message", content=self.step.content, calls=[ToolCall(*c) for c in self.step.calls])

    def start(self, index: int, step: Step) -> None:
        self.step, self.made = step, 0
        self.reads = 3 if index % REPEATS_EVERY == 0 else 1 if index % READS_EVERY == 0 or index % INVENTS_EVERY == 0 else 0
        self.ref = "10020" if index % INVENTS_EVERY == 0 else None


@dataclass
class Result:
    name: str
    prompts: list[Prompt]
    transcripts: list[list[Message]]  # what the client held at each step (the naive prompt)
    failed: int  # steps the proxy did not answer with a 200
    plants_left: dict[str, list[bool]] = field(default_factory=dict)  # kind -> retained?, for facts that left
    reachable: dict[str, list[bool]] = field(default_factory=dict)  # kind -> in the prompt or found?, for facts that left
    found: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # plant -> search_history's top hits
    key_facts: list[str] = field(default_factory=list)  # the last summary's
    summary_text: str = ""  # the last agent prompt's summary message


def run_config(loop: LoopThread, upstream: FakeUpstream, wire: Wire, name: str, overrides: dict[str, Any], run: Run) -> Result:
    upstream.reset()
    prepare = getattr(wire, "prepare", None)
    if prepare is not None:  # what the wire needs of the fake (Gemini: ids on its calls)
        prepare(upstream)
    model = ScriptedModel()
    upstream.responder = model
    with tempfile.TemporaryDirectory() as data:
        own = {"anthropic_base_url": upstream.anthropic.base_url, "gemini_base_url": upstream.gemini.base_url}
        sections = {**overrides, "upstream": {**own, **overrides.get("upstream", {})}}
        proxy = ProxyServer(loop, proxy_settings(upstream.base_url, Path(data), **sections)).start()
        transcript: list[Message] = [{"role": "system", "content": run.system}, {"role": "user", "content": run.task}]
        transcripts: list[list[Message]] = []
        failed = 0
        carriers: dict[int, int] = {}  # step -> the model's message of that step, in the transcript
        step_ends: list[int] = []  # after each step: how many requests the upstream had received
        try:
            with httpx.Client(base_url=proxy.url, timeout=120) as http:
                for index, step in enumerate(run.steps):
                    if step.user is not None:
                        transcript.append({"role": "user", "content": step.user})
                    model.start(index, step)
                    transcripts.append(list(transcript))
                    _, reply = wire.ask(http, run, transcript)
                    if reply is None:  # the run goes on as the script says, so configurations stay comparable
                        failed += 1
                        reply = {"role": "assistant", "content": step.content}
                        if step.calls:
                            reply["tool_calls"] = [{"id": c, "type": "function", "function": {"name": n, "arguments": a}}
                                                   for c, n, a in step.calls]
                    transcript.append(reply)
                    carriers[index] = len(transcript) - 1
                    for call_id, output in step.outputs.items():
                        transcript.append({"role": "tool", "tool_call_id": call_id, "content": output})
                    loop.run(proxy.app[COMPACTION].idle(), timeout=120)  # background compaction, done before the next step
                    step_ends.append(len(upstream.requests))
                found = {i: search_history(http, plant.query) for i, plant in enumerate(run.plants)}
                key_facts = last_key_facts(http)
        finally:
            proxy.stop()
    prompts = wire.prompts(upstream)
    for prompt in prompts:
        prompt.step = bisect.bisect_right(step_ends, prompt.request)
    result = Result(name, prompts, transcripts, failed, found=found, key_facts=key_facts)
    result.plants_left, result.reachable = retention(run, result, transcript, carriers)
    last = next(p for p in reversed(result.prompts) if not p.summary and not p.refused)
    result.summary_text = _summary_of(last) or ""
    return result


def search_history(http: httpx.Client, query: str) -> list[dict[str, Any]]:
    """What search_history's top 5 would show for `query` (the same search, asked as people do)."""
    response = http.get("/v1/conversations/bench/search", params={"q": query, "limit": 5},
                        headers={"Authorization": f"Bearer {KEY}"})
    response.raise_for_status()
    return response.json()["data"]


def last_key_facts(http: httpx.Client) -> list[str]:
    response = http.get("/v1/conversations/bench/trajectory", params={"limit": 1}, headers={"Authorization": f"Bearer {KEY}"})
    response.raise_for_status()
    summaries = response.json().get("summaries") or []
    return list(summaries[-1]["key_facts"]) if summaries else []


def retention(
    run: Run, result: Result, transcript: list[Message], carriers: dict[int, int]
) -> tuple[dict[str, list[bool]], dict[str, list[bool]]]:
    """For each planted fact whose message (the user's, for a decision; else the model's or its
    tool's output) is not in the last agent prompt as it was written: (is its value in that
    prompt?, is it there or in a hit of search_history's top 5 for its sentence without it?)."""
    last = next(p for p in reversed(result.prompts) if not p.summary and not p.refused)
    everything = json.dumps(last.messages, ensure_ascii=False)  # none of the planted values has a character JSON escapes
    kept: dict[str, list[bool]] = defaultdict(list)
    reachable: dict[str, list[bool]] = defaultdict(list)
    for i, plant in enumerate(run.plants):
        carrier = carriers[plant.step]
        if plant.kind == "decision":
            carrier = next(n for n, m in enumerate(transcript) if m.get("content") == plant.value)
        elif plant.kind in ("note", "warn", "json"):
            carrier += 1  # the tool output after the call
        if transcript[carrier] in last.messages:
            continue  # still in the prompt as it was: nothing to measure
        in_prompt = occurs(plant.value, everything)
        kept[plant.kind].append(in_prompt)
        reachable[plant.kind].append(in_prompt or any(occurs(plant.value, hit["text"]) for hit in result.found.get(i, ())))
    return kept, reachable


# -- figures ----------------------------------------------------------------------------------


class Pricing:
    def __init__(self) -> None:
        self.counter = TokenCounter()

    def tokens(self, messages: list[Message], tools: list[dict[str, Any]]) -> list[int]:
        """Tokens of the tools (first: they come first in the model's prompt), then of each message."""
        # As the proxy counts them against its window: the schemas as compact JSON text.
        tool_tokens = self.counter.count_texts([json.dumps(tools, separators=(",", ":"))], MODEL) if tools else 0
        return [tool_tokens, *self.counter.count_many(messages, MODEL)]

    def cost(
        self, prompts: list[tuple[list[Message], list[dict[str, Any]]]], cached_from: list[list[int]] | None = None
    ) -> tuple[int, float]:
        """(tokens, cache-priced cost) of prompts sent in this order; `cached_from[i]` names the
        earlier prompts the cache may still hold for prompt i (default: the one before it)."""
        total, cost = 0, 0.0
        for i, (messages, tools) in enumerate(prompts):
            counts = self.tokens(messages, tools)
            total += sum(counts)
            cached = 0
            for j in cached_from[i] if cached_from is not None else ([i - 1] if i else []):
                if prompts[j][1] == tools:
                    shared = _shared_prefix(prompts[j][0], messages)
                    cached = max(cached, counts[0] + sum(counts[1 : 1 + shared]))
            cost += cached * CACHED_PRICE + (sum(counts) - cached)
        return total, cost


def cache_candidates(agent: list[Prompt]) -> list[list[int]]:
    """For each agent prompt, the earlier ones a provider's prompt cache still holds: the one
    just before it, and when it is the first of its step, every prompt of the step before (a
    read-back round's prompt is cached, and so is the prompt it continued, which the next step's
    prompt extends: the proxy does not replay its rounds)."""
    out: list[list[int]] = []
    for i, prompt in enumerate(agent):
        if i == 0:
            out.append([])
        elif agent[i - 1].step == prompt.step:
            out.append([i - 1])
        else:
            j = i - 1
            while j > 0 and agent[j - 1].step == agent[i - 1].step:
                j -= 1
            out.append(list(range(j, i)))
    return out


def _shared_prefix(a: list[Message], b: list[Message]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _summary_of(prompt: Prompt) -> str | None:
    messages = prompt.messages
    return messages[1]["content"] if len(messages) > 1 and messages[1].get("role") == "system" else None


def _why(before: Prompt, after: Prompt) -> str:
    if before.tools != after.tools:
        return "tools"
    if any(c.get("function", {}).get("name") == READ_TOOL for m in before.messages for c in m.get("tool_calls") or ()) and not any(
            c.get("function", {}).get("name") == READ_TOOL for m in after.messages for c in m.get("tool_calls") or ()):
        return "read-back"
    return "window"  # the window's start moved, or mask masked another output


def figures(result: Result, pricing: Pricing, naive_cost: float, limit: int, run: Run) -> dict[str, Any]:
    # A request the API refuses is not billed and caches nothing: it is counted apart.
    agent = [p for p in result.prompts if not p.summary and not p.refused]
    summaries = [p for p in result.prompts if p.summary and not p.refused]
    cached_from = cache_candidates(agent)
    tokens, cost = pricing.cost([(p.messages, p.tools) for p in agent], cached_from)
    summary_tokens = sum(sum(pricing.tokens(p.messages, [])) + pricing.counter.count({"role": "assistant", "content": p.output}, MODEL) for p in summaries)
    extends = pairs = 0
    breaks: dict[str, int] = defaultdict(int)  # why a prompt extended none of those the cache holds
    for i, after in enumerate(agent):
        earlier = [agent[j] for j in cached_from[i]]
        if not earlier:
            continue
        same_summary = [b for b in earlier if _summary_of(b) == _summary_of(after)]
        if not same_summary:
            breaks["summary"] += 1
            continue  # a compaction (or the window's note) changed in between: a new prefix is expected
        pairs += 1
        if any(b.tools == after.tools and after.messages[: len(b.messages)] == b.messages for b in same_summary):
            extends += 1
        else:
            breaks[_why(same_summary[-1], after)] += 1
    history = [sum(pricing.tokens([m for m in p.messages if m.get("role") != "system"], p.tools)) for p in agent]
    kept = {kind: result.plants_left.get(kind, []) for kind in KINDS}
    left = sum(len(v) for v in kept.values())
    reachable = [hit for kind in KINDS for hit in result.reachable.get(kind, [])]
    values = [plant.value for plant in run.plants]
    fact_lines = [line for line in result.key_facts if any(occurs(v, line) for v in values)]
    return {
        "name": result.name,
        "tokens": tokens,
        "cost": cost + summary_tokens,
        "cost_share": (cost + summary_tokens) / naive_cost,
        "summarizer_calls": len(summaries),
        "summarizer_inputs": [sum(pricing.tokens(p.messages, [])) for p in summaries],
        "prefix": extends / pairs if pairs else 1.0,
        "facts": sum(sum(v) for v in kept.values()) / left if left else None,
        "by_kind": kept,
        "reachable": sum(reachable) / len(reachable) if reachable else None,
        "key_facts": len(result.key_facts),
        "key_facts_tokens": pricing.counter.count_texts(["\n".join(f"- {f}" for f in result.key_facts)], MODEL) if result.key_facts else 0,
        "key_fact_share": len(fact_lines) / len(result.key_facts) if result.key_facts else None,
        "summary_tokens": pricing.counter.count_texts([result.summary_text], MODEL) if result.summary_text else 0,
        "max_prompt": max(history),
        "over_limit": sum(1 for h in history if h > limit),
        "failed": result.failed,
        "refused": sum(1 for p in result.prompts if p.refused),
        "requests": len(agent),
        "breaks": dict(breaks),
    }


def naive_figures(result: Result, pricing: Pricing, run: Run) -> dict[str, Any]:
    tokens, cost = pricing.cost([(t, run.tools) for t in result.transcripts])
    return {"tokens": tokens, "cost": cost}


def table(rows: list[dict[str, Any]], naive: dict[str, Any], run: Run, steps: int) -> str:
    kinds = " | ".join(KINDS)
    lines = [
        f"Context economy: {steps} steps, {len(run.plants)} planted facts, {run.size() / 1e6:.1f} MB of messages; "
        f"default limits, summarizer keeps nothing.",
        "",
        f"| configuration | tokens | cost (cached at {CACHED_PRICE:g}) | vs naive | prefix kept | facts kept | reachable "
        f"| {kinds} | key facts | key facts tokens | key facts with a fact | summary tokens "
        "| summaries | max prompt | over limit | refused | failed |",
        "|" + " --- |" * (16 + len(KINDS)),
        f"| naive (whole transcript) | {naive['tokens']:,} | {naive['cost']:,.0f} | 100% | 100% | — | — |"
        + " — |" * len(KINDS) + " — | — | — | — | — | — | — | — | — |",
    ]
    for r in rows:
        by_kind = " | ".join(f"{sum(v)}/{len(v)}" if v else "—" for v in (r["by_kind"][k] for k in KINDS))
        share = "—" if r["key_fact_share"] is None else format(r["key_fact_share"], ".0%")
        lines.append(
            f"| {r['name']} | {r['tokens']:,} | {r['cost']:,.0f} | {100 * r['cost_share']:.1f}% | {100 * r['prefix']:.1f}% "
            f"| {'—' if r['facts'] is None else format(r['facts'], '.0%')} "
            f"| {'—' if r['reachable'] is None else format(r['reachable'], '.0%')} | {by_kind} "
            f"| {r['key_facts']} | {r['key_facts_tokens']:,} | {share} | {r['summary_tokens']:,} | {r['summarizer_calls']} "
            f"| {r['max_prompt']:,} | {r['over_limit']} | {r['refused']} | {r['failed']} |"
        )
    lines.append("")
    for r in rows:
        inputs = r["summarizer_inputs"]
        if inputs:
            lines.append(f"- {r['name']}: summarizer input tokens first {inputs[0]:,}, median {statistics.median(inputs):,.0f}, "
                         f"max {max(inputs):,}, last {inputs[-1]:,}")
    for r in rows:
        causes = ", ".join(f"{n} {why}" for why, n in sorted(r["breaks"].items())) or "none"
        lines.append(f"- {r['name']}: prompts not extending the one before: {causes}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--only", default="", help="comma-separated configuration names")
    parser.add_argument("--wire", default=",".join(WIRES), help=f"comma-separated wire formats ({', '.join(WIRES)})")
    parser.add_argument("--refill", default="", help="comma-separated context.window_refill shares to run each configuration at")
    args = parser.parse_args(argv)
    logging.getLogger("proxy").setLevel(logging.ERROR)  # the table says what failed; warnings would bury it
    run = generate_run(args.steps, args.seed)
    names = [n for n in CONFIGS if not args.only or n in args.only.split(",")]
    configs = [(name, CONFIGS[name]) for name in names]
    if args.refill:
        configs = [(f"{name}, refill {share}", {**overrides, "context": {"window_refill": float(share)}})
                   for name, overrides in configs for share in args.refill.split(",")]
    loop = LoopThread()
    upstream = FakeUpstream()
    loop.run(upstream.start())
    tables = []
    try:
        for wire_name in args.wire.split(","):
            wire = WIRES[wire_name]()
            results = [run_config(loop, upstream, wire, label, overrides, run) for label, overrides in configs]
            pricing = Pricing()
            naive = naive_figures(results[0], pricing, run)
            rows = [figures(r, pricing, naive["cost"], DEFAULT_LIMIT, run) for r in results]
            tables.append(f"### {wire.name}\n\n" + table(rows, naive, run, args.steps))
    finally:
        loop.run(upstream.close())
        loop.stop()
    print("\n\n".join(tables))

if __name__ == "__main__":
    main()
