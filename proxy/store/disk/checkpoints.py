"""SQLite's WAL checkpoints on a thread of their own, not inside a turn's commit.

In WAL mode a commit appends the pages it changed to the -wal file, and the connection whose
commit takes the WAL past 1,000 pages (SQLite's default) copies them back into the database
then and there, two fsyncs included, before the commit returns. A turn's two writes add ~11
pages on the bench's agent (the record with its newest index chunk, the new messages, the turn
record), so every ~90th turn would wait 5-9 ms for a checkpoint: that was the proxy's p99.

Here a thread with a connection of its own runs a PASSIVE checkpoint every `every` writes. It
copies frames already committed while the store thread goes on appending new ones: no turn
waits for it. The WAL starts over from its beginning only when a write finds every frame copied,
which a store busy without pause may seldom give it; so the store thread's connection still
checkpoints by itself past `backstop` pages (SQLite's own mechanism), as a bound on the WAL's
size. By then this thread has copied nearly everything: what is left is a few writes' pages.
"""

from __future__ import annotations

import logging
import sqlite3
import threading

from ...scheduling import run_behind_the_loop

log = logging.getLogger("proxy.store.disk")

# The bench's agent: ~5 MB of WAL between checkpoints. A checkpoint copies each page once however
# often it was written since the last: the conversation's record and the B-trees' upper pages are
# rewritten every turn, so fewer checkpoints copy fewer pages (32: 0.41 ms of CPU a later turn in
# bench/store_turn.py --api, 128: 0.37).
EVERY_WRITES = 128
# Pages (4 KB) past which the writer checkpoints by itself: the WAL's bound on disk, should this
# thread fall behind or fail. Measured on the bench's agent: that is every ~200 turns, and copies
# what this thread left (a few writes' pages), not 1,000 pages.
BACKSTOP_PAGES = 4096
CONNECT_TIMEOUT_S = 5


class Checkpointer:
    """Checkpoints `database` (a SQLite file in WAL mode) every `every` writes, in a daemon thread."""

    def __init__(self, database: str, every: int = EVERY_WRITES, backstop: int = BACKSTOP_PAGES) -> None:
        self.database, self.every, self.backstop = database, every, backstop
        self.runs = 0  # checkpoints made
        self._writes = 0
        self._due = threading.Event()
        self._done = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._loop, name="diskstore-checkpoints", daemon=True)
        self._thread.start()

    def writer(self, connection: sqlite3.Connection) -> None:
        """Set up the connection that writes: automatic checkpoints only past the backstop."""
        connection.execute(f"PRAGMA wal_autocheckpoint = {int(self.backstop)}")

    def wrote(self) -> None:
        """A write committed (called by the writing thread): every `every`-th asks for a checkpoint."""
        self._writes += 1
        if self._writes >= self.every:
            self._writes = 0
            self._due.set()

    def wait(self, runs: int, timeout: float) -> bool:
        """Wait until `runs` checkpoints were made (tests, and a shutdown that wants the last)."""
        with self._done:
            return self._done.wait_for(lambda: self.runs >= runs, timeout)

    def close(self) -> None:
        self._closing = True
        self._due.set()
        self._thread.join()

    def _loop(self) -> None:
        run_behind_the_loop()
        connection: sqlite3.Connection | None = None
        try:
            while True:
                self._due.wait()
                self._due.clear()
                if self._closing:
                    return
                try:
                    if connection is None:
                        connection = sqlite3.connect(
                            self.database, isolation_level=None, check_same_thread=False, timeout=CONNECT_TIMEOUT_S
                        )
                    connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:  # a full or read-only disk: the writes' own outcome says so
                    log.info("store: checkpoint not made", extra={"error": str(exc)})
                    continue
                with self._done:
                    self.runs += 1
                    self._done.notify_all()
        finally:
            if connection is not None:
                connection.close()
