"""Traces with the OpenTelemetry SDK, exported over OTLP/HTTP by its batch processor.

The span tree of one turn (docs/telemetry.md shows a real one):

    chat {model}                        SERVER    the turn: GenAI attributes and the proxy's own
    ├── upstream {model}                CLIENT    each upstream call (its status, usage, our count)
    ├── read_back round {n}             INTERNAL  each read-back round the proxy answered
    │   └── execute_tool read_tool_output         each of its tool answers
    └── chat {summarizer model}         CLIENT    each summarizer call (tool outputs, compaction)

The turn span is the one GenAI inference span of the turn (`gen_ai.usage.*` summed over its
upstream calls, which carry theirs as `context_proxy.usage.*`, so a tool that sums GenAI spans
counts the turn once). The summarizer's calls are separate GenAI spans: they cost separately.

A client's `traceparent` is continued (the turn span is its child); each upstream call carries its
own span's `traceparent` upstream, in place of the client's. Spans are queued and sent by the
SDK's BatchSpanProcessor on its own thread: the event loop never waits on the exporter, and a
collector that is down costs dropped spans, never a slower turn.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .. import __version__
from ..config import Settings
from ..tokens import estimated_tokens
from ..usage import TokenUsage
from .base import RoundTrace, SummarizerTrace, Telemetry, TurnTrace
from .content import messages_json, reply_json, texts_json
from .naming import OPENAI_API_TYPES, Providers, Served

if TYPE_CHECKING:
    from ..dialects.base import Dialect
    from ..engine.report import TurnReport
    from ..transcript import Call, Item, Raw

TRACE_HEADERS = ("traceparent", "tracestate")
TRACES_PATH = "/v1/traces"
OPERATION = "chat"  # the conventions' operation for chat completions, Responses and Messages alike


def traces_url(endpoint: str | None) -> str | None:
    """`telemetry.otlp_endpoint` as the exporter's traces URL: a base URL gets /v1/traces."""
    if endpoint is None:
        return None  # the exporter reads OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / _ENDPOINT itself
    base = endpoint.rstrip("/")
    return base if base.endswith(TRACES_PATH) else base + TRACES_PATH


def _resource(service_name: str) -> Resource:
    resource = Resource.create({"service.version": __version__})  # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES apply
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": service_name}))
    return resource


def _served(served: Served, provider: bool = True) -> dict[str, Any]:
    """Where the model is served; `provider` False for the upstream-call spans, which carry no
    gen_ai.* attribute (a tool that reads GenAI spans must see the turn once, not its calls too)."""
    out: dict[str, Any] = {"gen_ai.provider.name": served.provider} if provider else {}
    if served.address:
        out["server.address"] = served.address
        if served.port:
            out["server.port"] = served.port
    return out


def _usage(prefix: str, usage: TokenUsage) -> dict[str, int]:
    out = {
        f"{prefix}.input_tokens": usage.input,  # cache reads and writes included, as the conventions count
        f"{prefix}.output_tokens": usage.output,
        f"{prefix}.cache_read.input_tokens": usage.cache_read,
    }
    if usage.cache_creation:  # only providers that bill cache writes (Anthropic) report them
        out[f"{prefix}.cache_creation.input_tokens"] = usage.cache_creation
    return out


def _fail(span: Span, error_type: str, message: str | None) -> None:
    span.set_attribute("error.type", error_type)
    span.set_status(Status(StatusCode.ERROR, message))


class OtelTelemetry(Telemetry):
    enabled = True

    def __init__(self, settings: Settings) -> None:
        options = settings.telemetry
        self.capture = options.capture_content
        self.limit = options.max_attribute_chars
        self.providers = Providers(settings)
        # An app's own provider, not the global one: several apps (tests) each keep theirs, and
        # shutdown is ours (close), not an atexit hook's.
        self.provider = TracerProvider(
            resource=_resource(options.service_name),
            span_limits=SpanLimits(max_attribute_length=self.limit + 1024),  # a net: contents are cut before
            shutdown_on_exit=False,
        )
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(options.otlp_endpoint))))
        self.tracer = self.provider.get_tracer("context-proxy", __version__)
        self.propagator = TraceContextTextMapPropagator()

    def turn(self, headers: Mapping[str, str], dialect: Dialect, report: TurnReport) -> TurnTrace:
        carrier = {name.lower(): value for name, value in headers.items() if name.lower() in TRACE_HEADERS}
        return OtelTurnTrace(self, self.propagator.extract(carrier), dialect, report)

    def summarizer_call(self, model: str, system: str, user: str) -> SummarizerTrace:
        return OtelSummarizerTrace(self, model, system, user)

    def with_span_context(self, headers: Mapping[str, str], span: Span) -> dict[str, str]:
        """`headers` with `span`'s traceparent (and tracestate) in place of any the client sent."""
        out = {name: value for name, value in headers.items() if name.lower() not in TRACE_HEADERS}
        self.propagator.inject(out, context=trace.set_span_in_context(span))
        return out

    async def close(self) -> None:
        await asyncio.to_thread(self.provider.shutdown)  # flushes the queue: blocking, so off the loop


class OtelTurnTrace(TurnTrace):
    def __init__(self, telemetry: OtelTelemetry, parent: otel_context.Context, dialect: Dialect, report: TurnReport) -> None:
        self.t, self.parent, self.dialect, self.report = telemetry, parent, dialect, report
        self.served = telemetry.providers.served(dialect.name, report.model)
        self.span: Span = trace.INVALID_SPAN
        self.call: Span | None = None  # the upstream call under way, if any
        self.calls = 0
        self.transcript_items: int | None = None
        self._token: object = None

    def __enter__(self) -> OtelTurnTrace:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": OPERATION,
            **_served(self.served),
            "gen_ai.request.model": self.report.model,
            "gen_ai.conversation.id": self.report.key.id,
            "context_proxy.dialect": self.dialect.name,
        }
        if self.served.provider == "openai" and self.dialect.name in OPENAI_API_TYPES:
            attributes["openai.api.type"] = OPENAI_API_TYPES[self.dialect.name]
        self.span = self.t.tracer.start_span(
            f"{OPERATION} {self.report.model}", context=self.parent, kind=SpanKind.SERVER, attributes=attributes
        )
        self._token = otel_context.attach(trace.set_span_in_context(self.span, self.parent))
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        try:
            self._end_call(exc)
            self._finish(exc)
        finally:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            self.span.end()

    def transcript(self, items: Sequence[Item]) -> None:
        self.transcript_items = len(items)
        codec = self.dialect.codec
        estimate = 0
        for item in items:  # estimated: tracing must not make a turn tokenize more than it does
            texts, flat = codec.counted_parts(item.raw)
            estimate += estimated_tokens(sum(len(text) for text in texts)) + flat
        self.span.set_attribute("context_proxy.tokens.stored_estimate", estimate)

    def upstream_call(
        self, headers: dict[str, str], items: Sequence[Item], internal: Sequence[Item], tokens: int
    ) -> dict[str, str]:
        self._end_call(None)
        self.calls += 1
        if self.calls == 1 and self.t.capture:
            self.span.set_attribute("gen_ai.input.messages", messages_json(self.dialect.codec, [*items, *internal], self.t.limit))
        self.call = self.t.tracer.start_span(
            f"upstream {self.report.model}",
            kind=SpanKind.CLIENT,
            attributes={
                **_served(self.served, provider=False),
                "context_proxy.call.number": self.calls,
                "context_proxy.call.read_rounds_before": self.report.read_rounds,
                "context_proxy.tokens.sent": tokens,
            },
        )
        return self.t.with_span_context(headers, self.call)

    def upstream_replied(self, status: int) -> None:
        if self.call is not None:
            self.call.set_attribute("http.response.status_code", status)
            if status >= 400:
                _fail(self.call, str(status), f"the upstream answered {status}")

    def upstream_done(self, usage: Mapping[str, Any] | None) -> None:
        if self.call is None:
            return
        figures = TokenUsage.reported(usage)
        if figures is not None:
            self.call.set_attributes(_usage("context_proxy.usage", figures))
        self.call.end()
        self.call = None

    def read_round(self, calls: int) -> RoundTrace:
        return OtelRoundTrace(self.t, self.report.read_rounds + 1, calls)

    async def tool(self, call: Call, answer: Awaitable[str]) -> str:
        attributes = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.id,
            "gen_ai.tool.type": "function",
        }
        if self.t.capture:
            attributes["gen_ai.tool.call.arguments"] = call.arguments
        with self.t.tracer.start_as_current_span(f"execute_tool {call.name}", kind=SpanKind.INTERNAL, attributes=attributes) as span:
            text = await answer
            span.set_attribute("context_proxy.tool.result_chars", len(text))
            if self.t.capture:
                span.set_attribute("gen_ai.tool.call.result", text[: self.t.limit])
            return text

    def reply(self, raws: Sequence[Raw]) -> None:
        if self.t.capture:
            self.span.set_attribute("gen_ai.output.messages", reply_json(self.dialect.codec, raws, self.t.limit))

    def _end_call(self, exc: BaseException | None) -> None:
        """End a call still open (the turn failed under it, or a new call starts)."""
        if self.call is None:
            return
        if exc is not None:
            _fail(self.call, type(exc).__name__, getattr(exc, "message", None) or str(exc) or None)
        self.call.end()
        self.call = None

    def _finish(self, exc: BaseException | None) -> None:
        """Everything else the turn did, from its report."""
        r = self.report
        attributes: dict[str, Any] = {
            "context_proxy.tokens.sent": r.tokens_sent or 0,
            "context_proxy.tokens.sent_total": r.tokens_sent_total,
            "context_proxy.messages.sent": len(r.sent_seqs),
            "context_proxy.messages.left_out": r.messages_left_out,
            "context_proxy.tool_outputs.shortened": r.shortened,
            "context_proxy.tool_outputs.masked": r.masked,
            "context_proxy.summary.used": r.summary_id is not None,
            "context_proxy.read_rounds": r.read_rounds,
            "context_proxy.pairing_repairs": r.repairs,
            "context_proxy.upstream_calls": self.calls,
            "context_proxy.upstream_ms": round(r.upstream_s * 1000, 3),
        }
        if self.transcript_items is not None:
            attributes["context_proxy.messages.stored"] = self.transcript_items
        if r.token_budget is not None:
            attributes["context_proxy.tokens.budget"] = r.token_budget
        if r.summary_id is not None:
            attributes["context_proxy.summary.id"] = r.summary_id
        if r.llm_calls is not None:
            attributes["context_proxy.quota.used"] = r.llm_calls
        if r.llm_call_limit is not None:
            attributes["context_proxy.quota.limit"] = r.llm_call_limit
            attributes["context_proxy.quota.remaining"] = max(r.llm_call_limit - (r.llm_calls or 0), 0)
        if r.quota_warning is not None:
            attributes["context_proxy.quota.warning"] = r.quota_warning
        if r.client:
            attributes["context_proxy.client"] = r.client
        if r.usage is not None:  # the upstream reported usage: every call of the turn, summed
            attributes.update(_usage("gen_ai.usage", r.usage_total))
        if r.reply_id:
            attributes["gen_ai.response.id"] = r.reply_id
        self.span.set_attributes(attributes)
        if r.error is not None:
            status = r.error.get("status")
            self.span.set_attribute("context_proxy.error.source", r.error["source"])
            _fail(self.span, str(status) if status else f"{r.error['source']}_error", r.error["message"])
        elif exc is not None:
            _fail(self.span, type(exc).__name__, getattr(exc, "message", None) or str(exc) or None)


class OtelRoundTrace(RoundTrace):
    def __init__(self, telemetry: OtelTelemetry, number: int, calls: int) -> None:
        self.t, self.number, self.calls = telemetry, number, calls
        self.span: Span = trace.INVALID_SPAN
        self._token: object = None

    def __enter__(self) -> OtelRoundTrace:
        self.span = self.t.tracer.start_span(
            f"read_back round {self.number}",
            kind=SpanKind.INTERNAL,
            attributes={"context_proxy.read_round": self.number, "context_proxy.read_round.calls": self.calls},
        )
        self._token = otel_context.attach(trace.set_span_in_context(self.span))
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        otel_context.detach(self._token)  # type: ignore[arg-type]
        if exc is not None:
            _fail(self.span, type(exc).__name__, str(exc) or None)
        self.span.end()

    def not_made(self) -> None:
        self.span.set_attribute("context_proxy.read_round.made", False)

    def added(self, tokens: int) -> None:
        self.span.set_attributes({"context_proxy.read_round.made": True, "context_proxy.tokens.added": tokens})


class OtelSummarizerTrace(SummarizerTrace):
    def __init__(self, telemetry: OtelTelemetry, model: str, system: str, user: str) -> None:
        self.t, self.model, self.system, self.user = telemetry, model, system, user
        self.span: Span = trace.INVALID_SPAN

    def __enter__(self) -> OtelSummarizerTrace:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": OPERATION,
            **_served(self.t.providers.served("chat", self.model)),
            "gen_ai.request.model": self.model,
            "context_proxy.operation": "summarize",
        }
        if self.t.capture:
            attributes["gen_ai.input.messages"] = texts_json(self.t.limit, ("system", self.system), ("user", self.user))
        self.span = self.t.tracer.start_span(f"{OPERATION} {self.model}", kind=SpanKind.CLIENT, attributes=attributes)
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        if exc is not None:
            _fail(self.span, type(exc).__name__, str(exc) or None)
        self.span.end()

    def headers(self, headers: Mapping[str, str]) -> dict[str, str]:
        return self.t.with_span_context(headers, self.span)

    def done(self, text: str, tokens_in: int, tokens_out: int) -> None:
        self.span.set_attributes({"gen_ai.usage.input_tokens": tokens_in, "gen_ai.usage.output_tokens": tokens_out})
        if self.t.capture:
            self.span.set_attribute("gen_ai.output.messages", texts_json(self.t.limit, ("assistant", text)))
