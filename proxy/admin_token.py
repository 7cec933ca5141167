"""The admin token: the one credential that sees (and writes into) every tenant's conversations.

Jupyter's way: with no `admin.token` configured, the proxy makes one at its first start and keeps
it in the store folder (`<storage.path>/admin-token`, mode 0600, read again on later starts), and
prints the `/ui` URL carrying it when it starts. Being on loopback grants nothing: on a shared
machine every user's process is a loopback client. To rotate it, delete the file and restart; to
share one token between replicas, configure `admin.token`.

The file is opened without following a symlink and must be a regular file of this user's, private
to them: a token another user could read or replace is no secret.
"""

from __future__ import annotations

import errno
import hmac
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from .config import ConfigError, Settings

TOKEN_FILE = "admin-token"
PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600
TOKEN_BYTES = 32  # of randomness: 43 URL-safe characters
MAX_TOKEN_CHARS = 1000
NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK}  # os.link refused by the filesystem


@dataclass(frozen=True, slots=True)
class AdminToken:
    value: str
    file: Path | None  # where the proxy keeps the token it made; None: configured as admin.token

    def matches(self, token: str) -> bool:
        """Whether `token` is this one (in constant time: a timing must not spell it out)."""
        return hmac.compare_digest(token.encode(), self.value.encode())

    @property
    def generated(self) -> bool:
        return self.file is not None


def known_admin_token(settings: Settings) -> AdminToken | None:
    """The configured admin token, or the one kept in the store folder; None when neither is.
    Raises ConfigError when the file can't be trusted. Read before the store opens: a disk store
    tightens the modes of its folder's files, which would hide that the token was readable."""
    if settings.admin.token is not None:
        return AdminToken(settings.admin.token.get_secret_value(), None)
    path = settings.storage.path / TOKEN_FILE
    try:
        return AdminToken(_read(path), path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise ConfigError(f"admin token: cannot read {path}: {exc.strerror or exc}") from exc


def new_admin_token(settings: Settings) -> AdminToken:
    """A token made now and kept in the store folder (or the one another process of this store
    made meanwhile). Raises ConfigError when it can't be kept.

    The file appears whole or not at all: written under a name of this process's own, then
    hard-linked to its place (which, like O_EXCL, fails if anything is there, a symlink too).
    Created empty and written after, a replica starting at the same moment read it empty and
    refused to start."""
    folder = settings.storage.path
    path = folder / TOKEN_FILE
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
        value = secrets.token_urlsafe(TOKEN_BYTES)
        draft = folder / f".{TOKEN_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
        try:
            _write_new(draft, value)
            try:
                os.link(draft, path, follow_symlinks=False)
            except OSError as exc:
                if exc.errno not in NO_HARD_LINKS:
                    raise
                _write_new(path, value)  # a filesystem without hard links: made, then written
        except FileExistsError:  # another process of this store made it meanwhile: theirs it is
            return AdminToken(_read(path), path)
        finally:
            draft.unlink(missing_ok=True)
        return AdminToken(value, path)
    except OSError as exc:
        raise ConfigError(f"admin token: cannot keep it in {path}: {exc.strerror or exc}") from exc


def _write_new(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_FILE)
    with os.fdopen(fd, "w") as out:
        out.write(value + "\n")


def _read(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW: the name is a symlink
            raise ConfigError(f"admin token: {path} is a symlink; it must be a plain file") from None
        raise
    with os.fdopen(fd) as source:
        facts = os.fstat(source.fileno())
        if not stat.S_ISREG(facts.st_mode):
            raise ConfigError(f"admin token: {path} is not a regular file")
        if facts.st_uid != os.getuid() or facts.st_mode & 0o077:
            raise ConfigError(
                f"admin token: {path} must be this user's and private to them (chmod 600), "
                f"not mode {stat.S_IMODE(facts.st_mode):o}"
            )
        value = source.read(MAX_TOKEN_CHARS + 1).strip()
    if not value or len(value) > MAX_TOKEN_CHARS or not value.isascii() or any(c.isspace() for c in value):
        raise ConfigError(f"admin token: {path} holds no usable token (delete it to have a new one made)")
    return value


def ui_url(base_url: str, token: AdminToken) -> str:
    """The /ui address that signs the page in (the page keeps the token for its tab and drops it
    from the address bar)."""
    return f"{base_url.rstrip('/')}/ui/?token={token.value}"
