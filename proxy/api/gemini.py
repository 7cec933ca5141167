"""The Gemini API's routes, `/{v1beta|v1}/models/{model}:{method}` (also under `/c/<id>`):
`generateContent` and `streamGenerateContent?alt=sse` are managed turns, `countTokens` counts
the prompt the proxy would really send (as Messages' count_tokens does), every other method goes
to the Gemini API untouched.

The model and whether the reply streams are in the URL: the turn's dialect is bound to them. A
client's `?key=` names its tenant as `x-goog-api-key` does, and goes upstream as it came. A
stream asked for without `alt=sse` (a JSON array, not events) is passed through unmanaged.
"""

from __future__ import annotations

from urllib.parse import quote

import orjson
from aiohttp import web

from ..dialects.gemini import GEMINI, METHODS
from ..state import ENGINE, QUERY_API_KEY, ROUTER, UPSTREAM
from .errors import add_error_shape
from .count_tokens import relayed
from .passthrough import GEMINI_KEY, passthrough
from .turns import ResponseSink, run_turn, turn_request

VERSIONS = "v1beta|v1|v1alpha"


async def gemini_route(request: web.Request) -> web.StreamResponse:
    if "key" in request.query and GEMINI_KEY not in request.headers:
        request[QUERY_API_KEY] = request.query["key"]
    version, model, method = (request.match_info[k] for k in ("version", "model", "method"))
    stream = METHODS.get(method)
    if stream is not None and (not stream or request.query.get("alt") == "sse"):
        return await run_turn(request, GEMINI.bound(model, stream, version))
    if method == "countTokens":
        return await count_tokens(request, model, version)
    return await passthrough(request)


async def count_tokens(request: web.Request, model: str, version: str) -> web.StreamResponse:
    """The managed prompt's tokens: the Gemini API counts it (as a `generateContentRequest`: its
    system instruction and tools count too), or for a model served through litellm the proxy's
    own counter does (the count the window uses). A request already in that form is passed on."""
    try:
        body = orjson.loads(await request.read())
    except ValueError:
        body = None
    if not isinstance(body, dict) or "contents" not in body or "generateContentRequest" in body:
        return await passthrough(request)
    app = request.app
    turn = await turn_request(request, GEMINI.bound(model, False, version))
    managed = await app[ENGINE].dry_run(turn, ResponseSink(request))
    headers = managed.report.headers()
    if app[ROUTER].is_litellm(model):
        return web.json_response({"totalTokens": managed.report.tokens_sent or 0}, headers=headers)
    counted = {"generateContentRequest": {"model": f"models/{model}", **managed.body}}
    path = f"/{version}/models/{quote(model, safe='-._~')}:countTokens"
    return await relayed(await app[UPSTREAM].gemini_post(path, counted, managed.headers, turn.query), headers)


def add_routes(app: web.Application) -> None:
    add_error_shape(app, gemini_route, GEMINI.error_body)
    for prefix in ("", "/c/{conversation_id}"):
        app.router.add_post(prefix + "/{version:%s}/models/{model}:{method}" % VERSIONS, gemini_route)
