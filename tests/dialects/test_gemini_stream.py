"""A streamed Gemini reply relayed with its text chunks read by their frame (frames.py) is the
relay that parses every chunk: the same bytes out, the same reply, view and usage."""

from __future__ import annotations

import json
import random
from typing import Any

import orjson

from proxy.dialects.gemini_stream import GeminiRelay
from tests.support.relays import network_reads, with_and_without_frames

TEXTS = ["Hello", ' "quoted" ', "back\\slash", "naïve — ünïcode", "line\nbreak", "model", "?", "7", "{}"]


def chunk(parts: list[dict[str, Any]], tokens: int | None, finish: str | None = None) -> dict[str, Any]:
    """A GenerateContentResponse chunk as Gemini streams it: the usage cumulative on every chunk."""
    candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
    if finish:
        candidate["finishReason"] = finish
    out: dict[str, Any] = {"candidates": [candidate]}
    if tokens is not None:
        out["usageMetadata"] = {"promptTokenCount": 5, "candidatesTokenCount": tokens, "totalTokenCount": 5 + tokens,
                                "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 5}]}
    return {**out, "modelVersion": "gemini-2.5-flash", "responseId": "r1"}


def stream(rng: random.Random) -> list[dict[str, Any]]:
    """Texts (a thought's first, sometimes), perhaps the proxy's call (`recall`) or the client's, a final chunk."""
    usage = rng.random() < 0.7
    tokens = 0
    out = []

    def next_tokens() -> int | None:
        nonlocal tokens
        tokens += rng.randrange(1, 9)
        return tokens if usage else None

    if rng.random() < 0.3:
        out.append(chunk([{"text": "thinking", "thought": True}], next_tokens()))
    for _ in range(rng.randrange(1, 4)):
        out += [chunk([{"text": rng.choice(TEXTS)}], next_tokens()) for _ in range(rng.randrange(1, 15))]
        if rng.random() < 0.4:
            name = rng.choice(["recall", "run"])
            call: dict[str, Any] = {"functionCall": {"id": f"c{len(out)}", "name": name, "args": {"q": 1}}}
            if rng.random() < 0.5:
                call["thoughtSignature"] = "c2ln"
            out.append(chunk([call], next_tokens()))
    out.append(chunk([{"text": "."}], next_tokens(), finish="STOP"))
    return out


def relay_rounds(rounds: list[list[bytes]], ours: frozenset[str], frames: bool) -> list[Any]:
    """Rounds of one reply, as the exchange relays them (our calls answered between)."""
    relay = GeminiRelay()
    if not frames:
        relay._frames_left = 0
    seen = []
    for chunks in rounds:
        relay.begin_round(ours)
        seen.append([relay.feed(c) for c in chunks])
        end = relay.end_round()
        seen.append((end.reply.items, end.reply.response_id, [c.name for c in end.ours]))
    seen += [relay.release(), relay.closing(), relay.seen(), relay.usage]
    return seen


def test_a_relay_reading_text_chunks_by_their_frame_is_the_relay_that_parses_them():
    rng = random.Random(17)
    framed = 0
    for n in range(300):
        ending = rng.choice([b"\r\n\r\n", b"\n\n"])
        writes = [orjson.dumps, lambda p: json.dumps(p).encode()] if n % 3 == 0 else [orjson.dumps]
        data = b"".join(b"data: " + rng.choice(writes)(c) + ending for c in stream(rng))
        chunks = network_reads(rng, data)
        ours = frozenset({"recall"}) if n % 2 else frozenset()
        fast, _ = with_and_without_frames(GeminiRelay, chunks, ours)
        if not ours:
            assert b"".join(fast.out) == data.replace(b"\r", b"")  # as it came, LF-ended
        framed += fast.framed
    assert framed > 100, framed


def test_a_read_that_ends_a_chunk_begun_before_it_is_not_a_text_chunk_of_its_own():
    events = [b"data: " + orjson.dumps(chunk([{"text": t}], n)) + b"\r\n\r\n" for n, t in enumerate("abcd", 1)]
    look_alike = b"data: " + orjson.dumps(chunk([{"text": "whole?"}], 9)) + b"\r\n\r\n"
    chunks = [*events[:3], events[3][:-10], look_alike, events[3][-10:]]
    assert with_and_without_frames(GeminiRelay, chunks, frozenset())[0].framed


def test_a_signature_taken_off_our_call_goes_to_the_clients_next_call_not_to_a_text():
    """Our call carried the step's signature: it waits for the client's next call, past the text
    chunks read by their frame meanwhile."""
    ours = frozenset({"recall"})
    payloads = [chunk([{"text": "a"}], 1), chunk([{"text": "b"}], 2),
                chunk([{"functionCall": {"id": "c1", "name": "recall", "args": {}}, "thoughtSignature": "c2ln"}], 3),
                chunk([{"text": "c"}], 4), chunk([{"text": "d"}], 5),
                chunk([{"functionCall": {"id": "c2", "name": "run", "args": {}}}], 6, finish="STOP")]
    chunks = [b"data: " + orjson.dumps(p) + b"\r\n\r\n" for p in payloads]
    fast, _ = with_and_without_frames(GeminiRelay, chunks, ours)
    assert fast.framed and fast.seen[0]["parts"][-1].get("thoughtSignature") == "c2ln"


def test_a_later_rounds_text_chunks_read_by_the_first_rounds_frame_make_its_reply():
    """The frame outlives its round: a later round's reply (a new assembler) takes its id and usage
    from the text chunks read by it, as from parsed ones, though no parsed chunk follows them."""
    def texts(words: str, start: int) -> list[bytes]:
        return [b"data: " + orjson.dumps(chunk([{"text": w}], start + n)) + b"\r\n\r\n" for n, w in enumerate(words)]

    call = {"functionCall": {"id": "c1", "name": "recall", "args": {}}}
    first = [*texts("abc", 1), b"data: " + orjson.dumps(chunk([call], 4, finish="STOP")) + b"\r\n\r\n"]
    second = texts("de", 5)  # and the stream cut: no final chunk parsed
    ours = frozenset({"recall"})
    fast, slow = relay_rounds([first, second], ours, frames=True), relay_rounds([first, second], ours, frames=False)
    assert fast == slow
    assert fast[3][1] == "r1" and fast[-1]["candidatesTokenCount"] == 6


def test_a_usage_that_is_no_object_in_a_frames_place_is_parsed():
    """The usage's place holds an object in the frame: a chunk with another value there (a number) is
    parsed, and leaves the usage as it was."""
    events = [b"data: " + orjson.dumps(chunk([{"text": t}], n)) + b"\r\n\r\n" for n, t in enumerate("abc", 1)]
    odd = b"data: " + orjson.dumps({**chunk([{"text": "d"}], 4), "usageMetadata": 4}) + b"\r\n\r\n"
    fast, _ = with_and_without_frames(GeminiRelay, [*events, odd], frozenset())
    assert fast.framed and fast.usage["candidatesTokenCount"] == 3
