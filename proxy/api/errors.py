"""The one boundary that answers every failure as JSON in the client's API shape (OpenAI's, or
its route's wire format's: Anthropic's on /v1/messages, Google's on a Gemini route), never a
traceback. The exceptions themselves are plain (proxy/errors.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

from ..errors import BodyTooLarge, InternalError, ProxyError

log = logging.getLogger("proxy.errors")

ErrorShape = Callable[[ProxyError], dict[str, Any]]
# The error shape of each managed route's wire format, by the handler the route resolves to.
# aiohttp resolves the route before any middleware runs, so what the proxy refuses before the
# handler (the guard, a body too large or too slow, a busy proxy) answers in the client's shape.
ROUTE_ERROR_SHAPES = web.AppKey("route_error_shapes", dict)


class HTTPRefusal(ProxyError):
    """One of aiohttp's own refusals (the router's 404 or 405, ...), in the client's shape."""

    def __init__(self, exc: web.HTTPException) -> None:
        super().__init__(exc.reason, code=exc.reason.lower().replace(" ", "_"))
        self.status = exc.status


def add_error_shape(app: web.Application, handler: Callable[..., Any], shape: ErrorShape) -> None:
    """Answer every error of `handler`'s route in `shape` (a wire format's, e.g. Anthropic's)."""
    app.setdefault(ROUTE_ERROR_SHAPES, {})[handler] = shape


def error_shape(request: web.Request) -> ErrorShape | None:
    """The shape the request's errors take: its route's; None: OpenAI's."""
    return request.app.get(ROUTE_ERROR_SHAPES, {}).get(request.match_info.handler)


def error_response(exc: ProxyError, shape: ErrorShape | None = None) -> web.Response:
    return web.json_response(shape(exc) if shape is not None else exc.body(), status=exc.status)


@web.middleware
async def error_boundary(request: web.Request, handler: Any) -> web.StreamResponse:
    """Outermost middleware: every failure leaves as JSON in the client's API shape (OpenAI's,
    or the route's wire format's), never a traceback."""
    try:
        return await handler(request)
    except ProxyError as exc:
        return error_response(exc, error_shape(request))
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(BodyTooLarge(f"Request body too large: {exc.text}"), error_shape(request))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(HTTPRefusal(exc), error_shape(request))
    except Exception:
        log.exception("unhandled error", extra={"path": request.path})
        return error_response(InternalError("Internal proxy error"), error_shape(request))
