"""Whether traces are on, from the settings and the standard OpenTelemetry variables; and the
Telemetry that follows (the SDK is imported only when they are on)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from ..config import ConfigError, Settings, TelemetrySettings
from .base import NO_TELEMETRY, Telemetry

# OTLP over HTTP with protobuf is the exporter built in; these name another transport or exporter.
PROTOCOL_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def tracing_wanted(settings: TelemetrySettings, environ: Mapping[str, str] = os.environ) -> bool:
    """On when `telemetry.otlp_endpoint` or a standard OTLP endpoint variable is set, unless
    OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none; ConfigError for what cannot be honoured."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {e.strip().lower() for e in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()}
    if exporters == {"none"}:
        return False
    wanted = settings.otlp_endpoint is not None or any(environ.get(name) for name in ENDPOINT_VARIABLES)
    if not wanted:
        return False
    if exporters and "otlp" not in exporters:
        raise ConfigError(f"telemetry: OTEL_TRACES_EXPORTER={','.join(sorted(exporters))}: only otlp is built in")
    for name in PROTOCOL_VARIABLES:
        protocol = environ.get(name, "").strip().lower()
        if protocol and protocol != "http/protobuf":
            raise ConfigError(f"telemetry: {name}={protocol}: only OTLP over HTTP (http/protobuf) is built in")
    return True


def check_telemetry(settings: Settings) -> None:
    """At start-up: a telemetry setting that cannot be honoured stops it, naming the setting."""
    tracing_wanted(settings.telemetry)


def open_telemetry(settings: Settings) -> Telemetry:
    """NO_TELEMETRY, or (when tracing is wanted) the SDK's tracer exporting over OTLP/HTTP."""
    if not tracing_wanted(settings.telemetry):
        return NO_TELEMETRY
    from .otel import OtelTelemetry  # the SDK is imported only when traces are on

    return OtelTelemetry(settings)
