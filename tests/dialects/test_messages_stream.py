"""A streamed Messages reply relayed with its text deltas read by their frame (frames.py) is the
relay that parses every event: the same bytes out, the same reply, the same view of it."""

from __future__ import annotations

import json
import random
from typing import Any

import orjson

from proxy.dialects.messages_stream import MessagesRelay
from tests.support.relays import network_reads, with_and_without_frames

TEXTS = ["Hello", ' "quoted" ', "back\\slash", "naïve — ünïcode", "line\nbreak", "text_delta", "?", "{}", "msg_1"]


def event(payload: dict[str, Any], write: Any = orjson.dumps) -> bytes:
    return b"event: " + payload["type"].encode() + b"\ndata: " + write(payload) + b"\n\n"


def block_events(rng: random.Random, index: int, kind: str) -> list[dict[str, Any]]:
    """One content block's events: a text, or a tool_use of `kind`'s name."""
    if kind == "thinking":
        start = {"type": "content_block_start", "index": index, "content_block": {"type": "thinking", "thinking": ""}}
        deltas = [{"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": "hm"}},
                  {"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": "c2ln"}}]
    elif kind == "text":
        start = {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}
        deltas = [{"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": rng.choice(TEXTS)}}
                  for _ in range(rng.randrange(1, 20))]
    else:
        start = {"type": "content_block_start", "index": index,
                 "content_block": {"type": "tool_use", "id": f"toolu_{index}", "name": kind, "input": {}}}
        deltas = [{"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": p}}
                  for p in ('{"q": ', '"x"}')]
    return [start, *deltas, {"type": "content_block_stop", "index": index}]


def stream(rng: random.Random) -> list[dict[str, Any]]:
    """A message: text blocks, perhaps the proxy's call (`recall`) between them, perhaps the client's."""
    kinds = [rng.choice(["text", "text", "recall", "run"]) for _ in range(rng.randrange(1, 5))]
    if rng.random() < 0.3:  # a round that opens with thinking: held while the proxy's call may come
        kinds.insert(0, "thinking")
    events: list[dict[str, Any]] = [{"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 5}}}]
    for index, kind in enumerate(kinds):
        events += block_events(rng, index, kind)
        if rng.random() < 0.2:
            events.append({"type": "ping"})
    stop = "tool_use" if {"recall", "run"} & set(kinds) else "end_turn"
    events += [{"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 9}}, {"type": "message_stop"}]
    return events


def test_a_relay_reading_text_deltas_by_their_frame_is_the_relay_that_parses_them():
    rng = random.Random(11)
    framed = 0
    for n in range(300):
        writes = [orjson.dumps, lambda p: json.dumps(p).encode()] if n % 3 == 0 else [orjson.dumps]
        data = b"".join(event(p, rng.choice(writes)) for p in stream(rng))
        chunks = network_reads(rng, data)
        ours = frozenset({"recall"}) if n % 2 else frozenset()
        fast, _ = with_and_without_frames(MessagesRelay, chunks, ours)
        if not ours:
            assert b"".join(fast.out) == data  # as it came
        framed += fast.framed
    assert framed > 100, framed


def text(index: int, words: str) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": words}}


def start(index: int, kind: str = "text", name: str = "") -> dict[str, Any]:
    block = {"type": "text", "text": ""} if kind == "text" else {"type": "tool_use", "id": f"toolu_{index}", "name": name, "input": {}}
    return {"type": "content_block_start", "index": index, "content_block": block}


OPENING = {"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 5}}}
CLOSING = [{"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}}, {"type": "message_stop"}]


def test_a_read_that_looks_like_a_text_delta_but_ends_an_event_begun_before_is_not_one():
    events = [event(p) for p in [OPENING, start(0), text(0, "a"), text(0, "b"), text(0, "c"), *CLOSING]]
    look_alike = event(text(0, "whole?"))
    # A frame learned, then half an event, then a read that is a text delta whole: one broken event.
    chunks = [*events[:4], events[4][:-10], look_alike, events[4][-10:], *events[5:]]  # cut in its JSON
    fast, _ = with_and_without_frames(MessagesRelay, chunks, frozenset())
    assert fast.framed and fast.reply[0][0]["content"][0]["text"] == "ab"  # the broken event's text is no one's


def test_deltas_of_a_block_never_started_are_dropped_as_a_parse_drops_them():
    chunks = [event(p) for p in [OPENING, text(0, "a"), text(0, "b"), start(1), text(1, "c"), text(1, "d"), *CLOSING]]
    for ours in (frozenset(), frozenset({"recall"})):
        fast, _ = with_and_without_frames(MessagesRelay, chunks, ours)
        assert fast.framed and fast.reply[0][0]["content"] == [{"type": "text", "text": "cd"}]


def test_a_late_delta_of_a_block_shown_under_another_index_goes_to_that_block():
    """Our call first: the client's blocks are renumbered. A delta of the first text block after the
    second started (no real stream does it, a hostile one may) is in the frame of its index, which
    is the second block's index as the client sees it."""
    ours = frozenset({"recall"})
    payloads = [OPENING, start(0, "tool_use", "recall"), {"type": "content_block_stop", "index": 0},
                start(1), text(1, "a"), text(1, "b"), start(2), text(1, "late"), text(2, "c"), *CLOSING]
    chunks = [event(p) for p in payloads]
    fast, _ = with_and_without_frames(MessagesRelay, chunks, ours)
    assert fast.framed and [b["text"] for b in fast.seen[0]["content"]] == ["ablate", "c"]
