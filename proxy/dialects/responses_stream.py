"""Relaying a streamed response (Responses API SSE) across read-back rounds.

The client sees one well-formed stream: one `response.created` / `response.in_progress`, output
items numbered from 0 without the proxy's calls, contiguous `sequence_number`s, and one final
`response.completed` (or `.incomplete`) whose `output` lists what it saw, held until the reply is
stored. In a round that offers the proxy's tools, a `reasoning` item is held until the item it
belongs to starts: if that is one of our calls, both stay hidden (a reasoning item must come back
with its item, and the client never sees ours). Events that need no change go out as the bytes
the upstream sent.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..errors import ProxyError, UpstreamStreamBroken, error_body
from ..transcript import Raw
from ..upstream import frames
from .base import RoundEnd
from .responses_codec import CALLS, item_type, reply_read

MAX_EVENT_BYTES = 16 * 2**20  # one SSE event; a bigger one is a broken (or hostile) upstream
HELD = -1  # an output index whose events wait for what follows (a reasoning item)
HIDDEN = -2  # an output index the client never sees (our call, its reasoning)
START_EVENTS = ("response.created", "response.in_progress")
END_EVENTS = ("response.completed", "response.incomplete")
FAIL_EVENTS = ("response.failed", "error")


class EventSplitter:
    """Raw bytes in any split; complete SSE event blocks (their bytes, blank line included) out."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._scanned = 0  # the buffer before this offset holds no event end: never scanned twice

    @property
    def pending(self) -> bool:
        """Part of an event is waiting for its end."""
        return bool(self._buffer)

    def feed(self, chunk: bytes) -> list[bytes]:
        if not self._buffer and chunk[-2:] == b"\n\n" and chunk.find(b"\r") < 0:
            # A stream's usual chunk: whole LF-ended events, nothing carried over. Split where the
            # loop below would cut (each blank line, left to right), no copy into the buffer.
            blocks = chunk.split(b"\n\n")
            blocks.pop()
            return [block + b"\n\n" for block in blocks]
        self._buffer += chunk
        blocks = []
        start = 0
        while True:
            end = _event_end(self._buffer, max(start, self._scanned - 3))
            if end < 0:
                break
            blocks.append(bytes(self._buffer[start:end]))
            start = end
        if start:
            del self._buffer[:start]
        self._scanned = len(self._buffer)
        if len(self._buffer) > MAX_EVENT_BYTES:
            raise UpstreamStreamBroken(f"Upstream sent an SSE event over {MAX_EVENT_BYTES} bytes")
        return blocks


def _event_end(buffer: bytearray, at: int) -> int:
    """The offset just past the first blank line at or after `at`, or -1."""
    lf = buffer.find(b"\n\n", at)
    crlf = buffer.find(b"\r\n\r\n", at)
    if lf < 0 and crlf < 0:
        return -1
    if crlf >= 0 and (lf < 0 or crlf < lf):
        return crlf + 4
    return lf + 2


def event_data(block: bytes) -> bytes | None:
    at = block.find(b"data:")
    if at < 0:
        return None
    end = block.find(b"\n", at)
    if (at == 0 or block[at - 1] == 10) and (end < 0 or not block[end:].strip()):
        return block[at + 5 : end].strip() if end >= 0 else block[at + 5 :].strip()  # one data line, the event's last
    lines = [line[5:].strip() for line in block.splitlines() if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def _parsed(block: bytes) -> Any:
    """A block's `data:` JSON parsed; raises ValueError for a block without one, or not JSON."""
    return orjson.loads(event_data(block) or b"")


def sse_event(event: dict[str, Any]) -> bytes:
    return b"event: " + str(event.get("type")).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


class ResponsesRelay:
    def __init__(self, echo: dict[str, Any] | None = None) -> None:
        # Fields of the client's request the proxy did not forward (previous_response_id): every
        # response object the client sees says the client's value.
        self._echo = echo
        self._seq = 0  # the next sequence_number the client sees
        self._next_index = 0  # the next output_index the client sees
        self._started: set[str] = set()
        self._response_id: str | None = None  # the response id the client saw
        self._shown: list[Raw] = []  # finished output items the client saw, in order
        self._usage: dict[str, Any] | None = None  # summed over the rounds
        self._changed = False  # something was hidden or renumbered: the final event is rebuilt
        self._rounds = 0
        self._closing = b""
        self._upstream_error: str | None = None
        self._finished = False
        # A delta's frame (frames.py: its sequence_number's place, then its strings') and the
        # output_index it was learned at: most of a stream's events.
        self._frame: tuple[frames.Frame, int] | None = None
        self._frames_left = frames.MAX_FRAMES
        self.begin_round(frozenset())
        self._rounds = 0

    # -- rounds ----------------------------------------------------------------------------------

    def begin_round(self, ours: frozenset[str]) -> None:
        self._rounds += 1
        self._ours = ours
        self._splitter = EventSplitter()
        self._index: dict[int, int] = {}  # upstream output_index -> the client's (or HELD / HIDDEN)
        self._held: list[tuple[bytes, dict[str, Any]]] = []
        self._items: dict[int, Raw] = {}  # every finished output item of this round, ours included
        self._end: tuple[bytes, dict[str, Any]] | None = None

    def feed(self, chunk: bytes) -> bytes:
        if self._frame is not None and not self._splitter.pending and self._framed(chunk):
            return chunk  # one delta, whole, that goes out as it came
        blocks = self._splitter.feed(chunk)
        if len(blocks) == 1:  # a model's stream: an event a read
            return self._event(blocks[0])
        # Several events a read (a fast upstream, a busy proxy): each delta in the frame (learned
        # from this read's first, perhaps) is taken by it too, and not learned again.
        return b"".join([block if self._frame is not None and self._framed(block) else self._event(block) for block in blocks])

    def end_round(self) -> RoundEnd:
        end = self._end[1] if self._end is not None else None
        response = dict(end["response"]) if end is not None and isinstance(end.get("response"), dict) else {}
        response["output"] = [self._items[i] for i in sorted(self._items)]
        if end is None:
            response["status"] = "in_progress"  # the stream ended before it said how
        reply = reply_read(response)
        self._usage = add_usage(self._usage, reply.usage)
        ours = [c for c in reply.calls if c.name in self._ours]
        return RoundEnd(reply, ours, [c for c in reply.calls if c.name not in self._ours])

    def release(self) -> bytes:
        out = self._release_held()
        if self._end is not None:
            block, event = self._end
            self._finished = True
            if not self._changed and self._echo is None and self._rounds == 1 and event.get("sequence_number") == self._seq:
                self._closing = block  # nothing was touched: the upstream's own bytes
            else:
                response = {**event["response"], "output": list(self._shown), "usage": self._usage}
                if self._response_id is not None:
                    response["id"] = self._response_id
                self._closing = sse_event({**event, "sequence_number": self._seq, "response": response})
            self._seq += 1
        return out

    def closing(self) -> bytes:
        return self._closing

    def error_event(self, exc: ProxyError) -> bytes:
        if self._upstream_error is not None:
            return b""  # the upstream's own failure event went to the client already
        error = error_body(exc.message, exc.type, exc.code, exc.param)["error"]
        event = {**error, "type": "error", "sequence_number": self._seq}  # the event type, not the error's
        self._seq += 1
        return sse_event(event)

    @property
    def finished(self) -> bool:
        return self._finished

    @property
    def upstream_error(self) -> str | None:
        return self._upstream_error

    @property
    def response_id(self) -> str | None:
        return self._response_id

    def seen(self) -> list[Raw]:
        return list(self._shown)

    @property
    def usage(self) -> dict[str, Any] | None:
        return self._usage

    # -- events ----------------------------------------------------------------------------------

    def _framed(self, chunk: bytes) -> bool:
        """`chunk` (whole events, nothing of one pending before it) taken if it is one delta in
        the frame learned, numbered as the client's next event and of an item shown under its own
        index: what `_event` would do with it (count it, pass it as it came), without parsing it
        (frames.py); else nothing done."""
        assert self._frame is not None
        index = self._frame[1]
        if not self._in_frame(chunk, self._seq) or self._index.get(index) != index:
            return False
        self._seq += 1
        return True

    def _in_frame(self, block: bytes, seq: int) -> bool:
        """Whether `block` is one delta in the frame learned, numbered `seq`."""
        assert self._frame is not None
        frame, number = self._frame[0], str(seq).encode()
        before = frame[0]
        if not block.startswith(before) or not block.startswith(number, len(before)):
            return False
        return frames.read(frame[1:], block[len(before) + len(number) :]) is not None

    def _learn(self, block: bytes, event: dict[str, Any]) -> None:
        """The frame of `block` (parsed: `event`) if it is a delta that `_event` only counts and
        passes on: a `...delta` event of an output item, its `delta` a string (perhaps with an
        `obfuscation` string after it, OpenAI's, new in every event)."""
        seq, index, text, padding = event.get("sequence_number"), event.get("output_index"), event.get("delta"), event.get("obfuscation")
        if type(seq) is not int or type(index) is not int or type(text) is not str or not text or "response" in event:
            return
        if self._frame is not None and self._in_frame(block, seq):
            return  # one `_framed` passed by (its item held or hidden, its number not the client's next): the same frame
        values: tuple[str | int, ...] = (seq, text) if type(padding) is not str else (seq, text, padding)
        expected = {**event, "sequence_number": frames.PROBE_NUMBER, "delta": frames.PROBE}
        frame = frames.learn(block, values, _parsed, expected if len(values) == 2 else {**expected, "obfuscation": frames.PROBE})
        if frame is not None and (self._frame is None or frame != self._frame[0]):
            self._frame, self._frames_left = (frame, index), self._frames_left - 1

    def _event(self, block: bytes) -> bytes:
        data = event_data(block)
        if data is None:
            return block  # a comment (keep-alive): harmless, passed on
        try:
            event = orjson.loads(data)
        except ValueError:
            return block
        if not isinstance(event, dict):
            return block
        kind = event.get("type")
        if self._frames_left and type(kind) is str and kind.endswith(".delta"):
            self._learn(block, event)
        echoed = self._echo is not None and isinstance(event.get("response"), dict)
        if echoed:
            event = {**event, "response": {**event["response"], **self._echo}}  # type: ignore[dict-item]
        if kind in START_EVENTS:
            if kind in self._started:
                return b""  # a later round's start: the client's stream started once
            self._started.add(kind)
            if kind == "response.created":
                self._response_id = (event.get("response") or {}).get("id")
            return self._emit(block, event, touched=echoed)
        if kind in END_EVENTS:
            self._end = (block, event)  # held: the closing, or dropped when another round follows
            return b""
        if kind in FAIL_EVENTS:
            detail = event.get("message") or ((event.get("response") or {}).get("error") or {}).get("message")
            self._upstream_error = str(detail or kind)
            return self._emit(block, event, touched=echoed)
        index = event.get("output_index")
        if not isinstance(index, int):
            return self._emit(block, event)
        if kind == "response.output_item.added":
            return self._added(block, event, index)
        if kind == "response.output_item.done" and isinstance(event.get("item"), dict):
            self._items[index] = event["item"]
        target = self._index.get(index)
        if target == HIDDEN:
            self._changed = True
            return b""
        if target == HELD:
            self._held.append((block, event))
            return b""
        return self._visible(block, event, target)

    def _added(self, block: bytes, event: dict[str, Any], index: int) -> bytes:
        item = event.get("item") if isinstance(event.get("item"), dict) else {}
        kind = item_type(item)
        if kind in CALLS and item.get("name") in self._ours:
            self._index[index] = HIDDEN
            for _, held in self._held:  # the reasoning before our call goes with it
                self._index[held["output_index"]] = HIDDEN
            self._held = []
            self._changed = True
            return b""
        if kind == "reasoning" and self._ours:
            self._index[index] = HELD
            self._held.append((block, event))
            return b""
        out = self._release_held()
        return out + self._visible(block, event, None)

    def _release_held(self) -> bytes:
        held, self._held = self._held, []
        return b"".join(self._visible(block, event, self._index.get(event["output_index"])) for block, event in held)

    def _visible(self, block: bytes, event: dict[str, Any], target: int | None) -> bytes:
        index = event["output_index"]
        if target is None or target == HELD:
            target = self._index[index] = self._next_index
            self._next_index += 1
        if event.get("type") == "response.output_item.done" and isinstance(event.get("item"), dict):
            self._shown.append(event["item"])
        return self._emit(block, event, target)

    def _emit(self, block: bytes, event: dict[str, Any], index: int | None = None, touched: bool = False) -> bytes:
        seq = self._seq
        self._seq += 1
        if not touched and event.get("sequence_number") == seq and (index is None or event.get("output_index") == index):
            return block
        self._changed = True
        changed = {**event, "sequence_number": seq}
        if index is not None:
            changed["output_index"] = index
        return sse_event(changed)


def add_usage(total: dict[str, Any] | None, more: dict[str, Any] | None) -> dict[str, Any] | None:
    """Usage figures of several calls added up (nested details too)."""
    if more is None:
        return total
    if total is None:
        return dict(more)
    out = dict(total)
    for key, value in more.items():
        if isinstance(value, bool):
            out[key] = value
        elif isinstance(value, int) and isinstance(out.get(key), int):
            out[key] += value
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = add_usage(out[key], value)
        else:
            out.setdefault(key, value)
    return out
