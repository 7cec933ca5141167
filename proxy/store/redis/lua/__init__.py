"""The Redis store's Lua scripts: one `.lua` file each, read once when proxy.store.redis is imported.

A script is its shared pieces (prelude.lua: the conversation scripts' KEYS, ARGV[1..3] and helpers;
inbox_anchors.lua: the inbox anchors index) followed by its own file, as SCRIPTS lists. The files
name the Python constants they need as `${NAME}` (the status spellings, the error messages Python
matches on); `load` fills them from the one mapping the store passes, and fails on a placeholder
that mapping lacks, on a constant no script uses and on a missing file: at start, not mid-turn.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib.resources import files
from importlib.resources.abc import Traversable

PRELUDE = "prelude"
INBOX_ANCHORS = "inbox_anchors"

# Conversation scripts (those with PRELUDE) all take the same KEYS (see RedisStore._keys) and
# ARGV[1..3] = tenant, id, stamp; their own arguments start at ARGV[4] (the file says which).
SCRIPTS: dict[str, tuple[str, ...]] = {
    "append": (PRELUDE,),
    "set_statuses": (PRELUDE,),
    "finish_turn": (PRELUDE,),
    # ARGV[4] = the title ('' = none of its own). Returns 0 if there is no such conversation.
    "set_title": (PRELUDE,),
    # ARGV[4]: the most calls to count (absent: no limit); -1 when that many are counted already.
    "count_call": (PRELUDE,),
    # ARGV[4] names the hash (fwd, rw or meta: the caller's choice of key), then (field, value) pairs.
    "set_fields": (PRELUDE,),
    "add_summary": (PRELUDE,),
    # The conversation's lock is the last KEY: while a turn holds it (on any replica) its pending
    # messages are that turn's. Returns how many were marked failed, -1 when locked.
    "fail_pending": (PRELUDE,),
    "import": (PRELUDE, INBOX_ANCHORS),
    # KEYS: meta, rparts; ARGV: the stamp, then (hash, JSON record without its number and stamp) per
    # part. Keeps the parts not kept yet as "<n>:<stamp>:<JSON>" (n = 1, 2, ... in order kept), if
    # the conversation is stored; returns the hashes newly kept. The record (meta) does not change.
    "add_request_parts": (),
    "messages": (PRELUDE,),
    "record": (PRELUDE,),
    "post_inbox": (PRELUDE,),
    "deliver_inbox": (PRELUDE, INBOX_ANCHORS),
    "inbox": (PRELUDE, INBOX_ANCHORS),
    # KEYS = versions hash, versions by time, the tenant's index, the tenants set; ARGV = namespace,
    # base version, tenant, the version's JSON, its created_at. Returns the new version, or 0.
    "put_knowledge": (),
    # Locks and leases are token-checked: only the holder releases or extends one.
    "release": (),
    # A lock that vanished (expired while our event loop stalled, or Redis restarted empty) is taken
    # back if nobody else took it meanwhile.
    "extend": (),
}

_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")


def load(constants: Mapping[str, str], source: Traversable | None = None) -> dict[str, str]:
    """Every script in SCRIPTS by name, its pieces read from `source` (this package by default) and
    its `${NAME}` placeholders filled from `constants`. Raises FileNotFoundError for a missing file,
    ValueError for a placeholder not in `constants` or a constant no script uses."""
    folder = source if source is not None else files(__name__)
    filled: dict[str, str] = {}
    used: set[str] = set()
    for name in (PRELUDE, INBOX_ANCHORS, *SCRIPTS):
        path = folder / f"{name}.lua"
        if not path.is_file():
            raise FileNotFoundError(f"Redis Lua script {name}.lua is missing from {folder}")
        text = path.read_text(encoding="utf-8")
        named = set(_PLACEHOLDER.findall(text))
        if unknown := named - constants.keys():
            raise ValueError(f"Redis Lua script {name}.lua: unknown placeholders {sorted(unknown)}")
        used |= named
        filled[name] = _PLACEHOLDER.sub(lambda match: constants[match.group(1)], text)
    if unused := constants.keys() - used:
        raise ValueError(f"Redis Lua scripts: constants no script uses: {sorted(unused)}")
    # Each piece after a newline: the layout the scripts had as Python strings, kept so their texts
    # (and so their sha1s, tests/test_redis_lua.py) are the same.
    return {name: "".join("\n" + filled[piece] for piece in (*shared, name)) for name, shared in SCRIPTS.items()}
