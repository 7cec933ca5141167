"""Chat completion chunks as Responses server-sent events: `event:`/`data:` with contiguous
`sequence_number`s, one output item open at a time and its events one after the other, ending in
`response.completed` (`.incomplete` when the model ran out of tokens).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from .litellm_responses_reply import response_usage, thinking_block
from .litellm_responses_request import Translation, new_id

log = logging.getLogger("proxy.litellm")


def sse_event(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


@dataclass(slots=True)
class _OpenItem:
    kind: str  # "reasoning", "message" or "call"
    index: int  # its output_index
    item_id: str
    text: list[str] = field(default_factory=list)  # reasoning / message text, call arguments
    blocks: dict[int, dict[str, Any]] = field(default_factory=dict)  # thinking blocks by their index
    call_index: int | None = None  # the chat tool call's index
    call_id: str = ""
    name: str = ""


class EventWriter:
    """Chat completion chunks in, Responses events out: one output item open at a time (a new
    kind of delta closes the item before it), numbered from 0, the final events at `finish`."""

    def __init__(self, translation: Translation) -> None:
        self._t = translation
        self._seq = 0
        self._id = new_id("resp")
        self._created = int(time.time())
        self._output: list[dict[str, Any]] = []  # finished items, in order
        self._open: _OpenItem | None = None
        self._calls: dict[int, _OpenItem] = {}  # chat tool call index -> its item
        self._usage: dict[str, Any] | None = None
        self._finish: str | None = None

    def _event(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return sse_event(event)

    def start(self) -> bytes:
        started = self._t.response(self._id, self._created, "in_progress", [], None)
        return self._event("response.created", response=started) + self._event("response.in_progress", response=started)

    def feed(self, chunk: Mapping[str, Any]) -> bytes:
        out: list[bytes] = []
        if isinstance(chunk.get("usage"), dict):
            self._usage = response_usage(chunk["usage"])
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            reasoning = delta.get("reasoning_content")
            blocks = delta.get("thinking_blocks")
            if (isinstance(reasoning, str) and reasoning) or blocks:
                out.append(self._reasoning(reasoning if isinstance(reasoning, str) else "", blocks))
            content = delta.get("content")
            if isinstance(content, str) and content:
                out.append(self._message_text(content))
            for call in delta.get("tool_calls") or ():
                if isinstance(call, dict):
                    out.append(self._call(call))
            if choice.get("finish_reason"):
                self._finish = choice["finish_reason"]
                out.append(self._close())
        return b"".join(out)

    def finish(self) -> bytes:
        """The closing events: the open item's end, then response.completed (or .incomplete)."""
        out = self._close()
        status = "incomplete" if self._finish in ("length", "content_filter") else "completed"
        response = self._t.response(self._id, self._created, status, list(self._output), self._usage, self._finish)
        return out + self._event(f"response.{status}", response=response)

    # items

    def _switch(self, kind: str) -> tuple[bytes, _OpenItem | None]:
        """Close the open item unless it is of `kind` (calls: never reopened)."""
        if self._open is not None and self._open.kind == kind and kind != "call":
            return b"", self._open
        return self._close(), None

    def _reasoning(self, text: str, blocks: Any) -> bytes:
        out, item = self._switch("reasoning")
        if item is None:
            item = self._open = _OpenItem("reasoning", len(self._output), new_id("rs"))
            out += self._event(
                "response.output_item.added",
                output_index=item.index,
                item={"id": item.item_id, "type": "reasoning", "summary": []},
            )
            out += self._event(
                "response.reasoning_summary_part.added",
                item_id=item.item_id,
                output_index=item.index,
                summary_index=0,
                part={"type": "summary_text", "text": ""},
            )
        for block in blocks if isinstance(blocks, list) else ():
            if isinstance(block, dict):
                _merge_block(item.blocks, block)
        if text:
            item.text.append(text)
            out += self._event(
                "response.reasoning_summary_text.delta",
                item_id=item.item_id,
                output_index=item.index,
                summary_index=0,
                delta=text,
            )
        return out

    def _message_text(self, text: str) -> bytes:
        out, item = self._switch("message")
        if item is None:
            item = self._open = _OpenItem("message", len(self._output), new_id("msg"))
            out += self._event(
                "response.output_item.added",
                output_index=item.index,
                item={
                    "id": item.item_id,
                    "type": "message",
                    "status": "in_progress",
                    "role": "assistant",
                    "content": [],
                },
            )
            out += self._event(
                "response.content_part.added",
                item_id=item.item_id,
                output_index=item.index,
                content_index=0,
                part={"type": "output_text", "text": "", "annotations": []},
            )
        item.text.append(text)
        return out + self._event(
            "response.output_text.delta",
            item_id=item.item_id,
            output_index=item.index,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def _call(self, call: Mapping[str, Any]) -> bytes:
        index = call.get("index") if isinstance(call.get("index"), int) else len(self._calls)
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        arguments = function.get("arguments") if isinstance(function.get("arguments"), str) else ""
        out = b""
        item = self._calls.get(index)
        if item is None:
            out, _ = self._switch("call")
            name = str(function.get("name") or "")
            item = self._open = self._calls[index] = _OpenItem(
                "call",
                len(self._output),
                "",
                call_index=index,
                call_id=str(call.get("id") or new_id("call")),
                name=name,
            )
            shown = self._t.call_item(item.call_id, name, "")
            item.item_id = shown["id"]
            shown["status"] = "in_progress"
            out += self._event("response.output_item.added", output_index=item.index, item=shown)
        elif item is not self._open:
            # Providers stream one call after the other; one that goes back to a call already
            # closed (and shown whole) can't be followed: say so rather than guess.
            log.warning("a streamed tool call went on after the next one began", extra={"model": self._t.public_model})
            return b""
        if arguments:
            item.text.append(arguments)
            if item.name not in self._t.custom:  # a free-form input is shown whole, when done
                out += self._event(
                    "response.function_call_arguments.delta",
                    item_id=item.item_id,
                    output_index=item.index,
                    delta=arguments,
                )
        return out

    def _close(self) -> bytes:
        item, self._open = self._open, None
        if item is None:
            return b""
        text = "".join(item.text)
        at = {"item_id": item.item_id, "output_index": item.index}
        if item.kind == "reasoning":
            done = self._t.reasoning_item(text, [thinking_block(b) for _, b in sorted(item.blocks.items())], item.item_id)
            out = self._event("response.reasoning_summary_text.done", **at, summary_index=0, text=text)
            out += self._event(
                "response.reasoning_summary_part.done",
                **at,
                summary_index=0,
                part={"type": "summary_text", "text": text},
            )
        elif item.kind == "message":
            part = {"type": "output_text", "text": text, "annotations": []}
            done = {
                "id": item.item_id,
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
            out = self._event("response.output_text.done", **at, content_index=0, text=text, logprobs=[])
            out += self._event("response.content_part.done", **at, content_index=0, part=part)
        else:
            done = self._t.call_item(item.call_id, item.name, text, item.item_id)
            out = b""
            if done["type"] == "function_call":
                out = self._event("response.function_call_arguments.done", **at, arguments=text)
        self._output.append(done)
        return out + self._event("response.output_item.done", output_index=item.index, item=done)


def _merge_block(blocks: dict[int, dict[str, Any]], delta: Mapping[str, Any]) -> None:
    """Add a streamed thinking block delta to the block of its index: text appended, the
    signature (or a redacted block's data) kept."""
    index = delta.get("index") if isinstance(delta.get("index"), int) else len(blocks)
    block = blocks.setdefault(index, {"type": delta.get("type") or "thinking"})
    if block["type"] == "thinking":
        block["thinking"] = block.get("thinking", "") + (delta.get("thinking") or "")
    for key in ("signature", "data"):
        if delta.get(key):
            block[key] = delta[key]
