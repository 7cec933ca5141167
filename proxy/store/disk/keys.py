"""The embedded store's row names: one kind per prefix, then tenant and conversation id (SEP
between), numbers zero-padded so that a kind's rows sort in order.
"""

from __future__ import annotations

import zlib

from ...identity import ConversationKey

SEP = "\0"
TENANTS = "tenants"
SECRET = "ref-secret"
CREATED = "created-counter"
ALL_TENANTS = "\x01all"  # the index of every conversation (tenant names are hex: never this)
LEGACY_PENDING = "pending"  # before the buckets, one set of the conversations with pending messages
PENDING_BUCKETS = 64  # rows the pending flags are spread over: flagging one rewrites a small set
PROBE = "health-probe"  # written by health() to see whether a failed store writes again
FAILED_SCOPE = "\x02failed:"  # + a scope: the index of that scope's conversations with a failed turn
INDEX_PAGE = 1000  # conversations per index page: registering one rewrites one page, not an index


def conv_key(key: ConversationKey) -> str:
    return f"conv{SEP}{key.tenant}{SEP}{key.id}"


def numbered(kind: str, key: ConversationKey, number: int, digits: int = 12) -> str:
    """The key of one of a conversation's rows: its kind, the conversation, a zero-padded number."""
    return f"{kind}{SEP}{key.tenant}{SEP}{key.id}{SEP}{number:0{digits}d}"


def msg_key(key: ConversationKey, seq: int) -> str:
    return numbered("msg", key, seq)


def batch_key(key: ConversationKey, first: int) -> str:
    return numbered("batch", key, first)


def part_key(key: ConversationKey, first: int) -> str:
    return numbered("part", key, first)


def chunk_key(key: ConversationKey, number: int) -> str:
    return numbered("chunk", key, number, 8)


def rewrite_key(key: ConversationKey, seq: int) -> str:
    return numbered("rewrite", key, seq)


def turn_key(key: ConversationKey, turn: int) -> str:
    return numbered("turn", key, turn, 8)


def summary_key(key: ConversationKey, summary_id: int) -> str:
    return numbered("summary", key, summary_id, 8)


def pending_row(bucket: int) -> str:
    return f"pending{SEP}{bucket:02d}"


def pending_bucket(key: ConversationKey) -> str:
    # crc32, not hash(): a conversation's bucket must be the same in the next process
    return pending_row(zlib.crc32(f"{key.tenant}{SEP}{key.id}".encode()) % PENDING_BUCKETS)


def response_key(tenant: str, response_id: str) -> str:
    return f"response{SEP}{tenant}{SEP}{response_id}"


def inbox_key(key: ConversationKey, message_id: int) -> str:
    return numbered("inbox", key, message_id, 8)


def request_parts_key(key: ConversationKey) -> str:
    """The row of a conversation's request parts' index: {hash: n}, n = 1, 2, ... in order kept."""
    return f"rparts{SEP}{key.tenant}{SEP}{key.id}"


def request_part_key(key: ConversationKey, number: int) -> str:
    return numbered("rpart", key, number, 8)


def knowledge_key(tenant: str, namespace: str, version: int) -> str:
    return f"knowledge{SEP}{tenant}{SEP}{namespace}{SEP}{version:08d}"


def knowledge_index(tenant: str) -> str:
    """namespace -> its newest version number, for one tenant."""
    return f"knowledge-index{SEP}{tenant}"


KNOWLEDGE_TENANTS = "knowledge-tenants"


def index_page(scope: str, page: int) -> str:
    return f"index{SEP}{scope}{SEP}{page:012d}"
