"""The raw passthrough: any OpenAI-compatible base URL over one pooled aiohttp session."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import orjson
from multidict import CIMultiDict, CIMultiDictProxy

from ..config import UpstreamSettings
from ..errors import UpstreamTimeout, UpstreamUnreachable

# Hop-by-hop headers (RFC 9110 7.6.1) and those aiohttp recomputes; never copied across.
HOP_BY_HOP = frozenset(
    h.lower()
    for h in (
        "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer",
        "Transfer-Encoding", "Upgrade", "Host", "Content-Length", "Content-Encoding", "Accept-Encoding",
    )
)


# Where each managed wire format is sent, under base_url.
ENDPOINTS = {"chat": "/chat/completions", "responses": "/responses"}


def forwardable(headers: Mapping[str, str], drop: frozenset[str] = frozenset()) -> CIMultiDict[str]:
    """Copy headers minus hop-by-hop ones and `drop` (lower-case names)."""
    out: CIMultiDict[str] = CIMultiDict()
    for name, value in headers.items():
        low = name.lower()
        if low not in HOP_BY_HOP and low not in drop:
            out.add(name, value)
    return out


class HttpReply:
    """UpstreamReply over an aiohttp response."""

    def __init__(self, response: aiohttp.ClientResponse, timeout_s: float) -> None:
        self._response = response
        self._timeout_s = timeout_s
        self.status = response.status
        self.headers: CIMultiDictProxy[str] = response.headers

    @property
    def is_event_stream(self) -> bool:
        return self._response.content_type == "text/event-stream"

    async def read(self) -> bytes:
        with _upstream_errors(self._timeout_s):
            return await self._response.read()

    async def chunks(self) -> AsyncIterator[bytes]:
        with _upstream_errors(self._timeout_s):
            async for chunk in self._response.content.iter_any():
                yield chunk

    def close(self) -> None:
        self._response.release()


class HttpUpstream:
    def __init__(self, settings: UpstreamSettings) -> None:
        self.settings = settings
        self.base_url = settings.base_url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.settings.timeout_s, sock_read=self.settings.timeout_s
        )
        self._session = aiohttp.ClientSession(
            timeout=timeout,
            connector=aiohttp.TCPConnector(limit=self.settings.max_connections),
            # We forward bodies as received; never let the session merge or rewrite cookies.
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def url(self, path_qs: str) -> str:
        """Map a client path onto the base URL: `/v1/models?x=1` -> `<base_url>/models?x=1`."""
        if path_qs == "/v1" or path_qs.startswith(("/v1/", "/v1?")):
            path_qs = path_qs[3:]
        return self.base_url + path_qs

    def _auth(self, headers: CIMultiDict[str]) -> CIMultiDict[str]:
        if self.settings.api_key is not None:
            headers["Authorization"] = f"Bearer {self.settings.api_key.get_secret_value()}"
        return headers

    async def call(self, dialect: str, body: Mapping[str, Any], headers: Mapping[str, str]) -> HttpReply:
        path = ENDPOINTS.get(dialect)
        if path is None:
            raise ValueError(f"no upstream endpoint for the {dialect!r} wire format")
        out = self._auth(CIMultiDict(headers))
        out["Content-Type"] = "application/json"
        return await self.send("POST", path, out, orjson.dumps(body))

    async def chat(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> HttpReply:
        return await self.call("chat", body, headers)

    async def send(self, method: str, path_qs: str, headers: CIMultiDict[str], data: bytes | None) -> HttpReply:
        """One request upstream; returns once the status line and headers are in."""
        assert self._session is not None, "HttpUpstream.start() was not awaited"
        with _upstream_errors(self.settings.timeout_s):
            response = await self._session.request(
                method, self.url(path_qs), headers=self._auth(headers), data=data, allow_redirects=False
            )
        return HttpReply(response, self.settings.timeout_s)


class _upstream_errors:
    """Turn aiohttp's failures into our 502 / 504 errors."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> bool:
        if exc is None:
            return False
        if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
            raise UpstreamTimeout(f"Upstream sent nothing for {self.timeout_s:g}s") from None
        if isinstance(exc, aiohttp.ClientError):
            raise UpstreamUnreachable(f"Upstream unreachable: {type(exc).__name__}: {exc}") from None
        return False
