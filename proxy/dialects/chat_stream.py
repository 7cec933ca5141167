"""Relaying a streamed chat completion (`chat.completion.chunk` SSE events) across read-back rounds.

Without proxy tools in a round, the upstream's bytes go to the client as they came (the fast
path), only the final `data: [DONE]` is held until the reply is stored. With them, each event is
looked at: deltas of the proxy's calls are taken out, the client's calls renumbered from 0, and
the finish event held while only our calls were seen (another round may follow).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

from ..errors import ProxyError, error_body
from ..messages import message_calls
from ..upstream.sse import ReplyAssembler, SSEParser
from .base import OneMessageRelay, ReplyRead, RoundEnd

DONE = b"data: [DONE]"


class ChatRelay(OneMessageRelay):
    def __init__(self) -> None:
        self._seen = ReplyAssembler()  # what the client saw, across rounds
        self._round = self._seen
        self._parser = SSEParser()
        self._filter: CallFilter | None = None
        self._done_held: bytes | None = None
        self._usage: dict[str, Any] | None = None

    def begin_round(self, ours: frozenset[str]) -> None:
        self._parser = SSEParser()
        self._filter = CallFilter(ours) if ours else None
        # A filtered round's reply and the client's view of it differ only from the first event the
        # filter edits or holds: until then (a first round's text, most of a reply) one assembler
        # serves both, and it is copied when such an event comes (`_part`).
        self._round = self._seen if self._filter is None or self._seen.fresh else ReplyAssembler()
        self._shared = self._filter is not None and self._round is self._seen

    def feed(self, chunk: bytes) -> bytes:
        # A model's stream is an event a read, most of them text deltas: one in the frame learned
        # goes out as it came, not split into lines first (`ReplyAssembler.feed_text`).
        if (
            (self._filter is None or self._shared) and chunk[:6] == b"data: " and chunk[-2:] == b"\n\n"
            and not self._parser.pending and self._seen.feed_text(chunk[6:-2])
        ):
            return chunk
        if self._filter is None:  # the fast path: bytes out as they came in (but [DONE], held)
            seen = self._seen
            for payload in self._parser.feed(chunk):
                if not seen.feed_text(payload):
                    seen.feed(payload)
            if seen.done and self._done_held is None and (cut := chunk.find(DONE)) >= 0:
                chunk, self._done_held = chunk[:cut], chunk[cut:]
            return chunk
        out = []  # the payloads the client gets
        unchanged = True  # every event of the chunk goes to the client as it came
        for payload in self._parser.feed(chunk):
            if self._shared:
                if self._seen.feed_text(payload):  # a text delta: the filter passes it as it came
                    out.append(payload)
                    continue
                if (plain := _untouched(payload)) is not None:  # the filter passes it as it came
                    self._seen.take(payload, plain)
                    out.append(payload)
                    continue
                self._round, self._shared = self._seen.copy(), False  # they part here
            parsed = self._round.feed(payload)
            if payload == b"[DONE]":
                unchanged = False
                continue  # held until we know no other round follows
            kept = self._filter.feed(payload, parsed)
            if kept is not payload:
                unchanged = False
            if kept is not None:
                if parsed is not None:  # what `kept` encodes (the filter edits it in place): not parsed again
                    self._seen.feed_chunk(parsed)
                else:
                    self._seen.feed(kept)
                out.append(kept)
        if unchanged and out and chunk[-2:] == b"\n\n":
            # Whole events, all the client's: relayed as the upstream framed them, nothing re-encoded
            # or joined (a chunk ending mid-event is framed anew, so events never run together).
            return chunk
        return b"".join(b"data: " + payload + b"\n\n" for payload in out)

    def end_round(self) -> RoundEnd:
        self._usage = self._round.usage or self._usage
        message = self._round.message()
        calls = list(message_calls(message))
        reply = ReplyRead([message], calls, self._round.usage, response_id=self._round.id, complete=self._round.complete)
        ours = self._filter.ours if self._filter is not None else frozenset()
        return RoundEnd(reply, [c for c in calls if c.name in ours], [c for c in calls if c.name not in ours])

    def release(self) -> bytes:
        out = b""
        if self._filter is not None and self._filter.finish_held is not None:
            # Only our calls were seen and no round follows: the client's reply ends without calls.
            finish = orjson.loads(self._filter.finish_held)
            for choice in finish.get("choices") or ():
                if choice.get("finish_reason") == "tool_calls":
                    choice["finish_reason"] = "stop"
            payload = orjson.dumps(finish)
            self._seen.feed(payload)
            out = b"data: " + payload + b"\n\n"
        if self._filter is not None and self._round.done:
            self._done_held = DONE + b"\n\n"
        return out

    def closing(self) -> bytes:
        return self._done_held or b""

    def error_event(self, exc: ProxyError) -> bytes:
        if self._seen.error is not None:
            return b""  # the upstream's own error event went to the client already
        return b"data: " + orjson.dumps(error_body(exc.message, exc.type, exc.code, exc.param)) + b"\n\n"

    @property
    def upstream_error(self) -> str | None:
        return self._seen.error


def _untouched(payload: bytes) -> dict[str, Any] | None:
    """The parsed chunk if `payload` is one `CallFilter.feed` passes as it came and that leaves a
    reply unfinished (no tool-call delta, no finish, not [DONE]); else None."""
    if payload == b"[DONE]":
        return None
    try:
        chunk = orjson.loads(payload)
    except ValueError:
        return None
    if not isinstance(chunk, dict):
        return None
    for choice in chunk.get("choices") or ():
        if choice.get("finish_reason") or (choice.get("delta") or {}).get("tool_calls"):
            return None
    return chunk


class CallFilter:
    """Watches a streamed reply's chunks and takes the proxy's calls out of what the client sees.

    `feed` returns the payload to forward (the original bytes when nothing of ours is in it), or
    None to forward nothing. Client calls keep their order, renumbered from 0 without ours.
    """

    def __init__(self, ours: frozenset[str]) -> None:
        self.ours = ours  # the names of the proxy's own tools
        self._our_indexes: set[int] = set()
        self._client_index: dict[int, int] = {}
        self.finish_held: bytes | None = None  # the finish chunk, held while only our calls were seen

    def feed(self, payload: bytes, chunk: dict[str, Any] | None) -> bytes | None:
        if chunk is None:
            return payload
        choices = chunk.get("choices") or []
        deltas = [c for c in choices if (c.get("delta") or {}).get("tool_calls")]
        finishing = any(c.get("finish_reason") for c in choices)
        if not deltas and not finishing:
            return payload
        changed = False
        for choice in deltas:
            kept = list(self._client_deltas(choice["delta"]["tool_calls"]))
            if kept != choice["delta"]["tool_calls"]:
                changed = True
                if kept:
                    choice["delta"]["tool_calls"] = kept
                else:
                    del choice["delta"]["tool_calls"]
        if finishing and self._our_indexes and not self._client_index:
            self.finish_held = payload if not changed else orjson.dumps(chunk)
            return None
        if changed:
            if not any(c.get("delta") or c.get("finish_reason") for c in choices):
                return None
            return orjson.dumps(chunk)
        return payload

    def _client_deltas(self, deltas: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for delta in deltas:
            index = delta.get("index", 0)
            if index not in self._our_indexes and index not in self._client_index:
                if (delta.get("function") or {}).get("name") in self.ours:
                    self._our_indexes.add(index)
                else:
                    self._client_index[index] = len(self._client_index)
            if index in self._our_indexes:
                continue
            renumbered = self._client_index[index]
            yield delta if renumbered == index else {**delta, "index": renumbered}
