"""Who serves a model, as the GenAI conventions name it: `gen_ai.provider.name`, `server.*`.

A model of `models:` with a litellm model string is its provider's (the string's prefix); any other
goes to the wire format's own upstream, named for the API flavour it speaks (the OpenTelemetry
conventions make the provider name the discriminator of that flavour: an OpenAI-compatible vLLM
is `openai` to them, and `server.address` says where it really is).
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from ..config import Settings

# litellm's provider prefixes -> the conventions' well-known provider names (others: the prefix).
LITELLM_PROVIDERS = {
    "anthropic": "anthropic",
    "azure": "azure.ai.openai",
    "azure_ai": "azure.ai.inference",
    "bedrock": "aws.bedrock",
    "cohere": "cohere",
    "deepseek": "deepseek",
    "gemini": "gcp.gemini",
    "groq": "groq",
    "mistral": "mistral_ai",
    "openai": "openai",
    "perplexity": "perplexity",
    "vertex_ai": "gcp.vertex_ai",
    "watsonx": "ibm.watsonx.ai",
    "xai": "x_ai",
}
# A wire format's own upstream speaks this provider's API.
DIALECT_PROVIDERS = {"chat": "openai", "responses": "openai", "messages": "anthropic", "gemini": "gcp.gemini"}
# Where a wire format's own upstream is, when not at `upstream.base_url`.
DIALECT_BASE_URLS = {"messages": "anthropic_base_url", "gemini": "gemini_base_url"}
# The conventions' refinement of the OpenAI flavour (`openai.api.type`).
OPENAI_API_TYPES = {"chat": "chat_completions", "responses": "responses"}


@dataclass(frozen=True, slots=True)
class Served:
    provider: str
    address: str | None
    port: int | None


def _server(url: str | None) -> tuple[str | None, int | None]:
    if not url:
        return None, None
    parts = urlsplit(url)
    try:
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
    except ValueError:
        port = None
    return parts.hostname, port


class Providers:
    """Looks up, and keeps, who serves each (wire format, model) pair."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._known: dict[tuple[str, str], Served] = {}

    def served(self, dialect: str, model: str) -> Served:
        found = self._known.get((dialect, model))
        if found is None:
            if len(self._known) > 4096:  # model names come from clients: keep this bounded
                self._known.clear()
            found = self._known[(dialect, model)] = self._look_up(dialect, model)
        return found

    def _look_up(self, dialect: str, model: str) -> Served:
        entry = self.settings.models.get(model)
        if entry is not None and entry.litellm_model:
            prefix, slash, _ = entry.litellm_model.partition("/")
            provider = LITELLM_PROVIDERS.get(prefix, prefix) if slash else "openai"
            return Served(provider, *_server(entry.api_base))
        setting = DIALECT_BASE_URLS.get(dialect)
        base_url = getattr(self.settings.upstream, setting, None) if setting else None
        return Served(DIALECT_PROVIDERS.get(dialect, "openai"), *_server(base_url or self.settings.upstream.base_url))
