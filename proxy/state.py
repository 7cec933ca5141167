"""Typed keys for what the application holds: settings, store, upstream, pipeline."""

from __future__ import annotations

from aiohttp import web

from .config import Settings
from .identity import ConversationKey
from .pipeline import Pipeline
from .store import Store
from .upstream import HttpUpstream

SETTINGS = web.AppKey("settings", Settings)
STORE = web.AppKey("store", Store)
UPSTREAM = web.AppKey("upstream", HttpUpstream)
PIPELINE = web.AppKey("pipeline", Pipeline)

# Per request: the conversation it was routed to, for the request log.
CONVERSATION = web.RequestKey("conversation", ConversationKey)
