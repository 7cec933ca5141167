"""Every path the proxy does not handle itself goes upstream untouched, streamed both ways."""

from __future__ import annotations

import logging

from aiohttp import web

from ..errors import ProxyError
from ..identity import check_conversation_id
from ..state import UPSTREAM
from ..upstream import forwardable
from .turns import OWN_HEADERS

log = logging.getLogger("proxy.passthrough")


async def passthrough(request: web.Request) -> web.StreamResponse:
    # Under /c/<id>/..., the conversation prefix is ours: strip it before forwarding.
    if "conversation_id" in request.match_info:
        check_conversation_id(request.match_info["conversation_id"])
        path = "/" + request.match_info["tail"]
    else:
        path = request.path
    if request.query_string:
        path += "?" + request.query_string
    data = await request.read() if request.body_exists else None
    reply = await request.app[UPSTREAM].send(request.method, path, forwardable(request.headers, drop=OWN_HEADERS), data)
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
