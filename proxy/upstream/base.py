"""What the request handlers need from an upstream, whatever sits behind it.

The raw HTTP passthrough implements it, and the litellm adapter implements the same protocol, so
the engine never knows which one answered.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol
from urllib.parse import quote

import orjson


class EncodedBody(dict[str, Any]):
    """A request body that may also carry its JSON bytes (`orjson.dumps` of it, made cheaper by
    reusing the previous turn's): an HTTP upstream sends `encoded` as it is, any other reads
    the dict. Neither may be edited once made."""

    __slots__ = ("encoded",)

    def __init__(self, body: Mapping[str, Any], encoded: bytes | None = None) -> None:
        super().__init__(body)
        self.encoded = encoded


class GeminiRequest(EncodedBody):
    """A Gemini API request body with what that API puts in the URL instead: the model, whether
    the reply streams, and the API version the client called (`v1beta`, `v1`)."""

    __slots__ = ("model", "stream", "version")

    def __init__(
        self, body: Mapping[str, Any], model: str, stream: bool, version: str = "v1beta", encoded: bytes | None = None
    ) -> None:
        super().__init__(body, encoded)
        self.model, self.stream, self.version = model, stream, version

    @property
    def path(self) -> str:
        """Its path under the API's root, the model percent-encoded."""
        method = "streamGenerateContent" if self.stream else "generateContent"
        return f"/{self.version}/models/{quote(self.model, safe='-._~')}:{method}"


def encoded(body: Mapping[str, Any]) -> bytes:
    """The JSON bytes of a request body: those it carries, else made now."""
    made = body.encoded if isinstance(body, EncodedBody) else None
    return made if made is not None else orjson.dumps(body)


class UpstreamReply(Protocol):
    """An upstream answer whose status and headers are known; the body is read or streamed once."""

    status: int
    headers: Mapping[str, str]

    @property
    def is_event_stream(self) -> bool: ...

    async def read(self) -> bytes: ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; raises UpstreamTimeout / UpstreamUnreachable if it stops."""

    def close(self) -> None: ...


class Upstream(Protocol):
    # Whether it sends an EncodedBody's bytes as they are (HTTP) rather than reading the dict
    # (litellm, which may edit it): only then is a body worth making of the previous turn's bytes.
    sends_encoded: bool

    async def call(
        self, dialect: str, body: Mapping[str, Any], headers: Mapping[str, str], query: str = ""
    ) -> UpstreamReply:
        """Send one turn's request in the wire format named by `dialect` ("chat", "messages", ...),
        with the client's query string (`query`: Anthropic's `beta=true`); raises
        UpstreamUnreachable / UpstreamTimeout if no status came back."""

    async def chat(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> UpstreamReply:
        """Send a chat completion (`call("chat", ...)`)."""
