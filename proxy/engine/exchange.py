"""One turn's exchange with the upstream: run the pipeline, call upstream (with read-back rounds),
relay the reply to the client, and tell the TurnWriter how the turn ended.

The client sees exactly the upstream's reply, except that calls of the proxy's own tools
(`read_tool_output`) are answered here and never reach it. Everything format-specific is asked
of the dialect: how the transcript becomes a request body, how a reply or stream is read, how the
proxy's calls are taken out of what the client sees.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from ..dialects.base import Dialect, ReplyRead, RoundEnd, StreamRelay
from ..eager import eager
from ..errors import ProxyError, UpstreamStreamBroken
from ..pipeline import Turn
from ..quota import QuotaExceeded
from ..request_limits import off_loop
from ..store import INCOMPLETE, LIVE
from ..tools import ProxyTool, offered
from ..tools.readback import split_calls
from ..transcript import Call, Item
from ..turns import TurnWriter
from ..upstream import Upstream, UpstreamReply, forwardable
from ..upstream.error_body import error_text
from .report import MAX_ERROR_CHARS
from .request import ClientSink, Outcome

if TYPE_CHECKING:
    from ..metrics import Metrics
    from ..telemetry import TurnTrace
    from .prompt import PromptBuilder

log = logging.getLogger("proxy.exchange")

# What a read-back answer's message adds around its text (role, call id, framing).
ANSWER_OVERHEAD = 20
# Kept spare by every answer: room for the model's next call and a short "no room" answer to it,
# so a read that fills the budget never leaves the next round unmade (the client then got an
# empty reply: the model's calls were all ours).
NEXT_ROUND_TOKENS = 200  # a call (~50 tokens with its ids) and a short answer (~50), twice


class Exchange:
    def __init__(
        self,
        turn: Turn,
        writer: TurnWriter,
        dialect: Dialect,
        body: dict,
        streaming: bool,
        prompt: PromptBuilder,
        upstream: Upstream,
        sink: ClientSink,
        metrics: Metrics,
        trace: TurnTrace,
        query: str = "",
        anchor: str | None = None,
    ) -> None:
        self.turn, self.writer, self.dialect, self.body, self.query = turn, writer, dialect, body, query
        self.anchor = anchor  # the earlier reply the client's request named: its reply says so
        # How the prompt is made (the whole pipeline, or the fast path wrapping it: see prompt.py);
        # `upstream` is tracked as the agent's by the engine's InFlight.
        self.streaming, self.prompt, self.upstream, self.sink, self.metrics = streaming, prompt, upstream, sink, metrics
        self.trace = trace  # the turn's trace: told of each upstream call and read-back round
        self.report = turn.report
        self.items: list[Item] = []  # what the pipeline made of the client's transcript
        self.internal: list[Item] = []  # read-back rounds answered so far, sent after `items`
        self.tools: dict[str, ProxyTool] = {}  # the proxy's own tools offered this turn, by name
        self.internal_tokens = 0  # what the read-back rounds so far add to the prompt
        self._call_started = 0.0
        self._calls_before = turn.ledger.call_number - 1  # the conversation's upstream calls before this turn

    @property
    def ours(self) -> frozenset[str]:
        """Names of the proxy's tools in this call: their calls are answered here, never relayed."""
        return frozenset(self.tools)

    @property
    def _rounds_left(self) -> bool:
        return self.report.read_rounds < self.turn.profile.truncation.max_read_rounds

    # -- the turn --------------------------------------------------------------------------------

    async def run(self) -> Outcome:
        """The turn's new items are written (the engine did, under the conversation's lock)."""
        try:
            await self._rewrite()
            reply = await self._call()
        except BaseException as exc:
            self.report.failed_by(exc)
            await self.writer.fail()
            raise
        if not 200 <= reply.status < 300:
            return await self._relay_refusal(reply)
        if reply.is_event_stream:
            return await self._relay_stream(reply)
        return await self._relay_body(reply)

    def _upstream_done(self) -> None:
        self.report.upstream_s += time.perf_counter() - self._call_started

    def _call_read(self, usage: dict | None) -> None:
        """An upstream call's reply was read: what it reported it spent."""
        self.report.add_usage(usage)
        self.trace.upstream_done(usage)

    async def _rewrite(self) -> None:
        prompt = self.prompt
        items = await prompt.build(self.turn, self.writer.plan, self.writer.pending, self.trace)
        self.writer.forwarded = self.turn.ledger.new_marks  # kept with the turn's end
        self.items = items
        self.writer.report = self.report  # from now on the turn's record is kept with it
        self.report.sent_seqs, self.report.shortened = prompt.sent(items)
        tools = offered(self.turn, prompt.offer_probe(items), lambda name: self.dialect.has_tool(self.body, name))
        self.tools = {tool.spec.name: tool for tool in tools}

    async def _call(self) -> UpstreamReply:
        """One upstream call: counted against the quota, refused past it when the quota says reject."""
        ledger = self.turn.ledger
        try:
            ledger.check()
        except QuotaExceeded:
            self.metrics.quota_rejections.inc()
            raise
        if ledger.on:
            # Counted now, in the store, in one step with the check: turns of the conversation
            # in flight at once (no lock is held across calls) never pass the quota together.
            counted = await self.turn.store.count_llm_call(self.turn.key, ledger.settings.max_llm_calls if ledger.rejects else None)
            if counted is None:
                self.metrics.quota_rejections.inc()
                raise ledger.refusal()
            calls = counted
        else:  # counted with the turn's end (one write, added to the conversation's count)
            self.writer.llm_calls += 1
            calls = self._calls_before + self.writer.llm_calls
        if ledger.on and calls > (ledger.settings.max_llm_calls or 0):
            self.report.quota_warning = f"LLM call quota exhausted ({ledger.settings.max_llm_calls} calls)"
        ledger.call_number = calls + 1
        self.report.llm_calls = calls
        self.report.llm_call_limit = ledger.settings.max_llm_calls
        self.report.tokens_sent_total += (self.report.tokens_sent or 0) + self.internal_tokens
        specs = [tool.spec for tool in self.tools.values()]
        if not self.internal:  # the first call (on the fast path, its bytes reuse the last turn's)
            body = self.prompt.upstream_body(self.dialect, self.body, self.items, specs)
        else:
            body = self.dialect.upstream_body(self.body, self.items + self.internal, specs)
        headers = self.trace.upstream_call(
            self.turn.headers, self.items, self.internal, (self.report.tokens_sent or 0) + self.internal_tokens
        )
        self._call_started = time.perf_counter()
        call = self.upstream.call(self.dialect.name, body, headers, self.query)
        reply = await (self._committing_meanwhile(call) if self.streaming else call)
        self.trace.upstream_replied(reply.status)
        return reply

    async def _committing_meanwhile(self, call: Coroutine[Any, Any, UpstreamReply]) -> UpstreamReply:
        """A streamed turn's new items must be durable before its reply's first byte, not before
        it is forwarded: the request goes first (the call's first step, now: aiohttp queues the
        body's write as a task of its own), the commit is queued behind it and runs while the
        upstream works (the embedded store commits in place: run first, it would hold the request
        back by its whole length). A call that fails leaves the items to the turn's end, which
        writes them as failed."""
        sending = eager(call)
        committing = asyncio.get_running_loop().call_soon(self.writer.durable)
        try:
            return await sending
        except BaseException:
            committing.cancel()
            raise

    async def _read_round(self, reply: ReplyRead, ours: list[Call]) -> UpstreamReply | None:
        """Answer our calls, keep the round in the trajectory, and ask the upstream again.

        The round counts against the turn's token budget (the window's limit): an answer that
        would take the prompt past it is cut to fit, or refused with a short note (the tool), and
        a round that does not fit at all is not made (None): the model's reply goes to the
        client without our calls, as past the round limit."""
        codec = self.dialect.codec
        with self.trace.read_round(len(ours)) as round_trace:
            calls_made = codec.items(reply.items, [None] * len(reply.items), [None] * len(reply.items))
            used = (self.report.tokens_sent or 0) + self.internal_tokens + sum(await self._count(calls_made))
            answers = []
            for call in ours:
                room = None if self.report.token_budget is None else (
                    self.report.token_budget - used - ANSWER_OVERHEAD - NEXT_ROUND_TOKENS
                )
                answer = codec.tool_result(call, await self.trace.tool(call, self.tools[call.name].answer(call, room)))
                used += sum(await self._count([answer]))
                answers.append(answer)
            if self.report.token_budget is not None and used > self.report.token_budget:
                log.info("read-back round over the token budget: not made", extra={"conversation": str(self.turn.key)})
                round_trace.not_made()
                return None
            round_trace.added(used - (self.report.tokens_sent or 0) - self.internal_tokens)
            self.internal_tokens = used - (self.report.tokens_sent or 0)
            round_items = [*calls_made, *answers]
            await self.writer.internal([item.raw for item in round_items], [codec.hash(item.raw) for item in round_items])
            self.internal += round_items
            self.report.read_rounds += 1
        return await self._call()

    async def _count(self, items: list[Item]) -> list[int]:
        return await self.turn.counter.count_many_async(
            [i.raw for i in items], self.turn.model, parts=self.dialect.codec.counted_parts
        )

    # -- relaying --------------------------------------------------------------------------------

    def _name_reply(self, reply_id: str | None) -> None:
        """The upstream's id for the reply goes to the turn's trace; where a later request may
        name the reply by it (Responses), to its record too, for the store to know its owner."""
        self.report.reply_id = reply_id
        self.report.response_id = reply_id if self.dialect.names_replies else None

    def _headers(self, reply: UpstreamReply) -> dict[str, str]:
        return {**forwardable(reply.headers), **self.report.headers()}

    async def _relay_refusal(self, reply: UpstreamReply) -> Outcome:
        """The upstream's own 4xx/5xx goes back as it came; the turn is marked failed."""
        data = b""
        try:
            data = await reply.read()
        finally:
            reply.close()
            self._upstream_done()
            self._call_read(None)
            self.report.failed(error_text(data, MAX_ERROR_CHARS), status=reply.status, source="upstream")
            await self.writer.fail()
        return Outcome(reply.status, self._headers(reply), data, self.report)

    async def _relay_body(self, reply: UpstreamReply) -> Outcome:
        try:
            while True:
                try:
                    data = await reply.read()
                finally:
                    reply.close()
                    self._upstream_done()
                read = await off_loop(len(data), self.dialect.read_reply, data)  # a huge reply: in a thread
                self._call_read(read.usage if read is not None else None)
                ours, theirs = split_calls(read.calls, self.ours) if read is not None else ([], [])
                if ours and not theirs and self._rounds_left:
                    next_reply = await self._read_round(read, ours)  # type: ignore[arg-type]
                    if next_reply is not None:
                        reply = next_reply
                        if not 200 <= reply.status < 300:
                            return await self._relay_refusal(reply)
                        continue
                if ours:  # mixed, or past the round limit: the client gets its own calls only
                    data, read = self.dialect.without_calls(data, read, theirs)  # type: ignore[arg-type]
                break
        except BaseException as exc:
            self.report.failed_by(exc)
            await self.writer.fail()
            raise
        self._name_reply(read.response_id if read is not None else None)
        if self.anchor is not None:
            data = self.dialect.echo_anchor(data, self.anchor)
        headers = self._headers(reply)
        self.trace.reply(read.items if read is not None else [])
        try:
            await self.writer.accept(read.items if read is not None else [])
        except ProxyError as exc:
            # The store failed after the upstream answered (a full disk, Redis down): the reply is
            # paid for, so it still goes to the client, saying it was not kept.
            self.metrics.store_failures.inc()
            log.error("reply not stored: %s", exc.message, extra={"conversation": str(self.turn.key)})
            headers["X-Context-Store-Error"] = exc.message
        return Outcome(reply.status, headers, data, self.report)

    async def _relay_stream(self, reply: UpstreamReply) -> Outcome:
        """Forward each chunk the moment it arrives, assembling the reply on the side (see the
        dialect's StreamRelay for what is held back while the proxy's calls are recognised)."""
        relay = self.dialect.relay(self.anchor)
        broken: ProxyError | None = None
        headers = self._headers(reply)
        await self.writer.durable()  # the turn's new items, before the reply's first byte
        if self.writer.lost is not None:
            # The upstream has answered (the reply is paid for): it still goes to the client,
            # saying it was not kept; so does the stream's end (the turn's end raises it again).
            self.metrics.store_failures.inc()
            log.error("turn not stored: %s", self.writer.lost.message, extra={"conversation": str(self.turn.key)})
            headers["X-Context-Store-Error"] = self.writer.lost.message
        try:
            await self.sink.open(reply.status, headers)
            while True:
                filtering = bool(self.tools)
                end = await self._stream_round(reply, relay, self.ours if filtering else frozenset())
                last = not filtering or not end.ours or end.theirs or not end.reply.complete or not self._rounds_left
                next_reply = None if last else await self._read_round(end.reply, end.ours)
                if next_reply is None:
                    tail = relay.release()
                    if tail:
                        await self.sink.write(tail)
                    break
                reply = next_reply
                if not 200 <= reply.status < 300:
                    reply.close()
                    self._upstream_done()
                    raise UpstreamStreamBroken(f"Upstream answered {reply.status} to a read_tool_output round")
        except (ConnectionResetError, asyncio.CancelledError):
            # The client went away (aiohttp cancels the handler when it notices). The upstream did
            # accept the turn, so the request stays; the reply is kept whole if it was, else incomplete.
            if not relay.finished:
                self.report.failed("The client went away before the reply was complete", status=None, source="client")
            self._name_reply(relay.response_id)  # a reply kept whole is still named by it
            await self.writer.accept(relay.seen(), LIVE if relay.finished else INCOMPLETE)
            if not relay.finished:
                log.info("client went away mid-stream", extra={"conversation": str(self.turn.key)})
            raise
        except ProxyError as exc:
            broken = exc
        if broken is None and relay.upstream_error is not None:
            broken = UpstreamStreamBroken(f"Upstream ended the stream with an error: {relay.upstream_error}")
        if broken is None and not relay.finished:
            broken = UpstreamStreamBroken("Upstream stream ended before the reply was complete")
        self._name_reply(relay.response_id)
        if broken is not None:  # one way for every broken stream: logged, counted, kept as incomplete
            self.report.stream_error = broken.message
            self.report.failed_by(broken)
            self.metrics.stream_errors.inc()
            log.warning("streamed reply broke off: %s", broken.message, extra={"conversation": str(self.turn.key)})
        seen = relay.seen()
        self.trace.reply(seen)
        try:
            if broken is not None:
                await self.writer.keep_partial(seen)
            else:
                await self.writer.accept(seen)
        except ProxyError as exc:
            # The store failed us (a full disk, Redis down): the client has the text, and an error
            # event instead of the stream's end tells it the reply was not kept.
            self.metrics.store_failures.inc()
            log.error("streamed reply not stored: %s", exc.message, extra={"conversation": str(self.turn.key)})
            broken = broken or exc
        await self._write_quietly(relay.error_event(broken) if broken is not None else relay.closing())
        try:
            await self.sink.close()
        except ConnectionResetError:
            pass
        return Outcome(reply.status, {}, None, self.report)

    async def _stream_round(self, reply: UpstreamReply, relay: StreamRelay, ours: frozenset[str]) -> RoundEnd:
        """Relay one upstream stream; returns the whole reply of this round (our calls included)."""
        relay.begin_round(ours)
        try:
            # A task of its own: a model's events come one read at a time, and each read wakes the
            # task that waits for it through every coroutine it is awaited by (the handler's
            # middlewares, the engine, the exchange: ~15 frames, a third of an event's cost here).
            # Cancelling this turn cancels the task, and waits for its end.
            await asyncio.get_running_loop().create_task(self._relay_chunks(reply, relay))
        finally:
            reply.close()
            self._upstream_done()
        end = relay.end_round()
        self._call_read(end.reply.usage)  # this round's: a relay may sum its rounds for the client
        return end

    async def _relay_chunks(self, reply: UpstreamReply, relay: StreamRelay) -> None:
        async for chunk in reply.chunks():
            out = relay.feed(chunk)
            if out:
                await self.sink.write(out)

    async def _write_quietly(self, data: bytes) -> None:
        if not data:
            return
        try:
            await self.sink.write(data)
        except ConnectionResetError:
            pass

