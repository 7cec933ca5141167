"""A recording relay between the proxy and llama-server: what the model server really received.

The proxy's own figures are what the eval checks, so they cannot also be its source of truth.
Every upstream call passes through here unchanged (bodies and SSE streams byte for byte) and is
recorded: who sent it (an agent request carries the client's tools; a summarizer request carries
none), whether it answers a `read_tool_output` call (a read-back round), how many shortened
outputs its prompt holds, the server's own `usage.prompt_tokens`, and how it ended.

One change, to agent replies only (`untagged_calls`): Qwen2.5-Coder-0.5B writes its tool calls as
a bare or fenced JSON object instead of inside `<tool_call>` tags, and today's llama.cpp parser
(unlike older ones) leaves them as text. A reply whose whole text is such a call of an offered
tool is turned into the OpenAI `tool_calls` reply the model meant, streamed or not, so the proxy
sees the calls (its own `read_tool_output` among them) as it would from any provider. Every
rewrite is recorded.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

READ_TOOL = "read_tool_output"
SEARCH_TOOL = "search_history"  # the proxy's recall tool: answered by the proxy, like READ_TOOL
PROXY_TOOLS = frozenset({READ_TOOL, SEARCH_TOOL})
SHORTENED_MARKER = 'is stored as ref "'  # in the proxy's marker of a truncated tool output
# llama-server's refusal of a prompt longer than its context (type `exceed_context_size_error`).
LENGTH_ERRORS = ("exceed_context_size", "exceeds the available context size")


@dataclass
class UpstreamCall:
    index: int
    turn: int  # the session's user turn under way when the call arrived
    kind: str  # "agent" or "summarizer"
    messages: int
    offered_read_tool: bool
    read_round: bool  # its prompt ends with answers to the model's read_tool_output calls
    offered_search_tool: bool
    search_round: bool  # its prompt ends with answers to the model's search_history calls
    shortened_outputs: int  # truncation markers in its prompt
    request_chars: int
    started_s: float
    seconds: float = 0.0
    status: int = 0
    stream: bool = False
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    tool_calls: list[str] = field(default_factory=list)  # name(arguments) of the calls the model made
    error: str | None = None
    done: bool = False
    rewrote_untagged_call: bool = False

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300 and self.error is None

    @property
    def refused_for_length(self) -> bool:
        return self.error is not None and any(marker in self.error for marker in LENGTH_ERRORS)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ok": self.ok, "refused_for_length": self.refused_for_length}


def describe(body: dict[str, Any]) -> dict[str, Any]:
    """What the call is, from its request body alone."""
    messages = body.get("messages") or []
    tools = body.get("tools") or []
    names = {(t.get("function") or {}).get("name") for t in tools if isinstance(t, dict)}
    client_tools = names - PROXY_TOOLS
    last_assistant = next((m for m in reversed(messages) if m.get("role") == "assistant"), None)
    trailing_tools = messages and messages[-1].get("role") == "tool"
    calls = (last_assistant or {}).get("tool_calls") or []
    called = {(c.get("function") or {}).get("name") for c in calls}
    read_round = bool(trailing_tools and calls and called == {READ_TOOL})
    search_round = bool(trailing_tools and calls and SEARCH_TOOL in called and called <= PROXY_TOOLS)
    shortened = sum(
        (m.get("content") or "").count(SHORTENED_MARKER) for m in messages if isinstance(m.get("content"), str)
    )
    return {
        "kind": "agent" if client_tools else "summarizer",
        "messages": len(messages),
        "offered_read_tool": READ_TOOL in names,
        "read_round": read_round,
        "offered_search_tool": SEARCH_TOOL in names,
        "search_round": search_round,
        "shortened_outputs": shortened,
    }


class Relay:
    """`start()` serves on a free loopback port and forwards to `target` (a base URL without /v1)."""

    def __init__(self, target: str, untagged_calls: bool = True) -> None:
        self.target = target.rstrip("/")
        self.untagged_calls = untagged_calls
        self.calls: list[UpstreamCall] = []
        self.turn = 0
        self.started = time.monotonic()
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> Relay:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None, sock_read=900))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        data = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        call = self._record(request.path, data)
        try:
            return await self._forward(request, data, headers, call)
        except aiohttp.ClientError as exc:  # llama-server gone or broken: the proxy sees a 502
            if call is not None:
                call.status, call.error = 502, f"relay: {exc}"
            return web.json_response({"error": {"message": str(exc), "type": "relay_error"}}, status=502)
        finally:
            if call is not None:
                call.seconds = round(time.monotonic() - self.started - call.started_s, 3)
                call.done = True

    async def _forward(self, request: web.Request, data: bytes, headers: dict[str, str],
                       call: UpstreamCall | None) -> web.StreamResponse:
        assert self._session is not None
        url = self.target + request.path_qs
        async with self._session.request(request.method, url, data=data, headers=headers) as upstream:
            out_headers = {k: v for k, v in upstream.headers.items()
                           if k.lower() not in ("content-length", "transfer-encoding", "content-encoding", "connection")}
            if call is None:
                return web.Response(body=await upstream.read(), status=upstream.status, headers=out_headers)
            call.status = upstream.status
            offered = _offered_tools(data) if self.untagged_calls and call.kind == "agent" else set()
            if upstream.content_type != "text/event-stream":
                body = await upstream.read()
                if upstream.status == 200 and offered:
                    body = _rewrite_body(call, body, offered)
                _read_body(call, body)
                return web.Response(body=body, status=upstream.status, headers=out_headers)
            call.stream = True
            response = web.StreamResponse(status=upstream.status, headers=out_headers)
            await response.prepare(request)
            events = _Events(call)
            try:
                if offered:  # the whole stream first: only its end tells whether it was a call
                    stream = _rewrite_stream(call, await upstream.read(), offered)
                    events.feed(stream)
                    await response.write(stream)
                else:
                    async for chunk in upstream.content.iter_any():
                        events.feed(chunk)
                        await response.write(chunk)
            finally:
                events.close()
            await response.write_eof()
            return response

    def _record(self, path: str, data: bytes) -> UpstreamCall | None:
        if not path.endswith("/chat/completions"):
            return None
        try:
            body = json.loads(data)
        except ValueError:
            body = {}
        call = UpstreamCall(
            index=len(self.calls), turn=self.turn, request_chars=len(data),
            started_s=round(time.monotonic() - self.started, 3), **describe(body),
        )
        self.calls.append(call)
        return call


def _read_body(call: UpstreamCall, body: bytes) -> None:
    try:
        parsed = json.loads(body)
    except ValueError:
        call.error = body[:300].decode(errors="replace") if call.status >= 300 else "reply is not JSON"
        return
    if call.status >= 300 or "error" in parsed:
        call.error = json.dumps(parsed.get("error", parsed))[:500]
        return
    _take_usage(call, parsed.get("usage"))
    choice = (parsed.get("choices") or [{}])[0]
    call.finish_reason = choice.get("finish_reason")
    for tool_call in (choice.get("message") or {}).get("tool_calls") or []:
        fn = tool_call.get("function") or {}
        call.tool_calls.append(f"{fn.get('name')}({(fn.get('arguments') or '')[:120]})")


def _take_usage(call: UpstreamCall, usage: Any) -> None:
    if isinstance(usage, dict):
        call.prompt_tokens = usage.get("prompt_tokens")
        call.completion_tokens = usage.get("completion_tokens")


class _Events:
    """Reads a relayed SSE stream on the side: usage, finish reason, tool calls, an error event."""

    def __init__(self, call: UpstreamCall) -> None:
        self.call = call
        self.buffer = b""
        self.calls: dict[int, list[str]] = {}

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                continue
            try:
                event = json.loads(payload)
            except ValueError:
                continue
            if "error" in event:
                self.call.error = json.dumps(event["error"])[:500]
                continue
            _take_usage(self.call, event.get("usage"))
            for choice in event.get("choices") or []:
                self.call.finish_reason = choice.get("finish_reason") or self.call.finish_reason
                for delta in (choice.get("delta") or {}).get("tool_calls") or []:
                    name_args = self.calls.setdefault(delta.get("index", 0), ["", ""])
                    fn = delta.get("function") or {}
                    name_args[0] += fn.get("name") or ""
                    name_args[1] += fn.get("arguments") or ""

    def close(self) -> None:
        self.call.tool_calls = [f"{name}({args[:120]})" for name, args in self.calls.values()]


# A reply that is nothing but {"name": ..., "arguments": {...}} objects, maybe in ``` fences.
FENCE = re.compile(r"```(?:json)?")


def _offered_tools(data: bytes) -> set[str]:
    try:
        tools = json.loads(data).get("tools") or []
    except (ValueError, AttributeError):
        return set()
    return {(t.get("function") or {}).get("name") for t in tools if isinstance(t, dict)} - {None}


def untagged_calls(content: str | None, offered: set[str]) -> list[dict[str, Any]]:
    """The calls of offered tools that a reply's text spells out from its first character: calls of
    tools it invented are left out, and so is what follows the last whole object (a reply cut at
    `max_tokens` mid-object). [] when the text does not start with such an object."""
    text = FENCE.sub(" ", content or "").strip()
    decoder, position, calls = json.JSONDecoder(), 0, []
    while position < len(text):
        try:
            spelled, position = decoder.raw_decode(text, position)
        except ValueError:
            break
        if not isinstance(spelled, dict) or not isinstance(spelled.get("name"), str):
            break
        arguments = spelled.get("arguments", {})
        if spelled["name"] in offered:
            calls.append({"name": spelled["name"], "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)})
        while position < len(text) and text[position].isspace():
            position += 1
    return calls


def _tool_calls(call: UpstreamCall, functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"index": i, "id": f"call_{call.index}_{i}", "type": "function", "function": f} for i, f in enumerate(functions)]


def _rewrite_body(call: UpstreamCall, body: bytes, offered: set[str]) -> bytes:
    try:
        parsed = json.loads(body)
        choice = parsed["choices"][0]
        message = choice["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        return body
    functions = [] if message.get("tool_calls") else untagged_calls(message.get("content"), offered)
    if not functions:
        return body
    call.rewrote_untagged_call = True
    calls = [{k: v for k, v in c.items() if k != "index"} for c in _tool_calls(call, functions)]
    choice["message"] = {"role": "assistant", "content": None, "tool_calls": calls}
    choice["finish_reason"] = "tool_calls"
    return json.dumps(parsed).encode()


def _rewrite_stream(call: UpstreamCall, stream: bytes, offered: set[str]) -> bytes:
    events = []
    for line in stream.split(b"\n"):
        if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
            try:
                events.append(json.loads(line[5:].strip()))
            except ValueError:
                return stream
    content = "".join((c.get("delta") or {}).get("content") or "" for e in events for c in e.get("choices") or [])
    has_calls = any((c.get("delta") or {}).get("tool_calls") for e in events for c in e.get("choices") or [])
    functions = [] if has_calls or not events else untagged_calls(content, offered)
    if not functions:
        return stream
    call.rewrote_untagged_call = True
    head = {k: events[0][k] for k in ("id", "object", "created", "model") if k in events[0]}
    out = [
        head | {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}]},
        *(head | {"choices": [{"index": 0, "delta": {"tool_calls": [delta]}, "finish_reason": None}]}
          for delta in _tool_calls(call, functions)),
        head | {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
    ]
    out += [head | {"choices": [], "usage": e["usage"]} for e in events if e.get("usage")]
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in out) + b"data: [DONE]\n\n"
