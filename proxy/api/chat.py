"""POST /v1/chat/completions: check the request, find its conversation and profile, and run the
turn under the conversation's lock (one turn at a time per conversation).

A turn's new messages are written as pending before anything is forwarded. They join the live
transcript only once the upstream's reply has come back whole (or the client walked away from a
stream the upstream was answering); a refusal or failure marks them failed, so the live
transcript is as it was and the attempt stays in the trajectory (see turns.py, exchange.py).
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from ..compaction import CompactionJob
from ..config import ContextSettings, Profile, Settings
from ..errors import InvalidRequest
from ..history import TurnPlan, plan_full_history, plan_proxy_history
from ..identity import ConversationKey, derived_conversation_id, explicit_conversation_id, request_tenant
from ..messages import MAX_DEPTH, Message, too_deep
from ..pipeline import Turn
from ..quota import QuotaLedger
from ..request_limits import check_message_count, parse_json, validated_hashes
from ..state import COMPACTION, CONVERSATION, COUNTER, PIPELINE, PREFIXES, REFS, ROUTER, SETTINGS, STORE, SUMMARIZER
from ..store import Conversation, Store
from ..turns import TurnWriter
from ..upstream import forwardable
from .exchange import Exchange

log = logging.getLogger("proxy.chat")

HISTORY_HEADER = "X-History"
PROFILE_HEADER = "X-Context-Profile"
COMPACTION_HEADER = "X-Compaction"
# Our own request headers: meant for the proxy, never forwarded upstream.
OWN_HEADERS = frozenset({"x-history", "x-context-profile", "x-compaction"})


async def read_json_object(request: web.Request) -> dict[str, Any]:
    raw = await request.read()  # bounded by the app's client_max_size: 413 above it
    try:
        body = await parse_json(raw, request.app[SETTINGS].server.max_messages)  # orjson, off the loop if large
    except ValueError as exc:
        raise InvalidRequest(f"Request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise InvalidRequest("Request body is nested too deeply", code="invalid_json") from None
    if not isinstance(body, dict):
        raise InvalidRequest("Request body must be a JSON object", code="invalid_json")
    # The messages are checked as they are validated (only the new ones); here, the rest.
    if too_deep({k: v for k, v in body.items() if k != "messages"}, MAX_DEPTH):
        raise InvalidRequest("Request body is nested too deeply", code="invalid_json")
    return body


def compaction_control(request: web.Request) -> str | None:
    """`X-Compaction: force` compacts before this request; `skip` starts no compaction for it."""
    control = request.headers.get(COMPACTION_HEADER)
    if control is None:
        return None
    control = control.strip().lower()
    if control not in ("force", "skip"):
        raise InvalidRequest(f"{COMPACTION_HEADER} must be 'force' or 'skip'", param=COMPACTION_HEADER)
    return control


def history_mode(request: web.Request, default: str) -> str:
    mode = request.headers.get(HISTORY_HEADER, default).strip().lower()
    if mode not in ("full", "proxy"):
        raise InvalidRequest(f"{HISTORY_HEADER} must be 'full' or 'proxy'", param=HISTORY_HEADER)
    return mode


async def chat_completions(request: web.Request) -> web.StreamResponse:
    app = request.app
    settings = app[SETTINGS]
    store = app[STORE]
    body = await read_json_object(request)
    if "messages" not in body:
        raise InvalidRequest("'messages' is a required property", param="messages")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise InvalidRequest("'messages' must be an array of message objects", param="messages")
    check_message_count(messages, settings.server.max_messages)
    mode = history_mode(request, settings.conversation.history)
    profile = request_profile(request, settings, body)
    control = compaction_control(request)
    tenant = request_tenant(request, settings.conversation)
    conversation_id = explicit_conversation_id(request, settings.conversation)
    if conversation_id is None:
        if mode == "proxy":
            raise InvalidRequest(
                f"{HISTORY_HEADER}: proxy needs a conversation id ({settings.conversation.id_header} header "
                "or a /c/<id>/v1 base URL)",
                code="conversation_id_required",
            )
        conversation_id = derived_conversation_id(tenant, messages)
    key = ConversationKey(tenant, conversation_id)
    # Messages identical to the last request's need no checking or hashing again (see prefix.py).
    prefix = app[PREFIXES]
    known = prefix.known_prefix(key, messages)
    hashes = known + await validated_hashes(messages, len(known), size=len(await request.read()))
    prefix.remember(key, messages, hashes, size=len(await request.read()))  # aiohttp keeps the bytes read
    request[CONVERSATION] = key
    headers = dict(forwardable(request.headers, drop=OWN_HEADERS | {settings.conversation.id_header.lower()}))

    async with store.lock(key):
        conversation = await store.get(key)
        writer = TurnWriter(store, key, await _plan(store, key, mode, messages, hashes, conversation))
        ledger = QuotaLedger(
            profile.quota,
            call_number=(conversation.llm_calls if conversation else 0) + 1,
            first_forwarded=dict(conversation.first_forwarded) if conversation else {},
        )
        turn = Turn(key, body, store, profile, app[COUNTER], app[REFS], ledger, app[SUMMARIZER], headers)
        runner = app[COMPACTION]
        job = CompactionJob(
            key, profile, app[SUMMARIZER].model_for(turn.model), headers, ledger.figures(None), force=control == "force"
        )
        if control == "force" or (control != "skip" and not profile.compaction.background):
            await runner.run_now(job)  # before forwarding: this request already uses the new summary
        turn.summary = await runner.current_summary(job)
        try:
            upstream = app[ROUTER].for_model(turn.model)
            response = await Exchange(request, body, writer, turn, app[PIPELINE], upstream).run()
        finally:
            await writer.settled()  # the next turn of this conversation must see every write of this one
    if control is None and profile.compaction.background and 200 <= response.status < 300:
        runner.schedule(job)  # after the reply: never on the request's critical path
    return response


def request_profile(request: web.Request, settings: Settings, body: dict[str, Any]) -> Profile:
    """`X-Context-Profile`, else the model's entry in `models:`, else the defaults; unknown is a 400."""
    model = settings.models.get(str(body.get("model") or ""))
    name = request.headers.get(PROFILE_HEADER) or (model.profile if model else None)
    profile = settings.profile(name)
    if profile is None:
        raise InvalidRequest(f"Unknown context profile {name!r}", param=PROFILE_HEADER, code="unknown_profile")
    if model is not None and model.history_token_limit is not None:
        profile = profile.model_copy(update={"context": ContextSettings(history_token_limit=model.history_token_limit)})
    return profile


async def _plan(
    store: Store,
    key: ConversationKey,
    mode: str,
    messages: list[Message],
    hashes: list[str],
    conversation: Conversation | None,
) -> TurnPlan:
    if mode == "full":
        return plan_full_history(messages, hashes, conversation)
    live = await store.messages(key, live_only=True) if conversation else []
    return plan_proxy_history(messages, hashes, live)
