"""OpenTelemetry traces of every turn, opt-in: base.py says what the engine feeds them (and is
the trace of nothing, when off), otel.py the spans they become, wanted.py when they are on."""

from .base import NO_TELEMETRY, SummarizerTrace, Telemetry, TurnTrace
from .wanted import check_telemetry, open_telemetry, tracing_wanted

__all__ = ["NO_TELEMETRY", "SummarizerTrace", "Telemetry", "TurnTrace", "check_telemetry", "open_telemetry", "tracing_wanted"]
