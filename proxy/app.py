"""The aiohttp application: routes, middleware, and one lifecycle context for every resource."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from . import connections, guard
from .admin_token import known_admin_token, new_admin_token
from .api import admin, count_tokens, gemini, inbox, knowledge, models, turns, ui
from .api.errors import error_boundary
from .api.passthrough import passthrough
from .compaction import check_compactors
from .compaction.runner import CompactionRunner
from .config import Settings
from .dialects.formats import DIALECTS
from .engine import Engine
from .errors import error_body
from .identity import ConversationKey
from .logs import ACCESS_LOGGER, monotonic_ms
from .memory import Trimmer
from .metrics import Metrics
from .pipeline import build_pipeline
from .prefix import PrefixCache
from .refs import RefSigner
from .state import (
    ADMIN_TOKEN,
    COMPACTION,
    CONVERSATION,
    COUNTER,
    ENGINE,
    LOG_FIELDS,
    METRICS,
    PIPELINE,
    PREFIXES,
    REFS,
    ROUTER,
    SETTINGS,
    STORE,
    SUMMARIZER,
    TELEMETRY,
    TRAJECTORIES,
    UPSTREAM,
)
from .store import StoreError, StoreLifecycle, open_store
from .summarizer import Summarizer
from .telemetry import check_telemetry, open_telemetry
from .tokens import TokenCounter
from .trajectory_files import TrajectoryWriter, check_trajectory_dir
from .upstream import HttpUpstream
from .upstream.http import redacted
from .upstream.router import UpstreamRouter, counting_aliases, window_overrides

log = logging.getLogger("proxy")
# Tokenizers are loaded when a request's model first needs one (TokenCounter.ready), not here:
# a proxy that never counts for OpenAI models never holds o200k_base's ~48 MB.
WARM_MODELS: tuple[str, ...] = ()
access_log = logging.getLogger(ACCESS_LOGGER)


@web.middleware
async def request_log(request: web.Request, handler: web.Handler) -> web.StreamResponse:
    """One line per request. Headers are never logged: they carry API keys."""
    start = time.perf_counter()
    request[LOG_FIELDS] = {}
    response = await handler(request)
    route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
    metrics = request.app[METRICS]
    metrics.child(metrics.requests, route, str(response.status)).inc()
    if not access_log.isEnabledFor(logging.INFO):  # the line's fields are not even gathered
        return response
    key: ConversationKey | None = request.get(CONVERSATION)
    access_log.info(
        "request",
        extra={
            "method": request.method,
            "path": request.path,
            "status": response.status,
            "ms": monotonic_ms(start),
            "conversation": key.id if key else None,
            "tenant": key.tenant[:12] if key else None,
            **request[LOG_FIELDS],
        },
    )
    return response


async def healthz(request: web.Request) -> web.Response:
    """200 `{"status": "ok"}`; 503 `{"status": "degraded"}` while the store cannot write (full,
    read-only, unreachable), with the reason as an OpenAI-shaped "error" too (code `store_full`,
    `store_read_only`, `store_unavailable`). The store's own report is under "store" either way."""
    store = await request.app[STORE].health()
    body: dict[str, object] = {"status": "ok" if store.ok else "degraded", "store": store.to_api()}
    if not store.ok:
        body |= error_body(store.detail or f"The store is {store.status}", "server_error", f"store_{store.status}")
    return web.json_response(body, status=200 if store.ok else 503)


async def _resources(app: web.Application) -> AsyncIterator[None]:
    """Open the store and the upstream session together; close them together."""
    settings = app[SETTINGS]
    known_token = await asyncio.to_thread(known_admin_token, settings)
    app[STORE] = open_store(settings.storage)
    # Made (and kept in the store folder) if there is none; after the store opened, whose own
    # complaint about its folder is the one to hear first.
    app[ADMIN_TOKEN] = known_token or await asyncio.to_thread(new_admin_token, settings)
    upstream = app[UPSTREAM] = HttpUpstream(settings.upstream)
    await upstream.start()
    router = app[ROUTER] = UpstreamRouter.from_settings(settings, upstream)
    app[REFS] = RefSigner(await app[STORE].secret())
    await _fail_interrupted_turns(app[STORE])
    # A crashed replica's conversation locks outlive it for up to their TTL: look again then.
    second_look = (
        asyncio.create_task(_fail_interrupted_turns(app[STORE], after_s=settings.storage.redis_lock_ttl_s + 1))
        if settings.storage.backend == "redis"
        else None
    )
    # Load the token-count tables now, in a thread: the first request must not stall the loop on it.
    await asyncio.to_thread(app[COUNTER].warm, WARM_MODELS)
    telemetry = app[TELEMETRY] = open_telemetry(settings)
    app[SUMMARIZER] = Summarizer(
        settings.summarizer, route=router.for_model, dialects=DIALECTS, inflight=router.inflight, telemetry=telemetry
    )
    trajectories = app[TRAJECTORIES] = TrajectoryWriter(
        settings.storage.trajectory_dir, app[STORE], app[REFS],
        cache_bytes=int(settings.storage.trajectory_cache_mb * 2**20), failures=app[METRICS].trajectory_failures,
    )
    app[COMPACTION] = CompactionRunner(
        settings, app[STORE], app[SUMMARIZER], app[COUNTER], app[METRICS], on_summary=trajectories.after_turn
    )
    app[ENGINE] = Engine(
        settings, app[STORE], app[PIPELINE], app[COUNTER], app[REFS], app[SUMMARIZER], app[COMPACTION], router,
        app[PREFIXES], app[METRICS], telemetry, on_turn_end=trajectories.after_turn,
    )
    trimmer = Trimmer(settings.server.malloc_trim_interval_s)
    trimming = asyncio.create_task(trimmer.run(app[connections.CONNECTIONS].activity)) if trimmer.enabled else None
    log.info(
        "started",
        extra={
            "store": settings.storage.backend,
            "upstream": redacted(settings.upstream.base_url),
            "pipeline": app[PIPELINE].describe(),
            "traces": telemetry.enabled,
        },
    )
    try:
        yield
    finally:
        for task in (second_look, trimming):
            if task is not None:
                task.cancel()
        await app[ENGINE].bodies.idle()  # the proofs of bodies after their turns (prefix.py): short
        await app[COMPACTION].close()
        await trajectories.close()  # after compaction (a summary marks its file due), before the store
        await telemetry.close()  # after the compactions: their spans go too
        await router.close()
        await upstream.close()
        await app[STORE].close()


async def _fail_interrupted_turns(store: StoreLifecycle, after_s: float = 0) -> None:
    """Mark failed the pending messages of turns a crash cut short (they never finished)."""
    if after_s:
        await asyncio.sleep(after_s)
    try:
        failed = await store.fail_pending()
    except StoreError as exc:  # a full or read-only store still starts: /healthz says why, DELETE frees room
        log.warning("cannot mark interrupted turns failed: %s", exc.message)
    else:
        if failed:
            log.warning("pending messages of interrupted turns marked failed", extra={"messages": failed})


# How the app must be served (cli.py and the tests share this). Handler cancellation: a client
# that disconnects cancels its request, so an abandoned stream stops costing upstream tokens and
# its conversation is free for the next turn at once.
RUNNER_OPTIONS = {"access_log": None, "handler_cancellation": True}


def runner_options(settings: Settings) -> dict[str, object]:
    """RUNNER_OPTIONS plus what the settings bound (connections.py: what aiohttp's server does itself)."""
    return {**RUNNER_OPTIONS, "keepalive_timeout": settings.server.keepalive_timeout_s}


async def metrics_handler(request: web.Request) -> web.Response:
    response = web.Response(body=request.app[METRICS].render())
    response.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    return response


def build_app(settings: Settings) -> web.Application:
    """The proxy's app; raises ConfigError for a setting only start-up can check (user code)."""
    check_compactors(settings)
    check_telemetry(settings)
    for moved in settings.moved_keys():
        log.warning("setting renamed; the old name still works, for now", extra={"setting": moved})
    check_trajectory_dir(settings.storage.trajectory_dir)
    # The request log wraps the error boundary so that it logs the status the client really got;
    # the guard looks at headers only, before the connection's bounds read the body.
    app = web.Application(
        client_max_size=int(settings.server.max_body_mb * 1024 * 1024),
        middlewares=[request_log, error_boundary, guard.middleware, connections.middleware],
    )
    app[SETTINGS] = settings
    app[connections.CONNECTIONS] = connections.ConnectionTracker(settings)
    guard.install(app, settings)
    app[PIPELINE] = build_pipeline(settings)
    app[COUNTER] = TokenCounter(windows=window_overrides(settings.models), aliases=counting_aliases(settings.models))
    app[METRICS] = Metrics()
    app[PREFIXES] = PrefixCache(int(settings.server.cache_mb * 2**20 * 3 / 4))
    app.cleanup_ctx.append(_resources)

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics_handler)
    admin.add_routes(app)
    inbox.add_routes(app)
    knowledge.add_routes(app)
    ui.add_routes(app)
    guard.add_fallback_routes(app)  # the rest of /v1/conversations, /v1/knowledge, /healthz, /metrics: never upstream
    turns.add_routes(app)
    gemini.add_routes(app)
    count_tokens.add_routes(app)
    if settings.models:  # else /v1/models stays plain passthrough
        models.add_routes(app)
    # Routes match in the order added: everything not ours, last, goes upstream untouched.
    app.router.add_route("*", "/c/{conversation_id}/{tail:.*}", passthrough)
    app.router.add_route("*", "/{tail:.*}", passthrough)
    return app
