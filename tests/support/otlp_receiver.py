"""A real OTLP/HTTP trace receiver for the tests: a small aiohttp app on loopback that decodes each
export with the `opentelemetry-proto` messages, as a collector would, and keeps the spans.

It is strict where the exporter must be right: POST to /v1/traces, `application/x-protobuf`, a
body that parses as an ExportTraceServiceRequest (gzip-encoded or not). Anything else is a 4xx,
and counted in `refused`, so a test can assert that none was.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status

from tests.support.harness import serve_on_loopback

KINDS = {
    ProtoSpan.SPAN_KIND_INTERNAL: "INTERNAL",
    ProtoSpan.SPAN_KIND_SERVER: "SERVER",
    ProtoSpan.SPAN_KIND_CLIENT: "CLIENT",
    ProtoSpan.SPAN_KIND_PRODUCER: "PRODUCER",
    ProtoSpan.SPAN_KIND_CONSUMER: "CONSUMER",
}
STATUSES = {Status.STATUS_CODE_UNSET: "UNSET", Status.STATUS_CODE_OK: "OK", Status.STATUS_CODE_ERROR: "ERROR"}


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, which) if which else None


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root span
    kind: str
    attributes: dict[str, Any]
    status: str
    status_message: str
    resource: dict[str, Any]
    start_ns: int
    end_ns: int


@dataclass
class OtlpReceiver:
    spans: list[ReceivedSpan] = field(default_factory=list)
    refused: int = 0
    exports: int = 0
    port: int = 0
    _runner: web.AppRunner | None = None
    _arrived: threading.Condition = field(default_factory=threading.Condition)

    @property
    def endpoint(self) -> str:
        """The collector's base URL, as `telemetry.otlp_endpoint` or OTEL_EXPORTER_OTLP_ENDPOINT take it."""
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self._runner, self.port = await serve_on_loopback(app, access_log=None)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _traces(self, request: web.Request) -> web.Response:
        if request.content_type != "application/x-protobuf":
            return self._refuse(415, f"not protobuf: {request.content_type}")
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        export = ExportTraceServiceRequest()
        try:
            export.ParseFromString(body)
        except DecodeError as exc:
            return self._refuse(400, f"not an ExportTraceServiceRequest: {exc}")
        received = []
        for resource_spans in export.resource_spans:
            resource = {kv.key: _value(kv.value) for kv in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            kind=KINDS.get(span.kind, str(span.kind)),
                            attributes={kv.key: _value(kv.value) for kv in span.attributes},
                            status=STATUSES.get(span.status.code, str(span.status.code)),
                            status_message=span.status.message,
                            resource=resource,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                        )
                    )
        with self._arrived:
            self.spans.extend(received)
            self.exports += 1
            self._arrived.notify_all()
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf")

    def _refuse(self, status: int, reason: str) -> web.Response:
        with self._arrived:
            self.refused += 1
        return web.Response(status=status, text=reason)

    def wait_for(self, ready: Callable[[list[ReceivedSpan]], bool], timeout: float = 15) -> list[ReceivedSpan]:
        """The spans received, once `ready(spans)` holds (AssertionError at the deadline)."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while not ready(self.spans):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"the spans never got ready: {[s.name for s in self.spans]}")
                self._arrived.wait(left)
            return list(self.spans)
