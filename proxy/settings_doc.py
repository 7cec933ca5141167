"""Every setting, its default and what it does, read from the settings models themselves.

`context-proxy settings` prints it, and the README's settings table is this text (a test keeps
the two equal), so a setting is described in one place: its `Field(description=...)`.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from .config import ModelSettings, ProfileOverrides, Settings

START, END = "<!-- settings:start -->", "<!-- settings:end -->"


def reference() -> str:
    """The settings table in markdown: one row per key of every section."""
    rows = ["| setting | default | what it does |", "| --- | --- | --- |"]
    for section, field in Settings.model_fields.items():
        model = _model_of(field.default, field.annotation)
        if section == "profiles":
            sections = ", ".join(f"`{k}`" for k in ProfileOverrides.model_fields)
            rows.append(f"| `profiles.<name>.*` | `{{}}` | {_cell(field.description)} Sections: {sections}. |")
            continue
        if section == "models":
            model = ModelSettings
            for key, sub in model.model_fields.items():
                rows.append(f"| `models.<name>.{key}` | {_default(sub)} | {_cell(sub.description)} |")
            continue
        rows += _rows(section, model)
    return "\n".join(rows)


def _rows(prefix: str, model: type[BaseModel]) -> list[str]:
    """A row per key of `model`, a nested section's keys under its name (`compaction.mask.batch`)."""
    rows = []
    for key, sub in model.model_fields.items():
        if isinstance(sub.annotation, type) and issubclass(sub.annotation, BaseModel):
            rows.append(f"| `{prefix}.{key}` | | {_cell(sub.description)} |")
            rows += _rows(f"{prefix}.{key}", sub.annotation)
        else:
            rows.append(f"| `{prefix}.{key}` | {_default(sub)} | {_cell(sub.description)} |")
    return rows


def _model_of(default: Any, annotation: Any) -> type[BaseModel]:
    return type(default) if isinstance(default, BaseModel) else annotation


def _default(field: Any) -> str:
    value = field.default
    if value is PydanticUndefined:
        value = field.default_factory() if field.default_factory is not None else None
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    return f"`{text}`" if len(text) <= 40 else f"`{text[:37]}...`"


def _cell(text: str | None) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")


__all__ = ["END", "START", "reference"]
