"""GET /v1/models (and /v1/models/{id}): the `models:` names merged with the upstream's own list.

Without a `models:` table these requests are plain passthrough. With one, the upstream's list is
fetched with the client's headers and ours are added to it; when the upstream is unreachable,
slow or refuses (an OpenAI key not valid there, an upstream without /models), the list holds
just ours. Either way the shape is OpenAI's: `{"object": "list", "data": [{"id", "object":
"model", "created", "owned_by"}]}`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from aiohttp import web

from ..config import ModelSettings
from ..errors import ProxyError
from ..identity import check_conversation_id
from ..state import SETTINGS, UPSTREAM
from ..upstream import forwardable
from .passthrough import passthrough
from .turns import OWN_HEADERS

log = logging.getLogger("proxy.models")

UPSTREAM_LIST_TIMEOUT_S = 10.0  # a listing is not worth a long wait: past this, ours alone


def model_object(name: str, entry: ModelSettings) -> dict[str, Any]:
    owner = (
        entry.litellm_model.split("/", 1)[0] if entry.litellm_model and "/" in entry.litellm_model else "context-proxy"
    )
    return {"id": name, "object": "model", "created": 0, "owned_by": owner}


async def list_models(request: web.Request) -> web.StreamResponse:
    models = request.app[SETTINGS].models
    if not models:
        return await passthrough(request)
    _check_prefix(request)
    theirs = await _upstream_models(request)
    by_id: dict[str, dict[str, Any]] = {}
    for item in theirs:
        by_id.setdefault(item["id"], item)
    data = []
    for name, entry in models.items():
        # A passthrough entry the upstream lists keeps the upstream's own description.
        upstream_item = by_id.pop(name, None)
        data.append(
            upstream_item if upstream_item is not None and not entry.litellm_model else model_object(name, entry)
        )
    data += by_id.values()
    return web.json_response({"object": "list", "data": data})


async def retrieve_model(request: web.Request) -> web.StreamResponse:
    models = request.app[SETTINGS].models
    name = request.match_info.get("model") or request.match_info["tail"].removeprefix("v1/models/")
    entry = models.get(name)
    if entry is None or not entry.litellm_model:
        return await passthrough(request)  # the upstream's model (or its 404)
    _check_prefix(request)
    return web.json_response(model_object(name, entry))


def _check_prefix(request: web.Request) -> None:
    if "conversation_id" in request.match_info:
        check_conversation_id(request.match_info["conversation_id"])


async def _upstream_models(request: web.Request) -> list[dict[str, Any]]:
    """The passthrough upstream's model objects; [] when it can't or won't list them."""
    upstream = request.app[UPSTREAM]
    timeout = min(UPSTREAM_LIST_TIMEOUT_S, upstream.settings.timeout_s)
    headers = forwardable(request.headers, drop=OWN_HEADERS)
    path = "/v1/models" + ("?" + request.query_string if request.query_string else "")
    try:
        async with asyncio.timeout(timeout):
            reply = await upstream.send("GET", path, headers, None)
            try:
                data = await reply.read()
            finally:
                reply.close()
    except (ProxyError, TimeoutError) as exc:
        log.info("upstream model list unavailable: %s", getattr(exc, "message", None) or type(exc).__name__)
        return []
    if reply.status != 200:
        log.info("upstream model list refused", extra={"status": reply.status})
        return []
    try:
        items = json.loads(data)["data"]
    except (ValueError, KeyError, TypeError):
        log.info("upstream model list unreadable")
        return []
    if not isinstance(items, list):
        return []
    return [item for item in items if isinstance(item, dict) and isinstance(item.get("id"), str)]


def add_routes(app: web.Application) -> None:
    """Before the passthrough catch-all (routes match in the order added). The /c/<id>/ forms name
    their rest `tail`, as the passthrough's route does, so either handler can hand them over."""
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/v1/models/{model:.+}", retrieve_model)
    app.router.add_get("/c/{conversation_id}/{tail:v1/models}", list_models)
    app.router.add_get("/c/{conversation_id}/{tail:v1/models/.+}", retrieve_model)
