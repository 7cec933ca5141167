"""What one turn did, in one typed record: the stages and the exchange fill it in; the response
headers, the metrics, the request log line, the turn's trace span and the stored turn record are
all read from it."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from ..errors import ProxyError
from ..identity import ConversationKey
from ..metrics import Metrics
from ..seqruns import SeqRuns
from ..store import SYSTEM_PART, TOOLS_PART, RequestPart, TurnRecord
from ..tokens import estimated_tokens
from ..usage import TokenUsage

MAX_ERROR_CHARS = 1000  # of an error message kept with the turn record
# The usage figures counted by context_proxy_usage_tokens as the upstream named them.
REPORTED_KINDS = ("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens")


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
    sent_seqs: SeqRuns = field(default_factory=SeqRuns)  # in prompt order
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
    usage_total: TokenUsage = field(default_factory=TokenUsage)  # every call of the turn, in one shape
    reported: dict[str, int] = field(default_factory=dict)  # REPORTED_KINDS, every call of the turn
    reply_id: str | None = None  # the upstream's id for the reply the client saw (chatcmpl-..., msg_..., resp_...)
    response_id: str | None = None  # the same, where a later request may name the reply by it (Responses)
    marks: dict[str, int] = field(default_factory=dict)  # cuts a stage moved this turn, to keep
    stream_error: str | None = None  # why a streamed reply broke off, if it did
    fast_path: str | None = None  # how a turn's prompt was made: taken, declined or none (set on every turn)
    fast_path_reason: str | None = None  # why it was not taken (see Metrics.fast_path_not_taken)
    # Why the turn failed or ended incomplete: {"status": HTTP status or None, "message",
    # "source": "upstream" | "proxy" | "client"}; the first cause found wins.
    error: dict[str, Any] | None = None
    # What describes the conversation (kept on it by the store, see store.TurnFacts).
    client: str | None = None  # from the User-Agent
    title: str | None = None  # X-Conversation-Title
    task: str | None = None  # the task's first words, set on a conversation's first turns only
    inbox_delivered: list[int] = field(default_factory=list)  # inbox message ids this turn's prompt delivered
    knowledge: dict[str, Any] | None = None  # the knowledge document the prompt carried: namespace, version
    # The system prompt and tools the request sent (request_parts.py; chat's system prompt is a
    # message): the record names them by hash, the store keeps each once.
    request_parts: list[RequestPart] = field(default_factory=list)

    def saved(self, stage: str, chars: int) -> None:
        self.chars_saved[stage] = self.chars_saved.get(stage, 0) + chars

    def add_usage(self, usage: dict[str, Any] | None) -> None:
        """What the upstream reported for one call of the turn (None: it reported nothing)."""
        if usage is None:
            return
        self.usage = usage
        figures = TokenUsage.reported(usage)
        if figures is not None:
            self.usage_total.add(figures)
        for kind in REPORTED_KINDS:
            value = usage.get(kind)
            if isinstance(value, int) and not isinstance(value, bool):
                self.reported[kind] = self.reported.get(kind, 0) + value

    def failed(self, message: str, *, status: int | None, source: str) -> None:
        """Say why the turn failed (or ended incomplete); the first cause found is kept."""
        if self.error is None:
            self.error = {"status": status, "message": message[:MAX_ERROR_CHARS], "source": source}

    def failed_by(self, exc: BaseException) -> None:
        """The turn ended with `exc`: our own error, the upstream's as we saw it, or the client gone."""
        if isinstance(exc, ProxyError):
            source = "upstream" if exc.type == "upstream_error" else "proxy"
            self.failed(exc.message, status=exc.status, source=source)
        elif isinstance(exc, (asyncio.CancelledError, ConnectionResetError)):
            self.failed("The client went away before the reply was complete", status=None, source="client")
        elif isinstance(exc, Exception):
            self.failed(f"Internal proxy error ({type(exc).__name__})", status=500, source="proxy")

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

    def record(self, status: str, new_seqs: list[int]) -> TurnRecord:
        """The stored turn record: what went upstream, for the trajectory and the replay page."""
        return TurnRecord(
            status=status,
            created_at=self.created_at,
            format=self.dialect,
            model=self.model,
            client=self.client,
            sent_seqs=self.sent_seqs,
            new_seqs=new_seqs,
            tokens_sent=self.tokens_sent,
            tokens_sent_total=self.tokens_sent_total,
            messages_left_out=self.messages_left_out,
            truncated=self.shortened,
            masked=self.masked,
            summary_id=self.summary_id,
            repairs=self.repairs,
            llm_calls=self.llm_calls,
            llm_call_limit=self.llm_call_limit,
            read_rounds=self.read_rounds,
            response_id=self.response_id,
            inbox=self.inbox_delivered,
            knowledge=self.knowledge,
            **self.part_hashes(),
            usage=self.usage_total.to_record() if self.usage is not None else None,
            error=self.error,
            title=self.title,
            task=self.task,
        )

    def part_hashes(self) -> dict[str, str | None]:
        """`system_hash` and `tools_hash`: what the turn sent, by hash (None: it sent none)."""
        sent = {p.kind: p.hash for p in self.request_parts}
        return {"system_hash": sent.get(SYSTEM_PART), "tools_hash": sent.get(TOOLS_PART)}

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
            "fast_path": self.fast_path,
            "fast_path_reason": self.fast_path_reason,
        }

    def observe(self, metrics: Metrics) -> None:
        metrics.added_latency.observe(self.added_s)
        metrics.upstream_latency.observe(self.upstream_s)
        metrics.saw(self.key)
        metrics.tokens_sent.inc(self.tokens_sent_total)
        for stage, chars in self.chars_saved.items():  # estimated: what a stage left out was never counted
            if chars > 0:
                metrics.child(metrics.tokens_saved, stage).inc(estimated_tokens(chars))
        if self.read_rounds:
            metrics.read_rounds.inc(self.read_rounds)
        if self.repairs:
            metrics.repairs.inc(self.repairs)
        for kind, value in self.reported.items():
            metrics.child(metrics.usage_tokens, kind).inc(value)
        if self.usage_total.cache_read:
            metrics.child(metrics.usage_tokens, "cache_read_input_tokens").inc(self.usage_total.cache_read)
        if self.usage_total.cache_creation:
            metrics.child(metrics.usage_tokens, "cache_creation_input_tokens").inc(self.usage_total.cache_creation)
        if self.error is not None:
            status = self.error["status"]
            metrics.child(metrics.failed_turns, self.error["source"], str(status) if status is not None else "none").inc()
