"""Every setting, its default and what it does, read from the settings models themselves.

`context-proxy settings` prints it, and the README's settings table is this text (a test keeps
the two equal), so a setting is described in one place: its `Field(description=...)`.
"""

from __future__ import annotations

import json

from .config import ModelSettings, ProfileOverrides, Settings
from .settings_base import MISSING, Key, Section

START, END = "<!-- settings:start -->", "<!-- settings:end -->"


def reference() -> str:
    """The settings table in markdown: one row per key of every section."""
    rows = ["| setting | default | what it does |", "| --- | --- | --- |"]
    for section, key in Settings.model_fields.items():
        if section == "profiles":
            sections = ", ".join(f"`{k}`" for k in ProfileOverrides.model_fields)
            rows.append(f"| `profiles.<name>.*` | `{{}}` | {_cell(key.description)} Sections: {sections}. |")
            continue
        if section == "models":
            for name, sub in ModelSettings.model_fields.items():
                rows.append(f"| `models.<name>.{name}` | {_default(sub)} | {_cell(sub.description)} |")
            continue
        rows += _rows(section, key.annotation)
    return "\n".join(rows)


def _rows(prefix: str, model: type[Section]) -> list[str]:
    """A row per key of `model`, a nested section's keys under its name (`compaction.mask.batch`)."""
    rows = []
    for name, sub in model.model_fields.items():
        if isinstance(sub.annotation, type) and issubclass(sub.annotation, Section):
            rows.append(f"| `{prefix}.{name}` | | {_cell(sub.description)} |")
            rows += _rows(f"{prefix}.{name}", sub.annotation)
        else:
            rows.append(f"| `{prefix}.{name}` | {_default(sub)} | {_cell(sub.description)} |")
    return rows


def _default(key: Key) -> str:
    value = None if key.default is MISSING and key.default_factory is None else key.default_value()
    if isinstance(value, Section):
        value = value.model_dump()
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return f"`{text}`" if len(text) <= 40 else f"`{text[:37]}...`"


def _cell(text: str | None) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")


__all__ = ["END", "START", "reference"]
