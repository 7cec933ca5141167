"""A streamed response relayed with its deltas read by their frame (frames.py) is the relay that
parses every event: the same bytes out, the same reply, the same view of it, the same numbering."""

from __future__ import annotations

import json
import random
from typing import Any

import orjson

from proxy.dialects.responses_stream import ResponsesRelay
from tests.support.relays import network_reads, relayed, with_and_without_frames

TEXTS = ["Hello", ' "quoted" ', "back\\slash", "naïve — ünïcode", "line\nbreak", "msg_1", "?", "7", "{}"]
RESPONSE = {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}


def item_events(rng: random.Random, index: int, kind: str, padded: bool) -> list[dict[str, Any]]:
    """One output item's events: a message with text deltas, a reasoning item, or a call of `kind`."""
    pad = (lambda: {"obfuscation": "x" * rng.randrange(1, 9)}) if padded else dict
    if kind == "message":
        texts = [rng.choice(TEXTS) for _ in range(rng.randrange(1, 20))]
        item = {"type": "message", "id": f"msg_{index}", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": "".join(texts), "annotations": []}]}
        at = {"item_id": item["id"], "output_index": index, "content_index": 0}
        return [
            {"type": "response.output_item.added", "output_index": index, "item": {**item, "status": "in_progress", "content": []}},
            {"type": "response.content_part.added", **at, "part": {"type": "output_text", "text": "", "annotations": []}},
            *({"type": "response.output_text.delta", **at, "delta": t, "logprobs": [], **pad()} for t in texts),
            {"type": "response.output_text.done", **at, "text": item["content"][0]["text"], "logprobs": []},
            {"type": "response.output_item.done", "output_index": index, "item": item},
        ]
    if kind == "reasoning":
        item = {"type": "reasoning", "id": f"rs_{index}", "summary": [{"type": "summary_text", "text": "hm"}]}
        at = {"item_id": item["id"], "output_index": index, "summary_index": 0}
        return [
            {"type": "response.output_item.added", "output_index": index, "item": {**item, "summary": []}},
            {"type": "response.reasoning_summary_text.delta", **at, "delta": "hm", **pad()},
            {"type": "response.output_item.done", "output_index": index, "item": item},
        ]
    item = {"type": "function_call", "id": f"fc_{index}", "call_id": f"call_{index}", "name": kind, "arguments": '{"q": 1}'}
    return [
        {"type": "response.output_item.added", "output_index": index, "item": {**item, "arguments": ""}},
        {"type": "response.function_call_arguments.delta", "item_id": item["id"], "output_index": index, "delta": '{"q": 1}'},
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]


def stream(rng: random.Random) -> list[dict[str, Any]]:
    """A response: messages, reasoning before some, perhaps the proxy's call (`recall`) or the client's."""
    kinds = []
    for _ in range(rng.randrange(1, 5)):
        if rng.random() < 0.3:
            kinds.append("reasoning")
        kinds.append(rng.choice(["message", "message", "recall", "run"]))
    padded = rng.random() < 0.5  # OpenAI's: an obfuscation string on every delta
    events: list[dict[str, Any]] = [{"type": "response.created", "response": RESPONSE},
                                    {"type": "response.in_progress", "response": RESPONSE}]
    for index, kind in enumerate(kinds):
        events += item_events(rng, index, kind, padded)
    events.append({"type": "response.completed", "response": {**RESPONSE, "status": "completed", "usage": {"input_tokens": 3}}})
    return [{"type": e["type"], "sequence_number": n, **e} for n, e in enumerate(events)]


def event(payload: dict[str, Any], write: Any = orjson.dumps) -> bytes:
    return b"event: " + payload["type"].encode() + b"\ndata: " + write(payload) + b"\n\n"


def test_a_relay_reading_deltas_by_their_frame_is_the_relay_that_parses_them():
    rng = random.Random(13)
    framed = 0
    for n in range(300):
        writes = [orjson.dumps, lambda p: json.dumps(p).encode()] if n % 3 == 0 else [orjson.dumps]
        data = b"".join(event(p, rng.choice(writes)) for p in stream(rng))
        chunks = network_reads(rng, data)
        ours = frozenset({"recall"}) if n % 2 else frozenset()
        fast, _ = with_and_without_frames(ResponsesRelay, chunks, ours)
        if not ours:
            assert b"".join(fast.out) == data  # as it came
        framed += fast.framed
    assert framed > 100, framed


def text(n: int, words: str, index: int = 0) -> dict[str, Any]:
    return {"type": "response.output_text.delta", "sequence_number": n, "item_id": "msg_1", "output_index": index,
            "content_index": 0, "delta": words, "logprobs": []}


def test_a_delta_numbered_otherwise_or_cut_is_parsed():
    """A frame holds where the client's next number goes: a delta the upstream numbered otherwise
    (an event of ours hidden before it) is renumbered by the parse; a read that ends an event begun
    before it is no delta of its own."""
    opening = [{"type": "response.created", "sequence_number": 0, "response": RESPONSE},
               {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
                "item": {"type": "message", "id": "msg_1", "role": "assistant", "content": []}}]
    events = [event(p) for p in [*opening, text(2, "a"), text(3, "b"), text(5, "c"), text(6, "d")]]
    look_alike = event(text(4, "whole?"))
    chunks = [*events[:4], events[4][:-10], look_alike, events[4][-10:], events[5]]
    for case in (events, chunks):
        assert with_and_without_frames(ResponsesRelay, case, frozenset())[0].framed
    renumbered = relayed(ResponsesRelay, events, frozenset()).out
    assert b'"sequence_number":4' in renumbered[4] and b'"sequence_number":5' in renumbered[5]


def test_a_delta_of_an_item_shown_under_another_index_is_renumbered():
    """The proxy's call hidden first: the message after it is the client's item 0. An upstream that
    numbers its events again from there (a hostile one) sends deltas whose sequence_number is the
    client's next: their output_index must still be changed, so they are parsed."""
    call = {"type": "function_call", "id": "fc_0", "call_id": "call_0", "name": "recall", "arguments": "{}"}
    message = {"type": "message", "id": "msg_1", "role": "assistant", "content": []}
    payloads = [
        {"type": "response.created", "sequence_number": 0, "response": RESPONSE},
        {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0, "item": call},
        {"type": "response.output_item.done", "sequence_number": 2, "output_index": 0, "item": call},
        {"type": "response.output_item.added", "sequence_number": 1, "output_index": 1, "item": message},
        text(2, "a", index=1), text(3, "b", index=1), text(4, "c", index=1),
    ]
    chunks = [event(p) for p in payloads]
    fast, _ = with_and_without_frames(ResponsesRelay, chunks, frozenset({"recall"}))
    assert fast.framed and all(b'"output_index":0' in out for out in fast.out[3:7])
