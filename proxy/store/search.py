"""History search: a lexical (BM25) index over a conversation's stored messages, in passages of a
few lines, behind the store interface (`Store.search`).

One design for both backends: an in-process index per conversation, built from the store's own
log on a conversation's first search and kept up with its appends by reading only the messages
after the last one indexed (`messages(after=...)`), so each message is tokenized once per
process. Why not a second durable index (SQLite FTS5 beside diskcache's database): the log is the
truth on both backends, so an index derived from it can never disagree with it — not after an
import that replaces a conversation, a delete, or an append by another Redis replica (each
replica catches up from the shared log) — and both backends pass the same contract tests by
construction. What it costs: a conversation's first search in a process reads its log once
(off the event loop when large). The indexes held are bounded (least recently searched dropped).

What is searched: the live transcript — live messages, those a compaction covers included (they
stay live) — never superseded, failed or internal ones (the status is read at search time from
the conversation record, so a branch superseded after it was indexed drops out at once), never
another conversation's. Terms: lower-case words, plus identifiers matched whole (a path, URL,
ticket id, dotted or dashed name is one term besides its words, so a query naming it exactly
ranks the passage that has it first, and `PAY-1234` never matches `PAY-12345`).
"""

from __future__ import annotations

import asyncio
import math
import re
import weakref
from array import array
from collections import Counter, OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ..identity import ConversationKey
from ..transcript import Raw
from .base import LIVE, SearchHit, StoredMessage

if TYPE_CHECKING:
    from .base import Store

DEFAULT_HITS, MAX_HITS = 5, 20
PASSAGE_LINES = 4  # lines per passage: a log line or a statement with its neighbours
PASSAGE_CHARS = 600  # ... and at most this many characters (a long line is split)
CONTEXT_CHARS = 240  # shown around a passage on each side (a line or so)
MAX_QUERY_TERMS = 32
MAX_HELD_POSTINGS = 4_000_000  # postings held over every conversation's index (~8 bytes each)
READ_BATCH = 500  # messages read from the store at a time while catching up
THREAD_CHARS = 200_000  # catching up on more text than this runs in a thread
MAX_SCANNED = 1000  # postings of one term scored at most (its newest)
COMMON_FROM = 200  # passages from which a term in more than half of them is skipped
K1, B = 1.2, 0.75  # BM25's usual constants

_WORD = re.compile(r"[a-z0-9]+")
# Identifiers kept whole besides their words: a whitespace-delimited token holding a separator
# (a path, URL, e-mail address, ticket id, dotted or dashed name: src/app.py, PAY-1234, v2.4.1),
# found in one scan; timestamps and clock times are not names.
_JOINED = re.compile(r"[^\s\"'`()\[\]{}<>,;]*[./:_@-][^\s\"'`()\[\]{}<>,;]*")
_TIMELIKE = re.compile(r"^[\d:.tz+-]+$")
_TRAILING = ".,;:!?'\")]}>-_/"
_SKIPPED_KEYS = frozenset({"signature", "encrypted_content", "thoughtSignature", "thinking", "data", "image_url"})
_TEXT_KEYS = ("content", "text", "output", "arguments", "input", "args", "parts", "response", "functionCall",
              "functionResponse", "tool_calls", "function", "refusal")


def terms(text: str) -> list[str]:
    """The terms of `text`: its lower-case words, then its identifiers whole."""
    lower = text.lower()
    words = _WORD.findall(lower)
    for token in _JOINED.findall(lower):
        value = token.strip(_TRAILING)
        if len(value) > 2 and not value.isalnum() and not _TIMELIKE.match(value) and _WORD.search(value):
            words.append(value)
    return words


def message_role(message: Raw) -> str:
    """user, assistant or tool (a tool's output), or what else the item is (system, reasoning),
    read off any managed wire format: chat, Responses items, Anthropic and Gemini messages."""
    kind = message.get("type")
    if kind == "function_call_output" or kind == "custom_tool_call_output":
        return "tool"
    if kind in ("function_call", "custom_tool_call"):
        return "assistant"
    if kind == "reasoning":
        return "reasoning"
    role = message.get("role")
    content = message.get("content") if "content" in message else message.get("parts")
    if isinstance(content, list) and content and all(
        isinstance(part, dict) and (part.get("type") == "tool_result" or "functionResponse" in part) for part in content
    ):
        return "tool"
    if role == "model":
        return "assistant"
    return role if isinstance(role, str) else "other"


def message_text(message: Raw) -> str:
    """The searchable text of a stored message: its content's text (a chat message's content, a
    Responses item's text or output, Anthropic blocks, Gemini parts) and its calls' arguments,
    never signatures, encrypted reasoning or images."""
    content = message.get("content")
    if isinstance(content, str) and not message.get("tool_calls"):
        return content  # the common case (a chat message, a tool's output): as the codec reads it
    out: list[str] = []
    _collect(message, out, 0)
    return "\n".join(out)


def _collect(node: Any, out: list[str], depth: int) -> None:
    if depth > 12:
        return
    if isinstance(node, str):
        out.append(node)
    elif isinstance(node, list):
        for child in node:
            _collect(child, out, depth + 1)
    elif isinstance(node, dict):
        for name in _TEXT_KEYS:
            if name in node and name not in _SKIPPED_KEYS:
                value = node[name]
                if isinstance(value, dict) and name in ("input", "args", "response"):
                    _collect(list(_strings(value)), out, depth + 1)
                else:
                    _collect(value, out, depth + 1)


def _strings(value: Any) -> Iterable[str]:
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            stack.extend(reversed(list(node.values())))
        elif isinstance(node, list):
            stack.extend(reversed(node))


def passages(text: str) -> list[tuple[int, int]]:
    """[start, end) character spans of `text` in passages of PASSAGE_LINES lines, each at most
    PASSAGE_CHARS long. A longer line (minified JSON, a long sentence run) is cut into windows
    that overlap by half, so that whatever it says in half a window is whole in one of them."""
    spans: list[tuple[int, int]] = []
    start = at = 0
    lines = 0
    n = len(text)
    while at < n:
        newline = text.find("\n", at)
        end = n if newline < 0 else newline + 1
        while end - start > PASSAGE_CHARS:  # a long line (or lines): cut where a space falls, if near
            cut = text.rfind(" ", start + PASSAGE_CHARS // 2, start + PASSAGE_CHARS)
            cut = cut + 1 if cut > 0 else start + PASSAGE_CHARS
            spans.append((start, cut))
            half = text.find(" ", start + (cut - start) // 2, cut)
            start, lines = (half + 1 if half >= 0 else start + (cut - start) // 2), 0
        lines += 1
        at = end
        if lines >= PASSAGE_LINES or at >= n:
            if end > start:
                spans.append((start, end))
            start, lines = end, 0
    return spans


class _Index:
    """One conversation's passages and postings. Not thread-safe: the caller's lock serializes."""

    def __init__(self, created_at: float) -> None:
        self.created_at = created_at  # of the conversation it indexes: another one (deleted, made again) is not it
        self.upto = 0  # every message with a seq up to this one is indexed
        self.seqs = array("I")  # passage -> seq
        self.starts = array("I")  # passage -> its start in the message's text
        self.ends = array("I")  # ... and its end (passages of a long line overlap)
        self.sizes = array("I")  # passage -> how many terms it has
        self.total_terms = 0
        self.postings: dict[str, array] = {}  # term -> [passage, term frequency, passage, tf, ...]
        self.held = 0  # postings entries

    def add(self, stored: list[StoredMessage]) -> None:
        for message in stored:
            self.upto = max(self.upto, message.seq)
            if message_role(message.message) not in ("user", "assistant", "tool"):
                continue
            text = message_text(message.message)
            for start, end in passages(text):
                found = terms(text[start:end])
                if not found:
                    continue
                pid = len(self.seqs)
                self.seqs.append(message.seq)
                self.starts.append(start)
                self.ends.append(end)
                self.sizes.append(len(found))
                self.total_terms += len(found)
                counts = Counter(found)
                postings = self.postings
                for term, tf in counts.items():
                    posting = postings.get(term)
                    if posting is None:
                        posting = postings[term] = array("I")
                    posting.append(pid)
                    posting.append(tf)
                self.held += len(counts)

    def rank(self, query: list[str], live: set[int], limit: int) -> list[tuple[float, int]]:
        """(score, passage) of the best passages of live messages, best first, one per message."""
        n = len(self.seqs)
        if n == 0:
            return []
        avg = self.total_terms / n
        wanted = sorted({t for t in query if t in self.postings}, key=lambda t: len(self.postings[t]))[:MAX_QUERY_TERMS]
        # A term in most passages says next to nothing and costs the most: skipped, unless it is all there is.
        rare = [t for t in wanted if n < COMMON_FROM or len(self.postings[t]) // 2 <= n // 2] or wanted[:1]
        scores: dict[int, float] = {}
        sizes = self.sizes
        for term in rare:
            posting = self.postings[term]
            df = len(posting) // 2
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            weight = idf * (K1 + 1)
            norm, scale = K1 * (1 - B), K1 * B / avg  # tf / (tf + K1 (1 - B + B size / avg))
            # A term in thousands of passages weighs little: only its newest passages are scored.
            it = iter(posting[-2 * MAX_SCANNED:] if df > MAX_SCANNED else posting)
            get = scores.get
            for pid, tf in zip(it, it, strict=True):
                scores[pid] = get(pid, 0.0) + weight * tf / (tf + norm + scale * sizes[pid])
        best: dict[int, tuple[float, int]] = {}  # seq -> its best passage
        for pid in sorted(scores, key=scores.__getitem__, reverse=True)[: limit * 8 + 16]:
            score, seq = scores[pid], self.seqs[pid]
            if seq in live and seq not in best:
                best[seq] = (score, pid)
                if len(best) >= limit:
                    break
        if len(best) < limit:  # the first candidates were mostly of dropped messages: look at all
            for pid, score in scores.items():
                seq = self.seqs[pid]
                if seq in live and (seq not in best or best[seq][0] < score):
                    best[seq] = (score, pid)
        return sorted(best.values(), key=lambda hit: (-hit[0], -self.seqs[hit[1]]))[:limit]


class HistoryIndexes:
    """The indexes a store holds, one per conversation searched lately, bounded in postings."""

    def __init__(self, max_postings: int = MAX_HELD_POSTINGS) -> None:
        self.max_postings = max_postings
        self._held: OrderedDict[ConversationKey, _Index] = OrderedDict()
        # One catch-up at a time per conversation; a lock lives while someone holds or awaits it.
        self._locks: weakref.WeakValueDictionary[ConversationKey, asyncio.Lock] = weakref.WeakValueDictionary()

    def forget(self, key: ConversationKey) -> None:
        """Drop a conversation's index (it was deleted or replaced)."""
        self._held.pop(key, None)

    async def search(self, store: Store, key: ConversationKey, query: str, limit: int = DEFAULT_HITS) -> list[SearchHit]:
        """The best passages of the conversation's live messages for `query`, best first, at most
        `limit` (1..MAX_HITS), one per message."""
        limit = min(max(int(limit), 1), MAX_HITS)
        wanted = terms(query)
        conversation = await store.get(key)
        if conversation is None or not wanted:
            return []
        lock = self._locks.get(key)
        if lock is None:
            lock = self._locks[key] = asyncio.Lock()
        async with lock:
            index = self._held.get(key)
            if index is None or index.created_at != conversation.created_at or index.upto >= conversation.next_seq:
                index = _Index(conversation.created_at)
            self._held[key] = index
            self._held.move_to_end(key)
            await self._catch_up(store, key, index, conversation.next_seq - 1)
            live = {seq for seq, _ in conversation.live}
            ranked = index.rank(wanted, live, limit)
            hits = await asyncio.gather(*(self._hit(store, key, index, score, pid) for score, pid in ranked))
        self._bound()
        return [hit for hit in hits if hit is not None]

    async def _catch_up(self, store: Store, key: ConversationKey, index: _Index, last: int) -> None:
        while index.upto < last:
            batch = await store.messages(key, live_only=False, after=index.upto, limit=READ_BATCH)
            if not batch:
                index.upto = last
                return
            chars = sum(len(message_text(m.message)) for m in batch)
            if chars > THREAD_CHARS:
                await asyncio.to_thread(index.add, batch)
            else:
                index.add(batch)

    @staticmethod
    async def _hit(store: Store, key: ConversationKey, index: _Index, score: float, pid: int) -> SearchHit | None:
        stored = await store.message(key, index.seqs[pid])
        if stored is None or stored.status != LIVE:
            return None
        text = message_text(stored.message)
        start = index.starts[pid]
        end = index.ends[pid]
        line_before = text.rfind("\n", 0, max(start - 1, 0)) + 1 if start > 0 else 0  # the line before the passage
        shown_from = max(line_before, start - CONTEXT_CHARS)
        after = text.find("\n", end, end + CONTEXT_CHARS)
        shown_to = after if after >= 0 else min(len(text), end + CONTEXT_CHARS)
        return SearchHit(
            stored.seq, message_role(stored.message), stored.created_at, text[shown_from:shown_to].strip("\n"),
            shown_from, len(text), round(score, 3),
        )

    def _bound(self) -> None:
        total = sum(index.held for index in self._held.values())
        while len(self._held) > 1 and total > self.max_postings:
            _, dropped = self._held.popitem(last=False)
            total -= dropped.held


__all__ = ["DEFAULT_HITS", "MAX_HITS", "HistoryIndexes", "SearchHit", "message_role", "message_text", "passages", "terms"]
