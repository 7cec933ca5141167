"""One turn's exchange with the upstream: run the pipeline, call upstream (with read-back rounds),
relay the reply to the client unchanged, and tell the TurnWriter how the turn ended.

The client sees exactly the upstream's reply, except that calls of our own `read_tool_output`
are answered here and never reach it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import orjson
from aiohttp import web

from ..config import Profile
from ..errors import ProxyError, UpstreamStreamBroken
from ..messages import Message, reply_message
from ..pipeline import Pipeline, Turn
from ..quota import QuotaExceeded
from ..readback import CallFilter, ReadBack, client_has_read_tool, split_calls, with_read_tool
from ..state import LOG_FIELDS, METRICS
from ..store import INCOMPLETE, LIVE
from ..turns import TurnWriter
from ..upstream import Upstream, UpstreamReply, forwardable
from ..upstream.sse import ReplyAssembler, SSEParser

log = logging.getLogger("proxy.exchange")


class Exchange:
    def __init__(
        self,
        request: web.Request,
        body: dict[str, Any],
        writer: TurnWriter,
        turn: Turn,
        pipeline: Pipeline,
        upstream: Upstream,
    ) -> None:
        self.request, self.body, self.writer, self.turn = request, body, writer, turn
        self.pipeline, self.upstream = pipeline, upstream
        self.profile: Profile = turn.profile
        self.messages: list[Message] = []  # what the pipeline made of the client's transcript
        self.internal: list[Message] = []  # read-back rounds answered so far, sent after `messages`
        self.offer_read = False
        self.rounds = 0
        self.started = time.perf_counter()
        self.upstream_s = 0.0  # time spent waiting on the upstream, all rounds together
        self._call_started = 0.0
        self.usage: dict[str, Any] | None = None
        # The stream's final `data: [DONE]`, held until the reply is stored: a client must not take
        # a reply for done that the store never got.
        self._done_held: bytes | None = None

    # -- the turn --------------------------------------------------------------------------------

    async def run(self) -> web.StreamResponse:
        try:
            return await self._run()
        finally:
            self._observe()

    async def _run(self) -> web.StreamResponse:
        await self.writer.begin()
        try:
            await self._rewrite()
            reply = await self._call()
        except BaseException:
            await self.writer.fail()
            raise
        if not 200 <= reply.status < 300:
            return await self._relay_refusal(reply)
        if reply.is_event_stream:
            return await self._relay_stream(reply)
        return await self._relay_body(reply)

    def _upstream_done(self) -> None:
        self.upstream_s += time.perf_counter() - self._call_started

    def _observe(self) -> None:
        """Metrics and the request log line: what this turn cost and what the pipeline did."""
        metrics, notes = self.request.app[METRICS], self.turn.notes
        added = time.perf_counter() - self.started - self.upstream_s
        metrics.added_latency.observe(added)
        metrics.upstream_latency.observe(self.upstream_s)
        metrics.saw(self.turn.key)
        tokens_sent = notes.get("tokens_sent") or 0
        metrics.tokens_sent.inc(tokens_sent)
        for stage in ("truncation", "compaction"):
            saved = notes.get(f"chars_saved_{stage}", 0)
            if saved > 0:
                metrics.tokens_saved.labels(stage).inc(saved / 4)
        metrics.read_rounds.inc(self.rounds)
        metrics.repairs.inc(notes.get("repairs", 0))
        for kind in ("prompt_tokens", "completion_tokens"):
            if self.usage and isinstance(self.usage.get(kind), int):
                metrics.usage_tokens.labels(kind).inc(self.usage[kind])
        self.request[LOG_FIELDS].update(
            tokens_sent=tokens_sent,
            left_out=notes.get("messages_left_out", 0),
            truncated=len(notes.get("truncated", {})),
            read_rounds=self.rounds,
            llm_calls=self.turn.ledger.call_number - 1,
            upstream_ms=round(self.upstream_s * 1000, 3),
            added_ms=round(added * 1000, 3),
        )

    async def _rewrite(self) -> None:
        items = await self.pipeline(self.turn, self.writer.plan.items(self.writer.pending))
        await self.turn.store.mark_forwarded(self.turn.key, self.turn.ledger.new_marks)
        self.messages = [item.message for item in items]
        self.offer_read = bool(self.turn.notes.get("truncated")) and not client_has_read_tool(self.body)
        notes = self.turn.notes
        self.writer.record = {  # the turn's window, for the trajectory and the replay page
            "created_at": time.time(),
            "model": self.turn.model,
            "sent_seqs": [item.seq for item in items if item.seq is not None],
            "tokens_sent": notes.get("tokens_sent"),
            "messages_left_out": notes.get("messages_left_out", 0),
            "truncated": len(notes.get("truncated", {})),
            "summary_id": self.turn.summary.id if self.turn.summary is not None else None,
            "repairs": notes.get("repairs", 0),
        }

    @property
    def _reading(self) -> bool:
        """Whether this call offers read_tool_output (never past the round limit: then the model must answer)."""
        return self.offer_read and self.rounds < self.profile.truncation.max_read_rounds

    async def _call(self) -> UpstreamReply:
        """One upstream call: counted against the quota, refused past it when the quota says reject."""
        ledger = self.turn.ledger
        try:
            ledger.check()
        except QuotaExceeded:
            self.request.app[METRICS].quota_rejections.inc()
            raise
        if ledger.exhausted:
            self.turn.notes["quota_warning"] = f"LLM call quota exhausted ({ledger.settings.max_llm_calls} calls)"
        ledger.call_number = await self.turn.store.count_llm_call(self.turn.key) + 1
        if self.writer.record is not None:
            self.writer.record |= {
                "llm_calls": ledger.call_number - 1,
                "llm_call_limit": ledger.settings.max_llm_calls,
                "read_rounds": self.rounds,
            }
        body = {**self.body, "messages": self.messages + self.internal}
        if self._reading:
            body = with_read_tool(body)
        self._call_started = time.perf_counter()
        return await self.upstream.chat(body, self.turn.headers)

    async def _read_round(self, message: Message, ours: list[dict[str, Any]]) -> UpstreamReply:
        """Answer our calls, keep the round in the trajectory, and ask the upstream again."""
        reader = ReadBack(self.turn.store, self.turn.refs, self.turn.key, self.profile.truncation)
        answers = [await reader.answer(call) for call in ours]
        round_messages = [reply_message({**message, "tool_calls": ours}), *answers]
        await self.writer.internal(round_messages)
        self.internal += round_messages
        self.rounds += 1
        self.turn.notes["read_rounds"] = self.rounds
        return await self._call()

    # -- relaying --------------------------------------------------------------------------------

    def _headers(self, reply: UpstreamReply) -> dict[str, str]:
        headers = dict(forwardable(reply.headers))
        notes, ledger = self.turn.notes, self.turn.ledger
        headers["X-Conversation-ID"] = self.turn.key.id
        if "tokens_sent" in notes:
            headers["X-Context-Tokens-Sent"] = str(notes["tokens_sent"])
        headers["X-Context-Messages-Left-Out"] = str(notes.get("messages_left_out", 0))
        limit = ledger.settings.max_llm_calls
        if limit is not None:  # call_number is the next call's number by now
            headers["X-LLM-Calls-Remaining"] = str(max(limit - (ledger.call_number - 1), 0))
        if "quota_warning" in notes:
            headers["X-Quota-Warning"] = notes["quota_warning"]
        return headers

    async def _relay_refusal(self, reply: UpstreamReply) -> web.Response:
        """The upstream's own 4xx/5xx goes back as it came; the turn is marked failed."""
        try:
            data = await reply.read()
        finally:
            reply.close()
            self._upstream_done()
            await self.writer.fail()
        return web.Response(body=data, status=reply.status, headers=self._headers(reply))

    async def _relay_body(self, reply: UpstreamReply) -> web.StreamResponse:
        try:
            while True:
                try:
                    data = await reply.read()
                finally:
                    reply.close()
                    self._upstream_done()
                parsed, message = _first_choice(data)
                if parsed is not None and isinstance(parsed.get("usage"), dict):
                    self.usage = parsed["usage"]
                ours, theirs = split_calls(message) if (message and self._reading) else ([], [])
                if ours and not theirs:
                    reply = await self._read_round(message, ours)
                    if not 200 <= reply.status < 300:
                        return await self._relay_refusal(reply)
                    continue
                if ours:  # mixed: the client gets its own calls only
                    data, message = _without_our_calls(parsed, theirs)
                break
        except BaseException:
            await self.writer.fail()
            raise
        await self.writer.accept(message)
        return web.Response(body=data, status=reply.status, headers=self._headers(reply))

    async def _relay_stream(self, reply: UpstreamReply) -> web.StreamResponse:
        """Forward each chunk the moment it arrives, assembling the reply on the side.

        While read_tool_output is offered, chunks go through a CallFilter (our calls taken out);
        otherwise the upstream's bytes are written as they come.
        """
        response = web.StreamResponse(status=reply.status, headers=self._headers(reply))
        seen = ReplyAssembler()  # what the client saw, across read-back rounds
        broken: ProxyError | None = None
        try:
            await response.prepare(self.request)
            while True:
                filter_ = CallFilter() if self._reading else None
                round_reply = await self._stream_round(reply, response, seen, filter_)
                if filter_ is None or not filter_.saw_ours or filter_.saw_client_calls or not round_reply.complete:
                    if filter_ is not None and filter_.finish_held is not None:  # our call past the round limit
                        await response.write(b"data: " + filter_.finish_held + b"\n\n")
                    if round_reply.done and filter_ is not None:
                        self._done_held = b"data: [DONE]\n\n"
                    break
                ours, _ = split_calls(round_reply.message())
                reply = await self._read_round(round_reply.message(), ours)
                if not 200 <= reply.status < 300:
                    reply.close()
                    self._upstream_done()
                    raise UpstreamStreamBroken(f"Upstream answered {reply.status} to a read_tool_output round")
        except (ConnectionResetError, asyncio.CancelledError):
            # The client went away (aiohttp cancels the handler when it notices). The upstream did
            # accept the turn, so the request stays; the reply is kept whole if it was, else incomplete.
            finished = seen.complete or seen.done
            await self.writer.accept(None if seen.empty else seen.message(), LIVE if finished else INCOMPLETE)
            if not finished:
                log.info("client went away mid-stream", extra={"conversation": str(self.turn.key)})
            raise
        except ProxyError as exc:
            broken = exc
        if broken is None and not (seen.complete or seen.done):
            broken = UpstreamStreamBroken("Upstream stream ended before the reply was complete")
        try:
            if broken is not None:
                await self.writer.keep_partial(None if seen.empty else seen.message())
            else:
                await self.writer.accept(seen.message())
        except ProxyError as exc:  # the store failed us (e.g. Redis down): say so in the stream
            log.warning("streamed reply not stored: %s", exc.message, extra={"conversation": str(self.turn.key)})
            broken = broken or exc
        if broken is not None:
            await _write_quietly(response, b"data: " + json.dumps(broken.body()).encode() + b"\n\n")
        elif self._done_held is not None:
            await _write_quietly(response, self._done_held)
        await _write_quietly(response, None)
        return response

    async def _stream_round(
        self, reply: UpstreamReply, response: web.StreamResponse, seen: ReplyAssembler, filter_: CallFilter | None
    ) -> ReplyAssembler:
        """Relay one upstream stream; returns the whole reply of this round (our calls included)."""
        parser = SSEParser()
        this_round = seen if filter_ is None else ReplyAssembler()
        try:
            async for chunk in reply.chunks():
                if filter_ is None:  # the fast path: bytes out as they came in (but [DONE], held)
                    for payload in parser.feed(chunk):
                        seen.feed(payload)
                    if seen.done and self._done_held is None and (cut := chunk.find(b"data: [DONE]")) >= 0:
                        chunk, self._done_held = chunk[:cut], chunk[cut:]
                    if chunk:
                        await response.write(chunk)
                    continue
                out = []
                for payload in parser.feed(chunk):
                    parsed = this_round.feed(payload)
                    if payload == b"[DONE]":
                        continue  # held until we know no other round follows
                    kept = filter_.feed(payload, parsed)
                    if kept is not None:
                        seen.feed(kept)
                        out.append(b"data: " + kept + b"\n\n")
                if out:
                    await response.write(b"".join(out))
        finally:
            reply.close()
            self._upstream_done()
            self.usage = this_round.usage or self.usage
        return this_round


def _first_choice(data: bytes) -> tuple[dict[str, Any] | None, Message | None]:
    try:
        parsed = orjson.loads(data)
        return parsed, reply_message(parsed["choices"][0]["message"])
    except (ValueError, KeyError, IndexError, TypeError):
        log.warning("upstream 2xx reply without choices[0].message; nothing to persist")
        return None, None


def _without_our_calls(parsed: dict[str, Any] | None, theirs: list[dict[str, Any]]) -> tuple[bytes, Message]:
    assert parsed is not None
    raw_message = parsed["choices"][0]["message"]
    raw_message["tool_calls"] = [c for c in raw_message["tool_calls"] if c.get("id") in {t["id"] for t in theirs}]
    return json.dumps(parsed, ensure_ascii=False).encode(), reply_message(raw_message)


async def _write_quietly(response: web.StreamResponse, data: bytes | None) -> None:
    try:
        if data is None:
            await response.write_eof()
        else:
            await response.write(data)
    except ConnectionResetError:
        pass
