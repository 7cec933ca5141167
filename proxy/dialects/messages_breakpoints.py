"""`cache_control` breakpoints of a Messages request: counted, and never more than the API takes.

The client's own (at most four) are all kept; past four in the body (stored messages replayed in
proxy-history mode, the proxy's notes), the oldest messages' go first, in copies of their blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .messages_codec import system_blocks

MAX_CACHE_BREAKPOINTS = 4  # the API refuses a fifth


def limit_breakpoints(body: dict[str, Any]) -> None:
    """At most four `cache_control` breakpoints: past that, the oldest messages' are taken off
    (in copies of their blocks; the client's own breakpoints, at most four, are all kept)."""
    excess = _breakpoints(body) - MAX_CACHE_BREAKPOINTS
    if excess <= 0:  # the usual case: counted, nothing to take off
        return
    spots: list[tuple[int, int, int | None]] = []  # (message, block, inner block) of each marked block
    for m, message in enumerate(body["messages"]):
        for b, block in enumerate(_blocks(message)):
            if block.get("cache_control") is not None:
                spots.append((m, b, None))
            if block.get("type") == "tool_result":
                spots.extend((m, b, i) for i, x in enumerate(_blocks(block)) if x.get("cache_control") is not None)
    for m, b, i in spots[:excess]:
        message = body["messages"][m] = {**body["messages"][m]}
        content = message["content"] = list(message["content"])
        if i is None:
            content[b] = {k: v for k, v in content[b].items() if k != "cache_control"}
        else:
            inner = list(content[b]["content"])
            inner[i] = {k: v for k, v in inner[i].items() if k != "cache_control"}
            content[b] = {**content[b], "content": inner}


def _blocks(holder: Any) -> list[dict[str, Any]]:
    """The blocks of a message (or of a tool_result) that are objects."""
    content = holder.get("content") if type(holder) is dict else None
    return [b for b in content if type(b) is dict] if type(content) is list else []


def _breakpoints(body: dict[str, Any]) -> int:
    """The `cache_control` markers of a request: system blocks, tools, the top level (automatic
    caching) and message blocks, tool_result contents included."""
    return outside_breakpoints(body) + message_breakpoints(body["messages"])


def outside_breakpoints(body: dict[str, Any]) -> int:
    """The `cache_control` markers of a request but its messages'."""
    n = 0
    for holder in (*system_blocks(body.get("system")), *(body.get("tools") or ()), body):
        if type(holder) is dict and holder.get("cache_control") is not None:
            n += 1
    return n


def message_breakpoints(messages: Sequence[Any]) -> int:
    """The `cache_control` markers of `messages`' blocks, tool_result contents included. Every
    message's blocks are looked at on every turn the body is made whole: a plain loop."""
    n = 0
    for message in messages:
        content = message.get("content") if type(message) is dict else None
        if type(content) is not list:
            continue
        for block in content:
            if type(block) is dict:
                if block.get("cache_control") is not None:
                    n += 1
                inner = block.get("content")
                if type(inner) is list and block.get("type") == "tool_result":
                    n += sum(1 for x in inner if type(x) is dict and x.get("cache_control") is not None)
    return n
