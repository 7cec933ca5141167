"""The fake's prompt cache and token estimate for Messages requests.

A prompt is a sequence of units in the order the real API caches them -- tools, then system
blocks, then each message's content blocks -- each in a canonical form: `cache_control` markers
removed (moving a breakpoint never changes the content), string content written as one text
block (Claude Code re-sends a message as a string that it first sent as blocks), keys sorted.
A breakpoint (`cache_control`) writes the prefix up to its unit; a later request reads the
longest prefix written before that ends at or up to 20 units before one of its breakpoints, as
the real API's lookback does. Prefixes are keyed by API key and model, and compared by a
running hash of the canonical units: byte for byte on the canonical form.
"""

from __future__ import annotations

import collections
import hashlib
import json
import threading
from dataclasses import dataclass
from typing import Any

from tests.fakes.anthropic_rules import content_blocks

__all__ = ["CacheUsage", "PromptCache", "estimate_tokens", "prompt_tokens"]

LOOKBACK_UNITS = 20  # how far before a breakpoint the real API looks for an earlier write
MAX_ENTRIES = 50_000  # the fake lives for a whole test session: keep it bounded


def estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)  # roughly 4 characters per token, as the chat fake counts


@dataclass(frozen=True)
class _Unit:
    canonical: bytes
    tokens: int
    breakpoint: str | None  # the ttl ("5m" / "1h") when a cache_control marks this unit


@dataclass(frozen=True)
class CacheUsage:
    """One request's input tokens, split as the usage object reports them."""

    input_tokens: int
    cache_read_input_tokens: int
    cache_creation_input_tokens: int
    ttl: str  # of the newest breakpoint, for `cache_creation`'s 5m / 1h split

    def as_usage(self, output_tokens: int) -> dict[str, Any]:
        creation = self.cache_creation_input_tokens
        return {
            "input_tokens": self.input_tokens,
            "cache_creation_input_tokens": creation,
            "cache_read_input_tokens": self.cache_read_input_tokens,
            "cache_creation": {
                "ephemeral_5m_input_tokens": creation if self.ttl == "5m" else 0,
                "ephemeral_1h_input_tokens": creation if self.ttl == "1h" else 0,
            },
            "output_tokens": output_tokens,
            "service_tier": "standard",
        }


def _strip_cache_control(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip_cache_control(v) for v in value]
    return value


def _canonical_block(block: dict[str, Any]) -> dict[str, Any]:
    block = _strip_cache_control(block)
    if block.get("type") == "tool_result" and isinstance(block.get("content"), str):
        block = {**block, "content": content_blocks(block["content"])}
    return block


def _ttl(marker: Any) -> str | None:
    return (marker.get("ttl") or "5m") if isinstance(marker, dict) else None


def _units(body: dict[str, Any]) -> list[_Unit]:
    raw: list[tuple[Any, Any]] = []  # (canonical payload, cache_control marker)
    for tool in body.get("tools") or []:
        raw.append((["tool", _strip_cache_control(tool)], tool.get("cache_control")))
    system = body.get("system")
    for block in content_blocks(system) if system else []:
        raw.append((["system", _strip_cache_control(block)], block.get("cache_control")))
    for message in body["messages"]:
        extras = {k: v for k, v in message.items() if k not in ("role", "content")}
        for position, block in enumerate(content_blocks(message["content"])):
            head = [message["role"], extras] if position == 0 else [message["role"]]
            raw.append((head + [_canonical_block(block)], block.get("cache_control")))
    units = []
    for payload, marker in raw:
        canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
        units.append(_Unit(canonical, estimate_tokens(canonical.decode()), _ttl(marker)))
    if body.get("cache_control") is not None and units:  # automatic caching: the last unit
        units[-1] = _Unit(units[-1].canonical, units[-1].tokens, _ttl(body["cache_control"]))
    return units


def prompt_tokens(body: dict[str, Any]) -> int:
    """The estimated input tokens of a prompt: tools, system and messages."""
    return sum(unit.tokens for unit in _units(body))


class PromptCache:
    """Prefixes written by earlier requests; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._written: collections.OrderedDict[bytes, None] = collections.OrderedDict()

    def reset(self) -> None:
        with self._lock:
            self._written.clear()

    def use(self, body: dict[str, Any], api_key: str) -> CacheUsage:
        """Read the longest cached prefix this request may use, then write its breakpoints."""
        units = _units(body)
        seed = hashlib.sha256(json.dumps([api_key, body["model"]]).encode()).digest()
        prefix_hashes: list[bytes] = []  # prefix_hashes[i]: the prefix ending with unit i
        cumulative: list[int] = []
        digest, total = seed, 0
        for unit in units:
            digest = hashlib.sha256(digest + unit.canonical).digest()
            total += unit.tokens
            prefix_hashes.append(digest)
            cumulative.append(total)
        breakpoints = [i for i, unit in enumerate(units) if unit.breakpoint]
        with self._lock:
            hit = -1
            for point in breakpoints:
                for i in range(point, max(-1, point - LOOKBACK_UNITS - 1), -1):
                    if prefix_hashes[i] in self._written:
                        hit = max(hit, i)
                        break
            for point in breakpoints:
                self._written[prefix_hashes[point]] = None
                self._written.move_to_end(prefix_hashes[point])
            while len(self._written) > MAX_ENTRIES:
                self._written.popitem(last=False)
        read = cumulative[hit] if hit >= 0 else 0
        last = breakpoints[-1] if breakpoints else -1
        created = cumulative[last] - read if last > hit else 0
        ttl = units[last].breakpoint if last >= 0 else "5m"
        return CacheUsage(total - read - created, read, created, ttl or "5m")
