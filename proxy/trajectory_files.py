"""Trajectory files (`storage.trajectory_dir`, the seed's traj.json): after each turn the
conversation's trajectory, the same document as `GET .../trajectory` with every message, is
written to `<dir>/<tenant>/<conversation>.json`, so other tools can read runs as plain files.

Never in a turn's way: `after_turn` only marks the conversation due and returns; one background
task per conversation brings its file up to date (and runs once more if another turn ended
meanwhile). A failure is logged and counted; the turn never hears of it.

Incremental, because a long run's transcript is megabytes: the encoded messages of recent
conversations stay in memory (least recently written dropped first, within
`storage.trajectory_cache_mb`), so a turn reads and encodes only the messages it wrote or whose
status changed. Those are encoded, and the file written with writev straight from the parts, by
a worker thread: the event loop only works out what changed. Atomic for readers: a temp file in
the same folder, fsynced, renamed over the old one. Files 0600, folders 0700.

The folders are trusted only as this user's own: at start and before each write or removal the
root and the tenant's folder are looked at with lstat (a symlink is never followed: one would
make the proxy write, and a DELETE remove, files outside the root), must be folders of this
user's, and are made 0700 whatever they were found as (so no other user can swap one for a link
between the look and the write).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import tempfile
from collections import OrderedDict
from collections.abc import Iterator
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import Counter

from .config import ConfigError
from .dialects.formats import codec_for, format_of
from .identity import CONVERSATION_ID, ConversationKey
from .prefix import PARSED
from .refs import RefSigner
from .request_parts import with_turns
from .scheduling import run_behind_the_loop
from .store import PENDING, Conversation, RequestPart, Store, StoredMessage, Summary, part_json
from .trajectory import (
    TrajectoryDocument,
    encode,
    first_live_user,
    inbox_parts,
    roles_of,
    shown_status,
    trajectory_message,
)
from .transcript import Role

log = logging.getLogger("proxy.trajectory")

READ_PAGE = 500  # messages per store read when many changed (a cold start, a deep regenerate)
RUN_GAP = 8  # changed seqs this close together are read as one range
IOV_MAX = 1024  # buffers per writev call (Linux's limit)
PART_USE = ("turn", "system_hash", "tools_hash")  # what a mirror keeps of each turn record for its request parts
PRIVATE_DIR = 0o700
PER_MESSAGE = 64  # what a mirror holds per message besides its encoded bytes (list slots), for the budget


@dataclass(slots=True)
class _Mirror:
    """What a conversation's file holds, by seq (list index seq - 1), kept between turns."""

    created_at: float
    format: str | None = None  # the conversation's (its first turn record's); None before there is one
    statuses: list[str] = field(default_factory=list)  # as stored
    roles: list[Role] = field(default_factory=list)  # as the conversation's codec reads each message
    shown: list[str] = field(default_factory=list)  # as the trajectory shows them (compacted marks)
    encoded: list[bytes] = field(default_factory=list)
    live: list[tuple[int, str]] = field(default_factory=list)  # the record's live transcript, as last seen
    pending: set[int] = field(default_factory=set)  # seqs stored as pending: their status will change
    boundary: int = 0
    task_seq: int | None = None
    summaries: list[bytes] = field(default_factory=list)
    turns: list[bytes] = field(default_factory=list)
    # The system prompts and tools lists its turns sent (read again when a turn names a new one),
    # and which each turn sent.
    parts: list[RequestPart] = field(default_factory=list)
    part_uses: list[dict[str, Any]] = field(default_factory=list)
    size: int = 0  # bytes held

    @property
    def next_seq(self) -> int:
        return len(self.statuses) + 1

    def same_conversation(self, conversation: Conversation) -> bool:
        """False when the record is not the log this mirror followed: made again after a delete (or
        an import) has another creation time or fewer messages. An import of a later export of the
        same conversation is the same log further on, and is followed as such."""
        return self.created_at == conversation.created_at and self.next_seq <= conversation.next_seq

    def note(self, stored: StoredMessage, role: Role) -> None:
        """Take a message as read from the store (new, or with a changed status)."""
        i = stored.seq - 1
        if i == len(self.statuses):
            self.size += PER_MESSAGE
            self.statuses.append(stored.status)
            self.roles.append(role)
            self.shown.append("")
            self.encoded.append(b"")
        else:
            self.statuses[i] = stored.status
        if stored.status == PENDING:
            self.pending.add(stored.seq)
        else:
            self.pending.discard(stored.seq)

    def changed_live(self, live: list[tuple[int, str]]) -> set[int]:
        """Seqs that joined or left the live transcript since it was last seen. Usually it only
        grew at its end: one comparison in C, not a set of every live seq per turn."""
        seen = self.live
        if live[: len(seen)] == seen:
            return {seq for seq, _ in live[len(seen) :]}
        return {seq for seq, _ in seen} ^ {seq for seq, _ in live}  # an edit or regenerate

    def note_all(self, messages: dict[int, StoredMessage]) -> None:
        ordered = [messages[seq] for seq in sorted(messages)]
        for stored, role in zip(ordered, roles_of(codec_for(self.format), ordered), strict=True):
            self.note(stored, role)

    def shown_differently(self, read: AbstractSet[int], boundary: int, task_seq: int | None) -> set[int]:
        """The seqs to encode again: those just read, and those the trajectory now shows with
        another status (the boundary passed them, or the pinned task changed)."""
        candidates = set(read)
        if boundary != self.boundary:
            candidates.update(range(min(boundary, self.boundary) + 1, max(boundary, self.boundary) + 1))
        candidates.update(s for s in (task_seq, self.task_seq) if s is not None and s < self.next_seq)
        def shown_now(seq: int) -> str:
            return shown_status(self.statuses[seq - 1], seq, self.roles[seq - 1], boundary, task_seq)

        return {seq for seq in candidates if seq in read or shown_now(seq) != self.shown[seq - 1]}

    def add_records(self, summaries: list[bytes], turns: list[bytes]) -> None:
        self.size += sum(map(len, summaries)) + sum(map(len, turns))
        self.summaries += summaries
        self.turns += turns

    def set_encoded(self, seq: int, shown: str, encoded: bytes) -> None:
        self.size += len(encoded) - len(self.encoded[seq - 1])
        self.shown[seq - 1], self.encoded[seq - 1] = shown, encoded


@dataclass(frozen=True, slots=True)
class _Changes:
    """What a turn changed in a conversation's file, for the worker thread to encode."""

    messages: list[StoredMessage]  # to encode again (new, or shown with another status)
    task_seq: int | None
    summaries: list[Summary]  # new ones
    turns: list[dict[str, Any]]  # new turn records
    inbox: list[bytes]  # every inbox message, encoded (their statuses change: read whole, they are few)


def check_trajectory_dir(root: Path | None) -> None:
    """At start: the root made if missing and private; ConfigError when it is a symlink or not
    this user's folder."""
    if root is None:
        return
    try:
        private_folder(root, parents=True)
    except OSError as exc:
        raise ConfigError(f"storage.trajectory_dir: {exc}") from exc


class TrajectoryWriter:
    """Keeps `<root>/<tenant>/<conversation>.json` in step with the store; with no root, does nothing."""

    def __init__(
        self, root: Path | None, store: Store, refs: RefSigner, *, cache_bytes: int, failures: Counter | None = None
    ) -> None:
        self.root, self.store, self.refs = root, store, refs
        self.cache_bytes = cache_bytes
        self.failures = 0
        self._failures_metric = failures
        self._mirrors: OrderedDict[ConversationKey, _Mirror] = OrderedDict()  # least recently written first
        self._held = 0  # bytes in the mirrors
        self._due: set[ConversationKey] = set()
        self._tasks: dict[ConversationKey, asyncio.Task[None]] = {}
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trajectory", initializer=run_behind_the_loop)

    def path(self, key: ConversationKey) -> Path:
        assert self.root is not None
        for part in (key.tenant, key.id):  # both are checked names, but a path must never escape the root
            if not CONVERSATION_ID.fullmatch(part) or set(part) == {"."}:
                raise ValueError(f"not a safe file name: {part!r}")
        return self.root / key.tenant / f"{key.id}.json"

    async def after_turn(self, key: ConversationKey) -> None:
        """A turn of this conversation ended (or it was deleted): its file is brought up to date in
        the background. Returns at once."""
        if self.root is None:
            return
        self._due.add(key)
        if key not in self._tasks:
            self._tasks[key] = asyncio.create_task(self._drain(key))

    async def deleted(self, key: ConversationKey) -> None:
        """The conversation was deleted: its file goes too (after any write still under way)."""
        await self.after_turn(key)

    async def idle(self) -> None:
        """Wait until every file due is written (shutdown, and tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks.values()), return_exceptions=True)

    async def close(self) -> None:
        await self.idle()
        self._thread.shutdown(wait=True)

    async def _drain(self, key: ConversationKey) -> None:
        try:
            while key in self._due:
                self._due.discard(key)
                try:
                    await self._update(key)
                except Exception:
                    # The next turn rebuilds this conversation's file from the store.
                    self._drop(key)
                    self.failures += 1
                    if self._failures_metric is not None:
                        self._failures_metric.inc()
                    log.warning("trajectory file not written", exc_info=True, extra={"conversation": str(key)})
        finally:
            del self._tasks[key]

    async def _update(self, key: ConversationKey) -> None:
        path = self.path(key)
        conversation = await self.store.get(key)
        loop = asyncio.get_running_loop()
        if conversation is None:  # deleted: so is its file
            self._drop(key)
            await loop.run_in_executor(self._thread, _remove_file, path)
            return
        mirror, changes = await self._refresh(key, conversation)
        # Encoding holds the GIL: in the worker thread the loop still gets it every switch interval,
        # where a cold start's thousands of messages would hold the loop in one go.
        await loop.run_in_executor(self._thread, self._encode_and_write, mirror, changes, conversation, path)
        self._keep(key, mirror)

    async def _refresh(self, key: ConversationKey, conversation: Conversation) -> tuple[_Mirror, _Changes]:
        """The mirror brought up to the store's statuses, and what must be encoded again: reading
        only what changed since the last time."""
        mirror = self._drop(key)
        if mirror is None or not mirror.same_conversation(conversation):
            mirror = _Mirror(conversation.created_at)  # new here, or deleted and made again since
        # Turn records never change once written: only new ones are read. The first names the
        # conversation's format; a mirror made before it existed read the messages as the default
        # format's, so it starts over.
        turns = await self.store.turn_records(key, after=len(mirror.turns))
        if not mirror.turns and format_of(turns) != mirror.format:
            mirror = _Mirror(conversation.created_at, format_of(turns))
        mirror.part_uses += [{name: r.get(name) for name in PART_USE} for r in turns]
        mirror.size += PER_MESSAGE * len(turns)
        named = {r.get(name) for r in turns for name in PART_USE[1:]} - {None}
        if named - {p.hash for p in mirror.parts}:  # a new one: read those after the ones held
            new = await self.store.request_parts(key, after=len(mirror.parts))
            mirror.parts += new
            mirror.size += sum(len(part_json(p.value)) * PARSED for p in new)
        # Statuses only ever move from pending, or from live: those are the ones to look at again.
        stale = {seq for seq in mirror.changed_live(conversation.live) | mirror.pending if seq < mirror.next_seq}
        mirror.live = conversation.live
        fresh = await self._read(key, stale, mirror.next_seq, conversation.next_seq)
        mirror.note_all(fresh)
        task_seq = first_live_user(conversation, mirror.roles)
        redo = mirror.shown_differently(fresh.keys(), conversation.boundary, task_seq)
        needed = await self._read(key, redo - fresh.keys(), 0, 0)  # to show it differently, read it again
        mirror.note_all(needed)
        fresh |= needed
        # Summaries never change once written either.
        if not mirror.summaries:
            summaries = await self.store.summaries(key)
        else:
            summaries = []
            while (summary := await self.store.summary(key, len(mirror.summaries) + len(summaries) + 1)) is not None:
                summaries.append(summary)
        inbox = await inbox_parts(self.store, conversation)
        return mirror, _Changes([fresh[seq] for seq in redo], task_seq, summaries, turns, inbox)

    def _encode_and_write(self, mirror: _Mirror, changes: _Changes, conversation: Conversation, path: Path) -> None:
        """In the worker thread: the changed parts encoded into the mirror, then the file written."""
        for stored in changes.messages:
            entry = trajectory_message(stored, mirror.roles[stored.seq - 1], conversation, changes.task_seq, self.refs)
            mirror.set_encoded(stored.seq, entry["status"], encode(entry))
        mirror.boundary, mirror.task_seq = conversation.boundary, changes.task_seq
        mirror.add_records([encode(s.to_api()) for s in changes.summaries], [encode(r) for r in changes.turns])
        document = TrajectoryDocument(
            data=mirror.encoded,  # not copied: only this conversation's task changes it, never meanwhile
            first_id=1 if mirror.encoded else None,
            last_id=len(mirror.encoded) or None,
            has_more=False,
            summaries=mirror.summaries,
            turns=mirror.turns,
            conversation=encode(conversation.to_api()),
            inbox=changes.inbox,
            request_parts=[encode(p) for p in with_turns(mirror.parts, mirror.part_uses)],
        )
        _write_file(path.parent.parent, path, document)

    async def _read(
        self, key: ConversationKey, seqs: set[int], first_new: int, next_seq: int
    ) -> dict[int, StoredMessage]:
        """The messages of `seqs` and of [first_new, next_seq), in few range reads."""
        out: dict[int, StoredMessage] = {}
        ranges = list(_runs(sorted(seqs)))
        if first_new < next_seq:
            ranges.append((first_new, next_seq - 1))
        for start, end in ranges:
            while start <= end:
                limit = min(READ_PAGE, end - start + 1)
                page = await self.store.messages(key, live_only=False, after=start - 1, limit=limit)
                if not page:
                    break
                out.update((m.seq, m) for m in page)
                start = page[-1].seq + 1
        return out

    def _keep(self, key: ConversationKey, mirror: _Mirror) -> None:
        """Keep the mirror for the next turn, dropping the least recently written beyond the budget."""
        self._mirrors[key] = mirror
        self._held += mirror.size
        while self._held > self.cache_bytes and self._mirrors:
            self._drop(next(iter(self._mirrors)))

    def _drop(self, key: ConversationKey) -> _Mirror | None:
        mirror = self._mirrors.pop(key, None)
        if mirror is not None:
            self._held -= mirror.size
        return mirror


def _runs(seqs: list[int]) -> Iterator[tuple[int, int]]:
    """Sorted seqs grouped into (first, last) ranges, merging ones less than RUN_GAP apart."""
    if not seqs:
        return
    start = end = seqs[0]
    for seq in seqs[1:]:
        if seq - end > RUN_GAP:
            yield start, end
            start = seq
        end = seq
    yield start, end


# -- the worker thread -----------------------------------------------------------------------------


class UnsafeFolder(OSError):
    """A trajectory folder that is a symlink, no folder, or another user's."""


def private_folder(folder: Path, *, parents: bool = False) -> None:
    """`folder` made if missing, then checked without following a symlink and made 0700."""
    try:
        folder.mkdir(mode=PRIVATE_DIR, parents=parents)
    except FileExistsError:
        pass
    facts = os.lstat(folder)
    if stat.S_ISLNK(facts.st_mode):
        raise UnsafeFolder(f"{folder} is a symlink: trajectory folders must be plain folders")
    if not stat.S_ISDIR(facts.st_mode) or facts.st_uid != os.getuid():
        raise UnsafeFolder(f"{folder} must be a folder of this user's")
    if stat.S_IMODE(facts.st_mode) != PRIVATE_DIR:
        os.chmod(folder, PRIVATE_DIR, follow_symlinks=False)


def _write_file(root: Path, path: Path, document: TrajectoryDocument) -> None:
    private_folder(root, parents=True)
    private_folder(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")  # mode 0600
    try:
        try:
            _write_all(fd, document.chunks())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _write_all(fd: int, chunks: list[bytes]) -> None:
    for i in range(0, len(chunks), IOV_MAX):
        batch = chunks[i : i + IOV_MAX]
        written = os.writev(fd, batch)
        if written < sum(map(len, batch)):  # a short write (rare on a regular file): finish plainly
            rest = memoryview(b"".join(batch))[written:]
            while rest:
                rest = rest[os.write(fd, rest) :]


def _remove_file(path: Path) -> None:
    if not path.parent.parent.exists():
        return
    private_folder(path.parent.parent)
    if os.path.lexists(path.parent):
        private_folder(path.parent)  # a tenant folder that is a link: nothing outside the root goes
        path.unlink(missing_ok=True)
