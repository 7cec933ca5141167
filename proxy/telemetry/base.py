"""What the engine tells a turn's trace, and the trace that records nothing (telemetry off).

The engine opens one TurnTrace per turn (`Telemetry.turn`, a context manager around the whole
turn) and tells it, as the turn goes: the transcript the pipeline got, each upstream call (its
start, status and usage), each read-back round and tool answer, and the reply. At the end the
trace reads everything else from the TurnReport. The summarizer opens a SummarizerTrace per call.

Off (the default), `NO_TELEMETRY` hands out these base classes, whose methods do nothing and
return at once: the turn pays a handful of no-op calls, imports nothing from OpenTelemetry and
changes no header it sends upstream. On, proxy/telemetry/otel.py implements them with the SDK.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from ..dialects.base import Dialect
    from ..engine.report import TurnReport
    from ..transcript import Call, Item, Raw


class Scope:
    """A context manager that records nothing: the base of every trace here."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class RoundTrace(Scope):
    """One read-back round (a context manager around answering the proxy's own calls)."""

    def not_made(self) -> None:
        """The round did not fit the token budget: the model's reply went to the client as it was."""

    def added(self, tokens: int) -> None:
        """What the round adds to the next call's prompt."""


NULL_ROUND = RoundTrace()


class TurnTrace(Scope):
    """One turn's trace; this one records nothing."""

    def transcript(self, items: Sequence[Item]) -> None:
        """The conversation's items as the pipeline got them (what is stored, before rewriting)."""

    def upstream_call(
        self, headers: dict[str, str], items: Sequence[Item], internal: Sequence[Item], tokens: int
    ) -> dict[str, str]:
        """An upstream call starts with the prompt `items + internal` (`tokens` by our count);
        returns the headers to send with it (here: `headers` itself, untouched)."""
        return headers

    def upstream_replied(self, status: int) -> None:
        """The upstream's status line came back."""

    def upstream_done(self, usage: Mapping[str, Any] | None) -> None:
        """The upstream's reply was read whole (or not, on error); `usage` as it reported it."""

    def read_round(self, calls: int) -> RoundTrace:
        """A read-back round answering `calls` of the proxy's own tool calls."""
        return NULL_ROUND

    async def tool(self, call: Call, answer: Awaitable[str]) -> str:
        """The proxy answers one of its tool calls: `answer`, awaited under the call's span."""
        return await answer

    def reply(self, raws: Sequence[Raw]) -> None:
        """The reply the client got, as stored."""


NULL_TURN = TurnTrace()


class SummarizerTrace(Scope):
    """One summarizer call (a context manager around it); this one records nothing."""

    def headers(self, headers: Mapping[str, str]) -> Mapping[str, str]:
        """The headers to send with the call (here: `headers`, untouched)."""
        return headers

    def done(self, text: str, tokens_in: int, tokens_out: int) -> None:
        """The summary came back: its text and what the summarizer spent."""


NULL_SUMMARIZER = SummarizerTrace()


class Telemetry:
    """Where traces go; this one sends none (telemetry off)."""

    enabled = False

    def turn(self, headers: Mapping[str, str], dialect: Dialect, report: TurnReport) -> TurnTrace:
        """The trace of one turn: `headers` are the client's (its `traceparent` is continued)."""
        return NULL_TURN

    def summarizer_call(self, model: str, system: str, user: str) -> SummarizerTrace:
        return NULL_SUMMARIZER

    async def close(self) -> None:
        """Send what is still queued, then stop (off the event loop)."""


NO_TELEMETRY = Telemetry()
