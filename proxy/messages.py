"""Chat messages: validation of what a client sends, and the canonical hash used for dedupe.

Messages stay plain dicts (the OpenAI wire shape) so what the client sent is what we store and
forward; this module only checks them and derives hashes from them.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import orjson

from .errors import InvalidRequest
from .transcript import Call

Message = dict[str, Any]

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
SYSTEM_ROLES = frozenset({"system", "developer"})
# The fields that make two messages "the same" for dedupe. Anything else a client echoes back
# (refusal: null, annotations: [], ...) must not make a resent message look new.
HASHED_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id")
_EMPTY = (None, "", [])  # values of those fields that count as absent
_UNSHAPED = frozenset(HASHED_FIELDS) - {"tool_calls"}  # hashed as they are (tool calls are reshaped)


# Deeper JSON parses, but breaks pickling and re-serializing (recursion): refuse it up front.
MAX_DEPTH = 100


def validate_messages(messages: Any, start: int = 0) -> list[Message]:
    """Check the shape of `messages[start:]` enough to store it safely; raise InvalidRequest otherwise.
    (Messages before `start` are known good: identical to ones already checked.)"""
    if not isinstance(messages, list):
        raise InvalidRequest("'messages' must be an array of message objects", param="messages")
    for i in range(start, len(messages)):
        message = messages[i]
        _validate_message(message, i)
        if too_deep(message, MAX_DEPTH - 2):
            raise InvalidRequest(f"messages[{i}] is nested too deeply", param=f"messages[{i}]", code="invalid_json")
    return messages


def too_deep(value: Any, limit: int) -> bool:
    """Whether JSON `value` nests dicts/lists more than `limit` levels. Recursive, at most `limit`
    (MAX_DEPTH) frames deep: a third of the cost of an explicit stack of (node, depth) tuples."""
    if type(value) is dict or type(value) is list:
        return _deeper_than(value, limit)
    return limit < 1


def _deeper_than(node: dict[str, Any] | list[Any], left: int) -> bool:
    if left <= 0:
        return True
    for child in node.values() if type(node) is dict else node:
        if (type(child) is dict or type(child) is list) and _deeper_than(child, left - 1):
            return True
    return False


def _invalid(i: int, field: str, problem: str) -> InvalidRequest:
    """The 400 for `field` of messages[i] (its path made only for a message refused, not for each one checked)."""
    where = f"messages[{i}]{field}"
    return InvalidRequest(f"{where} {problem}", param=where)


def _validate_message(msg: Any, i: int) -> None:
    if not isinstance(msg, dict):
        raise _invalid(i, "", "must be an object")
    role = msg.get("role")
    if role not in ROLES:
        raise _invalid(i, ".role", f"must be one of {sorted(ROLES)}, got {role!r}")
    content = msg.get("content")
    if content is not None and not isinstance(content, (str, list)):
        raise _invalid(i, ".content", "must be a string or an array of content parts")
    if isinstance(content, list) and not all(isinstance(p, dict) and isinstance(p.get("type"), str) for p in content):
        raise _invalid(i, ".content", "parts must be objects with a 'type'")
    if "name" in msg and not isinstance(msg["name"], str):
        raise _invalid(i, ".name", "must be a string")
    if role == "tool" and not isinstance(msg.get("tool_call_id"), str):
        raise _invalid(i, ".tool_call_id", "must be a string")
    if "tool_calls" in msg and msg["tool_calls"] is not None:
        _validate_tool_calls(msg["tool_calls"], i)


def _validate_tool_calls(calls: Any, i: int) -> None:
    if not isinstance(calls, list):
        raise _invalid(i, ".tool_calls", "must be an array")
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not (
            isinstance(call, dict)
            and isinstance(call.get("id"), str)
            and isinstance(fn, dict)
            and isinstance(fn.get("name"), str)
            and isinstance(fn.get("arguments", ""), str)
        ):
            raise _invalid(i, f".tool_calls[{j}]", "must have a string 'id' and 'function' with string 'name' and 'arguments'")


def canonical(msg: Message) -> Message:
    """The dedupe-relevant view of a message: empty content and absent content are the same."""
    out: Message = {}
    for key in HASHED_FIELDS:
        value = msg.get(key)
        if not value and value in _EMPTY:  # a truthy value is never empty: most skip the comparisons
            continue
        if key == "tool_calls":
            value = [_canonical_call(c) for c in value]
        out[key] = value
    return out


def _canonical_call(call: dict[str, Any]) -> dict[str, Any]:
    fn = call.get("function") or {}
    return {"id": call.get("id"), "name": fn.get("name"), "arguments": fn.get("arguments")}


def message_hash(msg: Message) -> str:
    # A message that is its own canonical view (hashed fields only, none of them empty, no calls
    # to reshape: user, system and tool messages as clients send them) is hashed as it is: the
    # same bytes, without a copy.
    if msg.keys() <= _UNSHAPED and all(msg.values()):
        return canonical_digest(msg)
    return canonical_digest(canonical(msg))


def canonical_digest(value: Any) -> str:
    """sha256 of `value`'s sorted, compact JSON. orjson writes the same bytes as
    json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False) — stored hashes stay
    valid — ~10x faster; json is the fallback for what orjson refuses (integers past 64 bits)."""
    try:
        blob = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        blob = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return hashlib.sha256(blob).hexdigest()[:32]


def reply_message(raw: Message) -> Message:
    """An upstream reply message trimmed to what a request may carry, so it can be sent back later."""
    msg: Message = {"role": "assistant", "content": raw.get("content")}
    if raw.get("tool_calls"):
        msg["tool_calls"] = [
            {
                "id": c.get("id"),
                "type": c.get("type") or "function",
                "function": {
                    "name": (c.get("function") or {}).get("name"),
                    "arguments": (c.get("function") or {}).get("arguments") or "",
                },
            }
            for c in raw["tool_calls"]
        ]
    if raw.get("refusal"):
        msg["refusal"] = raw["refusal"]
    return msg


def message_calls(raw: Message) -> tuple[Call, ...]:
    """The tool calls of an assistant message, as the engine sees them."""
    calls = raw.get("tool_calls")
    if not calls:
        return ()
    out = []
    for call in calls:
        fn = call.get("function") or {}
        out.append(Call(str(call.get("id")), str(fn.get("name") or ""), fn.get("arguments") or ""))
    return tuple(out)


def text_of(content: Any) -> str | None:
    """The text of a message's content (a string, or the text parts of an array); None if it has none."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if texts and all(isinstance(t, str) for t in texts):
            return "".join(texts)
    return None


def tool_names_by_call_id(messages: list[Message]) -> dict[str, str]:
    """call id -> function name, from every assistant tool call in `messages`."""
    names: dict[str, str] = {}
    for msg in messages:
        for call in msg.get("tool_calls") or ():
            names[call.get("id")] = (call.get("function") or {}).get("name")
    return names
