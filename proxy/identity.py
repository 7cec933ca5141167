"""Who is asking (tenant) and which conversation a request belongs to.

Pure: it reads headers as a plain Mapping (an HTTP handler passes its request's), so the engine
and the store use it without an HTTP server.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
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
    dialect's `thread_basis`: system prompt, first user message, tool names)."""
    return thread_token_and_size("", basis)[0]


def thread_token_and_size(tenant: str, basis: Any) -> tuple[str, int]:
    """The thread token (the tenant is not in it: the family's id is), and the size it hashed."""
    blob = json.dumps(basis, sort_keys=True, ensure_ascii=False).encode()
    return hashlib.sha256(b"context-proxy thread\0" + blob).hexdigest()[:THREAD_HASH_CHARS], len(blob)


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
    return derived_id_and_size(tenant, basis)[0]


def derived_id_and_size(tenant: str, basis: Any) -> tuple[str, int]:
    """The derived id, and the size of what it hashed (what a remembered basis holds, about)."""
    blob = json.dumps([tenant, *basis], sort_keys=True, ensure_ascii=False).encode()
    return "auto-" + hashlib.sha256(blob).hexdigest()[:32], len(blob)


class RunNames:
    """A name hashed from a run's basis (`derived_conversation_id`, or a session thread's
    `thread_token`), remembered for recent runs: every turn of an agent repeats its run's basis
    (system prompt, task, tool names: KBs to dump and hash, ~3% of a later turn). Looked up by
    what the caller says names the run (its request's BodyCache key), and used only if the
    basis kept there equals this one: a comparison at C speed, usually of the very same objects
    (a body the BodyCache extended shares them), so a shared name costs a hash, never a wrong
    name. Bounded by `max_entries` runs and `max_bytes` of the bases kept (they outlive the
    bodies they came from), least recently used out first."""

    def __init__(
        self, name: Callable[[str, Any], tuple[str, int]], max_entries: int = 256, max_bytes: int = 2 * 2**20
    ) -> None:
        self.name = name  # (tenant, basis) -> (the name, the size of what it hashed)
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._ids: OrderedDict[Any, tuple[Any, str, int]] = OrderedDict()
        self._bytes = 0

    def of(self, tenant: str, basis: Any, run: Hashable) -> str:
        key = (tenant, run)
        held = self._ids.get(key)
        if held is not None and held[0] == basis:
            self._ids.move_to_end(key)
            return held[1]
        named, size = self.name(tenant, basis)
        if held is not None:
            self._bytes -= held[2]
        self._ids[key] = (basis, named, size)
        self._ids.move_to_end(key)
        self._bytes += size
        while len(self._ids) > self.max_entries or (self._bytes > self.max_bytes and len(self._ids) > 1):
            _, (_, _, dropped) = self._ids.popitem(last=False)
            self._bytes -= dropped
        return named
