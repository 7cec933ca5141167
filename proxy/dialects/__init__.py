"""Wire formats the proxy manages, one dialect each (see base.py for what a dialect must know)."""

from .base import Dialect, ReplyRead, RoundEnd, StreamRelay, ToolSpec

__all__ = ["Dialect", "ReplyRead", "RoundEnd", "StreamRelay", "ToolSpec"]
