"""The store's faults as its own errors, its private files, and the reserve that leaves room to delete.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sqlite3
from pathlib import Path

from ...identity import ConversationKey
from ..base import (
    StoreError,
    StoreFull,
    StoreReadOnly,
    StoreUnavailable,
)

log = logging.getLogger("proxy.store.disk")


log = logging.getLogger("proxy.store.disk")

RESERVE_FILE = "reserve"
RESERVE_SHARE = 1 / 8  # of the disk's size, at most: a disk under twice the reserve would hold none
LOW_SPACE = 1024 * 1024  # less free than this (beside the reserve) is a full store for health()
PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600
MB = 1024 * 1024


def missing_row(key: ConversationKey, seq: int) -> StoreUnavailable:
    """A row the conversation's index names is not there: a broken store, said as such."""
    log.error("a stored message is missing", extra={"conversation": str(key), "seq": seq})
    return StoreUnavailable("The conversation store failed; try again shortly.")


def store_error(exc: BaseException, folder: Path) -> StoreError:
    """sqlite3's, diskcache's and the OS's failures as the store's own (the cause stays chained,
    for the log; the client's message names no path). SQLite reports a write the OS refused as a
    bare "disk I/O error": a probe file then tells a full or read-only disk from a broken one."""
    text = str(exc).lower()
    code = getattr(exc, "errno", None)
    if isinstance(exc, sqlite3.Error) and "i/o error" in text:
        code = write_refused(folder)
    if code in (errno.ENOSPC, errno.EDQUOT) or (isinstance(exc, sqlite3.Error) and "full" in text):
        return StoreFull("The conversation store's disk is full: nothing was stored. Free space, or delete "
                         "conversations, and retry.")
    if code in (errno.EROFS, errno.EACCES, errno.EPERM) or (isinstance(exc, sqlite3.Error) and "readonly" in text):
        return StoreReadOnly("The conversation store is read-only: nothing was stored.")
    return StoreUnavailable("The conversation store failed; try again shortly.")


def write_refused(folder: Path) -> int | None:
    """The errno with which the OS refuses a small write in `folder` now, or None if it takes one."""
    probe = folder / f".write-probe-{os.getpid()}"
    try:
        with open(probe, "wb") as out:
            out.write(b"\0" * 4096)
            out.flush()
            os.fsync(out.fileno())
    except OSError as exc:
        return exc.errno
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return None


def make_private(root: Path) -> None:
    """The store's folder tree 0700, its files 0600 (SQLite gives its -wal and -shm files the
    database file's mode; diskcache's value files are made so by _PrivateDisk)."""
    try:
        os.chmod(root, PRIVATE_DIR)
        for folder, dirs, files in os.walk(root):
            for name in dirs:
                os.chmod(os.path.join(folder, name), PRIVATE_DIR)
            for name in files:
                os.chmod(os.path.join(folder, name), PRIVATE_FILE)
    except OSError as exc:  # not the owner: say so, the store still works
        log.warning("cannot make the store private", extra={"path": str(root), "error": str(exc)})


class Reserve:
    """A file of `size` bytes held so that there is room to delete when the disk is full."""

    def __init__(self, path: Path, size: int) -> None:
        with contextlib.suppress(OSError):
            fs = os.statvfs(path.parent)
            size = min(size, int(fs.f_blocks * fs.f_frsize * RESERVE_SHARE))
        self.path, self.size = path, size
        self.held = size == 0 or path.is_file() and path.stat().st_size >= size

    def make(self) -> None:
        """(Re)make the reserve if there is room for it and as much again; quietly not otherwise."""
        if self.held:
            return
        try:
            fs = os.statvfs(self.path.parent)
            if fs.f_bavail * fs.f_frsize < 2 * self.size:
                return
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, PRIVATE_FILE)
            try:
                os.posix_fallocate(fd, 0, self.size)  # allocated, not sparse: the room is really taken
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("cannot make the store's reserve", extra={"path": str(self.path), "error": str(exc)})
            with contextlib.suppress(OSError):
                self.path.unlink()
            return
        self.held = True

    def release(self) -> bool:
        """Free the reserve's room; False if there was none to free."""
        if not self.held or self.size == 0:
            return False
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.held = False
        return True
