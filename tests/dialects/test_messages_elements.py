"""The messages a Messages body is made of, as the fast path reuses them (proxy/engine/fastpath.py
splices a body from the previous one's bytes and the messages made again from one on): made
from any message's first item on, they are the whole prompt's messages from there."""

from __future__ import annotations

from typing import Any

from proxy.dialects.messages import MESSAGES, OMITTED_NOTE
from proxy.transcript import Item


def result(call: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call, "content": text, **extra}


def assistant(*calls: str, text: str = "") -> dict[str, Any]:
    blocks = [{"type": "text", "text": text}] if text else []
    return {"role": "assistant", "content": [*blocks, *({"type": "tool_use", "id": c, "name": "run", "input": {}} for c in calls)]}


TRANSCRIPT = [
    {"role": "user", "content": [{"type": "text", "text": "task"}, {"type": "text", "text": "<system-reminder>"}]},
    assistant("a", "b", text="two calls"),
    {"role": "user", "content": [result("a", "one"), result("b", "two"), {"type": "text", "text": "and a word",
                                                                              "cache_control": {"type": "ephemeral"}}]},
    assistant("c"),
    {"role": "user", "content": [result("c", "three", cache_control={"type": "ephemeral"})]},
    {"role": "assistant", "content": []},  # a reply that held only the proxy's calls: not sent
    {"role": "user", "content": "go on"},
    assistant("d"),
    {"role": "user", "content": [result("d", "four"), result("d2", "stray")]},
]


def prompt(transcript: list[dict[str, Any]]) -> list[Item]:
    raws = MESSAGES.transcript({"messages": transcript})
    return MESSAGES.codec.items(raws, list(range(1, len(raws) + 1)), [None] * len(raws))


def test_messages_made_from_any_messages_first_item_on_are_the_whole_prompts():
    items = prompt(TRANSCRIPT)
    body, elements = MESSAGES.upstream_body_elements({"model": "m", "messages": []}, items, [])
    assert elements is not None and elements.sendable == body["messages"]
    assert len(elements.firsts) == len(body["messages"]) and elements.firsts == sorted(elements.firsts)
    assert elements.breakpoints == 2 and elements.room == 4
    for m in range(1, len(elements.sendable)):
        again = MESSAGES.upstream_elements(items[elements.firsts[m] :])
        assert again is not None
        assert again.sendable == elements.sendable[m:], m
        assert [elements.firsts[m] + f for f in again.firsts] == elements.firsts[m:]
        assert again.breakpoints == MESSAGES.breakpoints(elements.sendable[m:])


def test_a_prompt_that_starts_on_an_assistant_message_gets_its_note_first():
    items = prompt(TRANSCRIPT)[1:]  # the window left the task out
    body, elements = MESSAGES.upstream_body_elements({"model": "m", "messages": []}, items, [])
    assert elements is not None and body["messages"][0] == {"role": "user", "content": OMITTED_NOTE}
    assert elements.firsts[0] == elements.firsts[1] == 0


def test_a_note_of_the_proxys_or_too_many_breakpoints_keep_a_body_from_being_reused():
    items = prompt(TRANSCRIPT)
    note = MESSAGES.codec.system_note("summary")
    assert MESSAGES.upstream_elements([note, *items[3:]]) is None  # it goes to `system`: the body's other part
    marked = {"system": [{"type": "text", "text": f"s{i}", "cache_control": {"type": "ephemeral"}} for i in range(3)]}
    body, elements = MESSAGES.upstream_body_elements({"model": "m", **marked}, items, [])
    assert elements is None  # five: the oldest message's was taken off
    assert sum(1 for m in body["messages"] for b in m["content"] if isinstance(b, dict) and "cache_control" in b) == 1
