"""Refs name a stored tool output: `out_<seq>_<mac>`, where the MAC binds the ref to its tenant and
conversation under a per-store secret. A ref is unguessable, and one conversation's ref is
meaningless in any other (it fails the check: a 404, never another tenant's data)."""

from __future__ import annotations

import hashlib
import hmac
import re

from .identity import ConversationKey

REF = re.compile(r"out_(\d{1,12})_([0-9a-f]{24})")


class RefSigner:
    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def _mac(self, key: ConversationKey, seq: int) -> str:
        data = f"{key.tenant}\0{key.id}\0{seq}".encode()
        return hmac.new(self._secret, data, hashlib.sha256).hexdigest()[:24]

    def make(self, key: ConversationKey, seq: int) -> str:
        return f"out_{seq}_{self._mac(key, seq)}"

    def seq_of(self, key: ConversationKey, ref: str) -> int | None:
        """The seq a ref names, if it is a ref of this conversation; None otherwise."""
        match = REF.fullmatch(ref.strip())
        if match is None:
            return None
        seq = int(match.group(1))
        return seq if hmac.compare_digest(match.group(2), self._mac(key, seq)) else None
