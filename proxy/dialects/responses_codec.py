"""Responses API items, for the engine: the codec of the Responses dialect, and reading replies.

Items are the input items as the client sent them: messages, `function_call` /
`function_call_output` (and custom tool calls), `reasoning` (its `encrypted_content` opaque and
replayed byte for byte), and any other type kept whole. Units: a reasoning item goes with the
item that follows it, parallel calls with each other, outputs with their calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from ..messages import canonical_digest
from ..tokens import PER_TOOL_CALL
from ..transcript import Call, Item, Raw, Role
from .base import ReplyRead

MESSAGE_ROLES = {"system": Role.SYSTEM, "developer": Role.SYSTEM, "user": Role.USER, "assistant": Role.ASSISTANT}
CALLS = {"function_call": "arguments", "custom_tool_call": "input"}  # type -> where its arguments are
RESULTS = frozenset({"function_call_output", "custom_tool_call_output"})
# Who says an item that is no message, as chat completions would frame it (for counting).
SPOKEN_BY = {**dict.fromkeys(CALLS, "assistant"), **dict.fromkeys(RESULTS, "tool")}
# Volatile fields that do not change what an item means: a resent item without them is the same item.
UNHASHED = frozenset({"status", "id"})
TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "refusal")


def item_type(raw: Raw) -> str:
    """An item's type; an input message may leave it out (`{"role", "content"}`)."""
    kind = raw.get("type")
    if isinstance(kind, str):
        return kind
    return "message" if "role" in raw else ""


def parts_text(value: Any) -> str | None:
    """The text of a content value: a string, or the text parts of a list; None if it has none."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = [p.get("text") for p in value if isinstance(p, dict) and p.get("type") in TEXT_PARTS]
        if texts and all(isinstance(t, str) for t in texts):
            return "".join(texts)
    return None


class ResponsesCodec:
    def items(self, raws: Sequence[Raw], seqs: Sequence[int | None], hashes: Sequence[str | None]) -> list[Item]:
        out: list[Item] = []
        previous = ""  # what the item before was: "reasoning", "call", "result" or ""
        assistant, tool, other = Role.ASSISTANT, Role.TOOL, Role.OTHER  # looked up once (see transcript.Role)
        for raw, seq, digest in zip(raws, seqs, hashes, strict=True):
            kind = item_type(raw)
            if kind == "message":
                role = MESSAGE_ROLES.get(raw.get("role"), other)
                # An assistant message is the item its reasoning belongs to.
                out.append(Item(raw, role, seq, digest, joins=role is assistant and previous == "reasoning"))
                previous = ""
            elif kind in CALLS:
                call = Call(str(raw.get("call_id")), str(raw.get("name") or ""), _argument_text(raw.get(CALLS[kind])))
                out.append(Item(raw, assistant, seq, digest, calls=(call,), joins=previous in ("reasoning", "call")))
                previous = "call"
            elif kind in RESULTS:
                out.append(Item(raw, tool, seq, digest, answers=raw.get("call_id"), joins=previous in ("call", "result")))
                previous = "result"
            elif kind == "reasoning":
                out.append(Item(raw, other, seq, digest))
                previous = "reasoning"
            else:  # built-in tool calls, references, compaction...: kept whole, in their unit
                joins = previous == "reasoning" or (kind.endswith("_output") and previous != "")
                out.append(Item(raw, other, seq, digest, joins=joins))
                previous = "call" if kind.endswith("_call") else "result" if kind.endswith("_output") else ""
        return out

    def hash(self, raw: Raw) -> str:
        return canonical_digest(canonical(raw))

    def text(self, item: Item) -> str | None:
        raw = item.raw
        if item.role is Role.TOOL:
            return parts_text(raw.get("output"))
        if item_type(raw) == "message":
            return parts_text(raw.get("content"))
        return None

    def with_text(self, item: Item, text: str) -> Item:
        key = "output" if item.role is Role.TOOL else "content"
        return item.but(raw={**item.raw, key: text}, hash=None)

    def with_appended_text(self, item: Item, text: str) -> Item:
        key = "output" if item.role is Role.TOOL else "content"
        value = item.raw.get(key)
        if isinstance(value, str):
            return item.but(raw={**item.raw, key: value + text}, hash=None)
        if isinstance(value, list):
            part = "output_text" if item.role is Role.ASSISTANT else "input_text"
            return item.but(raw={**item.raw, key: [*value, {"type": part, "text": text}]}, hash=None)
        return item

    def counted_parts(self, raw: Raw) -> tuple[tuple[str, ...], int]:
        """Texts the model reads, framed as chat completions frames its messages (a role, a call's
        id and name, 3 tokens a message and a call), so that the same run counts the same in
        either format; reasoning's encrypted_content is estimated (it is the model's own
        reasoning, sealed: ~6 characters of it a token)."""
        kind = item_type(raw)
        role = raw.get("role") if kind == "message" else SPOKEN_BY.get(kind, kind)
        texts: list[str] = [str(role or "")]
        extra = 3
        if kind == "message":
            _add_content(raw.get("content"), texts)
        elif kind in CALLS:  # the call's id too, as chat's tool_calls are counted: the same run, the same figures
            texts += [str(raw.get("call_id") or ""), str(raw.get("name") or ""), _argument_text(raw.get(CALLS[kind]))]
            extra += PER_TOOL_CALL
        elif kind in RESULTS:
            texts.append(str(raw.get("call_id") or ""))
            _add_content(raw.get("output"), texts)
        elif kind == "reasoning":
            _add_content(raw.get("summary"), texts)
            encrypted = raw.get("encrypted_content")
            extra += len(encrypted) // 6 if isinstance(encrypted, str) else 0
        else:
            texts.append(orjson.dumps(raw).decode())
        return tuple(texts), extra

    def system_note(self, text: str) -> Item:
        return Item({"type": "message", "role": "system", "content": [{"type": "input_text", "text": text}]}, Role.SYSTEM)

    def user_note(self, text: str) -> Item:
        return Item({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}, Role.USER)

    def tool_result(self, call: Call, text: str) -> Item:
        return Item({"type": "function_call_output", "call_id": call.id, "output": text}, Role.TOOL, answers=call.id, joins=True)


def _argument_text(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode() if value is not None else ""


def _add_content(value: Any, texts: list[str]) -> None:
    if isinstance(value, str):
        texts.append(value)
    elif isinstance(value, list):
        for part in value:
            if isinstance(part, dict):
                text = part.get("text")
                texts.append(text if isinstance(text, str) else orjson.dumps(part).decode())


def canonical(raw: Raw) -> Raw:
    """What an item means, for dedupe: no status or item id (except reasoning's, which with its
    encrypted_content is what it is), no null fields, string content as the one text part it
    stands for, and no empty annotations or logprobs."""
    kind = item_type(raw)
    # An absent key and a null one are the same (Codex resends a reasoning item with "content": null).
    out: Raw = {k: v for k, v in raw.items() if v is not None and (k not in UNHASHED or kind == "reasoning")}
    out["type"] = kind
    if kind == "message":
        out["content"] = _canonical_content(raw.get("content"), raw.get("role"))
    return out


def _canonical_content(content: Any, role: Any) -> Any:
    if isinstance(content, str):
        return [{"type": "output_text" if role == "assistant" else "input_text", "text": content}]
    if isinstance(content, list):
        return [
            {k: v for k, v in part.items() if not (k in ("annotations", "logprobs") and not v)}
            if isinstance(part, dict) else part
            for part in content
        ]
    return content



def reply_read(response: dict[str, Any]) -> ReplyRead:
    output = [item for item in response.get("output") or () if isinstance(item, dict)]
    calls = [call for item in CODEC.items(output, [None] * len(output), [None] * len(output)) for call in item.calls]
    usage = response.get("usage") if isinstance(response.get("usage"), dict) else None
    return ReplyRead(output, calls, usage, response_id=response.get("id"), complete=response.get("status") == "completed")


def without_calls(output: list[Raw], keep_ids: set[str]) -> list[Raw]:
    """`output` without the calls not in `keep_ids`, and without a reasoning item whose
    following item went with them (a reasoning item must come back with its item)."""
    out: list[Raw] = []
    for item in output:
        kind = item_type(item)
        if kind in CALLS and item.get("call_id") not in keep_ids:
            if out and item_type(out[-1]) == "reasoning":
                out.pop()
            continue
        out.append(item)
    return out



CODEC = ResponsesCodec()
