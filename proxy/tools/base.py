"""What a proxy tool's factory reads of the turn it is offered on: a narrow view, so that tools/
needs nothing of the pipeline (whose `Turn` has all of it, and is what the exchange passes)."""

from __future__ import annotations

from typing import Protocol

from ..config import Profile
from ..identity import ConversationKey
from ..marks import Marks
from ..refs import RefSigner
from ..store import Conversation, Store, Summary
from ..tokens import TokenCounter
from ..transcript import Codec


class ToolReport(Protocol):
    """What the recall tools read of the turn's report (what left the prompt), and the marks
    they keep with the turn's end."""

    marks: dict[str, int]
    messages_left_out: int
    masked: int


class ToolContext(Protocol):
    key: ConversationKey
    codec: Codec  # how a tool reads a stored message's text in this request's wire format
    model: str
    store: Store
    profile: Profile
    counter: TokenCounter
    refs: RefSigner
    report: ToolReport
    summary: Summary | None  # the conversation's current compaction summary, if any
    marks: Marks
    conversation: Conversation | None  # its record as the turn began (None: its first turn)
    knowledge_namespace: str | None
    dry_run: bool  # a count (count_tokens): nothing is written
