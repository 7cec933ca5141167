"""A turn's request read: from its bytes and headers (a TurnRequest) to what the engine works on
(a ParsedRequest). The body is parsed only where it extends the previous request of its
conversation (proxy/prefix.py's BodyCache, the fast path's first step); then the proxy's own
headers and the profile. Each check refuses with a clear InvalidRequest, in this order: the
body's JSON, its transcript's length, the title, the profile, the history mode, the compaction
control, the knowledge namespace.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..clients import client_name
from ..config import Profile, Settings, is_knowledge_namespace
from ..dialects.base import Dialect
from ..errors import InvalidRequest
from ..messages import MAX_DEPTH, too_deep
from ..prefix import BodyCache, ParsedBody, run_fingerprint
from ..request_limits import check_message_count, parse_json
from ..titles import TITLE_HEADER, check_title
from ..upstream import forwardable
from .request import ParsedRequest, TurnRequest

HISTORY_HEADER = "X-History"
PROFILE_HEADER = "X-Context-Profile"
COMPACTION_HEADER = "X-Compaction"
KNOWLEDGE_HEADER = "X-Knowledge-Namespace"
# Our own request headers: meant for the proxy, never forwarded upstream.
OWN_HEADERS = frozenset({"x-history", "x-context-profile", "x-compaction", "x-knowledge-namespace", TITLE_HEADER.lower()})


async def read_request(request: TurnRequest, settings: Settings, bodies: BodyCache) -> ParsedRequest:
    """`request` read and checked (its transcript only as far as the engine checks it at the top:
    its items are validated as they are hashed, only the new ones)."""
    dialect, headers = request.dialect, request.headers
    # A body that extends the previous request of its conversation is parsed only where it is new:
    # the conversation the client names, else its run's, by bytes. A session id names no single
    # run: Claude Code's subagents and side requests send theirs between the main thread's turns,
    # so within a session too each run is told by its bytes (it would otherwise replace the
    # other's body every turn, and none would extend the last). A run's first request, which no
    # reply names yet, is kept in a slot of its session's (or tenant's) opening key: its second
    # looks there.
    opening = None
    if request.conversation_id:
        cache_key: tuple[Any, ...] = (request.tenant, dialect.name, request.conversation_id)
    else:
        opening = (request.tenant, dialect.name, dialect.session_hint(headers))
        fingerprint = run_fingerprint(request.raw, dialect.reply_markers)
        cache_key = (*opening, fingerprint) if fingerprint is not None else bodies.opening_slot(opening)
    parsed = await read_body(request.raw, dialect, cache_key, bodies, settings.server.max_messages, opening)
    body = parsed.body
    # A missing or malformed transcript is a 400 before anything else, too long a one a 413 (a body
    # the cache knows has its transcript already: Messages splits only its new messages).
    transcript = parsed.entry.raws if parsed.entry is not None else dialect.transcript(body)
    check_message_count(transcript, settings.server.max_messages, dialect.transcript_key)
    title = check_title(headers.get(TITLE_HEADER), TITLE_HEADER)
    profile = request_profile(headers, settings, dialect.model(body))
    return ParsedRequest(
        dialect=dialect,
        body=body,
        size=len(request.raw),
        tenant=request.tenant,
        conversation_id=request.conversation_id,
        session_id=dialect.session_id(body, headers),
        history=history_mode(headers, settings.conversation.history),
        profile=profile,
        compaction=compaction_control(headers),
        headers=upstream_headers(request, settings),
        knowledge_namespace=knowledge_namespace(headers, profile),
        query=request.query,
        parsed=parsed,
        title=title,
        client=client_name(headers.get("User-Agent")),
    )


async def read_body(
    raw: bytes, dialect: Dialect, cache_key: Any, bodies: BodyCache, max_messages: int, opening: Any = None
) -> ParsedBody:
    """The request body; one that extends the previous request under `cache_key` (or, when it
    holds none, under `opening`) by appending transcript items is parsed only where it is new."""
    parts = dialect.transcript_parts  # a transcript that is not the body's array as it is
    parsed = await bodies.extend(cache_key, raw, dialect.transcript_key, parts, opening, dialect.volatile_fields)
    if parsed is not None:
        return parsed
    body = await json_object(raw, dialect.transcript_key, max_messages)
    return await bodies.full(cache_key, raw, body, dialect.transcript_key, parts)


async def json_object(raw: bytes, transcript_key: str, max_messages: int) -> dict[str, Any]:
    """`raw` parsed whole: a JSON object, or an InvalidRequest saying why not."""
    try:
        body = await parse_json(raw, max_messages)  # orjson, off the loop if large
    except ValueError as exc:
        raise InvalidRequest(f"Request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise InvalidRequest("Request body is nested too deeply", code="invalid_json") from None
    if not isinstance(body, dict):
        raise InvalidRequest("Request body must be a JSON object", code="invalid_json")
    # The transcript is checked as it is validated (only its new items); here, the rest.
    if too_deep({k: v for k, v in body.items() if k != transcript_key}, MAX_DEPTH):
        raise InvalidRequest("Request body is nested too deeply", code="invalid_json")
    return body


def compaction_control(headers: Mapping[str, str]) -> str | None:
    """`X-Compaction: force` compacts before this request; `skip` starts no compaction for it."""
    control = headers.get(COMPACTION_HEADER)
    if control is None:
        return None
    control = control.strip().lower()
    if control not in ("force", "skip"):
        raise InvalidRequest(f"{COMPACTION_HEADER} must be 'force' or 'skip'", param=COMPACTION_HEADER)
    return control


def knowledge_namespace(headers: Mapping[str, str], profile: Profile) -> str | None:
    """`X-Knowledge-Namespace`, else the profile's `knowledge.namespace` (None: the default document)."""
    value = headers.get(KNOWLEDGE_HEADER)
    if value is None:
        return profile.knowledge.namespace
    value = value.strip()
    if not is_knowledge_namespace(value):
        raise InvalidRequest(
            f"{KNOWLEDGE_HEADER} must be 1-64 characters of A-Z a-z 0-9 . _ : - (not 'versions' or 'diff')",
            param=KNOWLEDGE_HEADER,
        )
    return value


def history_mode(headers: Mapping[str, str], default: str) -> str:
    mode = headers.get(HISTORY_HEADER, default).strip().lower()
    if mode not in ("full", "proxy"):
        raise InvalidRequest(f"{HISTORY_HEADER} must be 'full' or 'proxy'", param=HISTORY_HEADER)
    return mode


def request_profile(headers: Mapping[str, str], settings: Settings, model_name: str) -> Profile:
    """`X-Context-Profile`, else the model's entry in `models:`, else the defaults; unknown is a 400."""
    model = settings.models.get(model_name)
    name = headers.get(PROFILE_HEADER) or (model.profile if model else None)
    profile = settings.profile(name)
    if profile is None:
        raise InvalidRequest(f"Unknown context profile {name!r}", param=PROFILE_HEADER, code="unknown_profile")
    if model is not None and model.history_token_limit is not None:
        context = profile.context.model_copy(update={"history_token_limit": model.history_token_limit})
        profile = profile.model_copy(update={"context": context})
    return profile


def upstream_headers(request: TurnRequest, settings: Settings) -> dict[str, str]:
    """What goes upstream with each of the turn's calls: the client's headers but ours; a Gemini
    client's `?key=` as the header too, for the calls that carry no query (its summaries)."""
    headers = dict(forwardable(request.headers, drop=OWN_HEADERS | {settings.conversation.id_header.lower()}))
    if request.query_api_key is not None:
        headers["x-goog-api-key"] = request.query_api_key
    return headers
