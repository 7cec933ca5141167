"""Storage: one interface (`Store`), one backend per module."""

from __future__ import annotations

from ..config import ConfigError, StorageSettings
from ..marks import LIVE_ORDER_MARK, RUNS_MARK, THREAD_MARK
from .base import (
    APPEND,
    BEFORE,
    FAILED,
    INBOX_DELIVERED,
    INBOX_DELIVERING,
    INBOX_PENDING,
    INCOMPLETE,
    INTERNAL,
    LIVE,
    PART_KINDS,
    PENDING,
    SEQ_LISTS,
    SUPERSEDED,
    SYSTEM_PART,
    TOOLS_PART,
    AdminStore,
    Conversation,
    ConversationDump,
    ConversationExists,
    HistoryStore,
    InboxFull,
    InboxMessage,
    InboxStore,
    KeyFact,
    KnowledgeStore,
    KnowledgeVersion,
    LeaseStore,
    QuotedMessage,
    RequestPart,
    Store,
    StoredMessage,
    StoreError,
    StoreFull,
    StoreHealth,
    StoreLifecycle,
    StoreReadOnly,
    StoreUnavailable,
    Summary,
    SummaryStore,
    TurnFacts,
    TurnRecord,
    TurnStore,
    part_hash,
    part_json,
)

__all__ = [
    "APPEND", "BEFORE", "FAILED", "INBOX_DELIVERED", "INBOX_DELIVERING", "INBOX_PENDING", "INCOMPLETE", "INTERNAL",
    "LIVE", "LIVE_ORDER_MARK", "PENDING", "RUNS_MARK", "SEQ_LISTS", "SUPERSEDED", "THREAD_MARK", "Conversation", "ConversationDump", "ConversationExists", "InboxFull",
    "InboxMessage", "KeyFact", "KnowledgeVersion", "QuotedMessage", "Store", "StoreError", "StoreFull", "StoreHealth",
    "StoreReadOnly", "StoreUnavailable", "StoredMessage", "Summary", "TurnFacts", "TurnRecord", "open_store",
    "AdminStore", "HistoryStore", "InboxStore", "KnowledgeStore", "LeaseStore", "StoreLifecycle", "SummaryStore", "TurnStore",
    "PART_KINDS", "SYSTEM_PART", "TOOLS_PART", "RequestPart", "part_hash", "part_json",  # the request parts
]


def open_store(settings: StorageSettings) -> Store:
    """The backend named by `storage.backend`."""
    if settings.backend == "diskcache":
        from .disk import DiskStore

        return DiskStore(settings.path, reserve_bytes=int(settings.reserve_mb * 1024 * 1024))
    if settings.backend == "redis":
        from .redis import RedisStore

        return RedisStore(settings.redis_url, lock_ttl_s=settings.redis_lock_ttl_s)
    raise ConfigError(f"storage.backend: {settings.backend!r} is not available in this build yet")
