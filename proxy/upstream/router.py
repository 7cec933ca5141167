"""Which upstream answers a model: a litellm route of `models:`, else the raw passthrough.

`for_model` is one dict lookup: a request for a model without `litellm_model` goes to the
HttpUpstream exactly as before, and nothing here imports litellm (the LiteLLMUpstream objects are
plain data until their first call). `for_agent` hands out the same upstream tracked by the
engine's InFlight (an agent's request in flight holds back the summaries on its upstream).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from ..config import ModelSettings, Settings
from ..inflight import InFlight, TrackedUpstream
from . import litellm as litellm_upstream
from .base import Upstream
from .limits import ReplyLimits
from .litellm import LiteLLMUpstream
from .litellm_gemini import gemini_call
from .litellm_messages import messages_call
from .litellm_responses import call_responses

# What a litellm route serves besides chat completions, each translated to chat and back: the
# Responses API (Codex, the Agents SDK), Anthropic Messages (Claude Code) and the Gemini API
# (Gemini CLI), on any model.
FORMATS = {"responses": call_responses, "messages": messages_call, "gemini": gemini_call}


class UpstreamRouter:
    def __init__(
        self, models: Mapping[str, ModelSettings], http: Upstream, timeout_s: float, limits: ReplyLimits | None = None,
        inflight: InFlight | None = None,
    ) -> None:
        self.http = http
        self.inflight = inflight or InFlight()
        self._tracked: dict[int, TrackedUpstream] = {}  # id of an upstream here -> it, tracked
        self.models = dict(models)
        self.timeout_s = timeout_s
        self.limits = limits
        self.routes: dict[str, LiteLLMUpstream] = {
            name: LiteLLMUpstream(name, entry, timeout_s, limits, FORMATS)
            for name, entry in models.items()
            if entry.litellm_model
        }
        self._adhoc: dict[tuple[str, str], LiteLLMUpstream] = {}

    @classmethod
    def from_settings(cls, settings: Settings, http: Upstream, inflight: InFlight | None = None) -> UpstreamRouter:
        return cls(settings.models, http, settings.upstream.timeout_s, ReplyLimits.for_turn(settings.upstream), inflight)

    def for_model(self, model: str) -> Upstream:
        """The upstream serving `model`: its litellm route, else the passthrough."""
        return self.routes.get(model, self.http)

    def for_agent(self, model: str) -> TrackedUpstream:
        """The upstream serving `model` for an agent's request: tracked as in flight while it runs."""
        upstream = self.for_model(model)
        tracked = self._tracked.get(id(upstream))
        if tracked is None:  # one per route (they live as long as the router), made on first use
            tracked = self._tracked[id(upstream)] = self.inflight.tracked(upstream)
        return tracked

    def is_litellm(self, model: str) -> bool:
        return model in self.routes

    def for_entry(self, name: str, entry: ModelSettings) -> Upstream:
        """An upstream for a model that is not in `models:` (e.g. a summarizer's own litellm model).

        `entry` without `litellm_model` means the passthrough. Built once per (name, entry)."""
        if not entry.litellm_model:
            return self.http
        key = (name, entry.model_dump_json())  # entries hold dicts: not hashable
        upstream = self._adhoc.get(key)
        if upstream is None:
            upstream = self._adhoc[key] = LiteLLMUpstream(name, entry, self.timeout_s, self.limits, FORMATS)
        return upstream

    def litellm_names(self) -> Iterator[str]:
        return iter(self.routes)

    async def warm(self) -> None:
        """Import litellm now (in a thread) when a route needs it; optional, e.g. right after start-up
        so the first routed request does not wait ~2 s for the import."""
        if self.routes:
            await litellm_upstream.load_litellm()

    async def close(self) -> None:
        """Close the HTTP clients litellm cached, if it was ever loaded. The HttpUpstream is the
        app's to close."""
        if not litellm_upstream.loaded():
            return
        from litellm.llms.custom_httpx.async_client_cleanup import close_litellm_async_clients

        import litellm

        try:
            await close_litellm_async_clients()
            # Closed clients must not stay cached: the next app in this process (a restart in
            # tests or an embedding program) would get them and fail every call.
            litellm.in_memory_llm_clients_cache.flush_cache()
        except Exception as exc:  # noqa: BLE001  # shutting down: log, don't fail
            litellm_upstream.log.warning("closing litellm's clients failed: %s", exc)

    def context_window(self, model: str) -> int | None:
        """The `context_window` override of a `models:` entry, if any."""
        entry = self.models.get(model)
        return entry.context_window if entry is not None else None


def counting_aliases(models: Mapping[str, ModelSettings]) -> dict[str, str]:
    """public name -> litellm model string, for token counting and window lookup by the real model."""
    return {name: entry.litellm_model for name, entry in models.items() if entry.litellm_model}


def window_overrides(models: Mapping[str, ModelSettings]) -> dict[str, int]:
    """public name -> the configured `context_window`."""
    return {name: entry.context_window for name, entry in models.items() if entry.context_window}
