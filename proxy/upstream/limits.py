"""Bounds on what an upstream may send: reply size, event-stream line length and total time.

An upstream is trusted to answer, not to answer sanely. One that streams without end, sends a
line that never ends, or trickles a byte a second would otherwise hold memory, a connection and
the conversation's lock for as long as it liked (the socket timeout only fires on total silence).
Every reply is read through a ReplyMeter: past a bound the read raises a ProxyError, so a
non-streamed turn is a 502/504 and a streamed one ends with an error event, keeping the partial
reply, itself no larger than the size bound, as incomplete.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ..config import UpstreamSettings
from ..errors import UpstreamReplyTooLarge, UpstreamTimeout

MB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class ReplyLimits:
    """What one reply may be. `max_stream_bytes` None: a stream relayed without being kept
    (passthrough), so its length costs no memory and is not bounded."""

    max_bytes: int  # any body read whole (read())
    max_stream_bytes: int | None  # the bytes of a streamed reply (chunks())
    max_line: int  # one line of an event stream
    max_s: float | None  # request sent to last byte

    @classmethod
    def for_turn(cls, settings: UpstreamSettings) -> ReplyLimits:
        """A chat turn's reply: kept whole (assembled, stored), under the conversation's lock."""
        size = int(settings.max_reply_mb * MB)
        return cls(size, size, int(settings.max_sse_line_mb * MB), settings.max_reply_s)

    @classmethod
    def for_passthrough(cls, settings: UpstreamSettings) -> ReplyLimits:
        """Any other path: streamed through as it comes, so only what is buffered is bounded, and
        only by silence (timeout_s) in time: a large download may take long."""
        return cls(int(settings.max_reply_mb * MB), None, int(settings.max_sse_line_mb * MB), None)


class ReplyMeter:
    """Counts one reply's bytes and event-stream lines against its limits; raises past one."""

    __slots__ = ("deadline", "event_stream", "limits", "line", "received")

    def __init__(self, limits: ReplyLimits, *, event_stream: bool = False, started: float | None = None) -> None:
        self.limits = limits
        self.event_stream = event_stream
        self.received = 0
        self.line = 0  # bytes of the event-stream line not yet ended by a newline
        loop_time = asyncio.get_running_loop().time() if started is None else started
        self.deadline = None if limits.max_s is None else loop_time + limits.max_s

    def check_length(self, content_length: int | None, *, streamed: bool) -> None:
        """Refuse at once a body whose declared length is over the bound (nothing read yet)."""
        bound = self.limits.max_stream_bytes if streamed else self.limits.max_bytes
        if content_length is not None and bound is not None and content_length > bound:
            raise self._too_large(bound)

    def count(self, chunk: bytes, *, streamed: bool) -> None:
        """Account for `chunk` before it is used; raises UpstreamReplyTooLarge past a bound."""
        self.received += len(chunk)
        bound = self.limits.max_stream_bytes if streamed else self.limits.max_bytes
        if bound is not None and self.received > bound:
            raise self._too_large(bound)
        # Whole lines, none too long: a stream's usual chunk (its events), counted without a search.
        if self.event_stream and (self.line or len(chunk) > self.limits.max_line or chunk[-1:] != b"\n"):
            self._count_lines(chunk)

    def _count_lines(self, chunk: bytes) -> None:
        max_line = self.limits.max_line
        first = chunk.find(b"\n")
        if first < 0:
            self.line += len(chunk)
        else:
            if self.line + first > max_line:
                raise self._line_too_long()
            if len(chunk) > max_line:  # a whole long line may sit inside one big chunk
                start = first + 1
                while (end := chunk.find(b"\n", start)) >= 0:
                    if end - start > max_line:
                        raise self._line_too_long()
                    start = end + 1
            self.line = len(chunk) - chunk.rfind(b"\n") - 1
        if self.line > max_line:
            raise self._line_too_long()

    def expired(self) -> bool:
        return self.deadline is not None and asyncio.get_running_loop().time() >= self.deadline

    def timeout(self) -> UpstreamTimeout:
        return UpstreamTimeout(f"Upstream reply took longer than {self.limits.max_s:g}s (upstream.max_reply_s)")

    def _too_large(self, bound: int) -> UpstreamReplyTooLarge:
        return UpstreamReplyTooLarge(
            f"Upstream reply is larger than {bound / MB:g} MB (upstream.max_reply_mb); it was cut there"
        )

    def _line_too_long(self) -> UpstreamReplyTooLarge:
        return UpstreamReplyTooLarge(
            f"Upstream event stream has a line longer than {self.limits.max_line / MB:g} MB "
            "(upstream.max_sse_line_mb); it was cut there",
            code="upstream_sse_line_too_long",
        )
