"""The managed routes (`/v1/chat/completions`, ...): HTTP in, a TurnRequest to the engine, HTTP out.

All a handler does is read the request (body, the proxy's own headers, the conversation the
client names), hand it to the engine with a sink for streamed replies, and answer what the
engine says. The turn itself is proxy/engine.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from ..clients import client_name
from ..config import Profile, Settings, is_knowledge_namespace
from ..dialects.base import Dialect
from ..dialects.chat import CHAT
from ..dialects.messages import MESSAGES
from ..dialects.responses import RESPONSES
from ..engine import TurnReport, TurnRequest
from ..errors import InvalidRequest
from .errors import add_error_shape
from ..identity import ConversationKey, explicit_conversation_id, request_tenant
from ..messages import MAX_DEPTH, too_deep
from ..prefix import ParsedBody, run_fingerprint
from ..request_limits import check_message_count, parse_json
from ..request_parts import with_request_parts
from ..state import CONVERSATION, ENGINE, LOG_FIELDS, METRICS, QUERY_API_KEY, SETTINGS
from ..titles import TITLE_HEADER, check_title
from ..upstream import forwardable

HISTORY_HEADER = "X-History"
PROFILE_HEADER = "X-Context-Profile"
COMPACTION_HEADER = "X-Compaction"
KNOWLEDGE_HEADER = "X-Knowledge-Namespace"
# Our own request headers: meant for the proxy, never forwarded upstream.
OWN_HEADERS = frozenset({"x-history", "x-context-profile", "x-compaction", "x-knowledge-namespace", TITLE_HEADER.lower()})


async def read_turn_body(request: web.Request, dialect: Dialect, cache_key: Any) -> ParsedBody:
    """The request body; one that extends the previous request of the conversation the client
    names (`cache_key`) by appending transcript items is parsed only where it is new."""
    raw = await request.read()
    bodies = request.app[ENGINE].bodies
    parts = dialect.transcript_parts
    parsed = await bodies.extend(cache_key, raw, dialect.transcript_key, parts) if cache_key is not None else None
    if parsed is not None:
        return parsed
    body = await read_json_object(request, dialect.transcript_key)
    if cache_key is None:
        return ParsedBody(body)
    return await bodies.full(cache_key, raw, body, dialect.transcript_key, parts)


async def read_json_object(request: web.Request, transcript_key: str) -> dict[str, Any]:
    raw = await request.read()  # bounded by the app's client_max_size: 413 above it
    try:
        body = await parse_json(raw, request.app[SETTINGS].server.max_messages)  # orjson, off the loop if large
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


def compaction_control(request: web.Request) -> str | None:
    """`X-Compaction: force` compacts before this request; `skip` starts no compaction for it."""
    control = request.headers.get(COMPACTION_HEADER)
    if control is None:
        return None
    control = control.strip().lower()
    if control not in ("force", "skip"):
        raise InvalidRequest(f"{COMPACTION_HEADER} must be 'force' or 'skip'", param=COMPACTION_HEADER)
    return control


def knowledge_namespace(request: web.Request, profile: Profile) -> str | None:
    """`X-Knowledge-Namespace`, else the profile's `knowledge.namespace` (None: the default document)."""
    value = request.headers.get(KNOWLEDGE_HEADER)
    if value is None:
        return profile.knowledge.namespace
    value = value.strip()
    if not is_knowledge_namespace(value):
        raise InvalidRequest(
            f"{KNOWLEDGE_HEADER} must be 1-64 characters of A-Z a-z 0-9 . _ : - (not 'versions' or 'diff')",
            param=KNOWLEDGE_HEADER,
        )
    return value


def history_mode(request: web.Request, default: str) -> str:
    mode = request.headers.get(HISTORY_HEADER, default).strip().lower()
    if mode not in ("full", "proxy"):
        raise InvalidRequest(f"{HISTORY_HEADER} must be 'full' or 'proxy'", param=HISTORY_HEADER)
    return mode


def request_profile(request: web.Request, settings: Settings, model_name: str) -> Profile:
    """`X-Context-Profile`, else the model's entry in `models:`, else the defaults; unknown is a 400."""
    model = settings.models.get(model_name)
    name = request.headers.get(PROFILE_HEADER) or (model.profile if model else None)
    profile = settings.profile(name)
    if profile is None:
        raise InvalidRequest(f"Unknown context profile {name!r}", param=PROFILE_HEADER, code="unknown_profile")
    if model is not None and model.history_token_limit is not None:
        context = profile.context.model_copy(update={"history_token_limit": model.history_token_limit})
        profile = profile.model_copy(update={"context": context})
    return profile


class ResponseSink:
    """ClientSink over an aiohttp StreamResponse."""

    def __init__(self, request: web.Request) -> None:
        self.request = request
        self.response: web.StreamResponse | None = None

    async def open(self, status: int, headers: Mapping[str, str]) -> None:
        self.response = web.StreamResponse(status=status, headers=headers)
        await self.response.prepare(self.request)

    async def write(self, data: bytes) -> None:
        assert self.response is not None
        await self.response.write(data)

    async def close(self) -> None:
        if self.response is not None:
            await self.response.write_eof()


def upstream_headers(request: web.Request, settings: Settings) -> dict[str, str]:
    """What goes upstream with each of the turn's calls: the client's headers but ours; a Gemini
    client's `?key=` as the header too, for the calls that carry no query (its summaries)."""
    headers = dict(forwardable(request.headers, drop=OWN_HEADERS | {settings.conversation.id_header.lower()}))
    query_key = request.get(QUERY_API_KEY)
    if query_key is not None:
        headers["x-goog-api-key"] = query_key
    return headers


async def turn_request(
    request: web.Request, dialect: Dialect, parsed: ParsedBody, tenant: str, conversation_id: str | None
) -> TurnRequest:
    """The engine's view of a managed request (its transcript already checked at the top), of
    `tenant` (request_tenant) naming `conversation_id` (explicit_conversation_id)."""
    settings = request.app[SETTINGS]
    body = parsed.body
    profile = request_profile(request, settings, dialect.model(body))
    return TurnRequest(
        dialect=dialect,
        body=body,
        size=len(await request.read()),  # aiohttp keeps the bytes read
        tenant=tenant,
        conversation_id=conversation_id,
        session_id=dialect.session_id(body, request.headers),
        history=history_mode(request, settings.conversation.history),
        profile=profile,
        compaction=compaction_control(request),
        headers=upstream_headers(request, settings),
        knowledge_namespace=knowledge_namespace(request, profile),
        query=request.query_string,
        parsed=parsed,
    )


async def read_turn(
    request: web.Request, dialect: Dialect, *, dry_run: bool = False
) -> tuple[TurnRequest, ConversationKey, TurnReport]:
    """A managed request read: the turn, the conversation it belongs to, its (empty) report. A
    `dry_run`'s request writes nothing, so it claims no session thread and writes no runs mark either."""
    settings = request.app[SETTINGS]
    # A body that extends the previous request of its conversation is parsed only where it is new
    # (the fast path's first step): the conversation the client names, else its run's, by bytes.
    path_id = request.match_info.get("conversation_id")
    explicit = explicit_conversation_id(request.headers, path_id, settings.conversation)
    named = explicit or dialect.session_hint(request.headers)
    tenant = request_tenant(request.headers, settings.conversation, request.get(QUERY_API_KEY))
    cache_key = (tenant, dialect.name, named) if named else (tenant, dialect.name, None, run_fingerprint(await request.read()))
    parsed = await read_turn_body(request, dialect, cache_key)
    body = parsed.body
    # A missing or malformed transcript is a 400 before anything else, too long a one a 413 (a body
    # the cache knows has its transcript already: Messages splits only its new messages).
    transcript = parsed.entry.raws if parsed.entry is not None else dialect.transcript(body)
    check_message_count(transcript, settings.server.max_messages, dialect.transcript_key)
    title = check_title(request.headers.get(TITLE_HEADER), TITLE_HEADER)
    turn = await turn_request(request, dialect, parsed, tenant, explicit)
    key = await request.app[ENGINE].conversation_key(turn, dry_run=dry_run)
    request[CONVERSATION] = key
    report = TurnReport(
        key, dialect.name, dialect.model(body), client=client_name(request.headers.get("User-Agent")), title=title
    )
    return turn, key, report


async def run_turn(request: web.Request, dialect: Dialect) -> web.StreamResponse:
    """One managed turn of `dialect`, from the request to its response."""
    app = request.app
    turn, key, report = await read_turn(request, dialect)
    await with_request_parts(app[ENGINE].store, app[ENGINE].request_parts, turn, key, report)
    sink = ResponseSink(request)
    try:
        outcome = await app[ENGINE].run(turn, key, report, sink)
    finally:  # failed turns are measured and logged too
        report.observe(app[METRICS])
        request[LOG_FIELDS].update(report.log_fields())
    if outcome.body is None:
        assert sink.response is not None
        return sink.response
    return web.Response(body=outcome.body, status=outcome.status, headers=outcome.headers)


def managed(dialect: Dialect) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The handler of one managed wire format."""

    async def handler(request: web.Request) -> web.StreamResponse:
        return await run_turn(request, dialect)

    return handler


chat_completions = managed(CHAT)
responses = managed(RESPONSES)
messages = managed(MESSAGES)


def add_routes(app: web.Application) -> None:
    for handler, dialect in ((chat_completions, CHAT), (responses, RESPONSES), (messages, MESSAGES)):
        add_error_shape(app, handler, dialect.error_body)  # the guard's refusals too, before the handler
    for prefix in ("", "/c/{conversation_id}"):
        app.router.add_post(prefix + "/v1/chat/completions", chat_completions)
        app.router.add_post(prefix + "/chat/completions", chat_completions)
        app.router.add_post(prefix + "/v1/responses", responses)
        app.router.add_post(prefix + "/responses", responses)
        app.router.add_post(prefix + "/v1/messages", messages)
