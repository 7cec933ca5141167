"""The LLM-call quota of a conversation: how many upstream calls it made, and what each message showed.

A message's quota figures are fixed when it is first forwarded (`first_forwarded`), so the same
bytes go upstream on every later turn and prompt caches keep hitting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .config import QuotaSettings
from .errors import ProxyError
from .markers import quota_line


class QuotaExceeded(ProxyError):
    status = 429
    type = "insufficient_quota"
    code = "llm_call_quota_exceeded"


@dataclass(frozen=True, slots=True)
class QuotaFigures:
    used: int
    remaining: int
    limit: int

    def as_dict(self) -> dict[str, int]:
        return {"used": self.used, "remaining": self.remaining, "limit": self.limit}

    def line(self) -> str:
        return quota_line(self.remaining, self.used, self.limit)


@dataclass(slots=True)
class QuotaLedger:
    """Quota state for one upstream call: `call_number` is the number this call will have."""

    settings: QuotaSettings
    call_number: int
    first_forwarded: Mapping[int, int]  # the conversation's, read only (a snapshot's: not copied)
    new_marks: dict[int, int] = field(default_factory=dict)

    @property
    def on(self) -> bool:
        return self.settings.max_llm_calls is not None

    @property
    def exhausted(self) -> bool:
        limit = self.settings.max_llm_calls
        return limit is not None and self.call_number > limit

    @property
    def rejects(self) -> bool:
        """Whether a call past the quota is refused (else it goes, with a warning)."""
        return self.on and self.settings.on_exhausted == "reject"

    def check(self) -> None:
        """Before the call: with `on_exhausted: reject`, a call past the quota is a 429."""
        if self.exhausted and self.rejects:
            raise self.refusal()

    def refusal(self) -> QuotaExceeded:
        return QuotaExceeded(
            f"This conversation has used its {self.settings.max_llm_calls} LLM calls "
            "(quota.max_llm_calls); start a new conversation or raise the quota"
        )

    def figures(self, seq: int | None) -> QuotaFigures | None:
        """The figures message `seq` carries: those of its first forwarding (recorded now if this is it)."""
        limit = self.settings.max_llm_calls
        if limit is None:
            return None
        used = self.call_number
        if seq is not None:
            used = self.first_forwarded.get(seq) or self.new_marks.setdefault(seq, self.call_number)
        return QuotaFigures(used, max(limit - used, 0), limit)
