"""Any provider through litellm: a `models:` entry with `litellm_model` is answered here.

`LiteLLMUpstream` implements the same `Upstream` protocol as the raw passthrough. The request's
OpenAI parameters go to `litellm.acompletion` (Anthropic, Gemini, Bedrock, Ollama, vLLM, ...), and
the reply comes back as OpenAI bytes: a `chat.completion` JSON body, or `data: {chunk}` SSE events
ending with `data: [DONE]`, tool calls included, with `model` set to the public name the client
asked for. The chat handler can't tell it from an OpenAI-compatible upstream. A Responses request
is translated to a chat completion and back (litellm_responses.py).

litellm is heavy (~2 s and ~190 MB to import), so it is imported on first use, in a thread, and
only by this module: a proxy without litellm models never loads it, and passthrough requests
never touch it. It is told to stay offline (bundled model table) and quiet (no callbacks, no
telemetry, no debug prints); its own log records go through ours at WARNING and above.

What reaches litellm is the request's OpenAI parameters only (an allow-list: a client can't set
`api_base` or `api_key`), a copy of the messages that starts on a user turn, then the entry's
`params`, `api_base`, key (from `api_key_env`, read at each call) and `extra_headers`. Parameters
a provider lacks are dropped, and nothing is retried behind the client's back.

Errors become OpenAI-shaped `ProviderError`s with the status a client expects (401, 403, 404,
429, 400, 504, 502/503) and a message naming the model and provider that failed. Provider keys
are scrubbed from every message; they are never logged.
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import json
import logging
import os
import re
import threading
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ..config import ModelSettings
from ..errors import ProxyError
from .base import UpstreamReply
from .error_body import read_error_body
from .limits import ReplyLimits, ReplyMeter

log = logging.getLogger("proxy.litellm")

# Parameters of an OpenAI chat request that are handed on to litellm; anything else a client
# sends (api_base, api_key, extra_headers, metadata, ...) stays here: a client must never be able
# to redirect our provider key, or to set litellm's own arguments.
OPENAI_PARAMS = frozenset(
    {
        "stream_options",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "functions",
        "function_call",
        "temperature",
        "top_p",
        "n",
        "stop",
        "max_tokens",
        "max_completion_tokens",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "user",
        "seed",
        "response_format",
        "reasoning_effort",
        "modalities",
        "audio",
        "prediction",
        "web_search_options",
        "verbosity",
        "service_tier",
        "thinking",
    }
)
# litellm arguments every call gets unless the model's `params:` say otherwise: parameters a
# provider lacks are dropped (as an OpenAI client expects them to be harmless), and retries are
# the client's business (an agent retries; a proxy that retries too multiplies the wait).
DEFAULT_PARAMS: dict[str, Any] = {"drop_params": True, "max_retries": 0}
# Replies of an upstream built without limits (by hand, in tests): no bound but silence.
UNBOUNDED = ReplyLimits(max_bytes=2**62, max_stream_bytes=None, max_line=2**62, max_s=None)

OMITTED_NOTE = "(Earlier messages of this conversation are not shown.)"
SSE_DONE = b"data: [DONE]\n\n"
JSON_HEADERS = {"Content-Type": "application/json"}
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
MAX_DETAIL_CHARS = 1000

# -- the lazy import ----------------------------------------------------------------------------

_litellm: ModuleType | None = None
_import_lock = threading.Lock()


def loaded() -> bool:
    """Whether litellm has been imported (by this module) in this process."""
    return _litellm is not None


async def load_litellm() -> ModuleType:
    """litellm, imported on first use in a thread (the import takes seconds: never on the loop)."""
    if _litellm is not None:
        return _litellm
    return await asyncio.to_thread(_import_litellm)


def _import_litellm() -> ModuleType:
    global _litellm
    with _import_lock:
        if _litellm is None:
            # Use the model table bundled in the wheel instead of fetching it at import.
            os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
            # Its types trip a pydantic warning on first use, printed to stderr: not ours to show.
            warnings.filterwarnings("ignore", message=r".*using the `ReadOnly` qualifier", category=UserWarning)
            module = importlib.import_module("litellm")
            _configure(module)
            _litellm = module
            log.info("litellm loaded", extra={"version": getattr(module, "__version__", None) or _version()})
    return _litellm


def _version() -> str | None:
    try:
        from importlib.metadata import version

        return version("litellm")
    except Exception:  # noqa: BLE001  # a version number is not worth failing for
        return None


def _configure(litellm: ModuleType) -> None:
    """No telemetry, no callbacks, no debug prints; litellm's log records flow through ours."""
    # Let litellm repair what a provider would refuse in an OpenAI-valid transcript (Anthropic and
    # Bedrock: empty turns, tool calls without results, one role twice in a row). An explicit
    # LITELLM_MODIFY_PARAMS in the environment keeps the user's choice.
    if "LITELLM_MODIFY_PARAMS" not in os.environ:
        litellm.modify_params = True
    litellm.telemetry = False
    litellm.suppress_debug_info = True  # else it print()s "Provider List: ..." banners
    litellm.set_verbose = False
    litellm.turn_off_message_logging = True
    litellm.redact_messages_in_exceptions = True
    for name in (
        "callbacks",
        "success_callback",
        "failure_callback",
        "input_callback",
        "service_callback",
        "_async_success_callback",
        "_async_failure_callback",
        "_async_input_callback",
    ):
        if isinstance(getattr(litellm, name, None), list):
            setattr(litellm, name, [])
    secret_filter = getattr(getattr(litellm, "_logging", None), "_secret_filter", None)
    for name in ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy"):
        logger = logging.getLogger(name)
        logger.handlers[:] = []  # its own handler prints to stdout in its own format
        logger.propagate = True
        logger.setLevel(logging.WARNING)
        if isinstance(secret_filter, logging.Filter):
            logger.addFilter(secret_filter)


# -- errors -------------------------------------------------------------------------------------


class ProviderError(ProxyError):
    """A provider's failure as an OpenAI-shaped error, with the status a client expects."""

    type = "upstream_error"

    def __init__(self, status: int, message: str, code: str | None, type_: str | None = None) -> None:
        super().__init__(message, code=code)
        self.status = status
        if type_ is not None:
            self.type = type_


class ProviderStreamBroken(ProviderError):
    """The provider failed after the stream had started (the client already has a 200)."""


# (litellm exception class name, status we answer, code, type): the first match wins, so
# subclasses come before their parents (ContextWindowExceeded is a BadRequest, Timeout is a
# connection error, MidStreamFallbackError a ServiceUnavailable).
_MAPPING: tuple[tuple[str, int, str, str], ...] = (
    ("ContextWindowExceededError", 400, "context_length_exceeded", "invalid_request_error"),
    ("ContentPolicyViolationError", 400, "content_policy_violation", "invalid_request_error"),
    ("UnsupportedParamsError", 400, "unsupported_parameter", "invalid_request_error"),
    ("BadRequestError", 400, "bad_request", "invalid_request_error"),
    ("UnprocessableEntityError", 400, "bad_request", "invalid_request_error"),
    ("AuthenticationError", 401, "invalid_api_key", "authentication_error"),
    ("PermissionDeniedError", 403, "permission_denied", "permission_error"),
    ("NotFoundError", 404, "model_not_found", "invalid_request_error"),
    ("RateLimitError", 429, "rate_limit_exceeded", "rate_limit_error"),
    ("Timeout", 504, "upstream_timeout", "upstream_error"),
    ("APIConnectionError", 502, "upstream_unreachable", "upstream_error"),
    ("ServiceUnavailableError", 503, "upstream_unavailable", "upstream_error"),
    ("BadGatewayError", 502, "upstream_error", "upstream_error"),
    ("InternalServerError", 502, "upstream_error", "upstream_error"),
)
_BY_STATUS = {
    400: ("bad_request", "invalid_request_error"),
    401: ("invalid_api_key", "authentication_error"),
    403: ("permission_denied", "permission_error"),
    404: ("model_not_found", "invalid_request_error"),
    408: ("upstream_timeout", "upstream_error"),
    413: ("request_too_large", "invalid_request_error"),
    422: ("bad_request", "invalid_request_error"),
    429: ("rate_limit_exceeded", "rate_limit_error"),
}
_LABELS = {
    400: "rejected the request",
    401: "rejected the API key",
    403: "refused access",
    404: "answered not found",
    429: "is rate limiting",
    502: "failed",
    503: "is unavailable",
    504: "timed out",
}
# Key-like strings a provider might echo back in an error (OpenAI-style, Anthropic, Google).
_KEY_PATTERN = re.compile(r"\b(?:sk-[A-Za-z0-9_\-]{6,}|AIza[0-9A-Za-z_\-]{20,})")
_LITELLM_PREFIX = re.compile(r"^(?:litellm\.\w+:\s*)+")
_PROVIDER_PREFIX = re.compile(r"^\w*(?:Exception|Error)\s*-\s*")
_HANDLE_WITH = re.compile(r"\.?\s*Handle with `litellm\.\w+`\.?\s*$")


def classify(exc: BaseException, provider_type: str | None = None) -> tuple[int, str, str]:
    """(status, code, type) for a failure of a litellm call; `provider_type` is the provider's own
    error type where its body said (Anthropic's 529 `overloaded_error` reaches us as a 500)."""
    original = getattr(exc, "original_exception", None)  # MidStreamFallbackError wraps the real one
    if isinstance(original, BaseException) and original is not exc:
        return classify(original, provider_type)
    names = {cls.__name__ for cls in type(exc).__mro__ if cls.__module__.startswith("litellm")}
    status_code = getattr(exc, "status_code", None)
    if status_code in (503, 529) or provider_type == "overloaded_error":
        return 503, "upstream_unavailable", "upstream_error"
    for name, status, code, type_ in _MAPPING:
        if name in names:
            if status == 502:  # litellm reports a refused connection as a provider's 500
                return _transport_failure(exc) or (status, code, type_)
            return status, code, type_
    if isinstance(status_code, int) and 400 <= status_code < 500:
        code, type_ = _BY_STATUS.get(status_code, ("bad_request", "invalid_request_error"))
        return (504 if status_code == 408 else status_code), code, type_
    return _transport_failure(exc) or (502, "upstream_error", "upstream_error")


_TIMEOUTS = (
    "TimeoutError",
    "TimeoutException",
    "ReadTimeout",
    "ConnectTimeout",
    "APITimeoutError",
    "ServerTimeoutError",
)
_CONNECTION_FAILURES = (
    "ConnectError",
    "ClientConnectorError",
    "ConnectionError",
    "APIConnectionError",
    "ServerDisconnectedError",
    "ClientOSError",
    "RemoteProtocolError",
)


def _transport_failure(exc: BaseException) -> tuple[int, str, str] | None:
    """504 / 502 when the exception's chain shows a timeout or a failed connection, else None."""
    seen: BaseException | None = exc
    for _ in range(12):
        if seen is None:
            break
        names = {cls.__name__ for cls in type(seen).__mro__}
        if names.intersection(_TIMEOUTS):
            return 504, "upstream_timeout", "upstream_error"
        if names.intersection(_CONNECTION_FAILURES):
            return 502, "upstream_unreachable", "upstream_error"
        seen = seen.__cause__ or seen.__context__
    return None


def provider_detail(exc: BaseException, secrets: list[str]) -> tuple[str | None, str]:
    """(the provider's error type if its body names one, its own words): litellm's prefixes and
    suffixes taken off, keys scrubbed, bounded."""
    original = getattr(exc, "original_exception", None)
    if isinstance(original, BaseException) and original is not exc:
        exc = original
    text = str(getattr(exc, "message", None) or exc or type(exc).__name__).strip()
    text = _LITELLM_PREFIX.sub("", text)
    text = _PROVIDER_PREFIX.sub("", text)
    text = _HANDLE_WITH.sub("", text)
    if text[:2] in ("b'", 'b"'):  # a streamed error body, quoted as bytes
        try:
            text = ast.literal_eval(text).decode("utf-8", "replace")
        except (ValueError, SyntaxError, AttributeError):
            pass
    kind: str | None = None
    body = read_error_body(text)
    if body.message is not None:
        text, kind = body.message, body.type
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    text = " ".join(_KEY_PATTERN.sub("***", text).split())
    if len(text) > MAX_DETAIL_CHARS:
        text = text[:MAX_DETAIL_CHARS] + "..."
    return kind, text or type(exc).__name__


# -- the upstream -------------------------------------------------------------------------------

# A wire format a route serves besides chat: one request in that format, sent through the route's
# chat path and answered in that format (litellm_responses.py, litellm_messages.py; the router
# supplies them, so this module imports neither).
FormatCall = Callable[["LiteLLMUpstream", Mapping[str, Any], Mapping[str, str]], Awaitable[UpstreamReply]]


class LiteLLMUpstream:
    """One `models:` entry routed through litellm: `chat(body, headers) -> UpstreamReply`."""

    sends_encoded = False  # it reads the body's dict (see Upstream)

    def __init__(
        self,
        name: str,
        entry: ModelSettings,
        timeout_s: float,
        limits: ReplyLimits | None = None,
        formats: Mapping[str, FormatCall] | None = None,
    ) -> None:
        if not entry.litellm_model:
            raise ValueError(f"models.{name} has no litellm_model")
        self.name = name
        self.entry = entry
        self.limits = limits  # None: unbounded (tests that build one by hand)
        self.litellm_model: str = entry.litellm_model
        self.provider = self.litellm_model.split("/", 1)[0] if "/" in self.litellm_model else "litellm"
        self.timeout_s = entry.timeout_s or timeout_s
        self.formats = dict(formats or {})  # wire formats besides chat, each translated to chat and back

    def __repr__(self) -> str:
        return f"LiteLLMUpstream({self.name!r} -> {self.litellm_model!r})"

    @property
    def describe(self) -> str:
        return f"{self.name} ({self.litellm_model})"

    def api_key(self, headers: Mapping[str, str]) -> str | None:
        """The provider key for one call: the env var's value now, or the client's own key."""
        entry = self.entry
        if entry.api_key_env is not None:
            value = os.environ.get(entry.api_key_env)
            if not value:
                raise ProviderError(
                    500,
                    f"Model {self.describe}: the key variable {entry.api_key_env} is not set for the proxy",
                    "provider_key_missing",
                    "server_error",
                )
            return value
        if entry.forward_client_key:
            for name, value in headers.items():
                if name.lower() == "authorization":
                    scheme, _, token = value.partition(" ")
                    if scheme.lower() == "bearer" and token.strip():
                        return token.strip()
        return None

    def arguments(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> dict[str, Any]:
        """The keyword arguments of `litellm.acompletion` for one request."""
        stream = body.get("stream") is True
        picked = {k: v for k, v in body.items() if k in OPENAI_PARAMS and v is not None}
        if not stream:
            picked.pop("stream_options", None)
        picked["messages"] = body.get("messages") or []
        # A deep copy (JSON round trip: the body is JSON): litellm's transformations may edit
        # messages and tools in place, and ours are reused on later turns and rounds.
        picked = json.loads(json.dumps(picked))
        picked["messages"] = user_first(picked["messages"])
        kwargs: dict[str, Any] = {**DEFAULT_PARAMS, **picked, **self.entry.params}
        kwargs.update(model=self.litellm_model, stream=stream, timeout=self.timeout_s)
        if self.entry.api_base is not None:
            kwargs["api_base"] = self.entry.api_base
        key = self.api_key(headers)
        if key is not None:
            kwargs["api_key"] = key
        if self.entry.extra_headers:
            kwargs["extra_headers"] = dict(self.entry.extra_headers)
        return kwargs

    async def call(
        self, dialect: str, body: Mapping[str, Any], headers: Mapping[str, str], query: str = ""
    ) -> UpstreamReply:
        if dialect == "chat":
            return await self.chat(body, headers)
        translate = self.formats.get(dialect)
        if translate is None:
            raise ValueError(f"litellm routes serve chat completions and {sorted(self.formats)}, not {dialect!r}")
        return await translate(self, body, headers)

    async def chat(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> LiteLLMReply:
        started = await self.start(self.arguments(body, headers))
        if started.iterator is None:
            return LiteLLMReply(self, started.secrets, started.meter, body=self._completion_bytes(started.response))
        return LiteLLMReply(
            self, started.secrets, started.meter, stream=started.response, iterator=started.iterator,
            first=started.first,
        )

    async def start(self, kwargs: dict[str, Any]) -> Started:
        """One `litellm.acompletion`, within this route's limits: the whole response, or a stream
        whose first chunk is in.

        Waiting for the first chunk: a provider that refuses a streamed request (401, 429, ...) does
        so before any chunk, and some litellm providers only connect on the first read. The
        refusal is then still an HTTP error with its status, not a 200 stream holding an error."""
        litellm = await load_litellm()
        secrets = [kwargs.get("api_key") or ""]
        meter = ReplyMeter(self.limits or UNBOUNDED, event_stream=kwargs["stream"])
        try:
            async with asyncio.timeout_at(meter.deadline):
                response = await litellm.acompletion(**kwargs)
        except Exception as exc:  # noqa: BLE001  # every provider failure becomes an OpenAI error
            raise (meter.timeout() if meter.expired() else self.error(exc, secrets)) from None
        if not kwargs["stream"]:
            return Started(response, secrets, meter)
        stream = response.__aiter__()
        try:
            async with asyncio.timeout_at(meter.deadline):
                first = await stream.__anext__()
        except StopAsyncIteration:
            first = None
        except BaseException as exc:
            await _aclose(response)
            if isinstance(exc, Exception):
                raise (meter.timeout() if meter.expired() else self.error(exc, secrets)) from None
            raise
        return Started(response, secrets, meter, stream, first)

    def error(self, exc: BaseException, secrets: list[str], midstream: bool = False) -> ProviderError:
        if isinstance(exc, ProviderError):
            return exc
        kind, detail = provider_detail(exc, secrets)
        status, code, type_ = classify(exc, kind)
        label = _LABELS.get(status, "failed")
        where = " mid-stream" if midstream else ""
        message = f"Model {self.describe}: provider {self.provider} {label}{where}: {detail}"
        log.warning(
            "provider error",
            extra={
                "model": self.name,
                "litellm_model": self.litellm_model,
                "status": status,
                "code": code,
                "error": type(exc).__name__,
                "midstream": midstream,
                "detail": detail,
            },
        )
        cls = ProviderStreamBroken if midstream else ProviderError
        return cls(status, message, code, type_)

    def _completion_bytes(self, response: Any) -> bytes:
        data = _dump(response)
        data["model"] = self.name
        for choice in data.get("choices") or ():
            for call in (choice.get("message") or {}).get("tool_calls") or ():
                call.pop("index", None)  # a streaming field: a message's tool calls have none
        return json.dumps(data, ensure_ascii=False).encode()

    def chunk_bytes(self, chunk: Any) -> tuple[bytes, bool]:
        """One SSE event for a litellm stream chunk; and whether it carries a finish_reason."""
        data = _dump(chunk)
        data["model"] = self.name
        finished = any(isinstance(c, dict) and c.get("finish_reason") for c in data.get("choices") or ())
        return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n", finished


@dataclass(slots=True)
class Started:
    """A litellm call under way: its response (a stream: its iterator and first chunk too), read
    within `meter`'s bounds."""

    response: Any
    secrets: list[str]
    meter: ReplyMeter
    iterator: AsyncIterator[Any] | None = None
    first: Any = None


def user_first(messages: list[Any]) -> list[Any]:
    """Start the conversation on a user turn: Anthropic, Gemini, Bedrock and many chat templates
    refuse one that starts on an assistant message, which is what the token window sends when the
    newest messages alone fill the budget. A short placeholder says what is missing."""
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role in ("system", "developer"):
            continue
        if role != "user":
            messages.insert(i, {"role": "user", "content": OMITTED_NOTE})
        break
    return messages


def _dump(obj: Any) -> dict[str, Any]:
    if hasattr(obj, "model_dump"):
        return obj.model_dump()
    if isinstance(obj, dict):
        return dict(obj)
    return json.loads(obj.json())


async def _aclose(stream: Any) -> None:
    close = getattr(stream, "aclose", None)
    try:
        if close is not None:
            await close()
        elif hasattr(stream, "close"):
            stream.close()
    except Exception as exc:  # noqa: BLE001  # closing an abandoned stream must not fail anything
        log.debug("closing a litellm stream failed: %s", exc)


class LiteLLMReply:
    """UpstreamReply over a litellm response: OpenAI JSON bytes, or OpenAI SSE events."""

    status = 200

    def __init__(
        self,
        upstream: LiteLLMUpstream,
        secrets: list[str],
        meter: ReplyMeter,
        *,
        body: bytes | None = None,
        stream: Any = None,
        iterator: AsyncIterator[Any] | None = None,
        first: Any = None,
    ) -> None:
        self._upstream = upstream
        self._secrets = secrets
        self._meter = meter
        self._body = body
        self._stream = stream
        self._iterator = iterator
        self._first = first
        self._finished = stream is None  # the litellm stream was read to its end (or there is none)
        self._closer: asyncio.Task[None] | None = None
        self.headers: Mapping[str, str] = JSON_HEADERS if stream is None else SSE_HEADERS

    @property
    def is_event_stream(self) -> bool:
        return self._stream is not None

    async def read(self) -> bytes:
        if self._body is not None:
            self._meter.count(self._body, streamed=False)
            return self._body
        return b"".join([chunk async for chunk in self.chunks()])

    async def chunks(self) -> AsyncIterator[bytes]:
        """The reply as SSE bytes, one event per litellm chunk, ending with `data: [DONE]`.

        Raises ProviderStreamBroken if the provider fails mid-stream or stops before a
        finish_reason (the reply would be cut short without anyone saying so).
        """
        meter = self._meter
        if self._body is not None:
            meter.count(self._body, streamed=True)
            yield self._body
            return
        assert self._iterator is not None, "a litellm stream is read once"
        upstream, iterator = self._upstream, self._iterator
        first, self._first, self._iterator = self._first, None, None
        finished = False
        try:
            if first is not None:
                event, done = upstream.chunk_bytes(first)
                meter.count(event, streamed=True)
                finished |= done
                yield event
            while True:
                try:
                    async with asyncio.timeout_at(meter.deadline):
                        chunk = await iterator.__anext__()
                except StopAsyncIteration:
                    break
                except Exception as exc:  # noqa: BLE001
                    if meter.expired():
                        raise meter.timeout() from None
                    raise upstream.error(exc, self._secrets, midstream=True) from None
                event, done = upstream.chunk_bytes(chunk)
                meter.count(event, streamed=True)  # past a bound: raises, and the stream is closed below
                finished |= done
                yield event
            self._finished = True
        finally:
            if not self._finished:
                await _aclose(self._stream)
        if not finished:
            message = (
                f"Model {upstream.describe}: provider {upstream.provider} ended the stream before the reply was done"
            )
            log.warning(
                "provider stream cut short", extra={"model": upstream.name, "litellm_model": upstream.litellm_model}
            )
            raise ProviderStreamBroken(502, message, "upstream_stream_broken")
        yield SSE_DONE

    def close(self) -> None:
        """Let go of the provider's stream if it was not read to its end (the client left)."""
        if self._finished or self._stream is None or self._closer is not None:
            return
        self._finished = True
        try:
            self._closer = asyncio.get_running_loop().create_task(_aclose(self._stream))
        except RuntimeError:  # no loop: nothing left to close on
            pass
