"""The summarizer: an LLM call that condenses text for an agent (tool outputs now; history later).

By default it is the request's own model at the same upstream, with the client's credentials.
Its prompts are files in `proxy/prompts/`. A failure is logged and returns None: the caller falls
back to what needs no LLM, and nothing is lost.
"""

from __future__ import annotations

import json
import logging
from functools import cache
from importlib import resources
from typing import Any

from .errors import ProxyError
from .upstream import HttpUpstream

log = logging.getLogger("proxy.summarizer")

# The summarizer's own request must fit its model: inputs beyond this are cut (chunked summaries
# of whole histories come with compaction).
MAX_INPUT_CHARS = 120_000


@cache
def prompt(name: str) -> str:
    return resources.files("proxy.prompts").joinpath(f"{name}.md").read_text(encoding="utf-8")


class Summarizer:
    def __init__(self, upstream: HttpUpstream) -> None:
        self.upstream = upstream
        self.failures = 0

    async def tool_output(self, text: str, tool: str, model: str, headers: dict[str, str]) -> str | None:
        user = f"Tool: {tool or 'unknown'}\n\nOutput:\n{text[:MAX_INPUT_CHARS]}"
        return await self._complete(prompt("tool_output"), user, model, headers)

    async def _complete(self, system: str, user: str, model: str, headers: dict[str, str]) -> str | None:
        body: dict[str, Any] = {"model": model, "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}
        try:
            reply = await self.upstream.chat(body, headers)
            try:
                data = await reply.read()
            finally:
                reply.close()
            if reply.status != 200:
                raise ValueError(f"upstream answered {reply.status}")
            content = json.loads(data)["choices"][0]["message"]["content"]
            if not isinstance(content, str) or not content.strip():
                raise ValueError("empty summary")
            return content.strip()
        except (ProxyError, ValueError, KeyError, IndexError, TypeError) as exc:
            self.failures += 1
            log.warning("summarizer failed: %s", getattr(exc, "message", exc))
            return None
