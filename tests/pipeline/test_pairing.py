"""The pairing guard: transcripts broken on purpose still reach the strict upstream as valid ones."""

from __future__ import annotations

import pytest

from tests.conftest import ALICE, live_messages

CALL = {"id": "call_a", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
CALL_B = {"id": "call_b", "type": "function", "function": {"name": "ls", "arguments": "{\"x\": 1}"}}
NO_RESULT = "[context-proxy: no result was recorded for this tool call]"

BROKEN = {
    "orphan tool result": (
        [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "call_zzz", "content": "stray"}],
        [{"role": "user", "content": "hi"}],
    ),
    "call without result, then a user message": (
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
         {"role": "user", "content": "never mind"}],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
         {"role": "tool", "tool_call_id": "call_a", "content": NO_RESULT}, {"role": "user", "content": "never mind"}],
    ),
    "one of two parallel results missing": (
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [CALL, CALL_B]},
         {"role": "tool", "tool_call_id": "call_b", "content": "b"}],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [CALL, CALL_B]},
         {"role": "tool", "tool_call_id": "call_b", "content": "b"}, {"role": "tool", "tool_call_id": "call_a", "content": NO_RESULT}],
    ),
    "result answering an older call": (
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
         {"role": "tool", "tool_call_id": "call_a", "content": "a"}, {"role": "user", "content": "again"},
         {"role": "tool", "tool_call_id": "call_a", "content": "late duplicate"}],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
         {"role": "tool", "tool_call_id": "call_a", "content": "a"}, {"role": "user", "content": "again"}],
    ),
}


@pytest.mark.parametrize("case", BROKEN)
def test_broken_transcript_is_repaired_before_the_upstream_sees_it(proxy, upstream, http, case):
    sent, repaired = BROKEN[case]
    response = http.post(
        "/v1/chat/completions",
        json={"model": "m", "messages": sent},
        headers={"Authorization": f"Bearer {ALICE}", "X-Conversation-ID": "broken"},
    )
    assert response.status_code == 200, response.text
    assert upstream.chat_requests()[-1]["messages"] == repaired
    # The record keeps what the client really sent.
    assert live_messages(http, "broken")[: len(sent)] == sent
