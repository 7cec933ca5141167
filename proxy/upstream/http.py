"""The raw passthrough: any OpenAI-compatible base URL, the Anthropic API for Messages requests
and the Gemini API for Gemini ones, over one pooled aiohttp session."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import unquote

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from ..config import UpstreamSettings
from ..errors import InvalidRequest, ProxyError, UpstreamTimeout, UpstreamUnreachable
from .base import GeminiRequest, encoded
from .limits import ReplyLimits, ReplyMeter

# Hop-by-hop headers (RFC 9110 7.6.1) and those aiohttp recomputes; never copied across.
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer",
        "Transfer-Encoding", "Upgrade", "Host", "Content-Length", "Content-Encoding", "Accept-Encoding",
    )
)
# What a path segment may not decode to: a dot segment (also behind `;` parameters, or with a
# backslash some servers read as a slash) would climb out of the base URL's path upstream.
_SEGMENT_SEPARATORS = re.compile(r"[/\\;]")


# Where each managed wire format is sent: (which API, the path under its root). OpenAI paths are
# under `base_url` (its /v1 included), Anthropic ones under `anthropic_base_url`. A Gemini
# request's path is in its body (GeminiRequest.path), under `gemini_base_url`.
ENDPOINTS = {
    "chat": ("openai", "/chat/completions"),
    "responses": ("openai", "/responses"),
    "messages": ("anthropic", "/v1/messages"),
}
GEMINI = "gemini"
COUNT_TOKENS = "/v1/messages/count_tokens"


def forwardable(headers: Mapping[str, str], drop: frozenset[str] = frozenset()) -> CIMultiDict[str]:
    """Copy headers minus hop-by-hop ones, those the `Connection` header names, and `drop`
    (lower-case names)."""
    out: CIMultiDict[str] = CIMultiDict()
    named: set[str] = set()
    for name, value in headers.items():
        low = name.lower()
        if low == "connection":  # its tokens name more hop-by-hop headers (RFC 9110 7.6.1)
            named.update(token.strip().lower() for token in value.split(","))
        elif low not in HOP_BY_HOP and low not in drop:
            out.add(name, value)
    for name in named.intersection(k.lower() for k in out):
        out.popall(name)
    return out


def checked_path(raw_path_qs: str) -> str:
    """A client's path and query as sent (still percent-encoded), refused (400) if it could leave
    the base URL's path upstream: not starting with '/', or with a segment that decodes to '.' or
    '..' (`%2e%2e`, `..%2F`, `..;x`, `..\\`). It is forwarded as it is, so `%3F` stays in the path."""
    path, _, _ = raw_path_qs.partition("?")
    bad = not path.startswith("/")
    if not bad and ("." in path or "%" in path or "\\" in path):  # the common path has none of them
        for segment in path.split("/"):
            if any(part in (".", "..") for part in _SEGMENT_SEPARATORS.split(unquote(segment))):
                bad = True
                break
    if bad:
        raise InvalidRequest("Invalid path: it must stay below the API's base path", code="invalid_path")
    return raw_path_qs


def redacted(url: str) -> str:
    """`url` fit for a log line: no user or password, no query values (either may be a key)."""
    try:
        parsed = URL(url)
    except ValueError:
        return "<unparseable url>"
    if parsed.user is not None or parsed.password is not None:
        parsed = parsed.with_user("***").with_password(None)
    if parsed.raw_query_string:
        parsed = parsed.with_query({key: "***" for key in parsed.query})
    return str(parsed)


class HttpReply:
    """UpstreamReply over an aiohttp response, read within its ReplyMeter's bounds.

    Silence (`timeout_s` with nothing read while a read waits) is watched by one timer that moves
    only when it fires: a read notes when it starts and that it waits, where aiohttp's `sock_read`
    would move a timer on every socket read (~10% of a streamed chunk's cost). Time the reader
    spends elsewhere (writing to a slow client) is no silence of the upstream's."""

    def __init__(self, response: aiohttp.ClientResponse, timeout_s: float, meter: ReplyMeter) -> None:
        self._response = response
        self._timeout_s = timeout_s
        self._meter = meter
        self.status = response.status
        self.headers: CIMultiDictProxy[str] = response.headers
        meter.event_stream = self.is_event_stream
        loop = self._loop = asyncio.get_running_loop()
        # One timer for the whole reply, not one per chunk: when it fires, the next read raises.
        self._deadline_timer = None if meter.deadline is None else loop.call_at(meter.deadline, self._expire)
        self._reading = False
        self._heard = loop.time()  # when the read under way started
        self._silence_timer: asyncio.TimerHandle | None = None  # armed by the first read

    def _expire(self) -> None:
        self._deadline_timer = None
        self._response.content.set_exception(self._meter.timeout())

    def _check_silence(self) -> None:
        self._silence_timer = None
        if not self._reading:
            return  # the next read watches again
        due = self._heard + self._timeout_s
        if self._loop.time() < due:
            self._silence_timer = self._loop.call_at(due, self._check_silence)
            return
        self._response.content.set_exception(UpstreamTimeout(f"Upstream sent nothing for {self._timeout_s:g}s"))

    async def _next(self, content: aiohttp.StreamReader) -> bytes:
        """The next bytes the upstream sent (b"" at the end), the wait for them watched."""
        self._heard, self._reading = self._loop.time(), True
        if self._silence_timer is None:
            self._silence_timer = self._loop.call_at(self._heard + self._timeout_s, self._check_silence)
        try:
            return await content.readany()
        finally:
            self._reading = False  # `_heard` is read only while a read waits: its end need not be timed

    def _stop_watching(self) -> None:
        if self._silence_timer is not None:
            self._silence_timer.cancel()
            self._silence_timer = None

    @property
    def is_event_stream(self) -> bool:
        return self._response.content_type == "text/event-stream"

    async def read(self) -> bytes:
        """The whole body, refused past `max_bytes` (a declared length over it: before reading)."""
        meter, content = self._meter, self._response.content
        parts: list[bytes] = []
        try:
            with _upstream_errors(self._timeout_s, meter):
                meter.check_length(self._response.content_length, streamed=False)
                while chunk := await self._next(content):
                    meter.count(chunk, streamed=False)
                    parts.append(chunk)
        finally:
            self._stop_watching()
        return b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; an event stream in whole lines only (the end of a line is held
        until its newline comes), so that a stream cut at a bound never leaves the client half an
        event for the error event to be glued to."""
        meter, content, loop = self._meter, self._response.content, self._loop
        held: list[bytes] = []  # the start of an event-stream line whose newline is still to come
        with _upstream_errors(self._timeout_s, meter):
            meter.check_length(self._response.content_length, streamed=True)
            while True:
                # `_next`, inline: a stream reads once an event, and a coroutine a read costs as
                # much as the rest of this loop.
                self._heard, self._reading = loop.time(), True
                if self._silence_timer is None:
                    self._silence_timer = loop.call_at(self._heard + self._timeout_s, self._check_silence)
                try:
                    chunk = await content.readany()
                except Exception as exc:
                    # A stream cut (aiohttp stores the error) goes on with what came before the
                    # cut, the error with the next read: it stays stored. Any other goes now.
                    if content.exception() is not exc or not (chunk := _received_before_error(content)):
                        raise
                finally:
                    self._reading = False
                if not chunk:
                    break
                meter.count(chunk, streamed=True)
                if not meter.event_stream or (not held and chunk[-1:] == b"\n"):
                    yield chunk  # not an event stream, or whole lines of one
                    continue
                end = chunk.rfind(b"\n") + 1
                if end == 0:
                    held.append(chunk)
                    continue
                whole = chunk if end == len(chunk) else chunk[:end]
                if held:
                    held.append(whole)
                    whole = b"".join(held)
                    held.clear()
                if end < len(chunk):
                    held.append(chunk[end:])
                yield whole
            if held:  # the stream's last bytes, as the upstream sent them
                yield b"".join(held)
        self._stop_watching()

    def close(self) -> None:
        self._stop_watching()
        if self._deadline_timer is not None:
            self._deadline_timer.cancel()
            self._deadline_timer = None
        self._response.release()


def _received_before_error(content: aiohttp.StreamReader) -> bytes:
    """The bytes `content` holds unread though an error is stored in it (b"" for none). Its
    `readany` raises the error ahead of them: a stream whose last events and cut were read off the
    socket together (the loop busy meanwhile: a commit, another turn) lost those events, to the
    client and to the partial reply kept. Read through aiohttp's own buffer (3.x's private
    `_buffer` and `_read_nowait`; without them, nothing is read and the error goes as before)."""
    read = getattr(content, "_read_nowait", None)
    if not getattr(content, "_buffer", None) or read is None:
        return b""
    return read(-1)  # type: ignore[no-any-return]


class HttpUpstream:
    sends_encoded = True  # see Upstream

    def __init__(self, settings: UpstreamSettings) -> None:
        self.settings = settings
        # Credentials in the base URL are sent as Basic auth in place of the client's own
        # Authorization (as upstream.api_key is), and kept out of the URL, hence out of every log.
        base = URL(settings.base_url.rstrip("/"))
        self._basic_auth = (
            aiohttp.BasicAuth(base.user or "", base.password or "").encode() if base.user or base.password else None
        )
        self.base_url = str(base.with_user(None)) if self._basic_auth else str(base)
        self.anthropic_base_url = settings.anthropic_base_url.rstrip("/")
        self.gemini_base_url = settings.gemini_base_url.rstrip("/")
        self.turn_limits = ReplyLimits.for_turn(settings)
        self.passthrough_limits = ReplyLimits.for_passthrough(settings)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        # No sock_read: the silence of a reply is HttpReply's to watch, the wait for its
        # headers _request's.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.settings.timeout_s, sock_read=None)
        self._session = aiohttp.ClientSession(
            timeout=timeout,
            connector=aiohttp.TCPConnector(limit=self.settings.max_connections),
            # We forward bodies as received; never let the session merge or rewrite cookies.
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def url(self, path_qs: str) -> URL:
        """Map a client path onto the base URL: `/v1/models?x=1` -> `<base_url>/models?x=1`.

        `path_qs` is percent-encoded as the client sent it and forwarded so (no re-normalising: a
        `%2F` or `%3F` stays what it was); one that could leave the base path is a 400."""
        checked_path(path_qs)
        if path_qs == "/v1" or path_qs.startswith(("/v1/", "/v1?")):
            path_qs = path_qs[3:]
        return URL(self.base_url + path_qs, encoded=True)

    @staticmethod
    def _under(root: str, path_qs: str) -> URL:
        """`path_qs` (as the client encoded it, its version prefix kept) under an API's root."""
        return URL(root + checked_path(path_qs), encoded=True)

    def _auth(self, headers: CIMultiDict[str]) -> CIMultiDict[str]:
        if self.settings.api_key is not None:
            headers["Authorization"] = f"Bearer {self.settings.api_key.get_secret_value()}"
        elif self._basic_auth is not None:
            headers["Authorization"] = self._basic_auth
        return headers

    def _anthropic_auth(self, headers: CIMultiDict[str]) -> CIMultiDict[str]:
        """The configured Anthropic key, when set, instead of whatever key the client sent."""
        if self.settings.anthropic_api_key is not None:
            headers.popall("Authorization", None)
            headers["x-api-key"] = self.settings.anthropic_api_key.get_secret_value()
        return headers

    async def call(
        self, dialect: str, body: Mapping[str, Any], headers: Mapping[str, str], query: str = ""
    ) -> HttpReply:
        if dialect == GEMINI and isinstance(body, GeminiRequest):
            return await self._post(GEMINI, body.path, body, headers, query)
        endpoint = ENDPOINTS.get(dialect)
        if endpoint is None:
            raise ValueError(f"no upstream endpoint for the {dialect!r} wire format")
        return await self._post(*endpoint, body, headers, query)

    async def chat(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> HttpReply:
        return await self.call("chat", body, headers)

    async def count_tokens(self, body: Mapping[str, Any], headers: Mapping[str, str], query: str = "") -> HttpReply:
        """Anthropic's `POST /v1/messages/count_tokens`."""
        return await self._post("anthropic", COUNT_TOKENS, body, headers, query)

    async def _post(
        self, api: str, path: str, body: Mapping[str, Any], headers: Mapping[str, str], query: str
    ) -> HttpReply:
        """`body` as JSON to `path` of the OpenAI (`api` "openai"), the Anthropic or the Gemini API."""
        out = CIMultiDict(headers)
        out["Content-Type"] = "application/json"
        path_qs = path + (f"?{query}" if query else "")
        send = self.send_anthropic if api == "anthropic" else self.send_gemini if api == GEMINI else self.send
        return await send("POST", path_qs, out, encoded(body), limits=self.turn_limits)

    async def send(
        self,
        method: str,
        path_qs: str,
        headers: CIMultiDict[str],
        data: bytes | None,
        limits: ReplyLimits | None = None,
    ) -> HttpReply:
        """One request upstream; returns once the status line and headers are in. The reply is
        read within `limits` (default: those of a passthrough request)."""
        return await self._request(method, self.url(path_qs), self._auth(headers), data, limits)

    async def send_anthropic(
        self,
        method: str,
        path_qs: str,
        headers: CIMultiDict[str],
        data: bytes | None,
        limits: ReplyLimits | None = None,
    ) -> HttpReply:
        """`send` to the Anthropic API: its root (`path_qs` keeps its /v1), its key."""
        return await self._request(method, self._under(self.anthropic_base_url, path_qs), self._anthropic_auth(headers), data, limits)

    async def send_gemini(
        self,
        method: str,
        path_qs: str,
        headers: CIMultiDict[str],
        data: bytes | None,
        limits: ReplyLimits | None = None,
    ) -> HttpReply:
        """`send` to the Gemini API: its root (`path_qs` keeps its /v1beta), the client's key
        (`x-goog-api-key`, or `?key=` in the query) as it came."""
        return await self._request(method, self._under(self.gemini_base_url, path_qs), headers, data, limits)

    async def gemini_post(self, path: str, body: Mapping[str, Any], headers: Mapping[str, str], query: str = "") -> HttpReply:
        """`body` as JSON to `path` of the Gemini API (a managed prompt's `:countTokens`)."""
        return await self._post(GEMINI, path, body, headers, query)

    async def _request(
        self, method: str, url: URL, headers: CIMultiDict[str], data: bytes | None, limits: ReplyLimits | None
    ) -> HttpReply:
        assert self._session is not None, "HttpUpstream.start() was not awaited"
        meter = ReplyMeter(limits or self.passthrough_limits)
        heard_by = asyncio.get_running_loop().time() + self.settings.timeout_s  # the headers' silence
        with _upstream_errors(self.settings.timeout_s, meter):
            async with asyncio.timeout_at(heard_by if meter.deadline is None else min(heard_by, meter.deadline)):
                response = await self._session.request(method, url, headers=headers, data=data, allow_redirects=False)
        return HttpReply(response, self.settings.timeout_s, meter)


class _upstream_errors:
    """Turn aiohttp's failures into our 502 / 504 errors."""

    def __init__(self, timeout_s: float, meter: ReplyMeter) -> None:
        self.timeout_s = timeout_s
        self.meter = meter

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if exc is None or isinstance(exc, ProxyError):
            return False
        if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
            if self.meter.expired():
                raise self.meter.timeout() from None
            raise UpstreamTimeout(f"Upstream sent nothing for {self.timeout_s:g}s") from None
        if isinstance(exc, aiohttp.ClientError):
            raise UpstreamUnreachable(f"Upstream unreachable: {type(exc).__name__}: {_no_userinfo(str(exc))}") from None
        return False


def _no_userinfo(text: str) -> str:
    """`text` with the user and password of any URL in it replaced (aiohttp's errors quote URLs)."""
    return _USERINFO.sub("//***@", text)


_USERINFO = re.compile(r"//[^/@\s]+@")
