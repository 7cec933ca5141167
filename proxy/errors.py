"""Our small family of exceptions and the one boundary that turns them into OpenAI-shaped JSON."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

log = logging.getLogger("proxy.errors")


class ProxyError(Exception):
    """An error answered to the client as `{"error": {"message", "type", "code", "param"}}`."""

    status = 400
    type = "invalid_request_error"
    code: str | None = None

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.code, self.param)


class InvalidRequest(ProxyError):
    status = 400


class Unauthorized(ProxyError):
    status = 401
    code = "invalid_api_key"


class NotFound(ProxyError):
    status = 404
    code = "not_found"


class Forbidden(ProxyError):
    """Refused for where the request comes from (its Host or Origin), whatever its credentials."""

    status = 403
    code = "forbidden"


class RequestTimeout(ProxyError):
    status = 408
    code = "request_timeout"


class BodyTooLarge(ProxyError):
    status = 413
    code = "request_too_large"


class UnsupportedMediaType(ProxyError):
    status = 415
    code = "unsupported_media_type"


class ServerBusy(ProxyError):
    """Every connection slot is taken by a request in flight: the client may retry shortly."""

    status = 503
    type = "server_error"
    code = "server_busy"


class UpstreamUnreachable(ProxyError):
    status = 502
    type = "upstream_error"
    code = "upstream_unreachable"


class UpstreamStreamBroken(ProxyError):
    status = 502
    type = "upstream_error"
    code = "upstream_stream_broken"


class UpstreamReplyTooLarge(ProxyError):
    """The upstream's reply (or one line of its event stream) is larger than the proxy reads."""

    status = 502
    type = "upstream_error"
    code = "upstream_reply_too_large"


class UpstreamTimeout(ProxyError):
    status = 504
    type = "upstream_error"
    code = "upstream_timeout"


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class HTTPRefusal(ProxyError):
    """One of aiohttp's own refusals (the router's 404 or 405, ...), in the client's shape."""

    def __init__(self, exc: web.HTTPException) -> None:
        super().__init__(exc.reason, code=exc.reason.lower().replace(" ", "_"))
        self.status = exc.status


class InternalError(ProxyError):
    status = 500
    type = "server_error"
    code = "internal_error"


ErrorShape = Callable[[ProxyError], dict[str, Any]]
# A handler's own error shape for the rest of its request (default: its route's, else OpenAI's).
ERROR_SHAPE = web.RequestKey("error_shape", ErrorShape)
# The error shape of each managed route's wire format, by the handler the route resolves to.
# aiohttp resolves the route before any middleware runs, so what the proxy refuses before the
# handler (the guard, a body too large or too slow, a busy proxy) answers in the client's shape.
ROUTE_ERROR_SHAPES = web.AppKey("route_error_shapes", dict)


def add_error_shape(app: web.Application, handler: Callable[..., Any], shape: ErrorShape) -> None:
    """Answer every error of `handler`'s route in `shape` (a wire format's, e.g. Anthropic's)."""
    app.setdefault(ROUTE_ERROR_SHAPES, {})[handler] = shape


def error_shape(request: web.Request) -> ErrorShape | None:
    """The shape the request's errors take: its handler's, else its route's; None: OpenAI's."""
    shape = request.get(ERROR_SHAPE)
    if shape is None:
        shape = request.app.get(ROUTE_ERROR_SHAPES, {}).get(request.match_info.handler)
    return shape


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
