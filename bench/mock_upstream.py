"""A fast OpenAI-compatible (and Anthropic Messages) upstream: `python -m bench.mock_upstream --port P [--gap-ms G]`.

It must never be the bottleneck, so it does the least an upstream can: it reads the body but does
not parse it. Two byte searches tell it what to answer:
- `"stream":true` (or `"stream": true`, how a proxy's json.dumps writes it) anywhere in the body.
  Inside a JSON string those quotes would be escaped (\\"), so only a real top-level key matches.
- the model name `bench-s<N>` (see workload.stream_model): stream N chunks (default 32).
Replies are prebuilt bytes; only the tool-call id (unique per reply, like a real model's) and the
usage figure are formatted per request.

The reply is an assistant message with a short thought and one tool call, so the client's next
turn is "reply + tool result", like an agent loop. Streamed replies are content deltas, one
tool-call chunk, a finish chunk with usage, then [DONE]; `--gap-ms` spaces the chunks the way a
model's tokens are spaced, so a proxy forwards them one by one instead of one coalesced read.
`POST /v1/messages` answers the same in Anthropic's format: a `message` with a text and a
`tool_use` block, or as many SSE events (message_start ... message_stop) as a chat stream has chunks;
`POST /v1/responses` in the Responses API's: a `response` with a message and a `function_call`
item, or its events (response.created ... response.completed, numbered);
`POST /v1{beta}/models/<model>:generateContent` (`:streamGenerateContent`) in Gemini's: a
candidate with a text and a `functionCall` part, or as many `data:` chunks (the model name in the
URL tells how many), the call in the last.
Streamed events are shaped as the real APIs' are where that costs a relay something: OpenAI's
deltas (chat's and Responses') carry an `obfuscation` string new in every event, a Responses
stream's `.done` events and `response.completed` repeat the text its deltas made, and every
Gemini chunk carries its usage so far.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import time
from functools import lru_cache

from aiohttp import web

CREATED = int(time.time())
THOUGHT = "The failing assertion points at the pagination cursor; I will rerun the focused test first."
CALL_NAME = "run_shell"
CALL_ARGS = json.dumps({"command": "python -m pytest -q tests/test_export.py -x", "timeout": 120})
DEFAULT_CHUNKS = 32

_ids = itertools.count(1)


def _j(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _reply_template() -> bytes:
    """A non-streamed chat.completion as a bytes %-template: (call id, prompt tokens, total tokens)."""
    body = _j(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": CREATED,
            "model": "bench",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": THOUGHT,
                        "tool_calls": [
                            {"id": "@@ID@@", "type": "function", "function": {"name": CALL_NAME, "arguments": CALL_ARGS}}
                        ],
                        "refusal": None,
                    },
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 111111111, "completion_tokens": 42, "total_tokens": 222222222},
        }
    )
    assert b"%" not in body
    return body.replace(b"@@ID@@", b"%s").replace(b"111111111", b"%d").replace(b"222222222", b"%d")


REPLY = _reply_template()


def _chunk(
    delta: dict[str, object], finish: str | None = None, usage: dict[str, int] | None = None, obfuscation: str | None = None
) -> bytes:
    obj: dict[str, object] = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": "bench",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage is not None:
        obj["usage"] = usage
    if obfuscation is not None:
        obj["obfuscation"] = obfuscation
    return b"data: " + _j(obj) + b"\n\n"


def _obfuscation(n: int) -> str:
    """The padding OpenAI's streamed deltas carry (`obfuscation`, chat's and Responses'): random
    characters, of a length that hides the text's, new in every event."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    return "".join(alphabet[(n * 7 + i * 13) % len(alphabet)] for i in range(2 + (n * 5) % 13))


@lru_cache(maxsize=64)
def stream_parts(chunks: int) -> tuple[list[bytes], tuple[bytes, bytes], list[bytes]]:
    """(content chunks, the tool-call chunk split around its id, closing chunks): `chunks` events in
    all, [DONE] included (at least 4)."""
    n_content = max(1, chunks - 3)
    words = (THOUGHT + " ") * (n_content // 8 + 1)
    step = max(1, len(words) // n_content)
    pieces = [words[i * step : (i + 1) * step] for i in range(n_content)]
    content = [_chunk({"role": "assistant", "content": pieces[0]}, obfuscation=_obfuscation(0))]
    content += [_chunk({"content": p}, obfuscation=_obfuscation(i)) for i, p in enumerate(pieces[1:], 1)]
    call = _chunk(
        {"tool_calls": [{"index": 0, "id": "@@ID@@", "type": "function", "function": {"name": CALL_NAME, "arguments": CALL_ARGS}}]}
    )
    a, b = call.split(b"@@ID@@")
    closing = [_chunk({}, "tool_calls", {"prompt_tokens": 1000, "completion_tokens": chunks, "total_tokens": 1000 + chunks})]
    return content, (a, b), closing + [b"data: [DONE]\n\n"]


def _anthropic_reply_template() -> bytes:
    """A non-streamed Anthropic `message` as a bytes %-template: (tool_use id, input tokens)."""
    body = _j(
        {
            "id": "msg_bench",
            "type": "message",
            "role": "assistant",
            "model": "bench",
            "content": [
                {"type": "text", "text": THOUGHT},
                {"type": "tool_use", "id": "@@ID@@", "name": CALL_NAME, "input": json.loads(CALL_ARGS)},
            ],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 111111111, "output_tokens": 42},
        }
    )
    assert b"%" not in body
    return body.replace(b"@@ID@@", b"%s").replace(b"111111111", b"%d")


ANTHROPIC_REPLY = _anthropic_reply_template()


def _event(payload: dict[str, object]) -> bytes:
    return b"event: " + str(payload["type"]).encode() + b"\ndata: " + _j(payload) + b"\n\n"


@lru_cache(maxsize=64)
def anthropic_stream_parts(chunks: int) -> tuple[list[bytes], tuple[bytes, bytes], list[bytes]]:
    """(the events up to the tool_use block, that block's start split around its id, the rest):
    `chunks` events in all (at least 9), like a chat stream of `chunks` chunks."""
    n_text = max(1, chunks - 8)
    words = (THOUGHT + " ") * (n_text // 8 + 1)
    step = max(1, len(words) // n_text)
    message = {"id": "msg_bench", "type": "message", "role": "assistant", "model": "bench", "content": [],
               "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1000, "output_tokens": 1}}
    head = [_event({"type": "message_start", "message": message}),
            _event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})]
    head += [_event({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": words[i * step : (i + 1) * step]}})
             for i in range(n_text)]
    head.append(_event({"type": "content_block_stop", "index": 0}))
    start = _event({"type": "content_block_start", "index": 1,
                    "content_block": {"type": "tool_use", "id": "@@ID@@", "name": CALL_NAME, "input": {}}})
    a, b = start.split(b"@@ID@@")
    tail = [
        _event({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": CALL_ARGS}}),
        _event({"type": "content_block_stop", "index": 1}),
        _event({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None}, "usage": {"output_tokens": chunks}}),
        _event({"type": "message_stop"}),
    ]
    return head, (a, b), tail


def _responses_reply(chunks: int, text: str = THOUGHT) -> dict[str, object]:
    output = [
        {"type": "message", "id": "msg_bench", "status": "completed", "role": "assistant",
         "content": [{"type": "output_text", "text": text, "annotations": []}]},
        {"type": "function_call", "id": "fc_bench", "status": "completed", "call_id": "@@ID@@",
         "name": CALL_NAME, "arguments": CALL_ARGS},
    ]
    return {"id": "resp_bench", "object": "response", "created_at": CREATED, "status": "completed", "model": "bench",
            "output": output, "usage": {"input_tokens": 111111111, "input_tokens_details": {"cached_tokens": 0},
                                        "output_tokens": chunks, "output_tokens_details": {"reasoning_tokens": 0},
                                        "total_tokens": 111111111}}


RESPONSES_REPLY = _j(_responses_reply(42)).replace(b"@@ID@@", b"%s").replace(b"111111111", b"%d")


@lru_cache(maxsize=64)
def responses_stream_parts(chunks: int) -> list[bytes]:
    """The events of a streamed response, as bytes with `@@ID@@` where the call id goes: about
    `chunks` of them (the text's deltas make up the difference)."""
    n_text = max(1, chunks - 10)
    words = (THOUGHT + " ") * (n_text // 8 + 1)
    step = max(1, len(words) // n_text)
    pieces = [words[i * step : (i + 1) * step] for i in range(n_text)]
    # The text's `.done` events, its item's and the response's say what its deltas made, as the
    # API's do: the reply (and what the client sends back) grows with the events, as over chat.
    reply = _responses_reply(chunks, "".join(pieces))
    message, call = reply["output"]  # type: ignore[misc]
    started = {**reply, "status": "in_progress", "output": [], "usage": None}
    at = {"item_id": "msg_bench", "output_index": 0, "content_index": 0}
    events: list[dict[str, object]] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
        {"type": "response.output_item.added", "output_index": 0, "item": {**message, "status": "in_progress", "content": []}},
        {"type": "response.content_part.added", **at, "part": {"type": "output_text", "text": "", "annotations": []}},
        *({"type": "response.output_text.delta", **at, "delta": piece, "logprobs": [], "obfuscation": _obfuscation(i)}
          for i, piece in enumerate(pieces)),
        {"type": "response.output_text.done", **at, "text": message["content"][0]["text"], "logprobs": []},  # type: ignore[index]
        {"type": "response.content_part.done", **at, "part": message["content"][0]},
        {"type": "response.output_item.done", "output_index": 0, "item": message},
        {"type": "response.output_item.added", "output_index": 1, "item": {**call, "status": "in_progress", "arguments": ""}},
        {"type": "response.function_call_arguments.delta", "item_id": "fc_bench", "output_index": 1, "delta": CALL_ARGS},
        {"type": "response.function_call_arguments.done", "item_id": "fc_bench", "output_index": 1, "arguments": CALL_ARGS},
        {"type": "response.output_item.done", "output_index": 1, "item": call},
        {"type": "response.completed", "response": {**reply, "usage": {**reply["usage"], "input_tokens": 1000, "total_tokens": 1000}}},  # type: ignore[dict-item]
    ]
    return [b"event: " + str(e["type"]).encode() + b"\ndata: " + _j({"type": e["type"], "sequence_number": n, **e}) + b"\n\n"
            for n, e in enumerate(events)]


def _gemini_reply(call_id: bytes, prompt_tokens: int) -> bytes:
    """A non-streamed GenerateContentResponse: a thought's text, then the call."""
    call = {"functionCall": {"id": "@@ID@@", "name": CALL_NAME, "args": json.loads(CALL_ARGS)}}
    body = _j({
        "candidates": [{"content": {"role": "model", "parts": [{"text": THOUGHT}, call]}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": prompt_tokens, "candidatesTokenCount": 42, "totalTokenCount": prompt_tokens + 42},
        "modelVersion": "bench", "responseId": "bench",
    })
    return body.replace(b"@@ID@@", call_id)


@lru_cache(maxsize=64)
def gemini_stream_parts(chunks: int) -> tuple[list[bytes], tuple[bytes, bytes]]:
    """(text chunks, the final chunk split around its call's id): `chunks` events in all."""
    n_text = max(1, chunks - 1)
    words = (THOUGHT + " ") * (n_text // 8 + 1)
    step = max(1, len(words) // n_text)
    head = {"modelVersion": "bench", "responseId": "bench"}
    # Every chunk carries the usage so far, cumulative, as the API's do.
    texts = [
        b"data: " + _j({"candidates": [{"content": {"role": "model", "parts": [{"text": words[i * step : (i + 1) * step]}]}, "index": 0}],
                        "usageMetadata": _gemini_usage(i + 1), **head}) + b"\r\n\r\n"
        for i in range(n_text)
    ]
    call = {"functionCall": {"id": "@@ID@@", "name": CALL_NAME, "args": json.loads(CALL_ARGS)}}
    final = b"data: " + _j({
        "candidates": [{"content": {"role": "model", "parts": [call]}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": _gemini_usage(chunks), **head,
    }) + b"\r\n\r\n"
    a, b = final.split(b"@@ID@@")
    return texts, (a, b)


def _gemini_usage(tokens: int) -> dict[str, object]:
    return {"promptTokenCount": 1000, "candidatesTokenCount": tokens, "totalTokenCount": 1000 + tokens,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 1000}]}


def _chunk_count(body: bytes) -> int:
    i = body.find(b"bench-s")
    if i < 0:
        return DEFAULT_CHUNKS
    j = i + 7
    while j < len(body) and 48 <= body[j] <= 57:
        j += 1
    return int(body[i + 7 : j]) if j > i + 7 else DEFAULT_CHUNKS


class Mock:
    def __init__(self, gap_s: float) -> None:
        self.gap_s = gap_s
        self.requests = 0

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests += 1
        call_id = b"call_%08d" % next(_ids)
        if b'"stream":true' in body or b'"stream": true' in body:
            return await self._stream(request, call_id, _chunk_count(body))
        # ~4 characters per token: a plausible usage figure without tokenizing anything.
        tokens = len(body) // 4
        return web.Response(body=REPLY % (call_id, tokens, tokens + 42), content_type="application/json")

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests += 1
        call_id = b"toolu_%08d" % next(_ids)
        if b'"stream":true' in body or b'"stream": true' in body:
            head, (start_a, start_b), tail = anthropic_stream_parts(_chunk_count(body))
            return await self._send(request, [*head, start_a + call_id + start_b, *tail])
        return web.Response(body=ANTHROPIC_REPLY % (call_id, len(body) // 4), content_type="application/json")

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests += 1
        call_id = b"call_%08d" % next(_ids)
        if b'"stream":true' in body or b'"stream": true' in body:
            return await self._send(request, [e.replace(b"@@ID@@", call_id) for e in responses_stream_parts(_chunk_count(body))])
        tokens = len(body) // 4
        return web.Response(body=RESPONSES_REPLY % (call_id, tokens, tokens), content_type="application/json")

    async def gemini(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.requests += 1
        call_id = b"call_%08d" % next(_ids)
        if request.match_info["method"] == "streamGenerateContent":
            texts, (final_a, final_b) = gemini_stream_parts(_chunk_count(request.match_info["model"].encode()))
            return await self._send(request, [*texts, final_a + call_id + final_b])
        return web.Response(body=_gemini_reply(call_id, len(body) // 4), content_type="application/json")

    async def _stream(self, request: web.Request, call_id: bytes, chunks: int) -> web.StreamResponse:
        content, (call_a, call_b), closing = stream_parts(chunks)
        return await self._send(request, [*content, call_a + call_id + call_b, *closing])

    async def _send(self, request: web.Request, events: list[bytes]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        for data in events:
            await response.write(data)
            if self.gap_s:
                await asyncio.sleep(self.gap_s)
        await response.write_eof()
        return response

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "bench", "object": "model", "owned_by": "bench"}]})

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response({"requests": self.requests})


def build_app(gap_s: float = 0.0) -> web.Application:
    mock = Mock(gap_s)
    app = web.Application(client_max_size=256 * 1024 * 1024)
    for path in ("/v1/chat/completions", "/chat/completions"):
        app.router.add_post(path, mock.chat)
    app.router.add_post("/v1/messages", mock.messages)
    app.router.add_post("/v1/responses", mock.responses)
    for version in ("v1", "v1beta"):
        app.router.add_post(f"/{version}/models/{{model}}:{{method}}", mock.gemini)
    app.router.add_get("/v1/models", mock.models)
    app.router.add_get("/models", mock.models)
    app.router.add_get("/healthz", mock.stats)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--gap-ms", type=float, default=0.0, help="pause between streamed chunks")
    args = parser.parse_args()
    # No access log: formatting a log line per request would be the mock's biggest cost.
    web.run_app(build_app(args.gap_ms / 1000), host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
