"""What one turn did, in one typed record: the stages and the exchange fill it in; the response
headers, the metrics, the request log line and the stored turn record are all read from it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..identity import ConversationKey
from ..metrics import Metrics

CHARS_PER_TOKEN = 4  # for the "tokens saved" estimate only: what a stage left out was never counted


@dataclass(slots=True)
class TurnReport:
    key: ConversationKey
    dialect: str
    model: str
    started: float = field(default_factory=time.perf_counter)
    created_at: float = field(default_factory=time.time)
    # The first upstream call's prompt as we count it: system, history and tool schemas.
    tokens_sent: int | None = None
    tokens_sent_total: int = 0  # every call of the turn together, read-back rounds included
    token_budget: int | None = None  # the most a prompt of this turn may hold (the window's limit)
    messages_left_out: int = 0
    sent_seqs: list[int] = field(default_factory=list)
    shortened: int = 0  # tool outputs sent shortened (truncated or summarized)
    masked: int = 0  # older tool outputs sent as placeholders (compaction: mask)
    chars_saved: dict[str, int] = field(default_factory=dict)  # by stage
    repairs: int = 0  # pairing problems repaired
    summaries_failed: int = 0  # tool-output summaries that fell back to a preview
    summary_id: int | None = None
    read_rounds: int = 0
    llm_calls: int | None = None  # the conversation's upstream calls so far, this turn's included
    llm_call_limit: int | None = None
    quota_warning: str | None = None
    upstream_s: float = 0.0  # waiting on the upstream, every call together
    usage: dict[str, Any] | None = None  # what the upstream reported for the last call
    response_id: str | None = None  # the reply's id as the client saw it (Responses)
    marks: dict[str, int] = field(default_factory=dict)  # cuts a stage moved this turn, to keep
    stream_error: str | None = None  # why a streamed reply broke off, if it did
    inbox_delivered: list[int] = field(default_factory=list)  # inbox message ids this turn's prompt delivered
    knowledge: dict[str, Any] | None = None  # the knowledge document the prompt carried: namespace, version

    def saved(self, stage: str, chars: int) -> None:
        self.chars_saved[stage] = self.chars_saved.get(stage, 0) + chars

    @property
    def added_s(self) -> float:
        return time.perf_counter() - self.started - self.upstream_s

    def headers(self) -> dict[str, str]:
        """The response headers that tell a client what the proxy did to its prompt."""
        out = {"X-Conversation-ID": self.key.id, "X-Context-Messages-Left-Out": str(self.messages_left_out)}
        if self.tokens_sent is not None:
            out["X-Context-Tokens-Sent"] = str(self.tokens_sent)
        if self.llm_call_limit is not None:
            out["X-LLM-Calls-Remaining"] = str(max(self.llm_call_limit - (self.llm_calls or 0), 0))
        if self.quota_warning is not None:
            out["X-Quota-Warning"] = self.quota_warning
        return out

    def record(self, status: str, new_seqs: list[int]) -> dict[str, Any]:
        """The stored turn record: what went upstream, for the trajectory and the replay page."""
        return {
            "created_at": self.created_at,
            "format": self.dialect,
            "model": self.model,
            "sent_seqs": self.sent_seqs,
            "tokens_sent": self.tokens_sent,
            "tokens_sent_total": self.tokens_sent_total,
            "messages_left_out": self.messages_left_out,
            "truncated": self.shortened,
            "masked": self.masked,
            "summary_id": self.summary_id,
            "repairs": self.repairs,
            "llm_calls": self.llm_calls,
            "llm_call_limit": self.llm_call_limit,
            "read_rounds": self.read_rounds,
            "response_id": self.response_id,
            "inbox": self.inbox_delivered,
            "knowledge": self.knowledge,
            "status": status,
            "new_seqs": new_seqs,
        }

    def log_fields(self) -> dict[str, Any]:
        return {
            "format": self.dialect,
            "tokens_sent": self.tokens_sent or 0,
            "tokens_sent_total": self.tokens_sent_total,
            "left_out": self.messages_left_out,
            "truncated": self.shortened,
            "read_rounds": self.read_rounds,
            "llm_calls": self.llm_calls,
            "upstream_ms": round(self.upstream_s * 1000, 3),
            "added_ms": round(self.added_s * 1000, 3),
        }

    def observe(self, metrics: Metrics) -> None:
        metrics.added_latency.observe(self.added_s)
        metrics.upstream_latency.observe(self.upstream_s)
        metrics.saw(self.key)
        metrics.tokens_sent.inc(self.tokens_sent_total)
        for stage, chars in self.chars_saved.items():
            if chars > 0:
                metrics.tokens_saved.labels(stage).inc(chars / CHARS_PER_TOKEN)
        metrics.read_rounds.inc(self.read_rounds)
        metrics.repairs.inc(self.repairs)
        for kind in ("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens"):
            value = (self.usage or {}).get(kind)
            if isinstance(value, int) and not isinstance(value, bool):
                metrics.usage_tokens.labels(kind).inc(value)
