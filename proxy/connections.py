"""Client connections: how many may be open, how long one may idle, how long a request may take
to arrive.

What aiohttp's server does itself: it closes a connection idle for `keepalive_timeout` (its
timer also runs from the opening, so a client that sends nothing is closed then too), and
refuses request lines and header fields over 8 KB or more than 128 headers (a 400). Nothing else
bounds a client: one that sends its headers a byte at a time, or a body that never ends, holds
its connection and file descriptor for as long as it likes, and once every descriptor is taken
the proxy accepts no one while asyncio logs the failed accept() hundreds of times a second.

So the proxy's listening socket hands each connection to aiohttp through a thin wrapper that
tracks it, and:
- `server.header_timeout_s`: a request's headers must be complete that long after its first byte
  (or after the connection opened, for the first request); else the connection is closed;
- `server.body_timeout_s`: the body must be in by then (a 408);
- `server.max_connections`: a new connection past the cap closes the longest-idle one; if every
  one is busy, the new one is answered 503 and closed (past a few such, closed unanswered). The
  cap is kept below the process's fd limit, whose soft value is raised to the hard one at start;
- a failed accept() is logged once a second at most.

The sweep that enforces `header_timeout_s` wakes at the earliest deadline of the connections
whose headers are awaited, and not at all with none: an idle proxy is never woken (nor, once
quiet, by the malloc trimmer, which waits for a client: proxy/activity.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import resource
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from aiohttp import web

from .activity import Activity
from .api.errors import error_response, error_shape
from .config import Settings
from .errors import ProxyError, RequestTimeout, ServerBusy

log = logging.getLogger("proxy.connections")

FD_RESERVE = 64  # descriptors kept for the store, logs, DNS, litellm, ... besides upstream connections
IDLE_GRACE_S = 1.0  # a connection this fresh from its last answer (or opening) is never evicted
# Past the cap with nothing to evict, so many new connections at most wait to be answered 503
# (for REFUSED_WAIT_S at most); any more are closed unanswered: a flood costs no descriptors.
MAX_REFUSED = 32
REFUSED_WAIT_S = 2.0
DEADLINE_SLACK_S = 0.005  # a deadline this close is met: asyncio may wake a timer a little early
ACCEPT_ERROR = "socket.accept() out of system resource"


class Connection:
    """One client connection as the tracker sees it."""

    __slots__ = ("busy", "idle_since", "opened", "partial_since", "refused", "requests", "transport")

    def __init__(self, transport: asyncio.BaseTransport, now: float) -> None:
        self.transport = transport
        self.opened = self.idle_since = now
        self.partial_since: float | None = None  # first byte of a request whose headers are not in
        self.busy = 0  # requests being handled
        self.requests = 0
        self.refused = False  # opened past the cap with no idle one to close: answered 503

    def idle_for(self, now: float) -> float:
        return 0.0 if self.busy else now - self.idle_since


class ConnectionTracker:
    """Every open client connection of one app, and the bounds on them."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings.server
        self.upstream_connections = settings.upstream.max_connections
        self.cap = self.settings.max_connections
        # Ordered by idle_since (a request's end moves its connection to the end): the first
        # connection not busy is the longest idle.
        self._open: OrderedDict[asyncio.BaseTransport, Connection] = OrderedDict()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self.refused = 0  # open connections waiting for their 503
        self.activity = Activity()  # poked by every new connection and request
        # When the sweep looks next: the earliest deadline it knows of (inf: none, it sleeps);
        # a connection whose headers are due sooner sets `_sooner` to wake it.
        self._sweep_at = math.inf
        self._sooner = asyncio.Event()
        self.sweeps = 0  # looks at the open connections (tests: how often it wakes)

    def __len__(self) -> int:
        return len(self._open)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        soft = raise_fd_limit()
        spare = soft - FD_RESERVE - self.upstream_connections - MAX_REFUSED
        self.cap = max(1, min(self.settings.max_connections, spare))
        rate_limit_accept_errors(loop)
        self._sweeper = loop.create_task(self._sweep())
        log.info("connection limits", extra={"max_connections": self.cap, "fd_limit": soft})

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            try:
                await self._sweeper
            except asyncio.CancelledError:
                pass
            self._sweeper = None

    def protocol_factory(self, make_protocol: Callable[[], Any]) -> Callable[[], asyncio.Protocol]:
        """Wrap the factory of aiohttp's per-connection protocol so that every connection is tracked."""
        return lambda: _Tracked(make_protocol(), self)

    # -- connections -----------------------------------------------------------------------------

    def _now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    def opened(self, transport: asyncio.BaseTransport) -> Connection:
        now = self._now()
        conn = Connection(transport, now)
        if len(self._open) - self.refused >= self.cap:
            victim = self._longest_idle(now)
            if victim is not None:
                self._close(victim)
            elif self.refused >= MAX_REFUSED:
                transport.close()
                return conn  # never tracked: aiohttp sees it open and lost at once
            else:
                conn.refused = True
                self.refused += 1
        self._open[transport] = conn
        self._due(now + (min(self.settings.header_timeout_s, REFUSED_WAIT_S) if conn.refused else self.settings.header_timeout_s))
        self.activity.poke()
        return conn

    def closed(self, conn: Connection) -> None:
        if self._open.pop(conn.transport, None) is not None and conn.refused:
            self.refused -= 1

    def _longest_idle(self, now: float) -> Connection | None:
        for conn in self._open.values():
            if conn.busy:
                continue
            # The oldest connection not busy; if even it only just answered (its response may
            # still be on its way out), no other one is idle for longer.
            if conn.idle_for(now) < IDLE_GRACE_S:
                return None
            if getattr(conn.transport, "get_write_buffer_size", lambda: 0)() == 0:
                return conn
        return None

    def _close(self, conn: Connection) -> None:
        self.closed(conn)
        conn.transport.close()

    def arriving(self, conn: Connection) -> None:
        """A request's first byte: its headers are due within header_timeout_s from now."""
        conn.partial_since = now = self._now()
        self._due(now + self.settings.header_timeout_s)
        self.activity.poke()

    def _due(self, at: float) -> None:
        """A connection's headers are due at `at` (loop time): the sweep looks by then."""
        if at < self._sweep_at:
            self._sweep_at = at
            self._sooner.set()

    def request_started(self, conn: Connection) -> None:
        conn.busy += 1
        conn.requests += 1
        conn.partial_since = None

    def request_ended(self, conn: Connection) -> None:
        conn.busy -= 1
        conn.idle_since = self._now()
        conn.partial_since = None
        if conn.transport in self._open:
            self._open.move_to_end(conn.transport)

    async def _sweep(self) -> None:
        """Close connections whose request headers are overdue (slow senders, silent openers), at
        their deadline. It sleeps until the earliest deadline of the connections awaited (idle
        keep-alive connections are aiohttp's to close), or, with none, until one is: a request
        whose headers come whole (nearly all) costs it nothing, and an agent's paced turns wake it
        once per `header_timeout_s`, not every second (on this project's VM each wake-up of an
        idle core costs ~2.5 ms)."""
        limit = self.settings.header_timeout_s
        while True:
            self._sooner.clear()
            self.sweeps += 1
            earliest = self._close_overdue(limit)
            self._sweep_at = math.inf if earliest is None else earliest
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(earliest):  # None: no deadline, only a sooner one wakes it
                    await self._sooner.wait()

    def _close_overdue(self, limit: float) -> float | None:
        """Close the connections whose headers are overdue; the earliest deadline of those still
        awaited (loop time), or None."""
        now = self._now()
        earliest: float | None = None
        for conn in list(self._open.values()):
            if conn.busy:
                continue
            since = conn.partial_since
            if since is None and conn.requests == 0:
                since = conn.opened
            if since is None:
                continue
            deadline = since + (min(limit, REFUSED_WAIT_S) if conn.refused else limit)
            if deadline - now <= DEADLINE_SLACK_S:
                self._close(conn)
            elif earliest is None or deadline < earliest:
                earliest = deadline
        return earliest

    # -- requests --------------------------------------------------------------------------------

    def connection_of(self, request: web.Request) -> Connection | None:
        transport = request.transport
        return self._open.get(transport) if transport is not None else None


CONNECTIONS = web.AppKey("connections", ConnectionTracker)


class _Tracked(asyncio.Protocol):
    """aiohttp's protocol for one connection, with the tracker told of its opening, its bytes
    while no request is being handled, and its end."""

    __slots__ = ("_conn", "_inner", "_tracker")

    def __init__(self, inner: Any, tracker: ConnectionTracker) -> None:
        self._inner = inner
        self._tracker = tracker
        self._conn: Connection | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._conn = self._tracker.opened(transport)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        conn = self._conn
        if conn is not None and not conn.busy and conn.partial_since is None:
            self._tracker.arriving(conn)
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._conn is not None:
            self._tracker.closed(self._conn)
        self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()


@web.middleware
async def middleware(request: web.Request, handler: web.Handler) -> web.StreamResponse:
    """Mark the connection busy while its request is handled; refuse it past the cap; read the
    body within `body_timeout_s`."""
    tracker = request.app.get(CONNECTIONS)
    conn = tracker.connection_of(request) if tracker is not None else None
    if conn is None:  # served without a TrackedSite (or the client is already gone)
        return await handler(request)
    if conn.refused:
        return await _answer_and_close(request, ServerBusy("The proxy has no free connection; retry shortly"))
    tracker.request_started(conn)
    try:
        if request.body_exists:
            try:
                async with asyncio.timeout(tracker.settings.body_timeout_s):
                    await read_body(request, int(tracker.settings.max_body_mb * 2**20))
            except TimeoutError:
                message = f"The request body took longer than {tracker.settings.body_timeout_s:g}s to arrive"
                return await _answer_and_close(request, RequestTimeout(message))
        return await handler(request)
    finally:
        tracker.request_ended(conn)


async def read_body(request: web.Request, max_bytes: int) -> bytes:
    """The request's body, kept where aiohttp's own `read()` returns it from (the handlers call
    that), refused past `max_bytes` as `read()` refuses it. `read()` grows a bytearray and copies
    it into bytes at the end: a 2.5 MB body was copied three times, in blocks the allocator maps
    afresh (page faults); joined once here, a body that came in one piece is not copied at all."""
    content = request.content
    content.set_read_chunk_size(max_bytes)  # as read() does: no pause of the socket every 64 KB
    parts: list[bytes] = []
    size = 0
    while chunk := await content.readany():
        size += len(chunk)
        if size > max_bytes:
            raise web.HTTPRequestEntityTooLarge(max_size=max_bytes, actual_size=size)
        parts.append(chunk)
    body = request._read_bytes = b"".join(parts)  # one of aiohttp's declared request attributes
    return body


async def _answer_and_close(request: web.Request, error: ProxyError) -> web.StreamResponse:
    """Send `error` and close the connection at once: aiohttp would otherwise linger up to 10 s
    reading the rest of a body this client is too slow (or too many) to send."""
    response = error_response(error, error_shape(request))
    response.force_close()
    try:
        await response.prepare(request)
        await response.write_eof()
    except ConnectionError:
        pass
    if request.transport is not None:
        request.transport.close()  # after what was written is flushed
    return response


class TrackedSite(web.BaseSite):
    """A TCP site like aiohttp's TCPSite, whose connections go through the app's ConnectionTracker."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, *, backlog: int = 128) -> None:
        super().__init__(runner, backlog=backlog)
        self._host, self._port = host, port
        self._tracker: ConnectionTracker = runner.app[CONNECTIONS]

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None, "runner.setup() was not awaited"
        self._tracker.start(loop)
        self._server = await loop.create_server(
            self._tracker.protocol_factory(server), self._host, self._port, backlog=self._backlog, reuse_address=True
        )

    async def stop(self) -> None:
        await self._tracker.stop()
        await super().stop()


async def start_site(runner: web.AppRunner, host: str, port: int) -> TrackedSite:
    """Listen on host:port for the runner's app (cli.py and the tests' ProxyServer both do this)."""
    site = TrackedSite(runner, host, port)
    await site.start()
    return site


def raise_fd_limit() -> int:
    """Raise the soft limit of open files to the hard one (as Go and Rust runtimes do); returns
    the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-files limit", extra={"soft": soft, "hard": hard, "error": str(exc)})
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def rate_limit_accept_errors(loop: asyncio.AbstractEventLoop) -> None:
    """Log asyncio's 'accept() out of system resource' once a second at most (with how many were
    left out); every other error goes to the handler there was before. Installed once per loop."""
    previous = loop.get_exception_handler()
    if getattr(previous, "limits_accept_errors", False):
        return
    last = [float("-inf"), 0]  # when the last one was logged, how many were left out since

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if str(context.get("message", "")).startswith(ACCEPT_ERROR):
            now = loop.time()
            if now - last[0] < 1.0:
                last[1] += 1
                return
            exc = context.get("exception")
            log.error(ACCEPT_ERROR, extra={"error": str(exc), "left_out": last[1]})
            last[0], last[1] = now, 0
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    handler.limits_accept_errors = True  # type: ignore[attr-defined]
    loop.set_exception_handler(handler)
