"""Every path the proxy does not handle itself goes upstream untouched, streamed both ways: to
the Anthropic API when the request is an Anthropic client's (it carries `anthropic-version`), to
the Gemini API when it is a Gemini client's (a `/v1beta/` path, or an `x-goog-api-key`), else to
the OpenAI-compatible base URL."""

from __future__ import annotations

import logging
from urllib.parse import unquote

from aiohttp import web

from ..errors import InvalidRequest, ProxyError
from ..identity import check_conversation_id
from ..state import QUERY_API_KEY, UPSTREAM
from ..upstream import forwardable
from .turns import OWN_HEADERS

log = logging.getLogger("proxy.passthrough")
ANTHROPIC_VERSION = "anthropic-version"
GEMINI_KEY = "x-goog-api-key"


async def passthrough(request: web.Request) -> web.StreamResponse:
    # The path goes upstream as the client encoded it (HttpUpstream.url checks that it stays in
    # the base path): decoding it here would turn a `%3F` into a query and `%2e%2e` into `..`.
    path = request.raw_path
    # Under /c/<id>/..., the conversation prefix is ours: strip it before forwarding.
    if "conversation_id" in request.match_info:
        conversation_id = check_conversation_id(request.match_info["conversation_id"])
        prefix, _, rest = path.removeprefix("/c/").partition("/")
        if unquote(prefix) != conversation_id:  # the id itself held an encoded '/'
            raise InvalidRequest("Invalid path: a conversation id has no '/'", code="invalid_path")
        path = "/" + rest
    data = await request.read() if request.body_exists else None
    upstream = request.app[UPSTREAM]
    # An Anthropic or Gemini client's other paths (batches, models, files...) go to its API.
    if ANTHROPIC_VERSION in request.headers:
        send = upstream.send_anthropic
    elif path.startswith("/v1beta/") or GEMINI_KEY in request.headers or QUERY_API_KEY in request:
        send = upstream.send_gemini
    else:
        send = upstream.send
    reply = await send(request.method, path, forwardable(request.headers, drop=OWN_HEADERS), data)
    try:
        response = web.StreamResponse(status=reply.status, headers=forwardable(reply.headers))
        await response.prepare(request)
        try:
            async for chunk in reply.chunks():
                await response.write(chunk)
            await response.write_eof()
        except ProxyError as exc:
            # Headers are gone already: cutting the connection is the only honest signal left.
            log.warning("upstream broke off a passthrough body: %s", exc.message)
            if request.transport is not None:
                request.transport.close()
        except ConnectionResetError:
            pass
        return response
    finally:
        reply.close()
