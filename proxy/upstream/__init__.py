"""Upstreams: where chat completions and every other path are sent."""

from .base import EncodedBody, Upstream, UpstreamReply, encoded
from .http import HttpUpstream, forwardable

__all__ = ["EncodedBody", "HttpUpstream", "Upstream", "UpstreamReply", "encoded", "forwardable"]
