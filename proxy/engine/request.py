"""What the engine takes from an HTTP handler and gives back to it: no aiohttp in here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ..config import Profile
from ..dialects.base import Dialect
from ..prefix import ParsedBody
from ..transcript import Raw
from .report import TurnReport


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """A client's request for one turn as it came, in no HTTP framework's terms: what an HTTP
    handler gives the engine (Engine.run reads it: intake.py)."""

    dialect: Dialect
    raw: bytes  # the request body
    headers: Mapping[str, str]  # the client's request headers, their names case-insensitive (as HTTP's)
    tenant: str  # who is asking (identity.request_tenant)
    conversation_id: str | None  # named by the client (X-Conversation-ID, the /c/<id> path), checked
    query: str = ""  # the request's query string, forwarded with each upstream call (`beta=true`)
    query_api_key: str | None = None  # a Gemini client's `?key=`: it goes upstream as `x-goog-api-key` too


@dataclass(slots=True)
class ParsedRequest:
    """A client's request for one turn, read (intake.py): everything the engine needs."""

    dialect: Dialect
    body: dict[str, Any]  # the request body as received; nothing edits it
    size: int  # bytes of the body
    tenant: str
    conversation_id: str | None  # named by the client (X-Conversation-ID, the /c/<id> path)
    session_id: str | None  # the session a known client names (Codex, Claude Code)
    history: str  # "full": the request carries the transcript; "proxy": only its new items
    profile: Profile
    compaction: str | None  # "force" | "skip" | None (X-Compaction)
    headers: dict[str, str]  # what goes upstream with the request (credentials, betas, ...)
    knowledge_namespace: str | None = None  # X-Knowledge-Namespace, else the profile's (None: the default)
    anchor_seq: int | None = None  # set by the engine: the stored reply the request continues
    thread: int | None = None  # set by the engine: the session thread this request starts as its main one
    query: str = ""  # the request's query string, forwarded with each upstream call (`beta=true`)
    parsed: ParsedBody | None = None  # how the body was read (what it reuses of the previous request)
    title: str | None = None  # X-Conversation-Title, checked
    client: str | None = None  # the client by its User-Agent ("Codex 0.171.0", ...)

    @property
    def from_cache(self) -> bool:
        """Whether the body is the body cache's (prefix.py): its transcript's items read already."""
        return self.parsed is not None and self.parsed.entry is not None and self.parsed.entry.body is self.body

    def transcript(self) -> list[Raw]:
        """The body's transcript items: the body cache's when the body came from it (Messages and
        Gemini split only the messages a request added), else the dialect's reading of it whole
        (~250 messages looked at one by one, every time it is asked)."""
        if self.from_cache:
            return self.parsed.entry.raws  # type: ignore[union-attr]
        return self.dialect.transcript(self.body)


@dataclass(slots=True)
class Outcome:
    status: int
    headers: dict[str, str]
    body: bytes | None  # None: the reply went to the client through the sink, as a stream
    report: TurnReport


@dataclass(slots=True)
class DryRun:
    """What a turn would send upstream first (Engine.dry_run), nothing written."""

    body: dict[str, Any]  # its first upstream call's body
    headers: dict[str, str]  # what would go upstream with it
    report: TurnReport


class TurnWatcher(Protocol):
    """Told once a turn's conversation is known (the request is read)."""

    def began(self, report: TurnReport) -> None:
        """`report.key` is the conversation; the report is filled in as the turn goes, and says
        how it went once the engine returned or raised."""


class ClientSink(TurnWatcher, Protocol):
    """Where a streamed reply goes: the client's open connection."""

    async def open(self, status: int, headers: Mapping[str, str]) -> None: ...

    async def write(self, data: bytes) -> None:
        """Raises ConnectionResetError when the client is gone."""

    async def close(self) -> None: ...
