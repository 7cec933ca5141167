"""The Anthropic Messages side of the fake upstream: `POST /v1/messages` (also `?beta=true`)
and `POST /v1/messages/count_tokens`, mounted by `tests.fakes.fake_upstream.FakeUpstream`.

Strict: a body the real API refuses gets its 400 (`tests.fakes.anthropic_rules`), a request without
`x-api-key` (or Bearer) a 401, one without `anthropic-version` a 400.

Scripted by the very Replies the chat fake serves, from the same queue and responder:
- `Reply.text` / `Reply.tool_calls` become a `message` with `text` and `tool_use` blocks (the
  Reply's JSON arguments become `tool_use.input`; the id is `tool_use_id(call)`), `stop_reason`
  `end_turn` or `tool_use`;
- `reasoning=` becomes a `thinking` block first, when the request turns thinking on, signed with a
  MAC of its text that the fake checks when the block comes back (text omitted under
  `display: "omitted"`, as the real API does). A reasoning holding `REDACTED_THINKING_TRIGGER`
  becomes a `redacted_thinking` block instead;
- `Reply.error` is answered as is when Anthropic-shaped, else translated (`overloaded()` is 529);
- `Reply.hang`, `pause_after_chunks`, and `error_mid_stream` / `endless_stream` below misbehave
  as the real API can. Streams count SSE events (`ping` included) for those.
Usage reports prompt-cache reads and writes from `tests.fakes.anthropic_cache`.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import dataclasses
import hashlib
import hmac
import json
import secrets
import threading
from typing import TYPE_CHECKING, Any

from aiohttp import web

from tests.fakes.anthropic_cache import CacheUsage, PromptCache, estimate_tokens, prompt_tokens
from tests.fakes.anthropic_rules import (
    AnthropicRefusal,
    betas_of,
    check_messages_request,
    content_blocks,
    thinking_enabled,
)

if TYPE_CHECKING:  # fake_upstream imports this module: no runtime import back
    from tests.fakes.fake_upstream import FakeUpstream, Recorded, Reply, ToolCall

__all__ = [
    "REDACTED_THINKING_TRIGGER",
    "AnthropicMessages",
    "ThinkingSigner",
    "anthropic_error",
    "endless_stream",
    "error_mid_stream",
    "overloaded",
    "tool_use_id",
]

# The real API's test string: a prompt holding it gets redacted thinking. Here a Reply's
# reasoning holding it does too (or the last user message, as the real API does).
REDACTED_THINKING_TRIGGER = (
    "ANTHROPIC_MAGIC_STRING_TRIGGER_REDACTED_THINKING_46C9A13E193C177646C7398A98432ECCCE4C1253"
)
# Fixed, so recorded fixtures (tests/samples/claude-*.json) replay against any run of the fake.
SIGNING_KEY = b"context-proxy tests: fake Anthropic thinking signatures"
NONCE_BYTES = 12
MAX_ISSUED = 50_000

ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
    500: "api_error", 529: "overloaded_error",
}


def tool_use_id(call: ToolCall) -> str:
    """The `tool_use.id` the fake gives a scripted tool call."""
    return "toolu_" + call.id.removeprefix("call_")


def anthropic_error(status: int, error_type: str, message: str) -> Reply:
    from tests.fakes.fake_upstream import Reply

    return Reply.error(status, {"type": "error", "error": {"type": error_type, "message": message}})


def overloaded() -> Reply:
    """The real API's 529."""
    return anthropic_error(529, "overloaded_error", "Overloaded")


def error_mid_stream(reply: Reply, after_events: int, error: dict[str, Any] | None = None) -> Reply:
    """`reply`, streamed: after `after_events` SSE events an `error` event ends the stream
    (by default `overloaded_error`, as the real API sends mid-stream)."""
    body = error or {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    return dataclasses.replace(reply, error_after_chunks=after_events, body=body)


def endless_stream(reply: Reply, after_events: int = 1, ping_every_s: float = 0.05) -> Reply:
    """`reply`, streamed: after `after_events` events it sends only `ping`s, forever (until
    `reply.release()` or the client leaves) -- a stream that never ends and never goes idle."""
    return dataclasses.replace(reply, pause_after_chunks=after_events, keepalive_every_s=ping_every_s)


class ThinkingSigner:
    """Signs the thinking the fake issues and remembers which tool_use it preceded; thread-safe.

    A signature is base64(nonce + HMAC(key, nonce + text)): any change to the text, or to the
    signature, fails the check."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._issued: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()

    def reset(self) -> None:
        with self._lock:
            self._issued.clear()

    @staticmethod
    def _mac(kind: bytes, nonce: bytes, text: str) -> bytes:
        return hmac.new(SIGNING_KEY, kind + b"\0" + nonce + text.encode(), hashlib.sha256).digest()

    def sign(self, thinking: str) -> str:
        nonce = secrets.token_bytes(NONCE_BYTES)
        return base64.b64encode(nonce + self._mac(b"thinking", nonce, thinking)).decode()

    def redact(self) -> str:
        nonce = secrets.token_bytes(NONCE_BYTES)
        return base64.b64encode(nonce + self._mac(b"redacted", nonce, "")).decode()

    def _valid(self, kind: bytes, token: Any, text: Any) -> bool:
        if not isinstance(token, str) or not isinstance(text, str):
            return False
        try:
            raw = base64.b64decode(token, validate=True)
        except ValueError:
            return False
        nonce, mac = raw[:NONCE_BYTES], raw[NONCE_BYTES:]
        return hmac.compare_digest(mac, self._mac(kind, nonce, text))

    def signature_valid(self, thinking: str, signature: str) -> bool:
        return self._valid(b"thinking", signature, thinking)

    def redacted_valid(self, data: str) -> bool:
        return self._valid(b"redacted", data, "")

    def remember(self, block: dict[str, Any], tool_use_ids: list[str]) -> None:
        with self._lock:
            for call_id in tool_use_ids:
                self._issued[call_id] = block
            while len(self._issued) > MAX_ISSUED:
                self._issued.popitem(last=False)

    def issued_before(self, tool_use_id: str) -> dict[str, Any] | None:
        with self._lock:
            return self._issued.get(tool_use_id)


# --------------------------------------------------------------------------------------------
# Rendering a Reply
# --------------------------------------------------------------------------------------------


def _wants_redaction(body: dict[str, Any], reasoning: str) -> bool:
    if REDACTED_THINKING_TRIGGER in reasoning:
        return True
    users = [m for m in body["messages"] if m["role"] == "user"]
    return bool(users) and any(
        REDACTED_THINKING_TRIGGER in (b.get("text") or "") for b in content_blocks(users[-1]["content"])
    )


def reply_blocks(body: dict[str, Any], reply: Reply, signer: ThinkingSigner) -> list[dict[str, Any]]:
    """The content blocks of the message answering `body`: thinking, text, tool_use."""
    blocks: list[dict[str, Any]] = []
    if reply.reasoning is not None and thinking_enabled(body):
        if _wants_redaction(body, reply.reasoning):
            blocks.append({"type": "redacted_thinking", "data": signer.redact()})
        else:
            shown = "" if body["thinking"].get("display") == "omitted" else reply.reasoning
            blocks.append({"type": "thinking", "thinking": shown, "signature": signer.sign(shown)})
    if reply.content:
        blocks.append({"type": "text", "text": reply.content})
    for call in reply.calls:
        arguments = json.loads(call.arguments)
        if not isinstance(arguments, dict):
            raise ValueError(f"a tool_use input must be a JSON object, got {call.arguments!r}")
        blocks.append({"type": "tool_use", "id": tool_use_id(call), "name": call.name, "input": arguments})
    if blocks and blocks[0]["type"] in ("thinking", "redacted_thinking"):
        signer.remember(blocks[0], [b["id"] for b in blocks if b["type"] == "tool_use"])
    return blocks


def _output_tokens(reply: Reply, blocks: list[dict[str, Any]]) -> int:
    thought = bool(blocks) and blocks[0]["type"] in ("thinking", "redacted_thinking")
    reasoning = (reply.reasoning or "") if thought else ""  # billed even when not shown
    text = reasoning + "".join(
        b.get("text", "") + (json.dumps(b["input"]) if b["type"] == "tool_use" else "") for b in blocks
    )
    return estimate_tokens(text)


def message_body(
    body: dict[str, Any], blocks: list[dict[str, Any]], usage: dict[str, Any], message_id: str
) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": blocks,
        "stop_reason": "tool_use" if any(b["type"] == "tool_use" for b in blocks) else "end_turn",
        "stop_sequence": None,
        "stop_details": None,
        "usage": usage,
    }


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


PING = b'event: ping\ndata: {"type": "ping"}\n\n'  # spelled as the real API spells it


def _split(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), max(1, size))]


def message_events(message: dict[str, Any], chunk_size: int) -> list[bytes]:
    """The SSE events of `message`, streamed as the real API streams it."""
    head = {**message, "content": [], "stop_reason": None,
            "usage": {**message["usage"], "output_tokens": 1}}
    events = [_sse("message_start", {"type": "message_start", "message": head})]
    for index, block in enumerate(message["content"]):
        events.append(_sse("content_block_start", {
            "type": "content_block_start", "index": index, "content_block": _block_start(block),
        }))
        if index == 0:
            events.append(PING)
        for delta in _block_deltas(block, chunk_size):
            events.append(_sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
        events.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
    if not message["content"]:
        events.append(PING)
    events.append(_sse("message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None, "stop_details": None},
        "usage": message["usage"],
    }))
    events.append(_sse("message_stop", {"type": "message_stop"}))
    return events


def _block_start(block: dict[str, Any]) -> dict[str, Any]:
    if block["type"] == "text":
        return {"type": "text", "text": ""}
    if block["type"] == "thinking":
        return {"type": "thinking", "thinking": "", "signature": ""}
    if block["type"] == "tool_use":
        return {**block, "input": {}}
    return block  # redacted_thinking arrives whole


def _block_deltas(block: dict[str, Any], chunk_size: int) -> list[dict[str, Any]]:
    if block["type"] == "text":
        return [{"type": "text_delta", "text": piece} for piece in _split(block["text"], chunk_size)]
    if block["type"] == "thinking":
        deltas = [{"type": "thinking_delta", "thinking": p} for p in _split(block["thinking"], chunk_size)]
        return deltas + [{"type": "signature_delta", "signature": block["signature"]}]
    if block["type"] == "tool_use":
        pieces = [""] + _split(json.dumps(block["input"]), chunk_size)  # the real API opens with ""
        return [{"type": "input_json_delta", "partial_json": p} for p in pieces]
    return []


def _error_body(status: int, body: dict[str, Any] | None) -> dict[str, Any]:
    """A scripted error in Anthropic's shape: as given when it already is, else translated from
    the OpenAI shape the chat tests script, so one Reply.error serves every format."""
    body = body or {}
    if body.get("type") == "error":
        return body
    error = body.get("error") if isinstance(body.get("error"), dict) else {}
    message = error.get("message") or f"upstream error {status}"
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


# --------------------------------------------------------------------------------------------
# The endpoints
# --------------------------------------------------------------------------------------------


def _api_key(request: web.Request) -> str | None:
    key = request.headers.get("x-api-key", "").strip()
    if key:
        return key
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _respond(record: Recorded, payload: dict[str, Any], status: int) -> web.Response:
    record.status_sent = status
    return web.json_response(payload, status=status, headers={"request-id": _request_id()})


def _request_id() -> str:
    return f"req_{secrets.token_hex(12)}"


class AnthropicMessages:
    """The Messages endpoints of one FakeUpstream, sharing its queue, responder, request log and
    parking (its underscore helpers are shared on purpose: one script serves every format)."""

    def __init__(self, host: FakeUpstream) -> None:
        self.host = host
        self.signer = ThinkingSigner()
        self.cache = PromptCache()
        self._bodies: list[dict[str, Any]] = []
        self._usages: list[dict[str, Any]] = []
        self._count_bodies: list[dict[str, Any]] = []

    @property
    def base_url(self) -> str:
        """The root an Anthropic client takes (`ANTHROPIC_BASE_URL`): no `/v1`."""
        return f"http://127.0.0.1:{self.host.port}"

    def requests(self) -> list[dict[str, Any]]:
        """Bodies of the `/v1/messages` requests that passed validation, in order."""
        with self.host._lock:
            return list(self._bodies)

    def usages(self) -> list[dict[str, Any]]:
        """The usage of each message the fake answered, in order (cache reads and writes)."""
        with self.host._lock:
            return list(self._usages)

    def count_tokens_requests(self) -> list[dict[str, Any]]:
        with self.host._lock:
            return list(self._count_bodies)

    def reset(self) -> None:
        with self.host._lock:
            self._bodies.clear()
            self._usages.clear()
            self._count_bodies.clear()
        self.signer.reset()
        self.cache.reset()

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/messages", self.handle_create),
            web.post("/v1/messages/count_tokens", self.handle_count_tokens),
        ]

    async def _admit(self, request: web.Request, count_tokens: bool) -> tuple[Recorded, Any]:
        """Record the request; return it with its body, or raise the refusal."""
        record = await self.host._record(request)
        if _api_key(request) is None:
            raise _Answered(record, AnthropicRefusal(
                "x-api-key header is required", 401, "authentication_error"))
        if not request.headers.get("anthropic-version"):
            raise _Answered(record, AnthropicRefusal("anthropic-version: header is required"))
        if not isinstance(record.body, dict):
            raise _Answered(record, AnthropicRefusal(
                "There was an error parsing the body of your request: it is not a JSON object."))
        betas = betas_of(request.headers.getall("anthropic-beta", []))
        refusal = check_messages_request(record.body, betas, self.signer, count_tokens=count_tokens)
        if refusal is not None:
            raise _Answered(record, refusal)
        return record, record.body

    async def handle_count_tokens(self, request: web.Request) -> web.StreamResponse:
        try:
            record, body = await self._admit(request, count_tokens=True)
        except _Answered as answered:
            return answered.response()
        with self.host._lock:
            self._count_bodies.append(body)
        return _respond(record, {"input_tokens": prompt_tokens(body)}, 200)

    async def handle_create(self, request: web.Request) -> web.StreamResponse:
        try:
            record, body = await self._admit(request, count_tokens=False)
        except _Answered as answered:
            return answered.response()
        reply = self.host._take_reply(body, self._bodies)
        if reply.kind == "error":
            return _respond(record, _error_body(reply.status, reply.body), reply.status)
        if reply.kind == "hang":
            await self.host._park(reply, reply.gate.wait())
            raise asyncio.CancelledError()  # drop the connection without an answer
        cache: CacheUsage = self.cache.use(body, _api_key(request) or "")
        blocks = reply_blocks(body, reply, self.signer)
        usage = cache.as_usage(_output_tokens(reply, blocks))
        with self.host._lock:
            self._usages.append(usage)
        message = message_body(body, blocks, usage, f"msg_{secrets.token_hex(12)}")
        if body.get("stream"):
            return await self._stream(request, record, message, reply)
        if reply.pause_after_chunks is not None:
            await self.host._park(reply, reply.gate.wait())
        return _respond(record, message, 200)

    async def _stream(
        self, request: web.Request, record: Recorded, message: dict[str, Any], reply: Reply
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            "request-id": _request_id(),
        })
        await response.prepare(request)
        record.status_sent = 200
        events = message_events(message, reply.chunk_size)
        try:
            for sent in range(len(events) + 1):
                if reply.pause_after_chunks == sent:
                    await self.host._park(reply, self._hold(response, reply))
                if reply.error_after_chunks == sent:
                    await response.write(_sse("error", _error_body(529, reply.body)))
                    break
                if sent < len(events):
                    await response.write(events[sent])  # written (flushed) one by one
            await response.write_eof()
        except asyncio.CancelledError:
            self.host._note_client_gone(reply)
            raise
        except ConnectionError:
            self.host._note_client_gone(reply)
        return response

    @staticmethod
    async def _hold(response: web.StreamResponse, reply: Reply) -> None:
        """Wait for `reply.release()`, sending a ping every `keepalive_every_s` if set."""
        if reply.keepalive_every_s is None:
            await reply.gate.wait()
            return
        released = asyncio.ensure_future(reply.gate.wait())
        try:
            while not released.done():
                done, _ = await asyncio.wait({released}, timeout=reply.keepalive_every_s)
                if not done:
                    await response.write(PING)
        finally:
            released.cancel()


class _Answered(Exception):
    """A request answered before it reached the script: its refusal."""

    def __init__(self, record: Recorded, refusal: AnthropicRefusal) -> None:
        super().__init__(refusal.message)
        self.record = record
        self.refusal = refusal

    def response(self) -> web.Response:
        return _respond(self.record, self.refusal.error_body(), self.refusal.status)
