"""Prometheus metrics, one registry per app (tests run several apps in one process).

Figures a proxy user wants to see: how requests end, what the upstream and the proxy each cost
in time, tokens going upstream and what the pipeline saved, compactions, read-back rounds,
quota rejections and how many conversations are active.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from .identity import ConversationKey

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
ACTIVE_WINDOW_S = 15 * 60  # a conversation is active if it had a request in the last 15 minutes
# Conversations the active gauge tells apart (~100 bytes each): past it, it says at least this many.
# A client may name a new conversation on every request; no scrape may come for hours.
MAX_ACTIVE_TRACKED = 100_000


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("context_proxy_requests", "HTTP requests by route and status", ["route", "status"], registry=r)
        self.upstream_latency = Histogram(
            "context_proxy_upstream_seconds", "Upstream time until the reply was complete (chat completions)",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.added_latency = Histogram(
            "context_proxy_added_seconds", "Time the proxy itself added to a chat completion (before and after the upstream)",
            buckets=LATENCY_BUCKETS, registry=r,
        )
        self.tokens_sent = Counter("context_proxy_tokens_sent", "Prompt tokens sent upstream (our count)", registry=r)
        self.usage_tokens = Counter(
            "context_proxy_usage_tokens",
            "Tokens the upstream reported in usage, by its own names; cache_read_input_tokens and "
            "cache_creation_input_tokens: the prompt tokens served from / written to its prompt cache, in every format",
            ["kind"], registry=r,
        )
        self.tokens_saved = Counter(
            "context_proxy_tokens_saved",
            "Prompt tokens the pipeline kept out of the upstream prompt (estimated at 4 characters a token)",
            ["stage"], registry=r,
        )
        self.failed_turns = Counter(
            "context_proxy_failed_turns",
            "Turns that failed or ended incomplete, by who ended them (upstream, proxy, client) and the HTTP status",
            ["source", "status"], registry=r,
        )
        self.stream_errors = Counter(
            "context_proxy_stream_errors", "Streamed replies that broke off (upstream error event, cut, limit)", registry=r
        )
        self.store_failures = Counter(
            "context_proxy_store_failures", "Replies the upstream gave that the store could not keep", registry=r
        )
        self.compactions = Counter("context_proxy_compactions", "Compactions by outcome", ["outcome"], registry=r)
        self.fast_path = Counter(
            "context_proxy_fast_path_turns",
            "Full-history turns by how their prompt was made: taken (the previous turn's work reused, "
            "only the new items rewritten), declined (the previous turn's work was kept but could not be "
            "reused: a cut, an inbox note, a summary), none (nothing kept to reuse: after an edit, a failed turn, "
            "a conversation's first turn)",
            ["outcome"], registry=r,
        )
        self.fast_path_not_taken = Counter(
            "context_proxy_fast_path_not_taken_turns",
            "Turns whose prompt was made by the whole pipeline, by why: proxy_history, anchored, "
            "compaction_header, contended (another turn of the conversation in flight), no_body_entry, "
            "no_previous_turn, body_not_extended, settings_changed, marks_changed, history_differs, "
            "declined_by_<stage>",
            ["reason"], registry=r,
        )
        self.read_rounds = Counter("context_proxy_read_rounds", "read_tool_output rounds the proxy answered", registry=r)
        self.quota_rejections = Counter("context_proxy_quota_rejections", "Requests refused by the LLM-call quota", registry=r)
        self.repairs = Counter("context_proxy_pairing_repairs", "Tool-call pairing problems repaired", registry=r)
        self.trajectory_failures = Counter(
            "context_proxy_trajectory_write_failures", "Trajectory files not written (storage.trajectory_dir)", registry=r
        )
        self.active = Gauge(
            "context_proxy_active_conversations",
            f"Conversations with a request in the last {ACTIVE_WINDOW_S}s (at most {MAX_ACTIVE_TRACKED:,} told apart)",
            registry=r,
        )
        # The hash of each recently seen conversation's key -> when last seen, the least recent first.
        self._last_seen: OrderedDict[int, float] = OrderedDict()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}  # see `child`

    def child(self, metric: Counter, *values: str) -> Any:
        """`metric.labels(*values)`, kept: prometheus checks the values and takes a lock at every
        `labels` (~1.3 µs), and a turn counts several. As many as prometheus keeps itself."""
        key = (id(metric), values)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

    def saw(self, key: ConversationKey) -> None:
        now = time.monotonic()
        seen, named = self._last_seen, hash(key)
        seen[named] = now
        seen.move_to_end(named)
        self._let_go(seen, now)

    def _refresh_active(self) -> None:
        self._let_go(self._last_seen, time.monotonic())
        self.active.set(len(self._last_seen))

    @staticmethod
    def _let_go(seen: OrderedDict[int, float], now: float) -> None:
        """Who went quiet, and the least recently seen past MAX_ACTIVE_TRACKED: amortised O(1) a turn."""
        cutoff = now - ACTIVE_WINDOW_S
        while seen and (len(seen) > MAX_ACTIVE_TRACKED or next(iter(seen.values())) < cutoff):
            seen.popitem(last=False)

    def render(self) -> bytes:
        self._refresh_active()
        return generate_latest(self.registry)
