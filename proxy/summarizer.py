"""The summarizer: an LLM call that condenses text for an agent (tool outputs, and history).

By default it is the request's own model at the same upstream, with the client's credentials;
`summarizer.model` names another. Its prompts are files in `proxy/prompts/`. A failure raises
SummarizerFailed (compaction logs, counts and retries later) or, for tool outputs, returns None
so the caller falls back to a preview: nothing is lost either way.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from .config import SummarizerSettings
from .errors import ProxyError
from .telemetry import NO_TELEMETRY, Telemetry
from .upstream import Upstream

log = logging.getLogger("proxy.summarizer")

# Tool outputs beyond this are cut before summarizing (history windows are chunked instead).
MAX_TOOL_INPUT_CHARS = 120_000


@cache
def prompt(name: str) -> str:
    return resources.files("proxy.prompts").joinpath(f"{name}.md").read_text(encoding="utf-8")


class SummarizerFailed(Exception):
    """The summarizer gave no usable summary (an error, a timeout, an empty or malformed reply)."""


@dataclass(frozen=True, slots=True)
class Completion:
    text: str
    tokens_in: int
    tokens_out: int


class Summarizer:
    def __init__(
        self, settings: SummarizerSettings, route: Callable[[str], Upstream], telemetry: Telemetry = NO_TELEMETRY
    ) -> None:
        self.settings = settings
        self.route = route  # model name -> the upstream that serves it
        self.telemetry = telemetry  # each call is a span of its own when traces are on
        self.failures = 0

    def model_for(self, request_model: str) -> str:
        return self.settings.model or request_model

    async def tool_output(self, text: str, tool: str, model: str, headers: dict[str, str]) -> str | None:
        user = f"Tool: {tool or 'unknown'}\n\nOutput:\n{text[:MAX_TOOL_INPUT_CHARS]}"
        try:
            return (await self.complete(prompt("tool_output"), user, self.model_for(model), headers)).text
        except SummarizerFailed:
            return None

    async def history(self, user: str, model: str, headers: dict[str, str]) -> Completion:
        return await self.complete(prompt("history"), user, model, headers)

    async def complete(self, system: str, user: str, model: str, headers: dict[str, str]) -> Completion:
        body: dict[str, Any] = {
            "model": model,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        }
        with self.telemetry.summarizer_call(model, system, user) as trace:
            try:
                completion = await asyncio.wait_for(self._call(body, trace.headers(headers)), self.settings.timeout_s)
            except (ProxyError, SummarizerFailed, TimeoutError, ValueError, KeyError, IndexError, TypeError) as exc:
                self.failures += 1
                reason = getattr(exc, "message", None) or str(exc) or type(exc).__name__
                log.warning("summarizer failed: %s", reason, extra={"model": model})
                raise SummarizerFailed(reason) from None
            trace.done(completion.text, completion.tokens_in, completion.tokens_out)
            return completion

    async def _call(self, body: dict[str, Any], headers: Mapping[str, str]) -> Completion:
        reply = await self.route(body["model"]).chat(body, headers)
        try:
            data = await reply.read()
        finally:
            reply.close()
        if reply.status != 200:
            raise SummarizerFailed(f"upstream answered {reply.status}")
        parsed = json.loads(data)
        content = parsed["choices"][0]["message"]["content"]
        if not isinstance(content, str) or not content.strip():
            raise SummarizerFailed("empty summary")
        usage = parsed.get("usage") or {}
        return Completion(content.strip(), int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))
