"""A streamed chat reply read by its text deltas' frames (`ReplyAssembler.feed_text`) is the reply
a parse of every chunk gives."""

from __future__ import annotations

import json
import random
from typing import Any

import orjson

from proxy.dialects.chat_stream import ChatRelay
from proxy.upstream.sse import ReplyAssembler

TEXTS = ["Hello", ' "quoted" ', "back\\slash", "naïve — ünïcode", "line\nbreak", "chatcmpl-1", "content", "?", "\u2028", "{}"]


def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


def stream(rng: random.Random, varying: bool) -> list[dict[str, Any]]:
    """A reply's chunks: a role first, texts, perhaps a tool call's pieces, a finish, usage.
    `varying`: a string new in every chunk after the text (OpenAI's `obfuscation`)."""
    extra = (lambda: {"obfuscation": "x" * rng.randrange(1, 9)}) if varying else dict
    out = [chunk({"role": "assistant", "content": ""}, **extra())]
    for _ in range(rng.randrange(1, 30)):
        out.append(chunk({"content": rng.choice(TEXTS)}, **extra()))
    if rng.random() < 0.5:
        out.append(chunk({"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "run", "arguments": ""}}]}))
        out.append(chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1}'}}]}))
        out.append(chunk({"content": "after the call"}, **extra()))
    out.append(chunk({}, "stop", **extra()))
    out.append({**chunk({}), "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}})
    return out


def write(value: Any, rng: random.Random) -> bytes:
    """As an upstream might: orjson's compact form, or Python's (spaces, non-ASCII escaped)."""
    return orjson.dumps(value) if rng.random() < 0.7 else json.dumps(value).encode()


def test_text_deltas_read_by_their_frame_make_the_reply_a_parse_makes():
    rng = random.Random(3)
    framed, padded = 0, 0
    for n in range(200):
        chunks = stream(rng, varying=n % 5 == 0)
        payloads = [write(c, rng) for c in chunks]
        parsed, fast = ReplyAssembler(), ReplyAssembler()
        for c in chunks:
            parsed.feed_chunk(json.loads(json.dumps(c)))
        for payload in payloads:
            if fast.feed_text(payload):
                framed += 1
                padded += n % 5 == 0
            else:
                fast.feed(payload)
        assert fast.message() == parsed.message() and fast.usage == parsed.usage
        assert (fast.id, fast.finish_reason) == (parsed.id, parsed.finish_reason)
    assert framed > 1000 and padded > 100, (framed, padded)  # most text deltas, OpenAI's padded ones too


def test_a_stream_whose_frame_changes_every_chunk_stops_learning():
    assembler = ReplyAssembler()
    framed = 0
    for n in range(1, 20):
        payload = orjson.dumps({**chunk({"content": "t"}), "created": n})  # before the text: the frame's
        if assembler.feed_text(payload):
            framed += 1
        else:
            assembler.feed(payload)
    assert framed == 0 and assembler.frames_left == 0
    assert assembler.message()["content"] == "t" * 19


def test_bytes_in_a_frame_that_are_not_one_string_are_parsed():
    assembler = ReplyAssembler()
    assembler.feed(orjson.dumps(chunk({"content": "first"})))
    assert assembler.frame is not None
    before, after = assembler.frame
    for middle in (b"null", b"1", b'"a","x":"b"', b'"unclosed', b"[]"):
        assert not assembler.feed_text(before + middle + after)
    assert assembler.feed_text(before + b'"\\u00e9t\\u00e9"' + after)
    finish = before + b'"!"' + after.replace(b"null", b'"ab"')  # as long as the frame, another tail
    assert not assembler.feed_text(finish)
    assembler.feed(finish)
    assert assembler.message()["content"] == "firstété!" and assembler.finish_reason == "ab"


def test_a_padded_frame_reads_the_text_before_the_padding_whatever_either_holds():
    """OpenAI's chunks end with an `obfuscation` string of their own: the frame has a hole for it.
    Texts and paddings that hold the bytes between the two (escaped, or not JSON) are read right
    or parsed."""
    assembler = ReplyAssembler()
    between = b'},"finish_reason":null}],"obfuscation":'
    texts = ["a", '},"finish_reason":null}],"obfuscation":"', "b"]
    for n, text in enumerate(texts):
        payload = orjson.dumps(chunk({"content": text}, obfuscation="p" * (n + 1)))
        if not assembler.feed_text(payload):
            assembler.feed(payload)
    assert assembler.frame is not None and between in assembler.frame[1]
    before, _, after = assembler.frame
    assert not assembler.feed_text(before + b'"x"' + between + b"1" + after)  # padding not a string
    assert not assembler.feed_text(before + b'"x' + between + b'"p"' + after)  # a text cut short
    assert assembler.message()["content"] == "".join(texts)


def test_a_frame_is_proven_where_the_text_is():
    """A text also written earlier in its chunk (a field's value) is not taken for that field."""
    assembler = ReplyAssembler()
    for fingerprint, text in (("x", "x"), ("y", "x"), ("y", "y"), ("z", "y")):
        payload = orjson.dumps({"id": "c", "system_fingerprint": fingerprint,
                                "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})
        if not assembler.feed_text(payload):
            assembler.feed(payload)
    assert assembler.message()["content"] == "xxyy"


def test_the_relay_passes_framed_events_as_they_came_and_filters_our_calls():
    """With the proxy's tools in the round, a framed text delta still goes out byte for byte, and
    the proxy's call after it is taken out."""
    relay = ChatRelay()
    relay.begin_round(frozenset({"recall"}))
    texts = [chunk({"role": "assistant", "content": "a"}), chunk({"content": "b"}), chunk({"content": "c"})]
    call = chunk({"tool_calls": [{"index": 0, "id": "call_9", "function": {"name": "recall", "arguments": "{}"}}]})
    events = [b"data: " + orjson.dumps(c) + b"\n\n" for c in [*texts, call, chunk({}, "tool_calls")]]
    out = [relay.feed(e) for e in events]
    assert out[:3] == events[:3]
    assert out[3] == b"" and out[4] == b""  # our call, and the finish held while only ours were seen
    end = relay.end_round()
    assert [c.name for c in end.ours] == ["recall"] and end.reply.items[0]["content"] == "abc"


def test_the_relay_reads_a_stream_split_anywhere_as_its_lines_parsed_say():
    """However the bytes come (an event a read, several, an event cut in two, a read that looks
    like a whole text delta but ends a line begun before it), the relay assembles what the
    stream's lines say and passes every byte on as it came."""
    rng = random.Random(5)
    for n in range(100):
        chunks = stream(rng, varying=False)
        data = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)
        event = b"data: " + orjson.dumps(chunk({"content": "looks whole"})) + b"\n\n"
        reads, at = [], 0
        if n % 4 == 0:  # a line begun, then a read that is a text delta of its own: one broken line
            at = sum(len(b"data: " + orjson.dumps(c) + b"\n\n") for c in chunks[:3]) + 20  # a frame is known
            data = data[:at] + event + data[at:]
            reads, at = [data[:at], event], at + len(event)
        while at < len(data):
            step = rng.choice([len(event), 7, 300, data.find(b"\n\n", at) + 2 - at])
            reads.append(data[at : at + max(step, 1)])
            at += max(step, 1)
        relay = ChatRelay()
        relay.begin_round(frozenset())
        relayed = b"".join(relay.feed(r) for r in reads)
        parsed = ReplyAssembler()
        for line in data.split(b"\n"):
            if line.startswith(b"data: "):
                parsed.feed(line[6:])
        assert relayed == data
        assert relay.end_round().reply.items[0] == parsed.message(), n
