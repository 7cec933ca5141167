"""The bench's agent transcripts (bench/workload.py and its wire formats): one generated
transcript serves every conversation, but two conversations must share no message but the
system prompt, as two real agents' do not (else a cache keyed by message makes a new
conversation's first turn look cheap)."""

from __future__ import annotations

import json

import pytest

from bench.messages_workload import MessagesConversation
from bench.responses_workload import ResponsesConversation
from bench.workload import SYSTEM_PROMPT, Conversation

TRANSCRIPT = {Conversation: "messages", ResponsesConversation: "input", MessagesConversation: "messages"}


@pytest.mark.parametrize("kind", [Conversation, ResponsesConversation, MessagesConversation], ids=lambda k: k.__name__)
def test_two_conversations_share_no_message_but_the_system_prompt(kind: type) -> None:
    def messages(conversation_id: str) -> list[str]:
        body = json.loads(kind(conversation_id, "agent200").body("m", False))
        return [json.dumps(m, sort_keys=True) for m in body[TRANSCRIPT[kind]]]

    one, other = messages("bench-1"), messages("bench-2")
    assert len(one) == len(other) >= 199  # Messages: the system prompt is not a message
    shared = set(one) & set(other)
    assert all(SYSTEM_PROMPT in m for m in shared), shared
    assert len(shared) <= 1
