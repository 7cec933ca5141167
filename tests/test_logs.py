"""The two renderings of a log record: one JSON object, or one line a person reads."""

from __future__ import annotations

import io
import json
import logging
import re
import sys

from proxy.logs import ACCESS_LOGGER, JsonFormatter, TextFormatter, resolved_format


def record(name: str, msg: str, exc_info: object = None, **extra: object) -> logging.LogRecord:
    entry = logging.LogRecord(name, logging.INFO, __file__, 1, msg, None, exc_info)  # type: ignore[arg-type]
    entry.__dict__.update(extra)
    return entry


def test_a_request_line_leads_with_method_path_status_and_time_then_its_fields():
    line = TextFormatter().format(record(
        ACCESS_LOGGER, "request", method="POST", path="/v1/responses", status=200, ms=12.5,
        conversation="fix-it", tenant=None, format="responses", fast_path="taken",
    ))
    assert re.fullmatch(r"\d\d:\d\d:\d\d INFO    POST /v1/responses 200 12.5 ms  "
                        r"conversation=fix-it format=responses fast_path=taken", line), line
    assert "tenant" not in line  # a field without a value says nothing


def test_values_that_would_read_ambiguously_are_quoted_as_json():
    line = TextFormatter().format(record(
        "proxy", "started", upstream="http://u/v1", note='two words', pipeline=["truncation", "window"],
        traces=False, empty="", eq="a=b",
    ))
    assert line.endswith(
        'started  upstream=http://u/v1 note="two words" pipeline=["truncation","window"] traces=false empty="" eq="a=b"'
    ), line


def test_an_exception_follows_its_line_in_text_and_is_a_field_in_json():
    try:
        raise ValueError("boom")
    except ValueError:
        failing = record("proxy", "summary failed", exc_info=sys.exc_info(), conversation="c")
    text = TextFormatter().format(failing)
    first, *rest = text.splitlines()
    assert first.endswith("summary failed  conversation=c") and rest[-1] == "ValueError: boom"
    entry = json.loads(JsonFormatter().format(failing))
    assert entry["msg"] == "summary failed" and entry["conversation"] == "c" and "ValueError: boom" in entry["exc"]


def test_auto_is_text_on_a_terminal_only():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert resolved_format("auto", Terminal()) == "text"
    assert resolved_format("auto", io.StringIO()) == "json"
    assert resolved_format("json", Terminal()) == "json"
    assert resolved_format("text", io.StringIO()) == "text"
