"""The Gemini API side of the fake upstream: `POST /v1beta/models/{model}:generateContent`,
`:streamGenerateContent?alt=sse` and `:countTokens` (and the same under `/v1`), mounted by
`tests.fakes.fake_upstream.FakeUpstream`.

Strict: a body the real API refuses gets its 400 (`tests.fakes.gemini_rules`), in Google's shape; a
request without a key (`x-goog-api-key` or `?key=`) a 403, one with `INVALID_KEY` a 400
`API_KEY_INVALID`; a stream asked without `alt=sse` a 400 (the fake speaks SSE only).

Scripted by the very Replies the chat fake serves, from the same queue and responder:
- `Reply.text` / `Reply.tool_calls` become a candidate whose content holds `text` and
  `functionCall` parts (`args` from the Reply's JSON arguments; no `id`, as the real API sends
  none: `call_ids = True` gives them one), finishReason `STOP`. The first functionCall of a
  reply carries a thought signature the fake checks when it comes back (tests.fakes.gemini_rules);
- `reasoning=` becomes a thought part (`{"text", "thought": true}`) first, when the request
  asks for thoughts (`thinkingConfig.includeThoughts`);
- `Reply.error` is answered in Google's shape (an OpenAI-shaped script is translated);
- `Reply.hang`, `pause_after_chunks` and `failing_after` misbehave as elsewhere; a stream broken
  off ends with a `data: {"error": ...}` event.
Streams are `data: <json>` events separated by CRLF blank lines, as Google sends them.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import TYPE_CHECKING, Any

from aiohttp import web

from tests.fakes.gemini_rules import GeminiRefusal, SignatureIssuer, check_generate_request, google_error

if TYPE_CHECKING:  # fake_upstream imports this module: no runtime import back
    from tests.fakes.fake_upstream import FakeUpstream, Recorded, Reply

__all__ = ["INVALID_KEY", "GeminiAPI", "GeminiCall", "gemini_error"]

INVALID_KEY = "invalid-gemini-key"


def gemini_error(status: int, message: str) -> Reply:
    """A scripted error reply in Google's shape."""
    from tests.fakes.fake_upstream import Reply

    return Reply.error(status, google_error(status, message))


class GeminiCall:
    """One accepted generate request: its model, whether it streamed, its body and headers."""

    def __init__(self, path: str, model: str, stream: bool, body: dict[str, Any], headers: dict[str, str], query: dict[str, str]):
        self.path, self.model, self.stream, self.body, self.headers, self.query = path, model, stream, body, headers, query


def _estimate(text: str) -> int:
    return max(1, len(text) // 4)


def _wants_thoughts(body: dict[str, Any]) -> bool:
    thinking = (body.get("generationConfig") or {}).get("thinkingConfig") or {}
    return bool(thinking.get("includeThoughts") or thinking.get("include_thoughts"))


def _error_body(status: int, body: dict[str, Any] | None) -> dict[str, Any]:
    """A scripted error in Google's shape: as given when it already is, else translated."""
    body = body or {}
    error = body.get("error") if isinstance(body.get("error"), dict) else {}
    if "status" in error and "code" in error:
        return body
    return google_error(status, str(error.get("message") or f"upstream error {status}"))


class GeminiAPI:
    """The Gemini endpoints of one FakeUpstream, sharing its queue, responder, request log and
    parking (one script serves every format)."""

    def __init__(self, host: FakeUpstream) -> None:
        self.host = host
        self.signer = SignatureIssuer()
        self.call_ids = False  # whether functionCall parts carry an `id`
        self._calls: list[GeminiCall] = []
        self._counts: list[dict[str, Any]] = []

    @property
    def base_url(self) -> str:
        """The root a Gemini client takes (`GOOGLE_GEMINI_BASE_URL`): no `/v1beta`."""
        return f"http://127.0.0.1:{self.host.port}"

    def calls(self) -> list[GeminiCall]:
        """The generate requests that passed validation, in order."""
        with self.host._lock:
            return list(self._calls)

    def requests(self) -> list[dict[str, Any]]:
        """Bodies of the generate requests that passed validation, in order."""
        return [call.body for call in self.calls()]

    def count_tokens_requests(self) -> list[dict[str, Any]]:
        with self.host._lock:
            return list(self._counts)

    def reset(self) -> None:
        with self.host._lock:
            self._calls.clear()
            self._counts.clear()
        self.call_ids = False

    def routes(self) -> list[web.RouteDef]:
        # v1beta is what Gemini CLI calls; the google-genai SDK calls v1 unless told otherwise.
        return [web.post(f"/{version}/models/{{model}}:{{method}}", self.handle) for version in ("v1beta", "v1")]

    # -- the endpoint ---------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        record = await self.host._record(request)
        model, method = request.match_info["model"], request.match_info["method"]
        try:
            body = self._admit(request, record, model, method)
        except GeminiRefusal as refusal:
            return _respond(record, refusal.error_body(), refusal.status)
        if method == "countTokens":
            with self.host._lock:
                self._counts.append(body)
            return _respond(record, {"totalTokens": _prompt_tokens(body)}, 200)
        stream = method == "streamGenerateContent"
        call = GeminiCall(record.path, model, stream, body, record.headers, record.query)
        reply = self.host._take_reply(body, [])  # the host's log of bodies is not ours: ours holds the call
        with self.host._lock:
            self._calls.append(call)
        if reply.kind == "error":
            return _respond(record, _error_body(reply.status, reply.body), reply.status)
        if reply.kind == "hang":
            await self.host._park(reply, reply.gate.wait())
            raise asyncio.CancelledError()  # drop the connection without an answer
        answer = self.response_body(body, model, reply)
        if stream:
            return await self._stream(request, record, answer, reply)
        if reply.pause_after_chunks is not None:
            await self.host._park(reply, reply.gate.wait())
        if reply.error_after_chunks is not None:
            return _respond(record, google_error(500, "An internal error has occurred."), 500)
        return _respond(record, answer, 200)

    def _admit(self, request: web.Request, record: Recorded, model: str, method: str) -> dict[str, Any]:
        key = request.headers.get("x-goog-api-key") or request.query.get("key")
        if not key:
            raise GeminiRefusal(
                "Method doesn't allow unregistered callers (callers without established identity). "
                "Please use API Key or other form of API consumer identity to call this API.", 403,
            )
        if key == INVALID_KEY:
            raise GeminiRefusal("API key not valid. Please pass a valid API key.")
        if method not in ("generateContent", "streamGenerateContent", "countTokens"):
            raise GeminiRefusal(f"Method {method} not found.", 404)
        if method == "streamGenerateContent" and request.query.get("alt") != "sse":
            raise GeminiRefusal("this fake streams only as SSE: ask with ?alt=sse")
        if not isinstance(record.body, dict):
            raise GeminiRefusal("Invalid JSON payload received. Expected an object.")
        body = record.body
        if method == "countTokens":
            inner = body.get("generateContentRequest")
            if inner is not None:
                if set(body) != {"generateContentRequest"} or not isinstance(inner, dict):
                    raise GeminiRefusal("countTokens takes contents or generateContentRequest, not both")
                check_generate_request({k: v for k, v in inner.items() if k != "model"}, model, self.signer)
            else:
                unknown = next((k for k in body if k != "contents"), None)
                if unknown is not None:
                    raise GeminiRefusal(f'Invalid JSON payload received. Unknown name "{unknown}": Cannot find field.')
                check_generate_request(body, model, self.signer)
            return body
        check_generate_request(body, model, self.signer)
        return body

    # -- rendering a Reply ----------------------------------------------------------------------

    def reply_parts(self, body: dict[str, Any], reply: Reply) -> list[dict[str, Any]]:
        parts: list[dict[str, Any]] = []
        if reply.reasoning is not None and _wants_thoughts(body):
            parts.append({"text": reply.reasoning, "thought": True})
        if reply.content:
            parts.append({"text": reply.content})
        for n, call in enumerate(reply.calls):
            args = json.loads(call.arguments)
            if not isinstance(args, dict):
                raise ValueError(f"functionCall args must be a JSON object, got {call.arguments!r}")
            function_call: dict[str, Any] = {"name": call.name, "args": args}
            if self.call_ids:
                function_call["id"] = call.id
            part: dict[str, Any] = {"functionCall": function_call}
            if n == 0:
                part["thoughtSignature"] = self.signer.issue()
            parts.append(part)
        return parts

    def response_body(self, body: dict[str, Any], model: str, reply: Reply) -> dict[str, Any]:
        parts = self.reply_parts(body, reply)
        prompt = _prompt_tokens(body)
        out = sum(_estimate(json.dumps(p)) for p in parts if not p.get("thought"))
        thoughts = sum(_estimate(p["text"]) for p in parts if p.get("thought"))
        usage = {"promptTokenCount": prompt, "candidatesTokenCount": out, "totalTokenCount": prompt + out + thoughts}
        if thoughts:
            usage["thoughtsTokenCount"] = thoughts
        return {
            "candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": usage,
            "modelVersion": model,
            "responseId": secrets.token_urlsafe(16),
        }

    @staticmethod
    def events(answer: dict[str, Any], chunk_size: int) -> list[bytes]:
        """`answer` streamed as the real API streams it: text in pieces, each a chunk of its own;
        function calls whole, in the last chunk, which carries finishReason and the usage."""
        parts = answer["candidates"][0]["content"]["parts"]
        head = {k: v for k, v in answer.items() if k not in ("candidates", "usageMetadata")}
        usage = answer["usageMetadata"]
        chunks: list[dict[str, Any]] = []
        for part in parts:
            if "text" not in part:
                continue
            text = part["text"]
            pieces = [text[i : i + chunk_size] for i in range(0, len(text), max(1, chunk_size))] or [""]
            for piece in pieces:
                chunks.append({**{k: v for k, v in part.items() if k != "text"}, "text": piece})
        calls = [p for p in parts if "functionCall" in p]
        events = [
            {"candidates": [{"content": {"role": "model", "parts": [chunk]}, "index": 0}],
             "usageMetadata": {"promptTokenCount": usage["promptTokenCount"], "totalTokenCount": usage["promptTokenCount"]},
             **head}
            for chunk in chunks
        ]
        last_parts = calls or ([events.pop()["candidates"][0]["content"]["parts"][0]] if events else [{"text": ""}])
        events.append({
            "candidates": [{"content": {"role": "model", "parts": last_parts}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": usage,
            **head,
        })
        return [_sse(event) for event in events]

    async def _stream(self, request: web.Request, record: Recorded, answer: dict[str, Any], reply: Reply) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        record.status_sent = 200
        events = self.events(answer, reply.chunk_size)
        try:
            for sent in range(len(events) + 1):
                if reply.pause_after_chunks == sent:
                    await self.host._park(reply, reply.gate.wait())
                if reply.error_after_chunks == sent:
                    await response.write(_sse(_error_body(503, reply.body or google_error(503, "The model is overloaded."))))
                    break
                if sent < len(events):
                    await response.write(events[sent])
            await response.write_eof()
        except asyncio.CancelledError:
            self.host._note_client_gone(reply)
            raise
        except ConnectionError:
            self.host._note_client_gone(reply)
        return response


def _prompt_tokens(body: dict[str, Any]) -> int:
    inner = body.get("generateContentRequest") if isinstance(body.get("generateContentRequest"), dict) else body
    return _estimate(json.dumps({k: v for k, v in inner.items() if k != "generationConfig"}))


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\r\n\r\n"


def _respond(record: Recorded, payload: dict[str, Any], status: int) -> web.Response:
    record.status_sent = status
    return web.json_response(payload, status=status)
