"""Who is asking (tenant) and which conversation a request belongs to.

Pure: it reads headers as a plain Mapping (an HTTP handler passes its request's), so the engine
and the store use it without an HTTP server.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .config import ConversationSettings
from .errors import InvalidRequest

CONVERSATION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
ANONYMOUS = "anonymous"
SHARED = "shared"


@dataclass(frozen=True, slots=True)
class ConversationKey:
    """A conversation's address in the store: ids are only unique within a tenant."""

    tenant: str
    id: str

    def __str__(self) -> str:
        return f"{self.tenant}/{self.id}"


def bearer_token(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("Authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def tenant_of(api_key: str | None) -> str:
    """A stable, one-way name for an API key; the key itself is never stored or logged."""
    if not api_key:
        return ANONYMOUS
    return hashlib.sha256(b"context-proxy tenant\0" + api_key.encode()).hexdigest()[:24]


def api_key(headers: Mapping[str, str], query_key: str | None = None) -> str | None:
    """The client's API key: its Bearer token, Anthropic's `x-api-key` header, Google's
    `x-goog-api-key`, or `query_key` (a Gemini route's `?key=`)."""
    return (
        bearer_token(headers)
        or (headers.get("x-api-key") or "").strip()
        or (headers.get("x-goog-api-key") or "").strip()
        or query_key
        or None
    )


def request_tenant(headers: Mapping[str, str], settings: ConversationSettings, query_key: str | None = None) -> str:
    """The tenant a request with these headers (and a Gemini route's `?key=`) belongs to."""
    if not settings.tenant_isolation:
        return SHARED
    return tenant_of(api_key(headers, query_key))


def check_conversation_id(value: str) -> str:
    if not CONVERSATION_ID.fullmatch(value) or set(value) == {"."}:
        raise InvalidRequest(
            "Invalid conversation id: use 1-128 characters of A-Z a-z 0-9 . _ : -",
            code="invalid_conversation_id",
        )
    return value


def session_conversation_id(value: object) -> str | None:
    """A client's session id as a conversation id, if it is one (a UUID is); else None."""
    if isinstance(value, str) and CONVERSATION_ID.fullmatch(value) and set(value) != {"."}:
        return value
    return None


def explicit_conversation_id(
    headers: Mapping[str, str], path_id: str | None, settings: ConversationSettings
) -> str | None:
    """The id named by the header or the `/c/<id>/v1` path (`path_id`), validated; None when neither is given."""
    header = headers.get(settings.id_header)
    if header is not None:
        return check_conversation_id(header)
    if path_id is not None:
        return check_conversation_id(path_id)
    return None


THREAD_SEPARATOR = ":"
THREAD_HASH_CHARS = 12


def thread_token(basis: Any) -> str:
    """A short stable name for one thread of a client session: a hash of what starts it (its
    dialect's `thread_basis`: system prompt, first user message, tool names). The tenant is not
    in it: the family's id is."""
    blob = json.dumps(basis, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(b"context-proxy thread\0" + blob).hexdigest()[:THREAD_HASH_CHARS]


def thread_conversation_id(family: str, token: str) -> str:
    """The conversation id of a session's thread other than its main one (a subagent's):
    `<session>:<token>`, the session cut so that the id stays within 128 characters."""
    room = 128 - len(THREAD_SEPARATOR) - len(token)
    return f"{family[:room]}{THREAD_SEPARATOR}{token}"


def family_of(conversation_id: str, is_thread: bool) -> str:
    """The session a thread's conversation id belongs to (the id itself for its main thread)."""
    head, sep, tail = conversation_id.rpartition(THREAD_SEPARATOR)
    if is_thread and sep and len(tail) == THREAD_HASH_CHARS and all(c in "0123456789abcdef" for c in tail):
        return head
    return conversation_id


def derived_conversation_id(tenant: str, basis: Any) -> str:
    """Stable per agent run: a hash of the tenant and the run's basis (its dialect's choice: the
    system prompt and the first user message)."""
    blob = json.dumps([tenant, *basis], sort_keys=True, ensure_ascii=False).encode()
    return "auto-" + hashlib.sha256(blob).hexdigest()[:32]
