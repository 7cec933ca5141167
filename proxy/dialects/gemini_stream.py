"""A Gemini reply: assembled from its parts (JSON or streamed), and a stream relayed across
read-back rounds (`data:` SSE events, each a whole GenerateContentResponse chunk).

Each streamed chunk carries a piece of the reply's content; the one with `finishReason` (and the
usage) ends it. The client sees one reply: its chunks as they came, but the final one held until
the reply is stored (a client must not take for done a reply the store never got).

Without proxy tools in a round, every chunk goes out as it came. With them, the proxy's
`functionCall` parts never reach the client (a chunk left with no part is not sent), and a round's
final chunk is held until it is known whether another round follows: if one does, only its
remaining parts go out, without its finishReason. A thought signature on one of our calls moves
to the client's first call of the round (Gemini 3 wants one on each step's first call).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson

from ..errors import ProxyError
from ..transcript import Call, Raw
from ..upstream import frames
from .base import OneMessageRelay, RoundEnd
from .messages_stream import EventSplitter, parsed_event, payload_of

log = logging.getLogger("proxy.gemini")

SIGNATURE = "thoughtSignature"
# The proxy's errors in Google's status names, by HTTP status; the upstream's own pass unmodified.
STATUS_NAMES = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
    409: "ABORTED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL",
    501: "NOT_IMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED", 507: "RESOURCE_EXHAUSTED",
}


def error_body(exc: ProxyError) -> dict[str, Any]:
    """`exc` in Google's shape: `{"error": {"code", "message", "status"}}`."""
    status = STATUS_NAMES.get(exc.status, "INVALID_ARGUMENT" if exc.status < 500 else "INTERNAL")
    return {"error": {"code": exc.status, "message": exc.message, "status": status}}


def call_id(function_call: dict[str, Any]) -> str:
    """The id the engine knows a call or a response by: the client's (Gemini CLI gives each one),
    else one made of its name (the API pairs by order, and ids it did not send stay unsent)."""
    given = function_call.get("id")
    return given if isinstance(given, str) and given else "#" + str(function_call.get("name") or "")


def calls_of(parts: Any) -> tuple[Call, ...]:
    """The functionCall parts of a model content, as the engine sees them."""
    if type(parts) is not list:
        return ()
    calls = []
    for part in parts:
        if type(part) is dict:
            call = part.get("functionCall")
            if type(call) is dict:
                calls.append(Call(call_id(call), str(call.get("name") or ""), orjson.dumps(call.get("args") or {}).decode()))
    return tuple(calls)


def first_candidate(payload: dict[str, Any]) -> dict[str, Any] | None:
    candidates = payload.get("candidates")
    if type(candidates) is list and candidates and type(candidates[0]) is dict:
        return candidates[0]
    return None


def parts_of(candidate: dict[str, Any] | None) -> list[Any]:
    content = candidate.get("content") if candidate is not None else None
    parts = content.get("parts") if type(content) is dict else None
    return parts if type(parts) is list else []


_PLAIN_TEXT_KEYS = frozenset(("text", "thought", SIGNATURE))


def _is_plain_text(part: dict[str, Any]) -> bool:
    return "text" in part and part.keys() <= _PLAIN_TEXT_KEYS


class ReplyAssembler:
    """Rebuilds a reply's content from its chunks: text pieces joined into their part (a thought's
    into its thought), function calls whole, the signature where it came; finish reason, usage."""

    def __init__(self) -> None:
        self.id: str | None = None
        self.parts: list[dict[str, Any]] = []
        self._pieces: list[list[str] | None] = []  # per part: the text pieces still to join
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.done = False  # a chunk with finishReason came

    def feed(self, payload: dict[str, Any]) -> None:
        if isinstance(payload.get("responseId"), str) and self.id is None:
            self.id = payload["responseId"]
        if isinstance(payload.get("usageMetadata"), dict):
            self.usage = payload["usageMetadata"]
        candidate = first_candidate(payload)
        for part in parts_of(candidate):
            if type(part) is dict:
                self._add(part)
        if candidate is not None and candidate.get("finishReason"):
            self.finish_reason = str(candidate["finishReason"])
            self.done = True

    def feed_text(self, text: str, usage: dict[str, Any] | None, response_id: str | None) -> None:
        """What `feed` does with a chunk of one plain text part and no finish (its usage and its
        id, if it has them)."""
        if response_id is not None and self.id is None:
            self.id = response_id
        if usage is not None:
            self.usage = usage
        self._add({"text": text})

    def _add(self, part: dict[str, Any]) -> None:
        last = self.parts[-1] if self.parts else None
        if (
            last is not None and _is_plain_text(part) and _is_plain_text(last) and SIGNATURE not in last
            and bool(last.get("thought")) == bool(part.get("thought"))
        ):
            pieces = self._pieces[-1]
            if pieces is None:
                pieces = self._pieces[-1] = [str(last.get("text") or "")]
            pieces.append(str(part.get("text") or ""))
            if SIGNATURE in part:
                last[SIGNATURE] = part[SIGNATURE]
            return
        self.parts.append(dict(part))
        self._pieces.append(None)

    @property
    def complete(self) -> bool:
        return self.finish_reason is not None

    @property
    def empty(self) -> bool:
        return not self.parts

    @property
    def fresh(self) -> bool:
        """Nothing fed yet."""
        return self.id is None and self.usage is None and self.finish_reason is None and not self.parts

    def copy(self) -> ReplyAssembler:
        """An assembler in this one's state, to be fed apart from it."""
        other = ReplyAssembler()
        other.id, other.finish_reason, other.usage, other.done = self.id, self.finish_reason, self.usage, self.done
        other.parts = [dict(part) for part in self.parts]
        other._pieces = [None if pieces is None else list(pieces) for pieces in self._pieces]
        return other

    def content(self) -> list[dict[str, Any]]:
        for part, pieces in zip(self.parts, self._pieces, strict=True):
            if pieces is not None:
                part["text"] = "".join(pieces)
        self._pieces = [None] * len(self.parts)
        return self.parts

    def message(self) -> Raw:
        return {"role": "model", "parts": list(self.content())}


def without_our_calls(parts: list[Any], ours: frozenset[str], keep_ids: frozenset[str] | None = None) -> tuple[list[Any], str | None]:
    """`parts` without the proxy's functionCall parts (named in `ours`; or, with `keep_ids`, every
    call not kept): a thought signature one of them carried moves to the next call kept, and is
    returned when no call after it takes it."""
    out: list[Any] = []
    carried: str | None = None
    for part in parts:
        call = part.get("functionCall") if type(part) is dict else None
        if type(call) is dict:
            if (call_id(call) not in keep_ids) if keep_ids is not None else (call.get("name") in ours):
                if SIGNATURE in part and carried is None:
                    carried = part[SIGNATURE]
                continue
            if carried is not None:
                if SIGNATURE not in part:
                    part = {**part, SIGNATURE: carried}
                carried = None
        out.append(part)
    return out, carried


def with_parts(payload: dict[str, Any], parts: list[Any], finish: bool = True) -> dict[str, Any]:
    """A chunk `payload` with its first candidate's parts replaced (and its finishReason dropped
    unless `finish`)."""
    candidate = first_candidate(payload) or {}
    content = candidate.get("content") if type(candidate.get("content")) is dict else {"role": "model"}
    candidate = {**candidate, "content": {**content, "parts": parts}}
    if not finish:
        candidate.pop("finishReason", None)
    return {**payload, "candidates": [candidate, *(payload.get("candidates") or [])[1:]]}


@dataclass(frozen=True, slots=True)
class TextFrame:
    """A text chunk's frame (frames.py), what its holes are (its text, then perhaps its
    `usageMetadata`) and the chunk's `responseId`."""

    frame: frames.Frame
    kinds: tuple[type, ...]
    response_id: str | None


def sse_event(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\r\n\r\n"


class GeminiRelay(OneMessageRelay):
    def __init__(self) -> None:
        self._seen = ReplyAssembler()  # what the client saw
        self._round = self._seen  # this round (ours included)
        self._shared = False  # a filtered round whose reply is, so far, what the client saw: one assembler
        self._split = EventSplitter()
        self._ours: frozenset[str] = frozenset()
        self._final: dict[str, Any] | None = None  # a filtered round's final chunk, held
        self._closing = b""  # the reply's final chunk, sent once it is stored
        self._pending = b""  # the previous round's last parts, sent with this round's first bytes
        self._carried: str | None = None  # a signature taken off our call, for the client's next call
        self._usage: dict[str, Any] | None = None
        self._upstream_error: str | None = None
        self._frame: TextFrame | None = None  # a text chunk's frame (frames.py): most of a stream's chunks
        self._frames_left = frames.MAX_FRAMES

    # -- StreamRelay ------------------------------------------------------------------------

    def begin_round(self, ours: frozenset[str]) -> None:
        self._split = EventSplitter()
        if self._final is not None:  # another round follows: the last one's parts go on, unfinished
            parts = parts_of(first_candidate(self._final))
            if parts:
                self._pending += self._show(with_parts(self._final, parts, finish=False))
            self._final = None
        self._ours = ours
        self._carried = None  # a new step: the model signs its own first call
        # A filtered round's reply and the client's view of it differ only from the first chunk
        # the filter edits or holds: until then (a first round's text, most of a reply) one
        # assembler serves both, and it is copied when such a chunk comes.
        self._round = self._seen if not ours or self._seen.fresh else ReplyAssembler()
        self._shared = bool(ours) and self._round is self._seen

    def feed(self, chunk: bytes) -> bytes:
        if self._frame is not None and not self._pending and not self._split.pending:
            # CRLF line ends (Gemini's) read as LF ones, as the splitter reads them and they go out
            whole = chunk.replace(b"\r", b"") if chunk.find(b"\r") >= 0 else chunk
            if self._framed(whole):
                return whole  # one text chunk that goes out as it came
        out: list[bytes] = [self._pending] if self._pending else []
        self._pending = b""
        for event in self._split.events(chunk):
            # Several chunks a read (a fast upstream, a busy proxy): each text chunk in the frame
            # (learned, perhaps, from this read's first) is taken by it too, not parsed.
            if self._frame is not None and self._framed(event):
                out.append(event)
                continue
            payload = payload_of(event)
            if self._frames_left and payload is not None:
                self._learn(event, payload)
            if payload is None:
                out.append(event)
                continue
            self._note_error(payload)
            candidate = first_candidate(payload)
            finishing = candidate is not None and bool(candidate.get("finishReason"))
            if not self._ours:  # the fast path: as it came, the final chunk held
                self._seen.feed(payload)
                if finishing:
                    self._closing = event
                else:
                    out.append(event)
                continue
            if candidate is None:
                if self._shared:  # they part here: the client's view is not fed it
                    self._round, self._shared = self._seen.copy(), False
                self._round.feed(payload)
                out.append(event)  # an error, or a chunk of another kind: as it came
                continue
            parts = parts_of(candidate)
            kept, carried = without_our_calls(parts, self._ours)
            if self._carried is not None:
                kept, self._carried = self._give_signature(kept, self._carried)
            self._carried = self._carried or carried
            shown = payload if kept == parts else with_parts(payload, kept)
            if self._shared:
                if not finishing and shown is payload:  # as it came, to both
                    self._seen.feed(payload)
                    out.append(event)
                    continue
                self._round, self._shared = self._seen.copy(), False  # they part here
            self._round.feed(payload)
            if finishing:
                self._final = shown
            elif shown is payload:
                self._seen.feed(payload)
                out.append(event)
            elif kept:
                out.append(self._show(shown))
        return b"".join(out)

    def end_round(self) -> RoundEnd:
        message = self._round.message()
        return self._round_end(message, list(calls_of(message["parts"])))

    def release(self) -> bytes:
        """The last round is over: its final chunk joins what the client saw (it goes out with
        `closing`); an earlier round's parts still held go now."""
        if self._final is not None:
            final, self._final = self._final, None
            if not parts_of(first_candidate(final)):  # only our calls were in it: the reply ends on none
                final = with_parts(final, [{"text": ""}])
            self._closing = self._show(final)
        out, self._pending = self._pending, b""
        return out

    def closing(self) -> bytes:
        return self._closing

    def error_event(self, exc: ProxyError) -> bytes:
        if self._upstream_error is not None:  # the upstream's own error went out already, unmodified
            return b""
        return sse_event(error_body(exc))

    @property
    def upstream_error(self) -> str | None:
        return self._upstream_error

    # -- text chunks read by their frame ------------------------------------------------------

    def _framed(self, chunk: bytes) -> bool:
        """`chunk` (LF-ended whole events, nothing of one pending before it) taken if it is one
        text chunk in the frame learned: what `feed` would do with it (its text and usage to the
        assemblers, the chunk out), without parsing it."""
        assert self._frame is not None
        frame = self._frame
        values = frames.read_values(frame.frame, chunk, frame.kinds)
        if values is None:
            return False
        usage = values[1] if len(values) > 1 else None
        for assembler in (self._seen,) if not self._ours or self._shared else (self._round, self._seen):
            assembler.feed_text(values[0], usage, frame.response_id)
        return True

    def _learn(self, event: bytes, payload: dict[str, Any]) -> None:
        """`event`'s frame (LF-ended, parsed: `payload`) if it is a text chunk that does nothing
        else (one candidate, one plain text part, no finish, no error); its `usageMetadata` after
        the text (cumulative: new in every chunk) is a hole of the frame, read whole."""
        candidates, usage = payload.get("candidates"), payload.get("usageMetadata")
        candidate = first_candidate(payload)
        if "error" in payload or type(candidates) is not list or len(candidates) != 1 or candidate is None:
            return
        content = candidate.get("content")
        parts = parts_of(candidate)
        if candidate.get("finishReason") or type(content) is not dict or len(parts) != 1 or type(parts[0]) is not dict:
            return
        text = parts[0].get("text")
        if parts[0].keys() != {"text"} or type(text) is not str or not text:
            return
        expected = {**payload, "candidates": [{**candidate, "content": {**content, "parts": [{"text": frames.PROBE}]}}]}
        values: tuple[Any, ...] = (text,)
        if type(usage) is dict:
            expected["usageMetadata"], values = frames.PROBE, (text, usage)
        found = frames.learn(event, values, parsed_event, expected)
        if found is not None and (self._frame is None or found != self._frame.frame):
            response_id = payload.get("responseId") if isinstance(payload.get("responseId"), str) else None
            self._frame = TextFrame(found, (str, dict) if len(values) > 1 else (str,), response_id)
            self._frames_left -= 1

    # -- helpers ------------------------------------------------------------------------------

    def _note_error(self, payload: dict[str, Any]) -> None:
        error = payload.get("error")
        if isinstance(error, dict):
            self._upstream_error = str(error.get("message") or "upstream error")

    @staticmethod
    def _give_signature(parts: list[Any], signature: str) -> tuple[list[Any], str | None]:
        """The first call of `parts` signed with `signature` (if unsigned); the signature back if none took it."""
        for i, part in enumerate(parts):
            if type(part) is dict and type(part.get("functionCall")) is dict:
                if SIGNATURE not in part:
                    parts = [*parts[:i], {**part, SIGNATURE: signature}, *parts[i + 1 :]]
                return parts, None
        return parts, signature

    def _show(self, payload: dict[str, Any]) -> bytes:
        """`payload` as the client sees it, fed to what the client saw."""
        self._seen.feed(payload)
        return sse_event(payload)
