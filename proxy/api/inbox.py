"""The inbox of a conversation: `POST /v1/conversations/{id}/inbox` leaves a message for the agent
running it, `GET` lists what is pending and what was delivered (and where, and in which turn).

Who may: the admin, or a client key of the conversation's own tenant (as for the rest of the
admin API: another tenant's conversation is a 404). Delivery is the inbox stage's
(proxy/pipeline/inbox.py), at the conversation's next turn.
"""

from __future__ import annotations

import time

from aiohttp import web

from ..errors import InvalidRequest, NotFound, ProxyError
from ..markers import inbox_note
from ..state import SETTINGS, STORE
from ..store import InboxFull
from .admin import _conversation, _limit, _page
from .writes import json_body


class InboxOverflow(ProxyError):
    status = 429
    type = "rate_limit_error"
    code = "inbox_full"


async def post_message(request: web.Request) -> web.Response:
    conversation = await _conversation(request)
    settings = request.app[SETTINGS].inbox
    body = await json_body(request, {"content": str}, {"content"})
    content = body["content"]
    if not content.strip():
        raise InvalidRequest("'content' must not be empty", param="content")
    if len(content) > settings.max_message_chars:
        raise InvalidRequest(
            f"'content' is longer than {settings.max_message_chars} characters (inbox.max_message_chars)",
            param="content",
        )
    try:
        message = await request.app[STORE].post_inbox(
            conversation.key, content, inbox_note(content, time.time()), settings.max_pending
        )
    except InboxFull:
        raise InboxOverflow(
            f"This conversation already holds {settings.max_pending} undelivered messages (inbox.max_pending)"
        ) from None
    if message is None:  # deleted meanwhile
        raise NotFound(f"No conversation found with id '{conversation.key.id}'")
    return web.json_response(message.to_api())


async def list_messages(request: web.Request) -> web.Response:
    conversation = await _conversation(request)
    after_raw = request.query.get("after", "0")
    if not after_raw.isdigit():
        raise InvalidRequest("after must be an inbox message id (an integer)", param="after")
    limit = _limit(request, 100, 1000)
    rows = await request.app[STORE].inbox(conversation.key, after=int(after_raw), limit=limit + 1)
    return web.json_response(_page([m.to_api() for m in rows[:limit]], len(rows) > limit))


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/conversations/{conversation_id}/inbox", post_message)
    app.router.add_get("/v1/conversations/{conversation_id}/inbox", list_messages)
