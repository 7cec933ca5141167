"""POST /v1/chat/completions: identify, persist, rewrite, forward, persist the reply, hand it back.

A turn's new messages are written as pending before anything is forwarded. They join the live
transcript only once the upstream's reply has come back whole (or the client walked away from a
stream the upstream was answering); a refusal or failure marks them failed, so the live
transcript is as it was and the attempt stays in the trajectory.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiohttp import web

from ..errors import InvalidRequest, ProxyError, UpstreamStreamBroken
from ..history import TurnPlan, plan_full_history, plan_proxy_history
from ..identity import ConversationKey, derived_conversation_id, explicit_conversation_id, request_tenant
from ..messages import Message, reply_message, validate_messages
from ..pipeline import Turn
from ..state import CONVERSATION, PIPELINE, SETTINGS, STORE, UPSTREAM
from ..store import INCOMPLETE, LIVE, Store
from ..turns import TurnWriter
from ..upstream import UpstreamReply, forwardable
from ..upstream.sse import ReplyAssembler, SSEParser

log = logging.getLogger("proxy.chat")

HISTORY_HEADER = "X-History"
# Our own request headers: meant for the proxy, never forwarded upstream.
OWN_HEADERS = frozenset({"x-history", "x-context-profile", "x-compaction"})


async def read_json_object(request: web.Request) -> dict[str, Any]:
    raw = await request.read()  # bounded by the app's client_max_size: 413 above it
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise InvalidRequest(f"Request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise InvalidRequest("Request body must be a JSON object", code="invalid_json")
    return body


def history_mode(request: web.Request, default: str) -> str:
    mode = request.headers.get(HISTORY_HEADER, default).strip().lower()
    if mode not in ("full", "proxy"):
        raise InvalidRequest(f"{HISTORY_HEADER} must be 'full' or 'proxy'", param=HISTORY_HEADER)
    return mode


async def chat_completions(request: web.Request) -> web.StreamResponse:
    settings = request.app[SETTINGS]
    store = request.app[STORE]
    body = await read_json_object(request)
    if "messages" not in body:
        raise InvalidRequest("'messages' is a required property", param="messages")
    messages = validate_messages(body["messages"])
    mode = history_mode(request, settings.conversation.history)
    tenant = request_tenant(request, settings.conversation)
    conversation_id = explicit_conversation_id(request, settings.conversation)
    if conversation_id is None:
        if mode == "proxy":
            raise InvalidRequest(
                f"{HISTORY_HEADER}: proxy needs a conversation id ({settings.conversation.id_header} header "
                "or a /c/<id>/v1 base URL)",
                code="conversation_id_required",
            )
        conversation_id = derived_conversation_id(tenant, messages)
    key = ConversationKey(tenant, conversation_id)
    request[CONVERSATION] = key

    async with store.lock(key):
        turn = TurnWriter(store, key, await _plan(store, key, mode, messages))
        try:
            return await _forward(request, body, turn)
        finally:
            await turn.settled()  # the next turn of this conversation must see every write of this one


async def _forward(request: web.Request, body: dict[str, Any], turn: TurnWriter) -> web.StreamResponse:
    await turn.begin()
    try:
        outgoing = await request.app[PIPELINE](Turn(turn.key, body, turn.store), turn.plan.upstream)
        id_header = request.app[SETTINGS].conversation.id_header.lower()
        headers = forwardable(request.headers, drop=OWN_HEADERS | {id_header})
        reply = await request.app[UPSTREAM].chat({**body, "messages": outgoing}, headers)
    except BaseException:
        await turn.fail()
        raise
    if not 200 <= reply.status < 300:
        return await _relay_refusal(reply, turn)
    if reply.is_event_stream:
        return await _relay_stream(request, reply, turn)
    return await _relay_body(reply, turn)


async def _plan(store: Store, key: ConversationKey, mode: str, messages: list[Message]) -> TurnPlan:
    conversation = await store.get(key)
    if mode == "full":
        return plan_full_history(messages, conversation)
    live = await store.messages(key, live_only=True) if conversation else []
    return plan_proxy_history(messages, live)


def _headers(reply: UpstreamReply, key: ConversationKey) -> dict[str, str]:
    headers = dict(forwardable(reply.headers))
    headers["X-Conversation-ID"] = key.id
    return headers


async def _relay_refusal(reply: UpstreamReply, turn: TurnWriter) -> web.Response:
    """The upstream's own 4xx/5xx goes back as it came; the turn is marked failed."""
    try:
        data = await reply.read()
    finally:
        reply.close()
        await turn.fail()
    return web.Response(body=data, status=reply.status, headers=_headers(reply, turn.key))


async def _relay_body(reply: UpstreamReply, turn: TurnWriter) -> web.Response:
    try:
        data = await reply.read()
    except BaseException:
        await turn.fail()
        raise
    finally:
        reply.close()
    await turn.accept(_first_choice(data))
    return web.Response(body=data, status=reply.status, headers=_headers(reply, turn.key))


def _first_choice(data: bytes) -> Message | None:
    try:
        return reply_message(json.loads(data)["choices"][0]["message"])
    except (ValueError, KeyError, IndexError, TypeError):
        log.warning("upstream 2xx reply without choices[0].message; nothing to persist")
        return None


async def _relay_stream(request: web.Request, reply: UpstreamReply, turn: TurnWriter) -> web.StreamResponse:
    """Forward each chunk the moment it arrives, assembling the reply on the side."""
    response = web.StreamResponse(status=reply.status, headers=_headers(reply, turn.key))
    parser, assembler = SSEParser(), ReplyAssembler()
    broken: ProxyError | None = None
    try:
        await response.prepare(request)
        async for chunk in reply.chunks():
            for payload in parser.feed(chunk):
                assembler.feed(payload)
            await response.write(chunk)
    except (ConnectionResetError, asyncio.CancelledError):
        # The client went away (aiohttp cancels the handler when it notices). The upstream did
        # accept the turn, so the request stays; the reply is kept whole if it was, else incomplete.
        finished = assembler.complete or assembler.done
        await turn.accept(None if assembler.empty else assembler.message(), LIVE if finished else INCOMPLETE)
        if not finished:
            log.info("client went away mid-stream", extra={"conversation": str(turn.key)})
        raise
    except ProxyError as exc:
        broken = exc
    finally:
        reply.close()

    if broken is None and not (assembler.complete or assembler.done):
        broken = UpstreamStreamBroken("Upstream stream ended before the reply was complete")
    if broken is not None:
        await turn.keep_partial(None if assembler.empty else assembler.message())
        await _write_quietly(response, b"data: " + json.dumps(broken.body()).encode() + b"\n\n")
    else:
        await turn.accept(assembler.message())
    await _write_quietly(response, None)
    return response


async def _write_quietly(response: web.StreamResponse, data: bytes | None) -> None:
    try:
        if data is None:
            await response.write_eof()
        else:
            await response.write(data)
    except ConnectionResetError:
        pass
