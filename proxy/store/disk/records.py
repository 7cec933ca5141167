"""A conversation as the store thread holds it: its record (small fields and index) and its
batches of messages, in the form the rows keep them (see store.py's layout).
"""

from __future__ import annotations

import bisect
import pickle
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...identity import ConversationKey
from ...transcript import Raw
from ..base import (
    PENDING,
    Conversation,
)

# Seqs per index chunk: a save pickles the newest chunk's entries, not the index. It rides in the
# record, rewritten every turn: 32 seqs keep that row ~1 KB on an agent's turn (128 made it 3.6 KB,
# more than the turn's own items), and a chunk closes (a row of its own) every ~16 turns.
INDEX_CHUNK = 32
CHUNK_BEFORE = 128  # of a record written before its size was kept in it (`chunk`): kept as it was
BATCH_MAX = 256  # messages per batch row: a bigger write (an import) is split
INLINE_PART = 8192  # bytes of a write's pickled messages kept in its batch row; more get a row of their own
LAYOUT = 2  # records with index chunks and batches; one without `layout` is read as written before


@dataclass(slots=True, eq=False)
class Batch:
    """Messages of one conversation with consecutive seqs from `first`, kept in one row.

    The messages are held as the writes that added them pickled them (`parts`: how many, and the
    bytes): what the caller passed can't change what is stored, a status change rewrites the row
    without pickling its messages again, and a batch can stay in memory between a turn's two
    writes. A part bigger than INLINE_PART has a row of its own (`part` at its first seq, bytes
    None here), written once: a status change rewrites the small batch row, not a first turn's
    whole transcript. A row written before batches (`legacy`) holds one message: it is written
    back in its own form."""

    first: int
    parts: list[tuple[int, bytes | None]]
    hashes: list[str]
    statuses: list[str]
    stamps: list[float]
    legacy: Raw | None = None
    unwritten: dict[int, bytes] = field(default_factory=dict)  # parts of their own to write, by first seq

    @property
    def end(self) -> int:
        """The seq after its last message."""
        return self.first + len(self.hashes)

    def add(self, messages: list[Raw], hashes: list[str], statuses: list[str], stamps: list[float]) -> None:
        blob = pickle.dumps(messages, pickle.HIGHEST_PROTOCOL)
        if len(blob) > INLINE_PART:
            self.unwritten[self.end] = blob
            self.parts.append((len(messages), None))
        else:
            self.parts.append((len(messages), blob))
        self.hashes.extend(hashes)
        self.statuses.extend(statuses)
        self.stamps.extend(stamps)

    def messages(self, read_part: Callable[[int], bytes]) -> list[Raw]:
        """Its messages, unpickled afresh (the caller's to change); `read_part(seq)` reads a part
        of its own."""
        if self.legacy is not None:
            return [self.legacy]
        out: list[Raw] = []
        seq = self.first
        for count, blob in self.parts:
            if blob is None:
                blob = self.unwritten.get(seq) or read_part(seq)
            out.extend(pickle.loads(blob))
            seq += count
        return out

    def own_parts(self) -> list[int]:
        """The first seqs of its parts that have a row of their own."""
        seqs, seq = [], self.first
        for count, blob in self.parts:
            if blob is None:
                seqs.append(seq)
            seq += count
        return seqs

    def row(self) -> dict[str, Any]:
        if self.legacy is not None:
            return {"message": self.legacy, "hash": self.hashes[0], "status": self.statuses[0], "created_at": self.stamps[0]}
        return {"parts": self.parts, "hashes": self.hashes, "statuses": self.statuses, "created_at": self.stamps}

    @classmethod
    def of_row(cls, first: int, row: dict[str, Any]) -> Batch:
        if "parts" in row:
            return cls(first, row["parts"], row["hashes"], row["statuses"], row["created_at"])
        return cls(first, [], [row["hash"]], [row["status"]], [row["created_at"]], legacy=row["message"])


class Record:
    """A conversation's record as the store thread holds it: its small fields as stored, its
    whole index in memory (each part in seq order: a turn's additions go at the end, nothing is
    sorted), and what the write under way changed (index chunks, batches) for `_save` to write.
    The index is stored in chunks of `chunk` seqs (`chunk_row`; INDEX_CHUNK for a new record, as
    its `chunk` field says): a save writes the chunks that changed, usually the newest alone."""

    __slots__ = (
        "fields", "chunk", "_live", "_forwarded", "_rewritten", "_starts", "changed", "unsaved", "pending_batch", "_frozen",
        "_lent",
    )

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields
        self.chunk: int = fields.get("chunk", CHUNK_BEFORE)
        self._live: list[tuple[int, str]] = []  # (seq, hash) of the live messages
        self._forwarded: dict[int, int] = {}  # seq -> llm_calls when first forwarded
        self._rewritten: set[int] = set()  # seqs with a stored rewrite
        self._starts: list[int] = []  # the first seq of every batch
        self.changed: set[int] = set()  # index chunks to write
        self.unsaved: dict[int, Batch] = {}  # batches to write, by first seq
        self.pending_batch: Batch | None = None  # the newest batch holding pending items, as written
        self._frozen: frozenset[int] | None = None  # `_rewritten`, for snapshots, until it changes
        # `_live` and `_forwarded` are lent to snapshots as they are, and copied by the next change
        # (`_own`) instead: a turn copies each once, not at each of its two snapshots.
        self._lent = False

    @classmethod
    def new(cls, stamp: float) -> Record:
        return cls({
            "layout": LAYOUT, "created_at": stamp, "updated_at": stamp, "next_seq": 1, "llm_calls": 0,
            "summaries": 0, "boundary": 0, "summary_id": None, "turns": 0, "order": 0,
            "inbox": 0, "inbox_open": [], "inbox_at": {}, "pending": [],
            "legacy": 1,  # no seq is in a row of its own
            "tail": 0,  # the index chunk the record holds: the one of next_seq - 1
            "chunk": INDEX_CHUNK,  # seqs per index chunk
        })

    @classmethod
    def stored(cls, row: dict[str, Any], chunk: Callable[[int], dict[str, Any] | None]) -> Record:
        """The record from its row; `chunk(n)` reads index chunk n's row (those behind the tail)."""
        fields = dict(row)
        if fields.get("layout") != LAYOUT:
            return cls._written_before(fields)
        record = cls(fields)
        tail = fields.pop("index")
        for number in range(fields["tail"]):
            part = chunk(number)
            if part is not None:
                record._take(part)
        record._take(tail)
        return record

    @classmethod
    def _written_before(cls, fields: dict[str, Any]) -> Record:
        """A record of the layout before chunks and batches: its whole index was in it, every
        message so far in a `msg` row of its own. Its next save writes the index as chunks."""
        fields["chunk"] = INDEX_CHUNK  # its index is written in chunks for the first time
        record = cls(fields)
        record._live = [tuple(entry) for entry in fields.pop("live")]
        record._forwarded = dict(fields.pop("first_forwarded", {}))
        record._rewritten = set(fields.pop("rewritten", ()))
        for name, empty in (("inbox", 0), ("inbox_open", []), ("inbox_at", {}), ("pending", [])):
            fields.setdefault(name, empty)  # records written before the inbox have none of it
        fields.update(layout=LAYOUT, legacy=fields["next_seq"], tail=(fields["next_seq"] - 1) // record.chunk)
        record.changed.update(range(fields["tail"] + 1))
        return record

    def _own(self) -> None:
        """Before `_live` or `_forwarded` changes: copies of them if a snapshot holds them."""
        if self._lent:
            self._live, self._forwarded, self._lent = list(self._live), dict(self._forwarded), False

    def _take(self, chunk: dict[str, Any]) -> None:
        """Add a stored chunk's entries (chunks come in seq order)."""
        self._own()
        self._live.extend(chunk["live"])
        self._forwarded.update(chunk["forwarded"])
        self._rewritten.update(chunk["rewritten"])
        self._starts.extend(chunk["starts"])

    def chunk_row(self, number: int) -> dict[str, Any]:
        """Index chunk `number` as stored: the entries of its seqs."""
        low, high = number * self.chunk, (number + 1) * self.chunk
        seqs = range(low, min(high, self.fields["next_seq"]))
        live, starts = self._live, self._starts
        return {
            "live": live[bisect.bisect_left(live, (low,)):bisect.bisect_left(live, (high,))],
            "forwarded": {s: self._forwarded[s] for s in seqs if s in self._forwarded} if self._forwarded else {},
            "rewritten": [s for s in seqs if s in self._rewritten] if self._rewritten else [],
            "starts": starts[bisect.bisect_left(starts, low):bisect.bisect_left(starts, high)],
        }

    def row(self) -> dict[str, Any]:
        """The record as stored: its fields and its tail chunk."""
        return {**self.fields, "index": self.chunk_row(self.fields["tail"])}

    def saved(self) -> None:
        """`_save` wrote what changed: hold on to the batch whose pending items a turn's end will change."""
        held = [b for b in (self.pending_batch, *self.unsaved.values()) if b is not None and PENDING in b.statuses]
        self.pending_batch = max(held, key=lambda b: b.first) if held else None
        self.unsaved = {}
        self.changed = set()

    # -- the index -----------------------------------------------------------------------------

    def live(self) -> list[tuple[int, str]]:
        """The live index, lent (for a snapshot): read it, never change it."""
        self._lent = True
        return self._live

    @property
    def entries(self) -> int:
        """Its per-seq entries (what its memory grows with), as `Held` counts them."""
        return len(self._live) + len(self._forwarded) + len(self._rewritten) + len(self._starts)

    def live_seqs(self, after: int | None, limit: int | None) -> list[int]:
        """The live seqs after `after` (all if None), at most `limit`."""
        start = 0 if after is None else bisect.bisect_left(self._live, (after + 1,))
        end = len(self._live) if limit is None else min(len(self._live), start + max(limit, 0))
        return [seq for seq, _ in self._live[start:end]]

    def forwarded(self) -> dict[int, int]:
        """The first-forwarded marks, lent as `live` is."""
        self._lent = True
        return self._forwarded

    def rewritten(self) -> frozenset[int]:
        if self._frozen is None:
            self._frozen = frozenset(self._rewritten)
        return self._frozen

    def starts(self) -> list[int]:
        return list(self._starts)

    @property
    def last_start(self) -> int | None:
        """The first seq of the newest batch."""
        return self._starts[-1] if self._starts else None

    def first_of(self, seq: int) -> int | None:
        """The first seq of the row holding message `seq`; None if there is no such message."""
        if not 1 <= seq < self.fields["next_seq"]:
            return None
        if seq < self.fields["legacy"]:
            return seq
        at = bisect.bisect_right(self._starts, seq) - 1
        return self._starts[at] if at >= 0 else None

    def new_batch(self, first: int) -> None:
        self._starts.append(first)  # after every batch so far
        self.changed.add(first // self.chunk)

    def extend_live(self, first: int, hashes: list[str]) -> None:
        """Messages first, first + 1, ... are live: after every live seq."""
        self._own()
        self._live.extend(zip(range(first, first + len(hashes)), hashes))
        self.touch(first, first + len(hashes))

    def add_live(self, entries: list[tuple[int, str]]) -> None:
        """Put (seq, hash) entries, ascending, in the live index (those there already stay)."""
        if not entries:
            return
        self._own()
        live = self._live
        if not live or live[-1][0] < entries[0][0]:  # the usual case: a turn's items, after every live one
            live.extend(entries)
        else:
            for entry in entries:
                at = bisect.bisect_left(live, (entry[0],))
                if at == len(live) or live[at][0] != entry[0]:
                    live.insert(at, entry)
        self.changed.update({seq // self.chunk for seq, _ in entries})

    def drop_live(self, seqs: list[int]) -> None:
        """Take these seqs out of the live index (those that are in it)."""
        if not seqs:
            return
        self._own()
        live = self._live
        for seq in seqs:
            at = bisect.bisect_left(live, (seq,))
            if at < len(live) and live[at][0] == seq:
                del live[at]
                self.changed.add(seq // self.chunk)

    def forward(self, marks: Mapping[int, int]) -> None:
        self._own()
        self._forwarded.update(marks)
        self.changed.update({seq // self.chunk for seq in marks})

    def rewrote(self, seqs: Iterable[int]) -> None:
        for seq in seqs:
            self._rewritten.add(seq)
            self.changed.add(seq // self.chunk)
        self._frozen = None

    def touch(self, first: int, end: int) -> None:
        """The index chunks of seqs first ... end - 1 changed."""
        if end > first:
            self.changed.update(range(first // self.chunk, (end - 1) // self.chunk + 1))


def snapshot_of(key: ConversationKey, record: Record) -> Conversation:
    f = record.fields  # .get: records written before these fields existed have none of them
    return Conversation(
        key, f["created_at"], f["updated_at"], f["next_seq"], record.live(),
        f["llm_calls"], record.forwarded(), record.rewritten(),
        f["boundary"], f["summary_id"], dict(f.get("marks") or {}),
        title=f.get("title"), task=f.get("task"), model=f.get("model"), client=f.get("client"),
        failures=f.get("failures", 0), last_error=f.get("last_error"), turns=f["turns"],
        inbox_open=len(f["inbox_open"]), inbox_anchors=frozenset(f["inbox_at"]),
    )
