"""The admin API: conversations, their live transcript and their whole trajectory.

Who sees what: the admin token (configured as `admin.token`, else the one the proxy made and
keeps in its store folder: proxy/admin_token.py) sees every tenant; any other Bearer is a client
key and sees only its own tenant's conversations. Being on loopback grants nothing. With
`conversation.tenant_isolation: false` every key is the one tenant `shared`, so a client key
would be every key's: then only the admin token has this API at all.

The list can be narrowed to conversations with a failed turn (`?failed=true`, from the store's
own index) and searched (`?q=words`: every word must appear, case-insensitively, in the id,
title, task, model or client). A search reads at most SEARCH_SCAN conversations per page, newest
first; its page then says where to go on (`next_after`), so no request reads a whole store.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from ..errors import InvalidRequest, NotFound, ProxyError, Unauthorized
from ..identity import ConversationKey, bearer_token, check_conversation_id, tenant_of
from ..request_parts import current_parts
from ..state import ADMIN_TOKEN, REFS, SETTINGS, STORE, TRAJECTORIES
from ..store import SYSTEM_PART, TOOLS_PART, Conversation, StoredMessage
from ..store.search import DEFAULT_HITS, MAX_HITS
from ..titles import check_title
from ..trajectory import build_trajectory, conversation_codec
from ..transcript import Role

ALL_TENANTS = None
SEARCH_SCAN = 2000  # conversations one search page reads at most
SEARCH_BATCH = 200  # ... from the store this many at a time
MAX_QUERY_CHARS = 200
MAX_HISTORY_QUERY_CHARS = 500  # a search of one conversation's messages: a sentence or two


class AdminTokenRequired(ProxyError):
    """A client key where only the admin token will do (tenant isolation off: no key is anyone's own)."""

    status = 403
    type = "permission_error"
    code = "admin_token_required"


def caller_scope(request: web.Request) -> str | None:
    """The tenant the caller may see, or ALL_TENANTS for the admin."""
    token = bearer_token(request.headers)
    if token is None:
        raise Unauthorized(
            "The admin API needs 'Authorization: Bearer <admin token or your API key>' (the admin token is "
            "admin.token, or the one in the store folder's admin-token file, printed at start-up)"
        )
    if request.app[ADMIN_TOKEN].matches(token):
        return ALL_TENANTS
    if not request.app[SETTINGS].conversation.tenant_isolation:
        raise AdminTokenRequired(
            "With conversation.tenant_isolation off every key shares one tenant: only the admin token may use this API"
        )
    return tenant_of(token)


def _limit(request: web.Request, default: int, maximum: int) -> int:
    raw = request.query.get("limit", str(default))
    if not raw.isdigit() or not 1 <= int(raw) <= maximum:
        raise InvalidRequest(f"limit must be an integer between 1 and {maximum}", param="limit")
    return int(raw)


def _page(data: list[dict[str, Any]], has_more: bool, id_key: str = "id") -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "first_id": data[0][id_key] if data else None,
        "last_id": data[-1][id_key] if data else None,
        "has_more": has_more,
    }


async def _conversation(request: web.Request) -> Conversation:
    """The conversation named in the path, as the caller may see it; 404 for anything else."""
    conversation_id = check_conversation_id(request.match_info["conversation_id"])
    scope = caller_scope(request)
    store = request.app[STORE]
    if scope is not ALL_TENANTS:
        found = await store.get(ConversationKey(scope, conversation_id))
        candidates = [found] if found else []
    else:
        candidates = await store.find(conversation_id)
        tenant = request.query.get("tenant")
        if tenant:
            candidates = [c for c in candidates if c.key.tenant.startswith(tenant)]
        if len(candidates) > 1:
            raise InvalidRequest("Several tenants have this conversation id: add ?tenant=<tenant>", param="tenant")
    if not candidates:
        raise NotFound(f"No conversation found with id '{conversation_id}'")
    return candidates[0]


def _flag(request: web.Request, name: str) -> bool:
    raw = request.query.get(name, "false").lower()
    if raw not in ("true", "false", "1", "0"):
        raise InvalidRequest(f"{name} must be true or false", param=name)
    return raw in ("true", "1")


def _search_words(request: web.Request) -> list[str]:
    text = request.query.get("q", "").strip()
    if len(text) > MAX_QUERY_CHARS:
        raise InvalidRequest(f"q must be at most {MAX_QUERY_CHARS} characters", param="q")
    return text.lower().split()


def _matches(conversation: Conversation, words: list[str]) -> bool:
    c = conversation
    searched = " ".join(v for v in (c.key.id, c.title, c.task, c.model, c.client) if v).lower()
    return all(word in searched for word in words)


async def list_conversations(request: web.Request) -> web.Response:
    scope = caller_scope(request)
    after = request.query.get("after")
    limit = _limit(request, 20, 100)
    failed = _flag(request, "failed")
    words = _search_words(request)
    store = request.app[STORE]
    if not words:
        page, has_more = await store.list_conversations(scope, after=after, limit=limit, failed=failed)
        return web.json_response(_page([c.to_api() for c in page], has_more))
    found: list[Conversation] = []
    scanned, cursor, more = 0, after, True
    while more and len(found) <= limit and scanned < SEARCH_SCAN:
        batch, more = await store.list_conversations(scope, after=cursor, limit=SEARCH_BATCH, failed=failed)
        for conversation in batch:
            scanned += 1
            cursor = conversation.key.id
            if _matches(conversation, words):
                found.append(conversation)
                if len(found) > limit:
                    break
        if not batch:
            break
    if len(found) > limit:  # the next page starts after this page's last match
        next_after: str | None = found[limit - 1].key.id
    else:  # the scan ran out first (the store has more) or reached the end
        next_after = cursor if more else None
    page = _page([c.to_api() for c in found[:limit]], next_after is not None)
    page["next_after"] = next_after
    return web.json_response(page)


async def get_conversation(request: web.Request) -> web.Response:
    """The conversation, with the system prompt and tools its newest turn sent besides its
    transcript (Messages' `system`, Responses' `instructions`; null: none, or chat's, a message)."""
    conversation = await _conversation(request)
    current = await current_parts(request.app[STORE], conversation)
    shown = {kind: part.value if (part := current.get(kind)) else None for kind in (SYSTEM_PART, TOOLS_PART)}
    return web.json_response({**conversation.to_api(), **shown})


async def update_conversation(request: web.Request) -> web.Response:
    """`PATCH {"title": "..."}`: name a conversation (null: no name of its own, its task's words again)."""
    conversation = await _conversation(request)  # (a body that is not application/json: the guard's 415)
    try:
        body = orjson.loads(await request.read())
    except ValueError:
        raise InvalidRequest("The body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict) or set(body) != {"title"}:
        raise InvalidRequest('The body must be {"title": "..."}: only the title can be changed', param="title")
    title = check_title(body["title"], "title")
    updated = await request.app[STORE].set_title(conversation.key, title)
    if updated is None:  # deleted meanwhile
        raise NotFound(f"No conversation found with id '{conversation.key.id}'")
    return web.json_response(updated.to_api())


def _seq_cursor(request: web.Request) -> tuple[int | None, int]:
    """A message page's `after` (a seq) and `limit`, checked."""
    after_raw = request.query.get("after")
    if after_raw is not None and not after_raw.isdigit():
        raise InvalidRequest("after must be a message seq (an integer)", param="after")
    return (int(after_raw) if after_raw else None), _limit(request, 100, 1000)


async def list_messages(request: web.Request) -> web.Response:
    conversation = await _conversation(request)
    after, limit = _seq_cursor(request)
    rows: list[StoredMessage] = await request.app[STORE].messages(
        conversation.key, live_only=True, after=after, limit=limit + 1
    )
    data = [m.to_api(with_status=False) for m in rows[:limit]]
    return web.json_response(_page(data, len(rows) > limit, id_key="seq"))


async def trajectory(request: web.Request) -> web.Response:
    """A page of every message (statuses, compacted marks, refs), with every summary, every turn
    record and the conversation record: the replayable record (see proxy/trajectory.py)."""
    conversation = await _conversation(request)
    after, limit = _seq_cursor(request)
    document = await build_trajectory(request.app[STORE], request.app[REFS], conversation, after=after, limit=limit)
    return web.Response(body=document.to_bytes(), content_type="application/json")


async def turns(request: web.Request) -> web.Response:
    """What went upstream at each turn: the window's seqs, tokens sent, left out, quota, summary."""
    conversation = await _conversation(request)
    after_raw = request.query.get("after", "0")
    if not after_raw.isdigit():
        raise InvalidRequest("after must be a turn number (an integer)", param="after")
    limit = _limit(request, 100, 1000)
    rows = await request.app[STORE].turn_records(conversation.key, after=int(after_raw), limit=limit + 1)
    return web.json_response(_page(rows[:limit], len(rows) > limit, id_key="turn"))


async def tool_output(request: web.Request) -> web.Response:
    """The full text of a shortened tool output (a chat tool message, a Responses
    function_call_output, an Anthropic tool_result: the conversation's codec says); a ref of
    another conversation or tenant is a 404."""
    conversation = await _conversation(request)
    store = request.app[STORE]
    ref = request.match_info["ref"]
    seq = request.app[REFS].seq_of(conversation.key, ref)
    stored = await store.message(conversation.key, seq) if seq is not None else None
    codec = await conversation_codec(store, conversation)
    item = codec.items([stored.message], [stored.seq], [None])[0] if stored is not None else None
    if item is None or item.role is not Role.TOOL:
        raise NotFound(f"No tool output with ref '{ref}' in this conversation")
    content = codec.text(item) or ""
    return web.json_response(
        {
            "object": "tool_output",
            "ref": ref,
            "seq": item.seq,
            "tool_call_id": item.answers,
            "length": len(content),
            "content": content,
        }
    )


async def search_conversation(request: web.Request) -> web.Response:
    """`?q=TEXT&limit=N`: the passages of the conversation's live transcript that best match,
    best first (the search the agent has as search_history); a tool output's hit names its ref."""
    conversation = await _conversation(request)
    query = request.query.get("q", "").strip()
    if not query:
        raise InvalidRequest("q must name what to search for", param="q")
    if len(query) > MAX_HISTORY_QUERY_CHARS:
        raise InvalidRequest(f"q must be at most {MAX_HISTORY_QUERY_CHARS} characters", param="q")
    limit = _limit(request, DEFAULT_HITS, MAX_HITS)
    hits = await request.app[STORE].search(conversation.key, query, limit=limit)
    refs = request.app[REFS]
    data = [
        {"seq": hit.seq, "role": hit.role, "created_at": hit.created_at, "text": hit.text,
         "ref": refs.make(conversation.key, hit.seq) if hit.role == "tool" else None}
        for hit in hits
    ]
    return web.json_response({"object": "list", "data": data})


async def delete_conversation(request: web.Request) -> web.Response:
    conversation = await _conversation(request)
    store = request.app[STORE]
    async with store.lock(conversation.key):
        await store.delete(conversation.key)
    await request.app[TRAJECTORIES].deleted(conversation.key)
    return web.json_response({"id": conversation.key.id, "object": "conversation.deleted", "deleted": True})


def add_routes(app: web.Application) -> None:
    base = "/v1/conversations"
    app.router.add_get(base, list_conversations)
    app.router.add_get(base + "/{conversation_id}", get_conversation)
    app.router.add_delete(base + "/{conversation_id}", delete_conversation)
    app.router.add_patch(base + "/{conversation_id}", update_conversation)
    app.router.add_get(base + "/{conversation_id}/messages", list_messages)
    app.router.add_get(base + "/{conversation_id}/trajectory", trajectory)
    app.router.add_get(base + "/{conversation_id}/tool_outputs/{ref}", tool_output)
    app.router.add_get(base + "/{conversation_id}/turns", turns)
    app.router.add_get(base + "/{conversation_id}/search", search_conversation)
