"""The summarizer: an LLM call that condenses text for an agent (tool outputs, and history).

By default it is the request's own model at the same upstream, with the client's credentials,
asked in chat completions, or for an Anthropic Messages conversation in Messages at the Anthropic
API (Claude Code's key opens no OpenAI API), for a Gemini one in Gemini's format at the Gemini
API (the dialect's `summary_format` says which, and makes the request and reads its answer);
`summarizer.model` names another, asked in chat. Its prompts are files in `proxy/prompts/`. Every request
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
from functools import cache
from importlib import resources
from typing import Any

from .config import SummarizerSettings
from .dialects.base import Completion, Dialect, SummaryFormat
from .errors import ProxyError
from .inflight import InFlight
from .telemetry import NO_TELEMETRY, Telemetry
from .upstream import Upstream
from .upstream.error_body import read_error_body

log = logging.getLogger("proxy.summarizer")

# Tool outputs beyond this are cut before summarizing (history windows are chunked instead).
MAX_TOOL_INPUT_CHARS = 120_000
TOOL_SUMMARY_MAX_TOKENS = 600  # the tool-output prompt asks for about 300 words
DEFAULT_WIRE = "chat"  # the wire format a summary is asked in when its conversation's dialect names none
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


class Summarizer:
    def __init__(
        self,
        settings: SummarizerSettings,
        route: Callable[[str], Upstream],
        dialects: Mapping[str, Dialect],
        inflight: InFlight,
        telemetry: Telemetry = NO_TELEMETRY,
    ) -> None:
        self.settings = settings
        self.route = route  # model name -> the upstream that serves it
        self.dialects = dialects  # by name: what a summary for a conversation in each is asked in
        chat = dialects[DEFAULT_WIRE].summary_format()
        assert chat is not None, "chat asks every summary no other format does"
        self._chat = chat
        self.inflight = inflight  # the engine's: the agent's requests, which summaries may yield to
        self.telemetry = telemetry  # each call is a span of its own when traces are on
        self.failures = 0

    def model_for(self, request_model: str) -> str:
        return self.settings.model or request_model

    def format_for(self, dialect: str) -> SummaryFormat:
        """The wire format a summary for a conversation in `dialect` is asked in: its own where
        it has one (Messages, Gemini: the client's credentials are that API's) and the summary
        goes to the conversation's own model; else chat."""
        known = self.dialects.get(dialect)
        own = known.summary_format() if known is not None and not self.settings.model else None
        return own or self._chat

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
        wire = self.format_for(dialect)
        body = wire.summary_request(model, system, user, max_tokens)
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

    async def _call(
        self, upstream: Upstream, wire: SummaryFormat, body: dict[str, Any], headers: Mapping[str, str]
    ) -> Completion:
        reply = await upstream.call(wire.name, body, headers)
        try:
            data = await reply.read()
        finally:
            reply.close()
        if reply.status != 200:
            error = read_error_body(data)
            code, message = error.code or error.type, error.message or data[:200].decode("utf-8", "replace")
            if reply.status in (400, 413, 422) and _too_long(code, message):
                raise PromptTooLong(f"upstream answered {reply.status}: {message or code}")
            raise SummarizerFailed(f"upstream answered {reply.status}")
        completion = wire.summary_reply(json.loads(data))
        if not completion.text:
            raise SummarizerFailed("empty summary")
        return completion


def echoes(answer: str, prompt_text: str) -> bool:
    """Whether most of `answer` (its longer lines, by characters) is copied from `prompt_text`."""
    lines = [line.strip() for line in answer.splitlines() if len(line.strip()) >= ECHO_MIN_LINE]
    total = sum(len(line) for line in lines)
    if not total:
        return False
    copied = sum(len(line) for line in lines if line in prompt_text)
    return copied >= ECHO_SHARE * total


def _too_long(code: str | None, message: str | None) -> bool:
    return code in _TOO_LONG_CODES or bool(message and _TOO_LONG_TEXT.search(message))


__all__ = ["Completion", "PromptTooLong", "Summarizer", "SummarizerFailed", "echoes", "prompt"]
