"""`POST /v1/messages/count_tokens`: the input tokens of the prompt the proxy would really send.

Claude Code sizes its own compaction from these counts, so they must be the managed prompt's
(long tool results shortened, the window, the summary, a waiting inbox message), not the raw
transcript's. The engine works that prompt out without writing anything (`Engine.dry_run`; a
count of something on its own, a tool result or the tool list, is counted as a new conversation
would send it); the Anthropic API counts it, or, for a model served through litellm, the proxy's
own counter does (the count the window uses). Errors are Anthropic's shape, as on /v1/messages.
"""

from __future__ import annotations

from aiohttp import web

from ..dialects.messages import MESSAGES
from ..state import ENGINE, ROUTER, UPSTREAM
from ..upstream import UpstreamReply, forwardable
from .errors import add_error_shape
from .turns import ResponseSink, turn_request


async def count_tokens(request: web.Request) -> web.Response:
    app = request.app
    turn = await turn_request(request, MESSAGES)
    managed = await app[ENGINE].dry_run(turn, ResponseSink(request))
    headers = managed.report.headers()
    if app[ROUTER].is_litellm(managed.report.model):
        return web.json_response({"input_tokens": managed.report.tokens_sent or 0}, headers=headers)
    return await relayed(await app[UPSTREAM].count_tokens(managed.body, managed.headers, turn.query), headers)


async def relayed(reply: UpstreamReply, headers: dict[str, str]) -> web.Response:
    """The upstream's count as it came, with the turn's own headers."""
    try:
        data = await reply.read()
    finally:
        reply.close()
    return web.Response(body=data, status=reply.status, headers={**forwardable(reply.headers), **headers})


def add_routes(app: web.Application) -> None:
    add_error_shape(app, count_tokens, MESSAGES.error_body)
    for prefix in ("", "/c/{conversation_id}"):
        app.router.add_post(prefix + "/v1/messages/count_tokens", count_tokens)
