"""Upstreams: where chat completions and every other path are sent."""

from .base import Upstream, UpstreamReply
from .http import HttpUpstream, forwardable

__all__ = ["HttpUpstream", "Upstream", "UpstreamReply", "forwardable"]
