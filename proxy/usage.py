"""What an upstream reported it spent, in one shape whatever the wire format.

The three usage objects the proxy meets share no key in a conflicting sense, so one reader
serves them all:

- Chat Completions: `prompt_tokens` (cache reads included), `completion_tokens`,
  `prompt_tokens_details.cached_tokens`;
- Responses: `input_tokens` (cache reads included), `output_tokens`,
  `input_tokens_details.cached_tokens`;
- Anthropic Messages: `input_tokens` (cache reads and writes *not* included),
  `output_tokens`, `cache_read_input_tokens`, `cache_creation_input_tokens`.

`input` is always the whole prompt, cached parts included (as the OpenTelemetry GenAI
conventions count `gen_ai.usage.input_tokens`), so figures from different formats add up.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass(slots=True)
class TokenUsage:
    input: int = 0  # the whole prompt, cache reads and writes included
    output: int = 0
    cache_read: int = 0  # of `input`: served from the provider's prompt cache
    cache_creation: int = 0  # of `input`: written to it (Anthropic bills these apart)

    @classmethod
    def reported(cls, usage: Mapping[str, Any] | None) -> TokenUsage | None:
        """The usage object of a reply in any managed format; None if there is none."""
        if not isinstance(usage, Mapping):
            return None
        if "prompt_tokens" in usage or "completion_tokens" in usage:  # Chat Completions
            details = usage.get("prompt_tokens_details")
            cached = _int(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
            return cls(_int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")), cached)
        if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:  # Anthropic
            read, written = _int(usage.get("cache_read_input_tokens")), _int(usage.get("cache_creation_input_tokens"))
            return cls(_int(usage.get("input_tokens")) + read + written, _int(usage.get("output_tokens")), read, written)
        if "promptTokenCount" in usage or "candidatesTokenCount" in usage:  # Gemini: thoughts are output too
            output = _int(usage.get("candidatesTokenCount")) + _int(usage.get("thoughtsTokenCount"))
            return cls(_int(usage.get("promptTokenCount")), output, _int(usage.get("cachedContentTokenCount")))
        if "input_tokens" in usage or "output_tokens" in usage:  # Responses (or Anthropic without caching)
            details = usage.get("input_tokens_details")
            cached = _int(details.get("cached_tokens")) if isinstance(details, Mapping) else 0
            return cls(_int(usage.get("input_tokens")), _int(usage.get("output_tokens")), cached)
        return None

    def add(self, other: TokenUsage) -> None:
        self.input += other.input
        self.output += other.output
        self.cache_read += other.cache_read
        self.cache_creation += other.cache_creation

    def to_record(self) -> dict[str, int]:
        return {
            "input_tokens": self.input,
            "output_tokens": self.output,
            "cache_read_input_tokens": self.cache_read,
            "cache_creation_input_tokens": self.cache_creation,
        }
