"""Typed keys for what the application holds: settings, store, upstream, pipeline."""

from __future__ import annotations

from aiohttp import web

from .admin_token import AdminToken
from .compaction.runner import CompactionRunner
from .config import Settings
from .engine import Engine
from .identity import ConversationKey
from .metrics import Metrics
from .pipeline import Pipeline
from .prefix import PrefixCache
from .refs import RefSigner
from .store import Store
from .summarizer import Summarizer
from .telemetry import Telemetry
from .tokens import TokenCounter
from .trajectory_files import TrajectoryWriter
from .upstream import HttpUpstream
from .upstream.router import UpstreamRouter

SETTINGS = web.AppKey("settings", Settings)
STORE = web.AppKey("store", Store)
UPSTREAM = web.AppKey("upstream", HttpUpstream)
PIPELINE = web.AppKey("pipeline", Pipeline)
REFS = web.AppKey("refs", RefSigner)
COUNTER = web.AppKey("counter", TokenCounter)
SUMMARIZER = web.AppKey("summarizer", Summarizer)
COMPACTION = web.AppKey("compaction", CompactionRunner)

METRICS = web.AppKey("metrics", Metrics)
ROUTER = web.AppKey("router", UpstreamRouter)
PREFIXES = web.AppKey("prefixes", PrefixCache)
ENGINE = web.AppKey("engine", Engine)
TRAJECTORIES = web.AppKey("trajectories", TrajectoryWriter)
TELEMETRY = web.AppKey("telemetry", Telemetry)
ADMIN_TOKEN = web.AppKey("admin_token", AdminToken)

# Per request: the conversation it was routed to, and what the request log line adds.
CONVERSATION = web.RequestKey("conversation", ConversationKey)
LOG_FIELDS = web.RequestKey("log_fields", dict)
# A Gemini client's `?key=` on a Gemini route (proxy/api/gemini.py): the key of that request.
QUERY_API_KEY = web.RequestKey("query_api_key", str)
