"""Structured JSON logs: one object per line, with whatever `extra=` fields a call adds."""

from __future__ import annotations

import json
import logging
import sys
import time

# Attributes every LogRecord has; anything else on a record came from `extra=` and is logged.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD:
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # aiohttp's own access log would duplicate ours (and print raw request lines).
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def monotonic_ms(start: float) -> float:
    return round((time.perf_counter() - start) * 1000, 3)
