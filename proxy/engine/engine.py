"""The turn engine: from a request's bytes to an outcome, in every wire format.

One turn, in order: read the request (intake.py: its body parsed only where it extends the
previous one), find the conversation (named; its thread of the client's session; or derived
from the agent's system prompt and task), check only what is new in the request (the prefix it
shares with the last request is known good); then, under the conversation's lock, plan what is
new and what goes upstream and write the new items as pending; then, with no lock held (a retry,
a second request of the conversation or a subagent never waits on this turn's upstream), compact
first if asked to, run the pipeline, call upstream (answering the proxy's own tool calls in
read-back rounds), relay the reply; and store it and the turn's record, under the lock again
(turns.py says which of two turns in flight at once the live transcript follows). Background
compaction is scheduled after the reply, off the request's path. The whole turn runs under its trace (proxy/telemetry: nothing
when telemetry is off).

A turn's new items join the live transcript only once the upstream's reply has come back whole
(or the client walked away from a stream the upstream was answering); a refusal or failure marks
them failed, so the live transcript is as it was and the attempt stays in the trajectory.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from ..compaction import CompactionJob
from ..compaction.runner import CompactionRunner
from ..config import Settings
from ..dialects.base import Dialect
from ..eager import eager
from ..errors import InvalidRequest, ProxyError
from ..history import TurnPlan, is_fresh_start, plan_anchored, plan_appended, plan_full_history, plan_proxy_history
from ..identity import ConversationKey, derived_conversation_id, thread_conversation_id, thread_token
from ..marks import Marks
from ..metrics import Metrics
from ..pipeline import Pipeline, Turn
from ..prefix import BodyCache, PrefixCache
from ..quota import QuotaLedger
from ..refs import RefSigner
from ..request_limits import validated_hashes
from ..request_parts import RequestParts, with_request_parts
from ..store import LIVE, PENDING, RUNS_MARK, THREAD_MARK, Conversation, Store
from ..summarizer import Summarizer
from ..telemetry import NO_TELEMETRY, Telemetry, TurnTrace
from ..titles import task_of
from ..tokens import TokenCounter
from ..tools import offered, standing
from ..tools.history_search import SEARCH_TOOL_SPEC
from ..tools.readback import READ_TOOL_SPEC
from ..turns import TurnWriter, adoptable
from ..upstream.router import UpstreamRouter
from .exchange import Exchange
from .fastpath import FastPath
from .intake import read_request
from .prompt import PromptBuilder
from .report import TurnReport
from .request import ClientSink, DryRun, Outcome, ParsedRequest, TurnRequest, TurnWatcher

log = logging.getLogger("proxy.engine")

MAX_RUNS_SEARCHED = 8  # older runs a continuing request is matched against
TOOL_TOKEN_MEMO = 64  # (dialect, tokenizer) pairs whose recall tools' tokens are kept


async def whole(step: Awaitable[None]) -> None:
    """Run `step` to its end even if the caller is cancelled meanwhile; the cancellation is
    raised once it has ended."""
    task = asyncio.ensure_future(step)
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:
            cancelled = True
    task.result()
    if cancelled:
        raise asyncio.CancelledError


def _run_name(request: ParsedRequest, kind: tuple[str, str], basis: Any, name: Callable[[], str]) -> str:
    """A run's name hashed from its basis (`kind`: a tenant's derived id, or a session thread's
    token), kept with the body it came from (BodyEntry.derived) for the request that extends it:
    that one repeats the basis's very objects, so a comparison at C speed replaces dumping and
    hashing KBs (~3% of a later turn). Kept nowhere else: a basis that outlived its body would
    hold that body's strings scattered through the heap (1.2 MB and more at the bench's peak)."""
    parsed = request.parsed
    origin = parsed.origin if parsed is not None and parsed.reused else None
    held = origin.derived.get(kind) if origin is not None else None
    named = held[1] if held is not None and held[0] == basis else name()
    if parsed is not None and parsed.entry is not None:
        parsed.entry.derived[kind] = (basis, named)
    return named


def _shared(stored: list[str], sent: list[str]) -> int:
    """How many leading hashes two transcripts share."""
    n = 0
    for a, b in zip(stored, sent, strict=False):
        if a != b:
            break
        n += 1
    return n


class Engine:
    def __init__(
        self,
        settings: Settings,
        store: Store,
        pipeline: Pipeline,
        counter: TokenCounter,
        refs: RefSigner,
        summarizer: Summarizer,
        compaction: CompactionRunner,
        router: UpstreamRouter,
        prefixes: PrefixCache,
        metrics: Metrics,
        telemetry: Telemetry = NO_TELEMETRY,
        on_turn_end: Callable[[ConversationKey], Awaitable[None]] | None = None,
    ) -> None:
        self.settings, self.store, self.pipeline, self.counter, self.refs = settings, store, pipeline, counter, refs
        self.summarizer, self.compaction, self.router, self.prefixes, self.metrics = (
            summarizer, compaction, router, prefixes, metrics,
        )
        self.telemetry = telemetry
        # The agent's upstream calls in flight: the router hands out upstreams tracked by it, and
        # the summarizer's background calls yield to them.
        self.inflight = router.inflight
        self.on_turn_end = on_turn_end  # told of every turn that ran its exchange (the trajectory file shows it)
        # Requests that extend the previous one: parsed (bodies) and rewritten (fastpath) only where new.
        cache = int(settings.server.cache_mb * 2**20)
        self.fastpath = FastPath(metrics, enabled=settings.server.fast_path, max_bytes=cache // 4)
        self.bodies = BodyCache(cache, enabled=settings.server.fast_path, on_evict=self.fastpath.let_go)
        self.request_parts = RequestParts()  # what each conversation's last turn sent besides its transcript
        self._tool_tokens: dict[tuple[str, str], int] = {}  # (dialect, tokenizer) -> the recall tools' tokens
        # Turns past their reply, still writing (the client may already hold the whole response),
        # with their conversation: its next turn waits for those writes, never for an upstream.
        self._ending: dict[asyncio.Future[None], ConversationKey] = {}
        # Turns whose new items are written and whose upstream call may be under way, per conversation.
        self._flying: dict[ConversationKey, list[TurnWriter]] = {}
        # Session threads claimed as their session's main one by a turn not yet ended (its end
        # keeps the claim in the conversation's THREAD_MARK): family key -> thread token.
        self._claims: dict[ConversationKey, int] = {}

    async def _read(
        self, request: TurnRequest, watcher: TurnWatcher, dry_run: bool
    ) -> tuple[ParsedRequest, ConversationKey, TurnReport]:
        """`request` read, the conversation it belongs to, its (empty) report; `watcher` is told of
        it, then in proxy-history mode a request without a system prompt gets the stored one."""
        parsed = await read_request(request, self.settings, self.bodies)
        key = await self.conversation_key(parsed, dry_run=dry_run)
        dialect = parsed.dialect
        report = TurnReport(key, dialect.name, dialect.model(parsed.body), client=parsed.client, title=parsed.title)
        watcher.began(report)
        await with_request_parts(self.store, self.request_parts, parsed, key, report)
        return parsed, key, report

    async def conversation_key(self, request: ParsedRequest, *, dry_run: bool = False) -> ConversationKey:
        """The conversation a request belongs to, in this order: the one it names; the one that
        produced the reply it continues (Responses' previous_response_id); its thread of the
        client's session; else one derived from its run (system prompt and task). A `dry_run`'s
        request writes nothing: it claims no session's main thread and counts no new run."""
        tenant, dialect = request.tenant, request.dialect
        anchor = dialect.anchor(request.body)
        owner = await self.store.response_owner(tenant, anchor) if anchor is not None else None
        if owner is not None and request.conversation_id in (None, owner[0]):
            request.anchor_seq = owner[1]
            return ConversationKey(tenant, owner[0])
        if request.conversation_id is not None:
            return ConversationKey(tenant, request.conversation_id)
        if request.session_id is not None:
            return await self._thread_of(ConversationKey(tenant, request.session_id), request, claim=not dry_run)
        if request.history == "proxy":
            raise InvalidRequest(
                f"X-History: proxy needs a conversation id ({self.settings.conversation.id_header} header "
                "or a /c/<id>/v1 base URL)",
                code="conversation_id_required",
            )
        raws = request.transcript()
        basis = dialect.identity_basis(request.body, raws)
        derived = _run_name(request, ("derived id", tenant), basis, lambda: derived_conversation_id(tenant, basis))
        return await self._run_of(ConversationKey(tenant, derived), request, raws, dry_run)

    async def _thread_of(self, family: ConversationKey, request: ParsedRequest, claim: bool) -> ConversationKey:
        """Which thread of a client session a request belongs to. A session id names a family:
        each distinct thread in it (its system prompt, first user message and tool names: a
        Claude Code subagent, a side request replaying the main transcript under other tools) is
        a conversation of its own, found again on its later turns. The first thread the session
        shows is its main one and keeps the session id; every other is `<session>:<token>`."""
        raws = request.transcript()
        basis = request.dialect.thread_basis(request.body, raws)
        token = _run_name(request, ("thread token", family.tenant), basis, lambda: thread_token(basis))
        conversation = await self.store.get(family)
        main = conversation.marks.get(THREAD_MARK) if conversation is not None else None
        main = main if main is not None else self._claims.get(family)
        if main is None and claim:  # the session's first thread (or one kept before threads were)
            self._claims[family] = request.thread = int(token, 16)
            return family
        if main is None or main == int(token, 16):
            return family
        request.thread = int(token, 16)  # marked a thread too: it lists with its family
        return ConversationKey(family.tenant, thread_conversation_id(family.id, token))

    async def _run_of(self, base: ConversationKey, request: ParsedRequest, raws: list, dry_run: bool) -> ConversationKey:
        """Which run of an unmodified agent a request belongs to. Runs of one agent with one task
        share a derived id; a request that starts over (its system prompt and task, nothing more)
        while the latest run has moved on is a new run, `<id>.2`, `<id>.3`, ...: the old one stays
        intact. A request that continues an older run goes back to it."""
        first = await self.store.get(base)
        # Items the body repeats of the last request were checked with it (their hashes say so).
        parsed = request.parsed
        known = parsed.hashes if parsed is not None and parsed.entry is not None and parsed.entry.raws is raws else []
        if first is None or not all(isinstance(r, dict) for r in raws[len(known):]):
            return base  # a new agent (or a malformed request: validation answers it)
        codec = request.dialect.codec
        runs = first.marks.get(RUNS_MARK, 1)

        def run(n: int) -> ConversationKey:
            return base if n == 1 else ConversationKey(base.tenant, f"{base.id}.{n}")

        latest = first if runs == 1 else await self.store.get(run(runs))
        if is_fresh_start(codec, raws):  # by roles: a system prompt and a task
            hashes = [codec.hash(r) for r in raws]
            if latest is not None and len(latest.live) > len(raws) and latest.live_hashes[: len(raws)] == hashes:
                if not dry_run:  # a count (count_tokens) writes nothing
                    await self.store.set_marks(base, {RUNS_MARK: runs + 1})
                return run(runs + 1)
            return run(runs)
        if runs == 1:  # the usual later turn: one run, which a request that does not start over continues
            return base
        # The run it shares the most history with (the newest of equals): runs of a deterministic
        # agent can share their first turns, so the longest match decides. Items the body repeats
        # of the previous request have their hashes already (see prefix.py).
        hashes = known + [codec.hash(r) for r in raws[len(known):]]
        best, best_shared = runs, _shared(latest.live_hashes if latest else [], hashes)
        for n in range(runs - 1, max(runs - MAX_RUNS_SEARCHED, 0), -1):
            older = first if n == 1 else await self.store.get(run(n))
            shared = _shared(older.live_hashes if older else [], hashes)
            if shared > best_shared:
                best, best_shared = n, shared
        return run(best)

    async def run(self, request: TurnRequest, sink: ClientSink) -> Outcome:
        """Run one turn, from its request's bytes to its outcome (a streamed reply goes to `sink`).
        The sink is told of the turn's report once its conversation is known: the report is filled
        in as the turn goes, also when it fails, and observed in the metrics at its end."""
        parsed, key, report = await self._read(request, sink, dry_run=False)
        try:
            with self.telemetry.turn(parsed.headers, parsed.dialect, report) as trace:
                return await self._run(parsed, key, report, sink, trace)
        finally:  # failed turns are measured too
            report.observe(self.metrics)

    async def _run(
        self, request: ParsedRequest, key: ConversationKey, report: TurnReport, sink: ClientSink, trace: TurnTrace
    ) -> Outcome:
        dialect, codec, body, parsed = request.dialect, request.dialect.codec, request.body, request.parsed
        # Items identical to the last request's need no checking or hashing again (see prefix.py).
        by_bytes = request.from_cache
        raws = request.transcript()
        # A body parsed whole (an edit; Claude Code's breakpoint moving to the newest message) still
        # shares its leading items with the last request: the prefix cache finds them by value.
        extended = by_bytes and parsed.reused > 0  # type: ignore[union-attr]
        known = parsed.hashes if extended else self.prefixes.known_prefix(key, raws)  # type: ignore[union-attr]
        # Checking and hashing cost what is new: off the loop only if that is large.
        fresh = parsed.fresh if extended and parsed.fresh is not None else request.size  # type: ignore[union-attr]
        hashes = known + await validated_hashes(dialect.validate, codec.hash, raws, len(known), fresh)
        if by_bytes:
            self.bodies.remember(parsed.key, parsed, hashes, key)  # type: ignore[union-attr]
        if not extended:
            self.prefixes.remember(key, raws, hashes, size=request.size)
        else:  # the body cache holds this conversation: a snapshot would outlive its body there, in memory of its own
            self.prefixes.forget(key)
        model = dialect.model(body)
        await self.counter.ready(model)  # its tokenizer, on its first use, in a thread

        await self._ended(key)  # its previous turn's last writes (never an upstream call)
        async with self.store.lock(key):  # planning and the pending write only: see turns.py
            conversation = await self.store.get(key)
            if conversation is None or conversation.task is None:  # its first turns: what was it asked?
                report.task = task_of(codec, raws)
            plan = await self._plan(request, key, raws, hashes, conversation)
            flying = self._flying.setdefault(key, [])
            writer = TurnWriter(
                self.store, key, plan, codec, order=conversation.next_seq if conversation else 1,
                adopted=adoptable(flying, plan),
            )
            writer.parts = self.request_parts.to_keep(key, report.request_parts, conversation)  # new system prompt/tools
            if request.thread is not None:  # a session's thread: its turn keeps its mark (a main one's claim)
                report.marks[THREAD_MARK] = request.thread
            try:
                await writer.begin()
            except BaseException:
                self._land(key, None, request)
                raise
            for other in flying:
                other.contended = writer.contended = True
            flying.append(writer)
        try:
            return await self._exchange(request, key, report, sink, trace, writer, conversation, body)
        finally:
            self._land(key, writer, request)
            if by_bytes:  # a body parsed whole is proven now, while its client reads the reply (prefix.py)
                self.bodies.prove_soon(parsed.key, dialect.transcript_key)  # type: ignore[union-attr]

    def _land(self, key: ConversationKey, writer: TurnWriter | None, request: ParsedRequest) -> None:
        """The turn is over (or never got its items written): it is no longer in flight."""
        flying = self._flying.get(key)
        if flying is not None and writer in flying:
            flying.remove(writer)
        if not flying:
            self._flying.pop(key, None)
        if request.thread is not None and self._claims.get(key) == request.thread:
            del self._claims[key]  # kept by the conversation's mark from now on (or free again)

    async def _ended(self, key: ConversationKey) -> None:
        """Wait for the conversation's turns that are past their reply to finish writing."""
        ending = [future for future, of in self._ending.items() if of == key]
        if ending:
            await asyncio.wait(ending)

    async def _exchange(
        self, request: ParsedRequest, key: ConversationKey, report: TurnReport, sink: ClientSink, trace: TurnTrace,
        writer: TurnWriter, conversation: Conversation | None, body: dict,
    ) -> Outcome:
        """A turn whose new items are written: its prompt made, the upstream asked, the reply
        relayed and stored. No lock is held: another turn of the conversation may run beside it."""
        dialect, profile = request.dialect, request.profile
        try:
            turn, job = self._turn(request, key, conversation, report)
            if request.compaction == "force" or (request.compaction != "skip" and not profile.compaction.background):
                await self.compaction.run_now(job)  # before forwarding: this request already uses the new summary
            turn.summary = await self.compaction.current_summary(job)
            upstream = self.router.for_agent(turn.model)
            if request.anchor_seq is not None:
                body = dialect.detach_anchor(body)  # the history goes from our store: the upstream needs none
            # The previous turn's work reused where it can be (see fastpath.py), else the whole pipeline.
            prompt = self.fastpath.builder(
                request, key, turn, body, self.pipeline,
                contended=writer.contended, encode=upstream.sends_encoded,
            )
        except BaseException as exc:
            report.failed_by(exc)
            await writer.fail()
            raise
        exchange = Exchange(
            turn, writer, dialect, body, dialect.streaming(body), prompt, upstream, sink, self.metrics, trace,
            query=request.query,
            anchor=dialect.anchor(request.body) if request.anchor_seq is not None else None,
        )
        try:
            return await exchange.run()
        finally:
            # Whole even when the client hangs up meanwhile (aiohttp then cancels this handler:
            # the openai client closes a stream at its [DONE], while we still wait for the
            # body's end): a cut's mark lost would make the next turn's window start elsewhere.
            compact = request.compaction is None and profile.compaction.background
            ending = eager(self._end_turn(key, turn, report, writer, prompt, job if compact else None))
            if not ending.done():  # it waits for a write: the conversation's next turn waits for it
                self._ending[ending] = key
                ending.add_done_callback(self._ending.pop)
            await whole(ending)

    async def _end_turn(
        self, key: ConversationKey, turn: Turn, report: TurnReport, writer: TurnWriter, prompt: PromptBuilder,
        compaction: CompactionJob | None,
    ) -> None:
        """After the exchange: every write of the turn landed (the next turn of this conversation
        must see them), the cuts it moved kept, what the next turn reuses, and the background
        `compaction` scheduled. A turn ended well when its items and its whole reply joined the
        live transcript, whether or not its client stayed to the end of the response. Then
        `on_turn_end` is told, whatever happened."""
        try:
            await writer.settled()
            if report.marks and writer.ended is None:  # a cut moved, and no end of the turn kept it
                try:
                    await self.store.set_marks(key, report.marks)
                except ProxyError as exc:  # the store failed the turn's end too: its reply said so
                    log.warning("marks not kept: %s", exc.message, extra={"conversation": str(key)})
            ended_well = writer.ended == (LIVE, LIVE) and report.stream_error is None
            # Another turn ran beside it: the next one can't build on this one's prompt.
            prompt.done(turn, report, ended_well and not writer.contended)
            if compaction is not None and ended_well:
                self.compaction.schedule(compaction)  # after the reply: never on the request's critical path
        finally:
            if self.on_turn_end is not None:
                await self.on_turn_end(key)

    async def idle(self) -> None:
        """Wait for every turn still ending and every compaction it scheduled (shutdown, and
        tests: a client holds its reply before the turn's writes, its compaction's scheduling and
        `on_turn_end`)."""
        while self._ending or self.compaction.busy:
            await asyncio.gather(*list(self._ending), return_exceptions=True)
            await self.compaction.idle()
        await self.bodies.idle()

    async def dry_run(self, turn_request: TurnRequest, watcher: TurnWatcher) -> DryRun:
        """The body a turn of `turn_request` would send upstream first, worked out without writing
        anything, calling no LLM and taking no lock (Anthropic's count_tokens: the client sizes
        its own compaction from the prompt the proxy really sends). New items get the seqs they
        would be stored under, so truncation markers come out as long as they will be. Its
        request claims no session thread and writes no runs mark either; `watcher` is told of
        its report as run's sink is."""
        request, key, report = await self._read(turn_request, watcher, dry_run=True)
        return DryRun(await self._dry_run(request, key, report), request.headers, report)

    async def _dry_run(self, request: ParsedRequest, key: ConversationKey, report: TurnReport) -> dict:
        dialect, codec, body = request.dialect, request.dialect.codec, request.body
        raws = dialect.transcript(body)
        known = self.prefixes.known_prefix(key, raws)
        hashes = known + await validated_hashes(dialect.validate, codec.hash, raws, len(known), request.size)
        conversation = await self.store.get(key)
        plan = await self._plan(request, key, raws, hashes, conversation)
        if conversation is not None and conversation.live and request.history == "full" and not plan.known_seqs:
            # Nothing of the conversation in it (Claude Code counts a tool result or its tools on
            # their own, under its session id): counted as a conversation of its own would send it.
            conversation = None
            plan = await self._plan(request, key, raws, hashes, None)
        turn, job = self._turn(request, key, conversation, report, dry_run=True)
        turn.summary = await self.compaction.current_summary(job) if conversation is not None else None
        first_seq = conversation.next_seq if conversation else 1
        items = await self.pipeline(turn, plan.items(codec, range(first_seq, first_seq + len(plan.new))))
        if request.anchor_seq is not None:
            body = dialect.detach_anchor(body)
        tools = offered(turn, items, lambda name: dialect.has_tool(body, name))
        return dialect.upstream_body(body, items, [tool.spec for tool in tools])

    def _turn(
        self, request: ParsedRequest, key: ConversationKey, conversation: Conversation | None, report: TurnReport,
        dry_run: bool = False,
    ) -> tuple[Turn, CompactionJob]:
        """The stages' view of this turn, and the compaction job it may start."""
        dialect, body, profile = request.dialect, request.body, request.profile
        model = dialect.model(body)
        ledger = QuotaLedger(
            profile.quota,
            call_number=(conversation.llm_calls if conversation else 0) + 1,
            first_forwarded=conversation.first_forwarded if conversation else {},  # read only: no copy of every seq's
        )
        # The proxy's tools offered on every turn are sent with every call, like the client's own.
        standing_tools = [
            orjson.dumps(dialect.tool_definition(spec)).decode()
            for spec in standing(profile) if not dialect.has_tool(body, spec.name)
        ]
        turn = Turn(
            key, dialect.codec, model, self.store, profile, self.counter, self.refs, ledger, self.summarizer,
            request.headers, report,
            reply_reserve=dialect.reply_reserve(body),
            fixed_tokens=self._fixed_tokens(request, model, standing_tools),
            proxy_tool_tokens=self._proxy_tool_tokens(dialect, model),
            body=body,
            marks=Marks(conversation.marks if conversation else None),
            conversation=conversation,
            knowledge_namespace=request.knowledge_namespace,
            dry_run=dry_run,
        )
        job = CompactionJob(
            key, profile, self.summarizer.model_for(model), request.headers, ledger.figures(None), dialect.codec,
            force=request.compaction == "force", dialect=dialect.name,
        )
        return turn, job

    def _fixed_tokens(self, request: ParsedRequest, model: str, standing_tools: list[str]) -> int:
        """Tokens of what every call sends besides the transcript (the body's tools and
        instructions, the standing tools), counted once for a run of bodies that extend each
        other: their bytes outside the transcript are the same (Claude Code's tools, ~60 KB, were
        serialized and hashed again every turn)."""
        parsed = request.parsed
        key = ("fixed_tokens", model, tuple(standing_tools))
        origin = parsed.origin if parsed is not None and parsed.reused else None
        tokens = origin.derived.get(key) if origin is not None else None
        if tokens is None:
            tokens = self.counter.count_texts(request.dialect.fixed_parts(request.body) + standing_tools, model)
        if parsed is not None and parsed.entry is not None:
            parsed.entry.derived[key] = tokens
        return tokens

    def _proxy_tool_tokens(self, dialect: Dialect, model: str) -> int:
        """Tokens of the recall tools' schemas as `dialect` declares them, for `model`'s tokenizer:
        the same on every turn, so counted once (bounded: a tokenizer per model litellm counts)."""
        key = (dialect.name, self.counter.tokenizer_name(model))
        tokens = self._tool_tokens.get(key)
        if tokens is None:
            if len(self._tool_tokens) >= TOOL_TOKEN_MEMO:
                self._tool_tokens.clear()
            specs = (READ_TOOL_SPEC, SEARCH_TOOL_SPEC)
            tokens = self._tool_tokens[key] = self.counter.count_texts(
                [orjson.dumps(dialect.tool_definition(spec)).decode() for spec in specs], model
            )
        return tokens

    async def _plan(
        self, request: ParsedRequest, key: ConversationKey, raws: list, hashes: list[str], conversation: Conversation | None
    ) -> TurnPlan:
        if request.anchor_seq is not None and conversation is not None:  # continues a stored reply
            live = await self.store.messages(key, live_only=True)
            return plan_anchored(raws, hashes, live, request.anchor_seq)
        if request.dialect.anchor(request.body) is not None:
            # An anchor the proxy never stored (a reply from before it): the upstream holds that
            # history, so the request goes as it came and its items are simply added.
            return plan_appended(raws, hashes)
        if request.history == "full":
            return plan_full_history(raws, hashes, conversation)
        live = await self.store.messages(key, live_only=True) if conversation else []
        # Nothing live yet, but a first turn in flight (on any replica: planning holds the lock)
        # has written its system prompt as pending: this one need not write it again.
        started = not live and conversation is not None and any(
            m.status == PENDING for m in await self.store.messages(key, live_only=False)
        )
        return plan_proxy_history(request.dialect.codec, raws, hashes, live, first=not live and not started)
