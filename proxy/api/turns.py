"""The managed routes (`/v1/chat/completions`, ...): HTTP in, a TurnRequest to the engine, HTTP out.

All a handler does is gather the request (its bytes, its headers, who is asking and the
conversation it names), hand it to the engine with a sink for streamed replies, and answer what
the engine says. Reading the body, the turn and its report are proxy/engine's.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from ..dialects.base import Dialect
from ..dialects.chat import CHAT
from ..dialects.messages import MESSAGES
from ..dialects.responses import RESPONSES
from ..engine import TurnReport, TurnRequest
from ..engine.intake import OWN_HEADERS
from ..identity import explicit_conversation_id, request_tenant
from ..logs import ACCESS_LOGGER
from ..state import CONVERSATION, ENGINE, LOG_FIELDS, QUERY_API_KEY, SETTINGS
from .errors import add_error_shape

__all__ = ["OWN_HEADERS", "ResponseSink", "managed", "run_turn", "turn_request"]

ACCESS_LOG = logging.getLogger(ACCESS_LOGGER)  # app.request_log's: the turn's fields go in its line


async def turn_request(request: web.Request, dialect: Dialect) -> TurnRequest:
    """A managed request as the engine takes it: its bytes (bounded by the app's client_max_size:
    413 above it), its headers, its tenant, the conversation it names (checked first)."""
    settings = request.app[SETTINGS]
    path_id = request.match_info.get("conversation_id")
    conversation_id = explicit_conversation_id(request.headers, path_id, settings.conversation)
    query_key = request.get(QUERY_API_KEY)
    return TurnRequest(
        dialect=dialect,
        raw=await request.read(),
        headers=request.headers,
        tenant=request_tenant(request.headers, settings.conversation, query_key),
        conversation_id=conversation_id,
        query=request.query_string,
        query_api_key=query_key,
    )


class ResponseSink:
    """ClientSink over an aiohttp StreamResponse; it names the turn's conversation in the request
    (the access log's line) once the engine knows it."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None
        self.report: TurnReport | None = None

    def began(self, report: TurnReport) -> None:
        self.report = report
        self.request[CONVERSATION] = report.key

    async def open(self, status: int, headers: Mapping[str, str]) -> None:
        self.response = web.StreamResponse(status=status, headers=headers)
        await self.response.prepare(self.request)
        # Each streamed chunk is written by the response itself: no coroutine of ours around it
        # (the method below, before `open`, says the response is not open yet).
        self.write = self.response.write  # type: ignore[method-assign]

    async def write(self, data: bytes) -> None:
        raise RuntimeError("write before open")

    async def close(self) -> None:
        if self.response is not None:
            await self.response.write_eof()


async def run_turn(request: web.Request, dialect: Dialect) -> web.StreamResponse:
    """One managed turn of `dialect`, from the request to its response."""
    sink = ResponseSink(request)
    try:
        outcome = await request.app[ENGINE].run(await turn_request(request, dialect), sink)
    finally:  # failed turns are logged too
        if sink.report is not None and ACCESS_LOG.isEnabledFor(logging.INFO):
            request[LOG_FIELDS].update(sink.report.log_fields())
    if outcome.body is None:
        assert sink.response is not None
        return sink.response
    return web.Response(body=outcome.body, status=outcome.status, headers=outcome.headers)


def managed(dialect: Dialect) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The handler of one managed wire format."""

    async def handler(request: web.Request) -> web.StreamResponse:
        return await run_turn(request, dialect)

    return handler


chat_completions = managed(CHAT)
responses = managed(RESPONSES)
messages = managed(MESSAGES)


def add_routes(app: web.Application) -> None:
    for handler, dialect in ((chat_completions, CHAT), (responses, RESPONSES), (messages, MESSAGES)):
        add_error_shape(app, handler, dialect.error_body)  # the guard's refusals too, before the handler
    for prefix in ("", "/c/{conversation_id}"):
        app.router.add_post(prefix + "/v1/chat/completions", chat_completions)
        app.router.add_post(prefix + "/chat/completions", chat_completions)
        app.router.add_post(prefix + "/v1/responses", responses)
        app.router.add_post(prefix + "/responses", responses)
        app.router.add_post(prefix + "/v1/messages", messages)
