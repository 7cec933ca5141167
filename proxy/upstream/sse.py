"""Server-sent events: split a byte stream into `data:` payloads and rebuild the streamed reply.

The bytes are forwarded to the client untouched; this module only watches them go by.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from ..messages import Message
from . import frames

log = logging.getLogger("proxy.sse")


class SSEParser:
    """Feed raw bytes in any split; get back the `data:` payload of each complete event line.

    Linear in the bytes fed, however a line is split: the pieces of an unfinished line are kept
    in a list and joined once, when its newline comes (appending each piece to one bytes object
    would copy the line again at every piece). How long a line may grow is the upstream's bound
    (upstream.max_sse_line_mb, see limits.py)."""

    def __init__(self) -> None:
        self._pieces: list[bytes] = []  # the unfinished line

    @property
    def pending(self) -> bool:
        """Part of a line is waiting for its end."""
        return bool(self._pieces)

    def feed(self, chunk: bytes) -> list[bytes]:
        # A stream's chunk is usually its events, whole: ended by a newline, no search needed.
        # (find, not `in`: bytes.__contains__ tries its argument as an int first, and builds and
        # drops a TypeError every time; a chat stream calls this once per event.)
        if chunk[-1:] != b"\n" and chunk.find(b"\n") < 0:
            if chunk:
                self._pieces.append(chunk)
            return []
        if self._pieces:
            self._pieces.append(chunk)
            chunk = b"".join(self._pieces)
            self._pieces = []
        lines = chunk.split(b"\n")
        rest = lines.pop()
        if rest:
            self._pieces.append(rest)
        payloads = []  # a loop, not a comprehension: no function call per chunk (Python 3.11)
        for line in lines:
            if line[:5] == b"data:":
                payloads.append(line[5:].strip())
        return payloads



class ReplyAssembler:
    """Rebuilds the assistant message (content and tool-call deltas) from chat.completion.chunks.

    Most of a stream is text deltas that differ only in their text: `feed_text` reads such a
    chunk by its text alone once a parsed one showed its frame (frames.py), ~1.5 µs an event
    less than a parse and a walk."""

    def __init__(self) -> None:
        self.content: list[str] = []
        self.refusal: list[str] = []
        # index -> id, and the pieces of its name and arguments (joined once, in message(): adding
        # each delta to one string would copy the arguments again at every delta).
        self.tool_calls: dict[int, _CallPieces] = {}
        self.id: str | None = None  # the completion's (chatcmpl-...), from its first chunk
        self.finish_reason: str | None = None
        self.done = False
        self.usage: dict[str, Any] | None = None
        self.error: str | None = None  # an error event the upstream ended the stream with
        self.frame: frames.Frame | None = None  # a text delta's bytes around its text
        self.frames_left = frames.MAX_FRAMES

    def feed(self, payload: bytes) -> dict[str, Any] | None:
        """Take one `data:` payload; returns it parsed (None for [DONE] or junk)."""
        if payload == b"[DONE]":
            self.done = True
            return None
        try:
            chunk = orjson.loads(payload)
        except ValueError:
            log.warning("unparseable SSE payload from upstream (%d bytes)", len(payload))
            return None
        if isinstance(chunk, dict):
            self.take(payload, chunk)
            return chunk
        return None

    def feed_text(self, payload: bytes) -> bool:
        """Take `payload` if it is a text delta in the frame learned (True), else nothing (False)."""
        text = frames.read(self.frame, payload) if self.frame is not None else None
        if text is None:
            return False
        if text:
            self.content.append(text)
        return True

    def take(self, payload: bytes, chunk: dict[str, Any]) -> None:
        """`feed_chunk`, and the chunk's frame learned from its bytes if it is a text delta
        (`feed_text` then reads the next ones that share it). A delta in the frame known (one a
        relay parsed anyway: a later round's, its view parted from the client's) is not learned
        again: it would give the same frame."""
        self.feed_chunk(chunk)
        if not self.frames_left or (self.frame is not None and frames.read(self.frame, payload) is not None):
            return
        if (frame := _frame_of(payload, chunk)) is not None and frame != self.frame:
            self.frame, self.frames_left = frame, self.frames_left - 1

    def feed_chunk(self, chunk: dict[str, Any]) -> None:
        if self.id is None and isinstance(chunk.get("id"), str):
            self.id = chunk["id"]
        if isinstance(chunk.get("error"), dict):
            self.error = str(chunk["error"].get("message") or "upstream error")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:  # n > 1: we keep the first choice, like the transcript does
                continue
            delta = choice.get("delta") or {}
            content = delta.get("content")
            if content:
                self.content.append(content)
            if len(delta) > (content is not None) + ("role" in delta):  # more than text (no call for most chunks)
                self._delta(delta)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def _delta(self, delta: dict[str, Any]) -> None:
        """What a delta adds besides its text: a refusal, tool-call pieces."""
        if delta.get("refusal"):
            self.refusal.append(delta["refusal"])
        for call in delta.get("tool_calls") or ():
            slot = self.tool_calls.get(call.get("index", 0))
            if slot is None:
                slot = self.tool_calls[call.get("index", 0)] = _CallPieces()
            if call.get("id"):
                slot.id = call["id"]
            fn = call.get("function") or {}
            if fn.get("name"):
                slot.name.append(fn["name"])
            if fn.get("arguments"):
                slot.arguments.append(fn["arguments"])

    @property
    def fresh(self) -> bool:
        """Nothing fed yet."""
        return self.id is None and self.finish_reason is None and self.usage is None and self.error is None and not self.done and self.empty

    def copy(self) -> ReplyAssembler:
        """An assembler in this one's state, to be fed apart from it."""
        other = ReplyAssembler()
        other.content, other.refusal = list(self.content), list(self.refusal)
        other.tool_calls = {index: pieces.copy() for index, pieces in self.tool_calls.items()}
        other.id, other.finish_reason, other.done = self.id, self.finish_reason, self.done
        other.usage, other.error = self.usage, self.error
        other.frame, other.frames_left = self.frame, self.frames_left
        return other

    @property
    def complete(self) -> bool:
        return self.finish_reason is not None

    @property
    def empty(self) -> bool:
        return not (self.content or self.refusal or self.tool_calls)

    def message(self) -> Message:
        msg: Message = {"role": "assistant", "content": "".join(self.content) if self.content else None}
        if self.tool_calls:
            msg["tool_calls"] = [self.tool_calls[i].call() for i in sorted(self.tool_calls)]
        if self.refusal:
            msg["refusal"] = "".join(self.refusal)
        return msg


def _frame_of(payload: bytes, chunk: dict[str, Any]) -> frames.Frame | None:
    """The frame of `payload` (parsed: `chunk`) if it is a text delta that does nothing else: one
    choice, no finish, no usage, no error, a delta of its text and perhaps its role; an
    `obfuscation` string after the text (OpenAI's, new in every chunk) is a string of the frame."""
    choices = chunk.get("choices")
    if chunk.get("usage") or chunk.get("error") is not None or type(choices) is not list or len(choices) != 1:
        return None
    choice = choices[0]
    if type(choice) is not dict or choice.get("index", 0) != 0 or choice.get("finish_reason"):
        return None
    delta = choice.get("delta")
    if type(delta) is not dict or not delta.keys() <= {"content", "role"}:
        return None
    text = delta.get("content")
    if type(text) is not str or not text:
        return None
    probed = {**chunk, "choices": [{**choice, "delta": {**delta, "content": frames.PROBE}}]}
    padding = chunk.get("obfuscation")
    if type(padding) is not str:
        return frames.learn(payload, (text,), orjson.loads, probed)
    return frames.learn(payload, (text, padding), orjson.loads, {**probed, "obfuscation": frames.PROBE})


class _CallPieces:
    """One streamed tool call as its deltas came."""

    __slots__ = ("arguments", "id", "name")

    def __init__(self) -> None:
        self.id: str | None = None
        self.name: list[str] = []
        self.arguments: list[str] = []

    def copy(self) -> _CallPieces:
        other = _CallPieces()
        other.id, other.name, other.arguments = self.id, list(self.name), list(self.arguments)
        return other

    def call(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": "".join(self.name), "arguments": "".join(self.arguments)},
        }
