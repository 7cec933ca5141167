"""Fake LLM providers in their own wire formats, on loopback, for litellm's real provider code.

- `FakeAnthropic`, the Anthropic Messages API (`POST /v1/messages`): strict about what the real
  API refuses (missing key or version header, unknown fields, roles, unanswered tool_use blocks,
  tool_result without its tool_use, empty text); non-streaming, and SSE streaming in Anthropic's
  event format (message_start, content_block_start/delta/stop with text_delta and
  input_json_delta, ping, message_delta, message_stop); errors in Anthropic's error shape, and
  mid-stream `error` events.
- `FakeGemini`, Google AI Studio's `models/{model}:generateContent` / `:streamGenerateContent`.
- `FakeOllama`, Ollama's `/api/chat` (NDJSON streaming).

Scripted like tests/fakes/fake_upstream.py: `enqueue` ProviderReply objects or rely on the default
echo ("reply to: <last user text>"), read back `requests`. OpenAI-compatible providers (openai/,
hosted_vllm/, ...) are tested against tests/fake_upstream.FakeUpstream itself.
"""

from __future__ import annotations

import asyncio
import collections
import json
import secrets
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web

from tests.support.harness import serve_on_loopback

ANTHROPIC_PARAMS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "metadata",
        "stop_sequences",
        "stream",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "thinking",
        "service_tier",
        "container",
        "mcp_servers",
        "context_management",
    }
)
BLOCK_TYPES = frozenset({"text", "image", "document", "tool_use", "tool_result", "thinking", "redacted_thinking"})
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


class Refusal(Exception):
    def __init__(self, status: int, message: str, type_: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message = status, message
        self.type = type_ or ERROR_TYPES.get(status, "api_error")

    def body(self) -> dict[str, Any]:
        return anthropic_error(self.type, self.message)


def anthropic_error(type_: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": type_, "message": message}}


# -- request validation (what the real API refuses) ----------------------------------------------


def check_messages_request(headers: dict[str, str], body: Any, keys: set[str] | None) -> None:
    key = headers.get("x-api-key")
    if not key:
        raise Refusal(401, "x-api-key header is required")
    if keys is not None and key not in keys:
        raise Refusal(401, "invalid x-api-key")
    if not headers.get("anthropic-version"):
        raise Refusal(400, "anthropic-version: header is required")
    if not isinstance(body, dict):
        raise Refusal(400, "body: Input should be a valid dictionary")
    for name in body:
        if name not in ANTHROPIC_PARAMS:
            raise Refusal(400, f"{name}: Extra inputs are not permitted")
    for name in ("model", "messages", "max_tokens"):
        if name not in body:
            raise Refusal(400, f"{name}: Field required")
    if not isinstance(body["model"], str) or not body["model"]:
        raise Refusal(400, "model: Input should be a valid string")
    if not isinstance(body["max_tokens"], int) or body["max_tokens"] < 1:
        raise Refusal(400, "max_tokens: Input should be greater than or equal to 1")
    _check_system(body.get("system"))
    tool_names = _check_tools(body.get("tools"))
    _check_tool_choice(body.get("tool_choice"), tool_names)
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise Refusal(400, "messages: at least one message is required")
    if messages[0].get("role") != "user":
        raise Refusal(400, 'messages: first message must use the "user" role')
    open_calls: set[str] = set()
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise Refusal(400, f"messages.{i}.role: Input should be 'user' or 'assistant'")
        extra = set(message) - {"role", "content"}
        if extra:
            raise Refusal(400, f"messages.{i}.{min(extra)}: Extra inputs are not permitted")
        blocks = _blocks(i, message.get("content"))
        results = {b["tool_use_id"] for b in blocks if b["type"] == "tool_result"}
        if message["role"] == "user":
            stray = results - open_calls
            if stray:
                raise Refusal(
                    400,
                    f"messages.{i}.content: unexpected `tool_use_id` found in `tool_result` blocks: {min(stray)}. "
                    "Each `tool_result` block must have a corresponding `tool_use` block in the previous message.",
                )
            missing = open_calls - results
            if missing:
                raise Refusal(
                    400,
                    f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                    f"{min(missing)}. Each `tool_use` block must have a corresponding `tool_result` block "
                    "in the next message.",
                )
            open_calls = set()
        else:
            if results:
                raise Refusal(400, f"messages.{i}.content: tool_result blocks are only allowed in user messages")
            if open_calls:
                raise Refusal(
                    400, f"messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after"
                )
            open_calls = {b["id"] for b in blocks if b["type"] == "tool_use"}


def _blocks(i: int, content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        if not content:
            raise Refusal(400, f"messages.{i}: all messages must have non-empty content")
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise Refusal(400, f"messages.{i}.content: Input should be a valid list")
    if not content:
        raise Refusal(400, f"messages.{i}: all messages must have non-empty content")
    for j, block in enumerate(content):
        where = f"messages.{i}.content.{j}"
        if not isinstance(block, dict) or block.get("type") not in BLOCK_TYPES:
            raise Refusal(
                400,
                f"{where}: Input tag '{(block or {}).get('type')}' found using 'type' does not match the expected tags",
            )
        kind = block["type"]
        if kind == "text":
            if not isinstance(block.get("text"), str) or not block["text"]:
                raise Refusal(400, f"{where}.text: text content blocks must be non-empty")
        elif kind == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise Refusal(400, f"{where}: tool_use blocks need an id and a name")
            if not isinstance(block.get("input"), dict):
                raise Refusal(400, f"{where}.input: Input should be a valid dictionary")
        elif kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str):
                raise Refusal(400, f"{where}.tool_use_id: Field required")
            inner = block.get("content")
            if inner is not None and not isinstance(inner, (str, list)):
                raise Refusal(400, f"{where}.content: Input should be a valid string or list")
    return content


def _check_system(system: Any) -> None:
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list):
        raise Refusal(400, "system: Input should be a valid string or list")
    for j, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text" or not block.get("text"):
            raise Refusal(400, f"system.{j}: system blocks must be non-empty text blocks")


def _check_tools(tools: Any) -> set[str]:
    if tools is None:
        return set()
    if not isinstance(tools, list):
        raise Refusal(400, "tools: Input should be a valid list")
    names = set()
    for j, tool in enumerate(tools):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise Refusal(400, f"tools.{j}.name: Field required")
        extra = set(tool) - {"name", "description", "input_schema", "cache_control", "type"}
        if extra:
            raise Refusal(400, f"tools.{j}.{min(extra)}: Extra inputs are not permitted")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise Refusal(400, f"tools.{j}.input_schema: Input should be an object schema")
        names.add(tool["name"])
    return names


def _check_tool_choice(choice: Any, names: set[str]) -> None:
    if choice is None:
        return
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise Refusal(400, "tool_choice: Input tag does not match any of the expected tags")
    if choice["type"] == "tool" and choice.get("name") not in names:
        raise Refusal(400, f"tool_choice.name: tool {choice.get('name')!r} is not in tools")


# -- scripted replies -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolUse:
    name: str
    input: dict[str, Any]
    id: str = field(default_factory=lambda: f"toolu_{secrets.token_hex(12)}")


@dataclass(eq=False)
class ProviderReply:
    """What a fake provider answers to one request, in whatever wire format it speaks."""

    kind: Literal["message", "error"]
    text: str | None = None
    tools: list[ToolUse] = field(default_factory=list)
    status: int = 200
    error_type: str | None = None
    error_message: str = ""
    chunk_size: int = 5  # characters per streamed text / tool-argument fragment
    error_after_events: int | None = None  # streaming: an error event after this many events
    cut_after_events: int | None = None  # streaming: the stream just ends after this many events
    delay_s: float = 0.0  # before the status line (timeouts)

    @classmethod
    def message(cls, text: str | None = None, tools: list[ToolUse] | None = None, **options: Any) -> ProviderReply:
        return cls("message", text=text, tools=list(tools or ()), **options)

    @classmethod
    def error(cls, status: int, message: str, type_: str | None = None) -> ProviderReply:
        return cls("error", status=status, error_type=type_, error_message=message)


@dataclass
class Seen:
    """One request as received: path (with query), lower-cased headers, the parsed body."""

    path: str
    headers: dict[str, str]
    body: Any
    status: int = 0


class FakeProvider:
    """A scripted provider on 127.0.0.1:<free port>. Subclasses add routes and speak the format;
    `enqueue`, `requests` and `reset` are safe from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: collections.deque[ProviderReply] = collections.deque()
        self._requests: list[Seen] = []
        self._runner: web.AppRunner | None = None
        self.port = 0

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    async def start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        self.routes(app)
        self._runner, self.port = await serve_on_loopback(app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def base_url(self) -> str:
        """The provider's litellm `api_base`."""
        return f"http://127.0.0.1:{self.port}"

    def enqueue(self, *replies: ProviderReply) -> None:
        with self._lock:
            self._queue.extend(replies)

    @property
    def requests(self) -> list[Seen]:
        with self._lock:
            return list(self._requests)

    def reset(self) -> None:
        with self._lock:
            self._queue.clear()
            self._requests.clear()

    async def _record(self, request: web.Request) -> Seen:
        raw = await request.read()
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = raw
        seen = Seen(str(request.rel_url), {k.lower(): v for k, v in request.headers.items()}, body)
        with self._lock:
            self._requests.append(seen)
        return seen

    def _take(self, echo: str) -> ProviderReply:
        with self._lock:
            if self._queue:
                return self._queue.popleft()
        return ProviderReply.message(f"reply to: {echo}")

    @staticmethod
    def _json(seen: Seen, payload: Any, status: int = 200) -> web.Response:
        seen.status = status
        return web.json_response(payload, status=status)

    @staticmethod
    async def _write_events(
        request: web.Request,
        reply: ProviderReply,
        events: list[bytes],
        error_event: bytes,
        content_type: str = "text/event-stream; charset=utf-8",
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": content_type, "Cache-Control": "no-cache"})
        await response.prepare(request)
        for n, event in enumerate(events):
            if reply.error_after_events == n:
                await response.write(error_event)
                break
            if reply.cut_after_events == n:
                break
            await response.write(event)
        await response.write_eof()
        return response


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), max(1, size))]


def _sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


# -- Anthropic ------------------------------------------------------------------------------------


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        texts = [b.get("text", "") for b in content or () if isinstance(b, dict) and b.get("type") == "text"]
        if texts:
            return "".join(texts)
        results = [b for b in content or () if isinstance(b, dict) and b.get("type") == "tool_result"]
        if results:
            inner = results[-1].get("content")
            return inner if isinstance(inner, str) else json.dumps(inner)
    return ""


class FakeAnthropic(FakeProvider):
    """The Anthropic Messages API. `keys`: the accepted x-api-keys (None = any). litellm's
    `api_base` for it is the host, without /v1."""

    def __init__(self, keys: set[str] | None = None) -> None:
        super().__init__()
        self.keys = keys

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/messages", self._handle)
        app.router.add_route("*", "/{tail:.*}", self._not_found)

    async def _not_found(self, request: web.Request) -> web.Response:
        return web.json_response(anthropic_error("not_found_error", f"Not found: {request.path}"), status=404)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        seen = await self._record(request)
        body = seen.body
        try:
            check_messages_request(seen.headers, body, self.keys)
        except Refusal as refusal:
            return self._json(seen, refusal.body(), refusal.status)
        reply = self._take(_last_user_text(body["messages"]))
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.kind == "error":
            type_ = reply.error_type or ERROR_TYPES.get(reply.status, "api_error")
            return self._json(seen, anthropic_error(type_, reply.error_message), reply.status)
        seen.status = 200
        if body.get("stream"):
            events = [_sse(data, name) for name, data in message_events(body, reply)]
            error = _sse(anthropic_error("overloaded_error", "Overloaded"), "error")
            return await self._write_events(request, reply, events, error)
        return web.json_response(message_body(body, reply), headers={"request-id": f"req_{secrets.token_hex(8)}"})


def _stop_reason(reply: ProviderReply) -> str:
    return "tool_use" if reply.tools else "end_turn"


def _usage(body: dict[str, Any], reply: ProviderReply) -> tuple[int, int]:
    prompt = len(json.dumps(body)) // 4
    out = len(reply.text or "") // 4 + sum(len(json.dumps(t.input)) // 4 + 5 for t in reply.tools)
    return max(prompt, 1), max(out, 1)


def message_body(body: dict[str, Any], reply: ProviderReply) -> dict[str, Any]:
    prompt, out = _usage(body, reply)
    content: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
    content += [{"type": "tool_use", "id": t.id, "name": t.name, "input": t.input} for t in reply.tools]
    return {
        "id": f"msg_{secrets.token_hex(12)}",
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": content,
        "stop_reason": _stop_reason(reply),
        "stop_sequence": None,
        "usage": {"input_tokens": prompt, "output_tokens": out},
    }


def message_events(body: dict[str, Any], reply: ProviderReply) -> list[tuple[str, dict[str, Any]]]:
    """The SSE events of a streamed Messages API reply, in order."""
    prompt, out = _usage(body, reply)
    start = {
        **message_body(body, reply),
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": prompt, "output_tokens": 1},
    }
    events: list[tuple[str, dict[str, Any]]] = [("message_start", {"type": "message_start", "message": start})]
    index = 0
    if reply.text:
        events.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
            )
        )
        events.append(("ping", {"type": "ping"}))
        for piece in _pieces(reply.text, reply.chunk_size):
            events.append(
                (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}},
                )
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    for tool in reply.tools:
        block = {"type": "tool_use", "id": tool.id, "name": tool.name, "input": {}}
        events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": block}))
        for piece in _pieces(json.dumps(tool.input), reply.chunk_size):
            events.append(
                (
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": piece},
                    },
                )
            )
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
        index += 1
    events.append(
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": _stop_reason(reply), "stop_sequence": None},
                "usage": {"output_tokens": out},
            },
        )
    )
    events.append(("message_stop", {"type": "message_stop"}))
    return events


# -- Gemini (Google AI Studio's generateContent) ------------------------------------------------------

GOOGLE_STATUS = {
    400: "INVALID_ARGUMENT",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
}


def google_error(status: int, message: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "status": GOOGLE_STATUS.get(status, "UNKNOWN")}}


class FakeGemini(FakeProvider):
    """`POST {api_base}/models/{model}:generateContent` and `:streamGenerateContent?alt=sse`; the key
    in `x-goog-api-key` (or `?key=`). Function calls come whole, as Gemini sends them."""

    def __init__(self, keys: set[str] | None = None) -> None:
        super().__init__()
        self.keys = keys

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/models/{call}", self._handle)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        seen = await self._record(request)
        model, _, method = request.match_info["call"].partition(":")
        key = seen.headers.get("x-goog-api-key") or request.query.get("key")
        if not key:
            return self._json(seen, google_error(403, "Method doesn't allow unregistered callers"), 403)
        if self.keys is not None and key not in self.keys:
            return self._json(seen, google_error(400, "API key not valid. Please pass a valid API key."), 400)
        if method not in ("generateContent", "streamGenerateContent"):
            return self._json(seen, google_error(404, f"models/{model} is not found"), 404)
        body = seen.body
        contents = body.get("contents") if isinstance(body, dict) else None
        if not contents or any(
            c.get("role") not in ("user", "model", "function") or not c.get("parts") for c in contents
        ):
            return self._json(
                seen, google_error(400, "* GenerateContentRequest.contents: contents is not specified"), 400
            )
        last = next(
            (p.get("text") for c in reversed(contents) if c["role"] == "user" for p in c["parts"] if "text" in p), ""
        )
        reply = self._take(last or "")
        if reply.delay_s:
            await asyncio.sleep(reply.delay_s)
        if reply.kind == "error":
            return self._json(seen, google_error(reply.status, reply.error_message), reply.status)
        seen.status = 200
        usage = {
            "promptTokenCount": max(1, len(json.dumps(contents)) // 4),
            "candidatesTokenCount": 1,
            "totalTokenCount": 2,
        }
        if method == "generateContent":
            parts = ([{"text": reply.text}] if reply.text else []) + [
                {"functionCall": {"name": t.name, "args": t.input}} for t in reply.tools
            ]
            candidate = {"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}
            return web.json_response({"candidates": [candidate], "usageMetadata": usage, "modelVersion": model})
        events = []
        for piece in _pieces(reply.text or "", reply.chunk_size):
            events.append({"candidates": [{"content": {"role": "model", "parts": [{"text": piece}]}, "index": 0}]})
        if reply.tools:
            calls = [{"functionCall": {"name": t.name, "args": t.input}} for t in reply.tools]
            events.append({"candidates": [{"content": {"role": "model", "parts": calls}, "index": 0}]})
        events.append(
            {
                "candidates": [
                    {"content": {"role": "model", "parts": [{"text": ""}]}, "finishReason": "STOP", "index": 0}
                ],
                "usageMetadata": usage,
            }
        )
        error = f"data: {json.dumps(google_error(503, 'The model is overloaded.'))}\r\n\r\n".encode()
        return await self._write_events(
            request, reply, [f"data: {json.dumps(e)}\r\n\r\n".encode() for e in events], error
        )


# -- Ollama (/api/chat) -------------------------------------------------------------------------------


class FakeOllama(FakeProvider):
    """`POST /api/chat`: NDJSON when streaming (Ollama's default), tool calls with object arguments,
    errors as `{"error": "..."}`. `models`: the models it has pulled."""

    def __init__(self, models: set[str] | None = None) -> None:
        super().__init__()
        self.models = models or {"llama3.1"}

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/api/chat", self._handle)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        seen = await self._record(request)
        body = seen.body
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return self._json(seen, {"error": "invalid request"}, 400)
        if body.get("model") not in self.models:
            return self._json(seen, {"error": f"model '{body.get('model')}' not found, try pulling it first"}, 404)
        last = next((m.get("content") for m in reversed(body["messages"]) if m.get("role") == "user"), "")
        reply = self._take(last or "")
        if reply.kind == "error":
            return self._json(seen, {"error": reply.error_message}, reply.status)
        seen.status = 200
        base = {"model": body["model"], "created_at": "2025-01-01T00:00:00Z"}
        calls = [{"function": {"name": t.name, "arguments": t.input}} for t in reply.tools]
        final = {
            **base,
            "message": {"role": "assistant", "content": ""},
            "done": True,
            "done_reason": "stop",
            "prompt_eval_count": max(1, len(json.dumps(body["messages"])) // 4),
            "eval_count": 1,
        }
        if body.get("stream") is False:
            message = {"role": "assistant", "content": reply.text or ""}
            if calls:
                message["tool_calls"] = calls
            return web.json_response({**final, "message": message})
        lines = [
            {**base, "message": {"role": "assistant", "content": piece}, "done": False}
            for piece in _pieces(reply.text or "", reply.chunk_size)
        ]
        if calls:
            lines.append({**base, "message": {"role": "assistant", "content": "", "tool_calls": calls}, "done": False})
        lines.append(final)
        return await self._write_events(
            request,
            reply,
            [(json.dumps(line) + "\n").encode() for line in lines],
            (json.dumps({"error": "an error was encountered while running the model"}) + "\n").encode(),
            content_type="application/x-ndjson",
        )
