"""Log lines: JSON objects for a collector, or readable text for a person at a terminal.

One record, two renderings, the same fields: whatever `extra=` a call adds. `logging.format`
chooses; `auto` (the default, as uvicorn and LiteLLM do it) writes text when stderr is a
terminal and JSON otherwise (a pipe, a file, Docker, systemd).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Literal, TextIO

LogFormat = Literal["auto", "text", "json"]
ACCESS_LOGGER = "proxy.access"  # one line per request (app.request_log)

# Attributes every LogRecord has; anything else on a record came from `extra=` and is logged.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def _extra(record: logging.LogRecord) -> dict[str, Any]:
    return {key: value for key, value in vars(record).items() if key not in _STANDARD}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_extra(record),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """`14:02:11 INFO  message  key=value ...`; a request's line leads with what a person scans
    for (`POST /v1/chat/completions 200 41.2 ms`). Fields that are None are left out."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {key: value for key, value in _extra(record).items() if value is not None}
        if record.name == ACCESS_LOGGER and {"method", "path", "status", "ms"} <= fields.keys():
            head = f"{fields.pop('method')} {fields.pop('path')} {fields.pop('status')} {fields.pop('ms')} ms"
        else:
            head = record.getMessage()
        clock = time.strftime("%H:%M:%S", time.localtime(record.created))
        line = f"{clock} {record.levelname:<7} {head}"
        if fields:
            line += "  " + " ".join(f"{key}={_text(value)}" for key, value in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line



def _text(value: Any) -> str:
    """A field's value on a text line: bare when it reads unambiguously, else as JSON."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, str) and value and not any(c.isspace() or c in '="' for c in value):
        return value
    return json.dumps(value, default=str, ensure_ascii=False, separators=(",", ":"))


def resolved_format(setting: LogFormat, stream: TextIO) -> Literal["text", "json"]:
    """`text` or `json`: the setting, or for `auto` whether `stream` is a terminal."""
    if setting != "auto":
        return setting
    try:
        return "text" if stream.isatty() else "json"
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return "json"


def configure_logging(level: str, log_format: LogFormat = "auto") -> Literal["text", "json"]:
    """Send every log record to stderr in `log_format`; returns the format chosen."""
    chosen = resolved_format(log_format, sys.stderr)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TextFormatter() if chosen == "text" else JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # aiohttp's own access log would duplicate ours (and print raw request lines).
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    return chosen


def monotonic_ms(start: float) -> float:
    return round((time.perf_counter() - start) * 1000, 3)
