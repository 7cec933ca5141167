"""The summarizer: an LLM call that condenses text for an agent (tool outputs, and history).

By default it is the request's own model at the same upstream, with the client's credentials,
asked in chat completions, or for an Anthropic Messages conversation in Messages at the Anthropic
API (Claude Code's key opens no OpenAI API), for a Gemini one in Gemini's format at the Gemini
API; `summarizer.model` names another, asked in chat. Its prompts are files in `proxy/prompts/`. Every request
carries a `max_tokens`. A failure raises SummarizerFailed (compaction logs, counts and retries
later) or, for tool outputs, returns None so the caller falls back to a preview: nothing is lost
either way. An answer that only echoes its prompt back (small models do) is a failure too, and a
request the model refuses as too long raises PromptTooLong, so the caller can split it.

With `summarizer.yield_to_agent`, calls wait for the agent's requests to the same upstream (see
inflight.py): a summary never holds up an agent on a model that serves one request at a time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from .config import SummarizerSettings
from .errors import ProxyError
from .inflight import InFlight
from .telemetry import NO_TELEMETRY, Telemetry
from .upstream import Upstream
from .upstream.base import GeminiRequest

log = logging.getLogger("proxy.summarizer")

# Tool outputs beyond this are cut before summarizing (history windows are chunked instead).
MAX_TOOL_INPUT_CHARS = 120_000
TOOL_SUMMARY_MAX_TOKENS = 600  # the tool-output prompt asks for about 300 words
# Models that refuse `max_tokens` and take `max_completion_tokens` instead (OpenAI's reasoning models).
# Formats whose conversations' summaries are asked in that format of their own model by default.
OWN_WIRES = ("messages", "gemini")
_COMPLETION_TOKENS_MODELS = re.compile(r"(?:^|/)(?:o\d|gpt-5)")
# How providers say a request is over the model's context: OpenAI and litellm, llama.cpp, vLLM, Ollama.
_TOO_LONG_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error", "string_above_max_length"})
_TOO_LONG_TEXT = re.compile(
    r"context (?:length|window|size)|maximum (?:context|prompt)|too many tokens|(?:prompt|input) is too long", re.I
)
# Echo detection: an answer whose lines are mostly copied from its prompt is not a summary.
ECHO_SHARE = 0.6
ECHO_MIN_LINE = 24


@cache
def prompt(name: str) -> str:
    return resources.files("proxy.prompts").joinpath(f"{name}.md").read_text(encoding="utf-8")


class SummarizerFailed(Exception):
    """The summarizer gave no usable summary (an error, a timeout, an empty, echoed or malformed reply)."""


class PromptTooLong(SummarizerFailed):
    """The model refused the request as longer than its context."""


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    tokens_in: int
    tokens_out: int
    cut: bool = False  # the model stopped at max_tokens (finish_reason "length")


class Summarizer:
    def __init__(
        self,
        settings: SummarizerSettings,
        route: Callable[[str], Upstream],
        inflight: InFlight,
        telemetry: Telemetry = NO_TELEMETRY,
    ) -> None:
        self.settings = settings
        self.route = route  # model name -> the upstream that serves it
        self.inflight = inflight  # the engine's: the agent's requests, which summaries may yield to
        self.telemetry = telemetry  # each call is a span of its own when traces are on
        self.failures = 0

    def model_for(self, request_model: str) -> str:
        return self.settings.model or request_model

    def wire(self, dialect: str) -> str:
        """The wire format a summary for a conversation in `dialect` is asked in: its own for a
        Messages or Gemini conversation on its own model (its credentials are that API's), else chat."""
        return dialect if dialect in OWN_WIRES and not self.settings.model else "chat"

    async def tool_output(
        self, text: str, tool: str, model: str, headers: dict[str, str], dialect: str = "chat"
    ) -> str | None:
        user = f"Tool: {tool or 'unknown'}\n\nOutput:\n{text[:MAX_TOOL_INPUT_CHARS]}"
        try:
            completion = await self.complete(
                prompt("tool_output"), user, self.model_for(model), headers, TOOL_SUMMARY_MAX_TOKENS, dialect=dialect
            )
        except SummarizerFailed:
            return None
        return completion.text

    async def history(
        self, user: str, model: str, headers: dict[str, str], max_tokens: int, source: str, dialect: str = "chat"
    ) -> Completion:
        """A history summary; `source` is the part of `user` it must not merely copy (the messages:
        repeating the previous summary is no echo)."""
        system = prompt("history").replace("{max_words}", str(max_tokens * 3 // 4))  # about 0.75 words a token
        return await self.complete(system, user, model, headers, max_tokens, source, dialect)

    async def complete(
        self,
        system: str,
        user: str,
        model: str,
        headers: dict[str, str],
        max_tokens: int,
        source: str | None = None,
        dialect: str = "chat",
    ) -> Completion:
        """One summarizer call with `max_tokens`, for a conversation in `dialect`; SummarizerFailed
        if its answer is no summary (empty, or, where `source` is given, mostly a copy of the
        system prompt and `source`)."""
        wire = self.wire(dialect)
        body: dict[str, Any]
        if wire == "messages":
            body = {"model": model, "max_tokens": max_tokens, "system": system, "messages": [{"role": "user", "content": user}]}
        elif wire == "gemini":
            body = gemini_summary_request(model, system, user, max_tokens)
        else:
            limit = "max_completion_tokens" if _COMPLETION_TOKENS_MODELS.search(model) else "max_tokens"
            body = {
                "model": model,
                "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
                limit: max_tokens,
            }
        upstream = self.route(model)
        with self.telemetry.summarizer_call(model, system, user) as trace:
            traced = trace.headers(headers)
            try:
                if self.settings.yield_to_agent:
                    call = self.inflight.background(upstream, lambda: self._call(upstream, wire, body, traced))
                else:
                    call = self._call(upstream, wire, body, traced)
                completion = await asyncio.wait_for(call, self.settings.timeout_s)
                if source is not None and echoes(completion.text, system + "\n" + source):
                    raise SummarizerFailed("the answer echoes the prompt instead of summarizing it")
            except (ProxyError, SummarizerFailed, TimeoutError, ValueError, KeyError, IndexError, TypeError) as exc:
                self.failures += 1
                reason = getattr(exc, "message", None) or str(exc) or type(exc).__name__
                log.warning("summarizer failed: %s", reason, extra={"model": model})
                if isinstance(exc, PromptTooLong) or (isinstance(exc, ProxyError) and _too_long(exc.code, exc.message)):
                    raise PromptTooLong(reason) from None
                raise SummarizerFailed(reason) from None
            trace.done(completion.text, completion.tokens_in, completion.tokens_out)
            return completion

    async def _call(self, upstream: Upstream, wire: str, body: dict[str, Any], headers: Mapping[str, str]) -> Completion:
        reply = await upstream.call(wire, body, headers)
        try:
            data = await reply.read()
        finally:
            reply.close()
        if reply.status != 200:
            code, message = _error_of(data)
            if reply.status in (400, 413, 422) and _too_long(code, message):
                raise PromptTooLong(f"upstream answered {reply.status}: {message or code}")
            raise SummarizerFailed(f"upstream answered {reply.status}")
        parsed = json.loads(data)
        if wire == "messages":
            return _messages_completion(parsed)
        if wire == "gemini":
            return _gemini_completion(parsed)
        choice = parsed["choices"][0]
        content = choice["message"]["content"]
        if not isinstance(content, str) or not content.strip():
            raise SummarizerFailed("empty summary")
        usage = parsed.get("usage") or {}
        return Completion(
            content.strip(),
            int(usage.get("prompt_tokens") or 0),
            int(usage.get("completion_tokens") or 0),
            cut=choice.get("finish_reason") == "length",
        )


def _messages_completion(parsed: dict[str, Any]) -> Completion:
    """An Anthropic message's text as a Completion (its cache reads and writes are input too)."""
    text = "".join(b.get("text") or "" for b in parsed["content"] if isinstance(b, dict) and b.get("type") == "text")
    if not text.strip():
        raise SummarizerFailed("empty summary")
    usage = parsed.get("usage") or {}
    tokens_in = sum(int(usage.get(k) or 0) for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))
    return Completion(text.strip(), tokens_in, int(usage.get("output_tokens") or 0), cut=parsed.get("stop_reason") == "max_tokens")


def gemini_summary_request(model: str, system: str, user: str, max_tokens: int) -> GeminiRequest:
    return GeminiRequest(
        {
            "systemInstruction": {"parts": [{"text": system}]},
            "contents": [{"role": "user", "parts": [{"text": user}]}],
            "generationConfig": {"maxOutputTokens": max_tokens},
        },
        model,
        stream=False,
    )


def _gemini_completion(parsed: dict[str, Any]) -> Completion:
    """A Gemini reply's text (its thoughts aside) as a Completion (thoughts are output too)."""
    candidate = parsed["candidates"][0]
    parts = (candidate.get("content") or {}).get("parts") or []
    text = "".join(p.get("text") or "" for p in parts if isinstance(p, dict) and not p.get("thought"))
    if not text.strip():
        raise SummarizerFailed("empty summary")
    usage = parsed.get("usageMetadata") or {}
    tokens_out = int(usage.get("candidatesTokenCount") or 0) + int(usage.get("thoughtsTokenCount") or 0)
    return Completion(
        text.strip(), int(usage.get("promptTokenCount") or 0), tokens_out, cut=candidate.get("finishReason") == "MAX_TOKENS"
    )


def echoes(answer: str, prompt_text: str) -> bool:
    """Whether most of `answer` (its longer lines, by characters) is copied from `prompt_text`."""
    lines = [line.strip() for line in answer.splitlines() if len(line.strip()) >= ECHO_MIN_LINE]
    total = sum(len(line) for line in lines)
    if not total:
        return False
    copied = sum(len(line) for line in lines if line in prompt_text)
    return copied >= ECHO_SHARE * total


def _error_of(data: bytes) -> tuple[str | None, str]:
    """(code or type, message) of an error body, in the OpenAI shape or llama.cpp's."""
    try:
        error = json.loads(data).get("error")
    except (ValueError, AttributeError):
        return None, data[:200].decode("utf-8", "replace")
    if isinstance(error, dict):
        code = error.get("code") if isinstance(error.get("code"), str) else error.get("type")
        return (code if isinstance(code, str) else None), str(error.get("message") or "")
    return None, str(error or "")


def _too_long(code: str | None, message: str | None) -> bool:
    return code in _TOO_LONG_CODES or bool(message and _TOO_LONG_TEXT.search(message))


__all__ = ["Completion", "PromptTooLong", "Summarizer", "SummarizerFailed", "echoes", "prompt"]
