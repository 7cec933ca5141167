"""What every write of the admin API checks first (POST an inbox message, PUT a knowledge document):
a JSON body, sent from this origin.

JSON only, by content type: a browser sends a cross-site JSON request only after a CORS preflight
this server never grants, and a plain HTML form can't send one, so another site can't make a
visitor's browser write here (with no admin token set, a loopback browser is the admin). An
`Origin` header naming another host is refused outright, for the same reason.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import orjson
from aiohttp import web

from ..errors import InvalidRequest, ProxyError


class UnsupportedMediaType(ProxyError):
    status = 415
    code = "unsupported_media_type"


class ForeignOrigin(ProxyError):
    status = 403
    code = "foreign_origin"


async def json_body(request: web.Request, fields: dict[str, type], required: set[str]) -> dict[str, Any]:
    """The request's JSON object, holding only `fields` (name -> type) and every one of `required`."""
    origin = request.headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc != request.host:
        raise ForeignOrigin("Writes are accepted from this proxy's own origin only")
    if request.content_type != "application/json":
        raise UnsupportedMediaType("The body must be JSON, sent with Content-Type: application/json")
    try:
        body = orjson.loads(await request.read())
    except ValueError as exc:
        raise InvalidRequest(f"Request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise InvalidRequest("Request body must be a JSON object", code="invalid_json")
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise InvalidRequest(f"Unknown field {unknown[0]!r}", param=unknown[0])
    for name in sorted(required - set(body)):
        raise InvalidRequest(f"Missing required field {name!r}", param=name)
    for name, value in body.items():
        kind = fields[name]
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):  # JSON true is no int
            raise InvalidRequest(f"Field {name!r} has the wrong type", param=name)
    return body
