"""Which client sent a request, named for a person reading the conversation list.

Read from the User-Agent alone (a hint, never an identity: anything can send any User-Agent).
Known agents and SDKs get their product name and version; anything else its first product
token, cut short. The most specific patterns come first: the Agents SDK rides on the OpenAI SDK.
"""

from __future__ import annotations

import re
from functools import lru_cache

MAX_CLIENT_CHARS = 64

KNOWN_CLIENTS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), name)
    for pattern, name in (
        (r"^codex_[a-z_]+/(\S+)", "Codex"),  # codex_cli_rs/0.46.0, codex_exec/0.171.0, codex_vscode/...
        (r"^claude-cli/(\S+)", "Claude Code"),  # claude-cli/2.1.332 (external, sdk-cli)
        (r"^Agents/Python (\S+)", "OpenAI Agents SDK"),
        (r"^(?:Async)?(?:Azure)?OpenAI/Python (\S+)", "OpenAI Python SDK"),
        (r"^OpenAI/JS (\S+)", "OpenAI Node SDK"),
        (r"^(?:Async)?Anthropic(?:Bedrock|Vertex)?/Python (\S+)", "Anthropic Python SDK"),
        (r"^Anthropic/JS (\S+)", "Anthropic TypeScript SDK"),
        (r"^litellm/(\S+)", "LiteLLM"),
        (r"^curl/(\S+)", "curl"),
        (r"^python-httpx/(\S+)", "httpx"),
        (r"^python-requests/(\S+)", "requests"),
        (r"^Python/[\d.]+ aiohttp/(\S+)", "aiohttp"),
    )
)
# The first product token of an unknown User-Agent, e.g. "my-agent/1.2" of "my-agent/1.2 (linux)".
PRODUCT = re.compile(r"[!-~]+")


@lru_cache(maxsize=256)  # a few User-Agents send nearly every request: each is matched once
def client_name(user_agent: str | None) -> str | None:
    """"Codex 0.171.0", "OpenAI Python SDK 1.99.1", ...; None without a User-Agent."""
    if not user_agent or not user_agent.strip():
        return None
    agent = user_agent.strip()
    for pattern, name in KNOWN_CLIENTS:
        match = pattern.match(agent)
        if match:
            return f"{name} {match.group(1)}"[:MAX_CLIENT_CHARS]
    product = PRODUCT.match(agent)
    return product.group(0)[:MAX_CLIENT_CHARS] if product else None
