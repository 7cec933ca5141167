"""Our small family of exceptions, each with its HTTP status and OpenAI-shaped body.

Plain exceptions: the engine, dialects and upstreams raise them without knowing HTTP servers;
proxy/api/errors.py is the boundary that answers them (in the client's API shape).
"""

from __future__ import annotations

from typing import Any


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


class InternalError(ProxyError):
    status = 500
    type = "server_error"
    code = "internal_error"
