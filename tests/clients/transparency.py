"""What a client meant to send the upstream, to compare two runs of one scripted session: one
straight against the fake upstream, one through the proxy ("point your agent at it and change
nothing": tests/clients/test_transparency.py).

`meaning(format, body)` reads an upstream request as what the model reads: the fixed parts
(system prompt / instructions, tool definitions, the other parameters) and the transcript,
message by message, as (role, parts) where a part is its type and its text (a call: its id, name
and arguments; a result: the id it answers). What does not change the meaning is left out: a
string and one text block are the same content, cache_control breakpoints move, item ids and
statuses are bookkeeping, a thinking block's signature and a reasoning item's sealed content are
the fake's own bytes of each run.

`Blanks` then names the values that differ from run to run whatever the proxy does — the temp
dirs the test gave the client, and ids the fake or the client generate (uuids, call ids, response
ids, timestamps) — each distinct one by a placeholder numbered in order of first appearance, so
that a call and its result still name the same id after blanking, and two runs of the same script
come out equal.

`expand_anchors` turns a request anchored with `previous_response_id` into what it stands for
(the stored response's input and output, then the new items): the proxy sends the history
itself instead of the id, so the direct run is compared after that rule.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

Format = Literal["chat", "responses", "messages"]
TRANSCRIPT_KEY = {"chat": "messages", "responses": "input", "messages": "messages"}

# Values a run makes up whatever the proxy does, by the kind of placeholder they get.
GENERATED = (
    ("uuid", re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")),
    ("call", re.compile(r"\b(?:call|toolu|fc|ctc)_[0-9A-Za-z]{12,}\b")),  # the fake's call ids, Claude Code's too
    ("id", re.compile(r"\b(?:resp|msg|rs|chatcmpl|req)_[0-9A-Za-z]{8,}\b")),  # the fake's reply and item ids
    ("time", re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?")),
    ("date", re.compile(r"\b\d{4}-\d{2}-\d{2}\b")),
    ("unix_time", re.compile(r"\b1[5-9]\d{8}(?:\d{3})?\b")),  # seconds or milliseconds since 1970, 2017 to 2033
)


class Blanks:
    """Run-specific values in a run's requests, replaced by numbered placeholders: `literals` the
    test knows (its temp dirs: longest first, so a folder inside another is named as itself),
    then the generated values above."""

    def __init__(self, literals: dict[str, str] | None = None, patterns: Sequence[tuple[str, re.Pattern[str]]] = ()) -> None:
        self._literals = sorted((literals or {}).items(), key=lambda kv: -len(kv[0]))
        self._patterns = (*patterns, *GENERATED)
        self._seen: dict[tuple[str, str], str] = {}

    def text(self, value: str) -> str:
        for literal, name in self._literals:
            value = value.replace(literal, f"<{name}>")
        for kind, pattern in self._patterns:
            value = pattern.sub(lambda m, kind=kind: self._name(kind, m.group(0)), value)
        return value

    def _name(self, kind: str, value: str) -> str:
        key = (kind, value)
        if key not in self._seen:
            self._seen[key] = f"<{kind}{sum(1 for k, _ in self._seen if k == kind) + 1}>"
        return self._seen[key]

    def __call__(self, value: Any) -> Any:
        """`value` with every string in it blanked (dict keys too: tool schemas name paths rarely,
        but a JSON object of arguments may)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, list):
            return [self(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self(v) for v in value)
        if isinstance(value, dict):  # in key order: a client's map may come in any order (Codex's client_metadata)
            return {self.text(k): self(value[k]) for k in sorted(value)}
        return value


def compared(format: Format, bodies: Iterable[dict[str, Any]], literals: dict[str, str] | None = None,
             patterns: Sequence[tuple[str, re.Pattern[str]]] = ()) -> list[dict[str, Any]]:
    """The meaning of each of one run's upstream requests, in order, blanked with one `Blanks`
    (so ids keep their numbers across the run's requests); `patterns`: a client's own
    run-specific values, blanked before the generated ones."""
    blanks = Blanks(literals, patterns)
    return [blanks(meaning(format, body)) for body in bodies]


def meaning(format: Format, body: dict[str, Any]) -> dict[str, Any]:
    """What the model reads of one request: its parameters, fixed parts and transcript."""
    transcript = body.get(TRANSCRIPT_KEY[format])
    reader = {"chat": chat_message, "responses": responses_item, "messages": messages_message}[format]
    if format == "responses" and isinstance(transcript, str):
        transcript = [{"role": "user", "content": transcript}]
    skipped = {TRANSCRIPT_KEY[format], "tools", "system", "instructions"}
    return {
        "params": {k: v for k, v in sorted(body.items()) if k not in skipped},
        "system": _system(format, body),
        "tools": [_tool(tool) for tool in body.get("tools") or ()],
        "transcript": [reader(message) for message in transcript or ()],
    }


def expand_anchors(bodies: list[dict[str, Any]], stored: Callable[[str], list[dict[str, Any]] | None]) -> list[dict[str, Any]]:
    """Responses requests as the proxy sends them: one anchored with `previous_response_id` gets
    the stored response's items (`stored(id)`: its whole input, then its output) before its own,
    and no anchor."""
    out = []
    for body in bodies:
        anchor = body.get("previous_response_id")
        if anchor is None:
            out.append(body)
            continue
        history = stored(anchor)
        assert history is not None, f"the fake did not store {anchor}"
        given = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
        out.append({**{k: v for k, v in body.items() if k != "previous_response_id"}, "input": [*history, *given]})
    return out


def first_difference(direct: list[dict[str, Any]], proxied: list[dict[str, Any]]) -> str:
    """Where two runs' meanings first part, said for a failing assertion ("" when they agree)."""
    if len(direct) != len(proxied):
        return f"{len(direct)} upstream requests direct, {len(proxied)} through the proxy"
    for n, (a, b) in enumerate(zip(direct, proxied, strict=True)):
        if a != b:
            return f"request {n}" + _where(a, b)
    return ""


def _where(a: Any, b: Any) -> str:
    """The path to the first place `a` and `b` differ, and what each holds there."""
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        key = next(k for k in a if a[k] != b[k])
        return f", {key}" + _where(a[key], b[key])
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f": {len(a)} elements direct, {len(b)} proxied\n  direct  {_short(a)}\n  proxied {_short(b)}"
        i = next(i for i in range(len(a)) if a[i] != b[i])
        return f"[{i}]" + _where(a[i], b[i])
    if isinstance(a, str) and isinstance(b, str):
        at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return f", at character {at}:\n  direct  ...{a[max(0, at - 200):at + 200]!r}\n  proxied ...{b[max(0, at - 200):at + 200]!r}"
    return f":\n  direct  {_short(a)}\n  proxied {_short(b)}"


def _short(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) < 1500 else text[:1500] + "..."


# -- the formats -------------------------------------------------------------------------------


def _text_parts(content: Any, string_type: str) -> list[tuple[Any, ...]]:
    """Content as (type, text) parts: a string is one part of `string_type`."""
    if content is None:
        return []
    if isinstance(content, str):
        return [(string_type, content)]
    parts: list[tuple[Any, ...]] = []
    for part in content:
        kind = part.get("type")
        if "text" in part:
            parts.append((kind, part["text"]))
        elif kind == "image_url":
            parts.append((kind, (part.get("image_url") or {}).get("url")))
        else:
            parts.append((kind, _without(part, {"type", "cache_control"})))
    return parts


def _without(raw: dict[str, Any], keys: set[str]) -> dict[str, Any]:
    return {k: v for k, v in raw.items() if k not in keys}


def _arguments(text: Any) -> Any:
    """A call's arguments as the JSON they hold (so key order and spacing don't matter)."""
    if isinstance(text, str):
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    return _without(tool, {"cache_control"})


def _system(format: Format, body: dict[str, Any]) -> Any:
    if format == "messages":
        return [text for _, text in _text_parts(body.get("system"), "text")]
    if format == "responses":
        return body.get("instructions")
    return None  # chat: system messages are in the transcript


def chat_message(message: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.get("role"), "parts": _text_parts(message.get("content"), "text")}
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        out["parts"].append(("tool_call", call.get("id"), function.get("name"), _arguments(function.get("arguments"))))
    if "tool_call_id" in message:
        out["answers"] = message["tool_call_id"]
    if message.get("name"):
        out["name"] = message["name"]
    return out


def messages_message(message: dict[str, Any]) -> dict[str, Any]:
    parts: list[tuple[Any, ...]] = []
    content = message.get("content")
    for block in [{"type": "text", "text": content}] if isinstance(content, str) else content or ():
        kind = block.get("type")
        if kind == "text":
            parts.append((kind, block.get("text")))
        elif kind == "thinking":
            parts.append((kind, block.get("thinking")))  # its signature: the fake's, new each run
        elif kind == "redacted_thinking":
            parts.append((kind,))
        elif kind == "tool_use":
            parts.append((kind, block.get("id"), block.get("name"), block.get("input")))
        elif kind == "tool_result":
            parts.append((kind, block.get("tool_use_id"), _text_parts(block.get("content"), "text"),
                          bool(block.get("is_error"))))
        else:
            parts.append((kind, _without(block, {"type", "cache_control"})))
    return {"role": message.get("role"), "parts": parts}


def responses_item(item: dict[str, Any]) -> dict[str, Any]:
    kind = item.get("type") or ("message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        string_type = "output_text" if role == "assistant" else "input_text"
        return {"type": kind, "role": role, "parts": _text_parts(item.get("content"), string_type)}
    if kind in ("function_call", "custom_tool_call"):
        arguments = item.get("arguments") if kind == "function_call" else item.get("input")
        return {"type": kind, "call": item.get("call_id"), "name": item.get("name"), "arguments": _arguments(arguments)}
    if kind in ("function_call_output", "custom_tool_call_output"):
        return {"type": kind, "call": item.get("call_id"), "output": _text_parts(item.get("output"), "output_text")}
    if kind == "reasoning":  # its encrypted_content: sealed by the fake, new each run
        summary = [part.get("text") for part in item.get("summary") or ()]
        return {"type": kind, "summary": summary, "sealed": item.get("encrypted_content") is not None}
    return {"type": kind, **_without(item, {"type", "id", "status"})}
