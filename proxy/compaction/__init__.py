"""History compaction: when and how a conversation's older history becomes a summary.

- `windows.py` picks what to summarize, `facts.py` keeps identifiers, `quotes.py` the user's own
  words, `render.py` makes a summary's system message, `llm.py` is the built-in compactor,
  `runner.py` runs compactions one at a time per conversation, in the background, backing off
  after a failure.
- The pipeline stage that applies a summary (and the no-LLM `mask` strategy) is
  `proxy/pipeline/compaction.py`.
"""

from __future__ import annotations

import importlib

from ..config import ConfigError, Settings
from .base import CompactionJob, Compactor

__all__ = ["CompactionJob", "Compactor", "check_compactors", "compactor_class"]


def compactor_class(path: str | None) -> type:
    """Import the compactor class at `path`; ValueError with a clear reason if it is not usable."""
    if not path:
        raise ValueError("compaction is enabled but no compactor_class is set")
    module_name, _, class_name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ValueError(f"cannot import compactor_class {path!r}: {exc}") from None
    missing = [op for op in ("get_summary", "compact_if_needed") if not callable(getattr(cls, op, None))]
    if not isinstance(cls, type) or missing:
        raise ValueError(f"compactor_class {path!r} is not a compactor (needs get_summary and compact_if_needed)")
    return cls


def check_compactors(settings: Settings) -> None:
    """Import every compactor class the settings name, at start-up: a bad one stops it with one
    line naming the setting. (Not in config.py: settings never import user code.)"""
    for name, profile in settings.named_profiles().items():
        if profile.compaction.strategy in ("turns", "budget"):
            try:
                compactor_class(profile.compaction.compactor_class)
            except ValueError as exc:
                where = "compaction" if name is None else f"profiles.{name}.compaction"
                raise ConfigError(f"{where}.compactor_class: {exc}") from None
