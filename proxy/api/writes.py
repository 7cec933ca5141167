"""The JSON body of an admin API write (POST an inbox message, PUT a knowledge document), checked
field by field. Where the request may come from, and that it says JSON, the guard checked first
(proxy/guard.py: the Host, the Origin, JSON-only writes under our own paths)."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from ..errors import InvalidRequest


async def json_body(request: web.Request, fields: dict[str, type], required: set[str]) -> dict[str, Any]:
    """The request's JSON object, holding only `fields` (name -> type) and every one of `required`."""
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
