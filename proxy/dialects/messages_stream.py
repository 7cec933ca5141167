"""Relaying a streamed Anthropic message (`event:` + `data:` SSE events) across read-back rounds.

The client sees one message: one `message_start`, content blocks indexed 0, 1, 2... without
gaps, one `message_delta` and one `message_stop`. Events go out whole (an incomplete event at
the end of a chunk waits for its end: a client can't act on half an event anyway), and the
final `message_stop` only once the reply is stored.

Without proxy tools in a round, every event goes out as it came (the fast path). With them, the
proxy's `tool_use` blocks never reach the client and the rest is renumbered. A round that opens
with thinking is held back until it is known whether it ends in one of our calls: if it does,
that round is answered by the proxy and the client never sees its thinking (shown, its signature
would sit before the next round's thinking and the API would refuse the message when it comes
back). A round's `message_delta` is held while only our calls were seen: another round follows.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

import orjson

from ..errors import ProxyError
from ..transcript import Call, Raw
from ..upstream import frames
from .base import OneMessageRelay, RoundEnd

log = logging.getLogger("proxy.messages")



# The proxy's errors in Anthropic's error types, by status; the upstream's own pass unmodified.
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_body(exc: ProxyError) -> dict[str, Any]:
    """`exc` in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`."""
    kind = ERROR_TYPES.get(exc.status, "invalid_request_error" if exc.status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


class CallCache:
    """The Calls of recent tool_use blocks by id, with the name and input each was made from:
    every turn reads the whole transcript's calls again, and a JSON dump of each input is the
    dear part of that. A hit is compared, not trusted (an id sent again with another input gets
    a new Call); the least recently made go first."""

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._calls: OrderedDict[str, tuple[Any, str, Call]] = OrderedDict()

    def call(self, call_id: str, name: str, arguments: Any) -> Call:
        cached = self._calls.get(call_id)
        if cached is not None and cached[1] == name and cached[0] == arguments:
            return cached[2]
        call = Call(call_id, name, orjson.dumps(arguments).decode())
        self._calls[call_id] = (arguments, name, call)
        if len(self._calls) > self.size:
            self._calls.popitem(last=False)
        return call


def calls_of(content: Any, cache: CallCache | None = None) -> tuple[Call, ...]:
    """The tool_use blocks of an assistant message's content, as the engine sees them."""
    if type(content) is not list:
        return ()
    calls = []
    for b in content:
        if type(b) is dict and b.get("type") == "tool_use":
            call_id, name, arguments = str(b.get("id")), str(b.get("name") or ""), b.get("input") or {}
            if cache is not None:
                calls.append(cache.call(call_id, name, arguments))
            else:
                calls.append(Call(call_id, name, orjson.dumps(arguments).decode()))
    return tuple(calls) if calls else ()


def sse_event(payload: dict[str, Any]) -> bytes:
    return b"event: " + str(payload.get("type")).encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class EventSplitter:
    """Bytes in any split; out come complete events: (their bytes, the parsed `data:` JSON or None),
    or their bytes alone (`events`).

    Linear in the bytes fed (as SSEParser is): the pieces of an unfinished event are kept in a
    list and joined once, when its blank line comes. How long one may grow is the upstream's bound
    (upstream.max_sse_line_mb: an Anthropic event is one data line)."""

    def __init__(self) -> None:
        self._pieces: list[bytes] = []  # the unfinished event

    @property
    def pending(self) -> bool:
        """Part of an event is waiting for its end."""
        return bool(self._pieces)

    def feed(self, chunk: bytes) -> list[tuple[bytes, dict[str, Any] | None]]:
        events = []  # a loop, not a comprehension: no function call per chunk (Python 3.11)
        for event in self.events(chunk):
            events.append((event, payload_of(event)))
        return events

    def events(self, chunk: bytes) -> list[bytes]:
        """The events `chunk` completes, not parsed (see `payload_of`)."""
        # find, not `in` (see SSEParser.feed: `in` builds and drops a TypeError per call)
        if chunk.find(b"\r") >= 0:  # CRLF line ends (the API sends LF): the same events, LF-ended
            chunk = chunk.replace(b"\r", b"")
        if self._pieces:
            ends_here = chunk.find(b"\n\n") >= 0 or (chunk[:1] == b"\n" and self._pieces[-1][-1:] == b"\n")
            self._pieces.append(chunk)
            if not ends_here:
                return []
            chunk = b"".join(self._pieces)
            self._pieces = []
        complete = chunk.split(b"\n\n")
        rest = complete.pop()
        if rest:
            self._pieces.append(rest)
        events = []
        for event in complete:
            if event.strip():
                events.append(event + b"\n\n")
        return events


def payload_of(event: bytes) -> dict[str, Any] | None:
    """An event's `data:` JSON object parsed; None if it has none (a comment) or is not one."""
    try:
        parsed = parsed_event(event)
    except ValueError:
        log.warning("unparseable SSE event from upstream (%d bytes)", len(event))
        return None
    return parsed if isinstance(parsed, dict) else None


def parsed_event(event: bytes) -> Any:
    """An event's `data:` JSON parsed (None without one); raises ValueError for one that isn't JSON."""
    at = event.find(b"data:")
    if at < 0:
        return None
    if (at == 0 or event[at - 1] == 10) and event.find(b"\n", at) < 0:
        data = event[at + 5 :]  # one data line, the event's last (Anthropic's "event: ...\ndata: {...}")
    else:
        lines = [line[5:].strip() for line in event.splitlines() if line.startswith(b"data:")]
        if not lines:
            return None
        data = b"\n".join(lines)
    return orjson.loads(data)


def _text_frame(event: bytes, payload: dict[str, Any]) -> frames.Frame | None:
    """The frame of `event` (parsed: `payload`) if it is a text delta that does nothing else."""
    delta = payload.get("delta")
    if payload.keys() != {"type", "index", "delta"} or type(payload["index"]) is not int or type(delta) is not dict:
        return None
    text = delta.get("text")
    if delta.keys() != {"type", "text"} or delta["type"] != "text_delta" or type(text) is not str or not text:
        return None
    return frames.learn(event, (text,), parsed_event, {**payload, "delta": {**delta, "text": frames.PROBE}})


# What the filter does with a content block as it starts (MessagesRelay._block_start).
OURS, THEIRS, HOLD, SHOW = "ours", "theirs", "hold", "show"

# The field of its block each text-like delta adds to.
DELTA_FIELDS = {"text_delta": "text", "thinking_delta": "thinking", "signature_delta": "signature"}


class MessageAssembler:
    """Rebuilds the message from its stream events: blocks by index, stop reason, usage."""

    def __init__(self) -> None:
        self.id: str | None = None
        self.blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}  # partial JSON of tool inputs not yet stopped
        # The pieces of each block's text, thinking and signature, joined once (not a copy per delta).
        self._pieces: dict[tuple[int, str], list[str]] = {}
        self.stop_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.done = False  # message_stop seen
        self.started = False

    def feed(self, payload: dict[str, Any]) -> None:
        kind = payload.get("type")
        if kind == "content_block_delta":
            block = self.blocks.get(payload.get("index"))  # type: ignore[arg-type]
            delta = payload.get("delta") or {}
            if block is not None:
                self._delta(payload["index"], block, delta)
        elif kind == "content_block_start":
            block = payload.get("content_block")
            if isinstance(block, dict) and isinstance(payload.get("index"), int):
                self.blocks[payload["index"]] = dict(block)
        elif kind == "content_block_stop":
            self._finish_input(payload.get("index"))  # type: ignore[arg-type]
        elif kind == "message_start":
            message = payload.get("message") or {}
            self.started = True
            self.id = message.get("id")
            if isinstance(message.get("usage"), dict):
                self.usage = dict(message["usage"])
        elif kind == "message_delta":
            delta = payload.get("delta") or {}
            if delta.get("stop_reason"):
                self.stop_reason = delta["stop_reason"]
            if isinstance(payload.get("usage"), dict):
                self.usage = {**(self.usage or {}), **{k: v for k, v in payload["usage"].items() if v is not None}}
        elif kind == "message_stop":
            self.done = True

    def add_text(self, index: int, text: str) -> None:
        """What a `text_delta` of block `index` (started) adds."""
        pieces = self._pieces.get((index, "text"))
        if pieces is None:
            pieces = self._pieces[(index, "text")] = [str(self.blocks[index].get("text") or "")]
        pieces.append(text)

    def _delta(self, index: int, block: dict[str, Any], delta: dict[str, Any]) -> None:
        kind = delta.get("type")
        field = DELTA_FIELDS.get(kind)  # type: ignore[arg-type]
        if field is not None:
            pieces = self._pieces.get((index, field))
            if pieces is None:
                pieces = self._pieces[(index, field)] = [str(block.get(field) or "")]
            pieces.append(str(delta.get(field) or ""))
        elif kind == "input_json_delta":
            self._json.setdefault(index, []).append(str(delta.get("partial_json") or ""))
        elif kind == "citations_delta" and delta.get("citation") is not None:
            block["citations"] = [*(block.get("citations") or ()), delta["citation"]]

    def _finish_input(self, index: int) -> None:
        parts = self._json.pop(index, None)
        if parts is None or index not in self.blocks:
            return
        text = "".join(parts)
        try:
            self.blocks[index]["input"] = orjson.loads(text) if text.strip() else {}
        except ValueError:
            log.warning("a streamed tool input is not valid JSON (%d characters)", len(text))

    @property
    def fresh(self) -> bool:
        """Nothing fed yet."""
        return not (self.started or self.blocks or self.stop_reason or self.usage or self.done)

    def copy(self) -> MessageAssembler:
        """An assembler in this one's state, to be fed apart from it."""
        other = MessageAssembler()
        other.id, other.stop_reason, other.usage, other.done, other.started = (
            self.id, self.stop_reason, self.usage, self.done, self.started
        )
        other.blocks = {index: dict(block) for index, block in self.blocks.items()}
        other._json = {index: list(parts) for index, parts in self._json.items()}
        other._pieces = {key: list(pieces) for key, pieces in self._pieces.items()}
        return other

    @property
    def complete(self) -> bool:
        return self.stop_reason is not None

    @property
    def empty(self) -> bool:
        return not self.blocks

    def content(self) -> list[dict[str, Any]]:
        for index in list(self._json):  # cut off mid-block: keep what arrived
            self._finish_input(index)
        for (index, field), pieces in self._pieces.items():
            self.blocks[index][field] = "".join(pieces)
        self._pieces.clear()  # a later delta starts from the joined text
        return [self.blocks[i] for i in sorted(self.blocks)]

    def message(self) -> Raw:
        return {"role": "assistant", "content": self.content()}


class MessagesRelay(OneMessageRelay):
    def __init__(self) -> None:
        self._seen = MessageAssembler()  # what the client saw, in the client's indexes
        self._round = self._seen  # this round, in the upstream's indexes
        self._split = EventSplitter()
        self._ours: frozenset[str] = frozenset()
        self._rounds = 0
        self._next_index = 0  # the client's next block index
        self._stop_held: bytes | None = None
        self._usage: dict[str, Any] | None = None
        self._upstream_error: str | None = None  # the message of an error event the upstream sent
        # A text delta's frame (frames.py) and its block's index: most of a stream's events.
        self._frame: tuple[frames.Frame, int] | None = None
        self._frames_left = frames.MAX_FRAMES
        self._new_round_state()

    def _new_round_state(self) -> None:
        self._index: dict[int, int] = {}  # upstream block index -> the client's, for blocks shown
        self._our_blocks: set[int] = set()
        self._held: dict[int, list[dict[str, Any]]] = {}  # blocks held back, in order, with their events
        self._holding = False  # this round's blocks are held (it opened with thinking)
        self._theirs = False  # a tool_use of the client's was seen: this round is the last
        self._delta_held: dict[str, Any] | None = None

    # -- StreamRelay ------------------------------------------------------------------------

    def begin_round(self, ours: frozenset[str]) -> None:
        self._rounds += 1
        self._split = EventSplitter()
        self._ours = ours
        # A round with our tools: its reply (in the upstream's indexes) and what the client sees
        # differ only from the first block the filter drops, holds or renumbers; until then (a
        # first round's text, most replies) one assembler serves both, copied where they part.
        self._round = self._seen if not ours or self._seen.fresh else MessageAssembler()
        self._shared = bool(ours) and self._round is self._seen
        self._new_round_state()

    def feed(self, chunk: bytes) -> bytes:
        if self._frame is not None and chunk[-2:] == b"\n\n" and not self._split.pending and self._framed(chunk):
            return chunk  # one text delta, whole, that goes out as it came
        out: list[bytes] = []
        for event in self._split.events(chunk):
            # Several events a read (a fast upstream, a busy proxy): each text delta in the frame
            # (learned, perhaps, from this read's first) is taken by it too, not parsed.
            if self._frame is not None and self._framed(event):
                out.append(event)
                continue
            payload = payload_of(event)
            if self._frames_left and payload is not None and payload.get("type") == "content_block_delta":
                self._learn(event, payload)
            if payload is None:
                out.append(event)
            elif not self._ours:  # the fast path: as it came, but message_stop
                self._seen.feed(payload)
                kind = payload.get("type")
                if kind == "message_stop":
                    self._stop_held = event
                else:
                    if kind == "error":
                        self._note_error(payload)
                    out.append(event)
            else:
                if self._shared and self._parts_at(payload):
                    self._round, self._shared = self._seen.copy(), False  # they part here
                if not self._shared:  # shared: `_filter` feeds the client's view, the round's too
                    self._round.feed(payload)
                out.extend(self._filter(event, payload))
        return b"".join(out)

    def end_round(self) -> RoundEnd:
        message = self._round.message()
        return self._round_end(message, list(calls_of(message["content"])))

    def release(self) -> bytes:
        if not self._ours:
            return b""
        out = self._release_held()
        if self._delta_held is not None:
            delta = self._delta_held
            if not self._theirs and (delta.get("delta") or {}).get("stop_reason") == "tool_use":
                # Only our calls were seen and no round follows: the client's reply ends without calls.
                delta = {**delta, "delta": {**delta["delta"], "stop_reason": "end_turn"}}
            out.append(self._show(delta))
        return b"".join(out)

    def closing(self) -> bytes:
        return self._stop_held or b""

    def error_event(self, exc: ProxyError) -> bytes:
        if self._upstream_error is not None:  # the upstream's own error event went out already, unmodified
            return b""
        return sse_event(error_body(exc))

    @property
    def upstream_error(self) -> str | None:
        return self._upstream_error

    def _learn(self, event: bytes, payload: dict[str, Any]) -> None:
        if self._frame is not None and frames.read(self._frame[0], event) is not None:
            return  # one `_framed` passed by (its block held, ours, not started): the same frame
        frame = _text_frame(event, payload)
        if frame is not None and (self._frame is None or frame != self._frame[0]):
            self._frame, self._frames_left = (frame, payload["index"]), self._frames_left - 1

    def _framed(self, chunk: bytes) -> bool:
        """`chunk` (whole events, nothing of one pending before it) taken if it is one text delta
        in the frame learned whose block is shown as it came: what `feed` would do with it,
        without parsing it (frames.py); else nothing done."""
        assert self._frame is not None
        frame, index = self._frame
        if (text := frames.read(frame, chunk)) is None:
            return False
        if index not in self._seen.blocks:
            return False  # an assembler drops a delta of a block never started
        if self._ours:  # to both assemblers, if shown under its own index (so neither ours nor held)
            if self._index.get(index) != index:
                return False
            if not self._shared:
                if index not in self._round.blocks:
                    return False
                self._round.add_text(index, text)
        self._seen.add_text(index, text)
        return True

    # -- a round that offers our tools --------------------------------------------------------

    def _note_error(self, payload: dict[str, Any]) -> None:
        if payload.get("type") == "error":
            error = payload.get("error")
            self._upstream_error = str((error.get("message") if isinstance(error, dict) else None) or "upstream error")

    def _filter(self, event: bytes, payload: dict[str, Any]) -> list[bytes]:
        kind = payload.get("type")
        index = payload.get("index")
        if kind in ("content_block_delta", "content_block_stop") and isinstance(index, int):
            if index in self._our_blocks:
                return []
            if index in self._held:
                self._held[index].append(payload)
                return []
            return [self._show(payload, event)]
        if kind == "content_block_start" and isinstance(index, int):
            start = self._block_start(payload)
            if start is OURS:
                self._our_blocks.add(index)
                return []
            if start is THEIRS:  # the client's call: this round is the last, nothing to hold
                self._theirs = True
                return [*self._release_held(), self._show(payload, event)]
            if start is HOLD:
                self._holding = True
                self._held[index] = [payload]
                return []
            return [self._show(payload, event)]
        if kind == "message_delta":
            if self._our_blocks and not self._theirs:
                self._delta_held = payload  # another round may follow
                return []
            return [*self._release_held(), self._show(payload, event)]
        if kind == "message_start":
            if self._rounds > 1:  # the client's message started in the first round
                return []
            self._seen.feed(payload)
            return [event]
        if kind == "message_stop":
            self._stop_held = event
            return []
        self._note_error(payload)
        return [event]  # ping, error, and events this proxy does not know

    def _block_start(self, payload: dict[str, Any]) -> str:
        """What `_filter` does with a content_block_start: OURS (dropped), THEIRS (the client's
        call, shown), HOLD (a thinking round's block, held), else SHOW."""
        block = payload.get("content_block") or {}
        if block.get("type") == "tool_use":
            return OURS if block.get("name") in self._ours else THEIRS
        if self._holding or (block.get("type") in ("thinking", "redacted_thinking") and not self._theirs):
            return HOLD
        return SHOW

    def _parts_at(self, payload: dict[str, Any]) -> bool:
        """Whether the client's view and the round's reply part at this event: it is shown under
        another index, or starts a block that is dropped or held. (Until one is, no event is
        dropped or held: each is fed to both alike, or to neither where an assembler ignores it.)"""
        index = payload.get("index")
        if not isinstance(index, int):
            return False  # passed on as it came (an assembler ignores a block event without one)
        if self._index.get(index, self._next_index) != index:
            return True
        return payload.get("type") == "content_block_start" and self._block_start(payload) in (OURS, HOLD)

    def _show(self, payload: dict[str, Any], event: bytes | None = None) -> bytes:
        """`payload` as the client sees it (its block renumbered), fed to what the client saw."""
        index = payload.get("index")
        if isinstance(index, int):
            shown = self._index.get(index)
            if shown is None:
                shown = self._index[index] = self._next_index
                self._next_index += 1
            if shown != index:
                payload, event = {**payload, "index": shown}, None
        self._seen.feed(payload)
        return event if event is not None else sse_event(payload)

    def _release_held(self) -> list[bytes]:
        """The held blocks, shown in order (this round is the client's after all)."""
        held, self._held, self._holding = self._held, {}, False
        return [self._show(payload) for payloads in held.values() for payload in payloads]
