"""What an upstream's error body says: one reader for the shapes upstreams answer errors in, so
that the turn record, the summarizer and the litellm route read the same words from it.

OpenAI's and llama.cpp's `{"error": {"message", "type", "code"}}`, Anthropic's `{"type": "error",
"error": {"type", "message"}}`, Google's `{"error": {"code", "message", "status"}}`, a bare
`{"error": "..."}`, and the `{"message": ...}` / `{"detail": ...}` of other servers (FastAPI, vLLM).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson


@dataclass(frozen=True, slots=True)
class ErrorBody:
    message: str | None  # the error's own words, stripped (None: the body names none)
    type: str | None = None  # `error.type`, when a string
    code: str | None = None  # `error.code`, when a string (Google's is a number: not this)


def read_error_body(body: bytes | str) -> ErrorBody:
    """What `body` says of its error (all None when it is not JSON or names nothing)."""
    try:
        parsed = orjson.loads(body)
    except ValueError:
        return ErrorBody(None)
    if not isinstance(parsed, dict):
        return ErrorBody(None)
    error = parsed.get("error")
    kind = code = None
    if isinstance(error, dict):
        kind, code = _string(error.get("type")), _string(error.get("code"))
        error = error.get("message")
    for candidate in (error, parsed.get("message"), parsed.get("detail")):
        if isinstance(candidate, str) and candidate.strip():
            return ErrorBody(candidate.strip(), kind, code)
    return ErrorBody(None, kind, code)


def error_text(body: bytes, limit: int) -> str:
    """The message of an error body, else the text it sent, cut to `limit` characters: never empty."""
    message = read_error_body(body).message
    if message is not None:
        return message[:limit]
    return body[:limit].decode("utf-8", "replace").strip() or "(no error message)"


def _string(value: object) -> str | None:
    return value if isinstance(value, str) else None
