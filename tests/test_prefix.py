"""The prefix cache: what it reuses, and that it stays within its bound."""

from __future__ import annotations

from proxy.identity import ConversationKey
from proxy.prefix import PrefixCache

A, B = ConversationKey("t", "a"), ConversationKey("t", "b")


def msgs(*texts: str) -> list[dict]:
    return [{"role": "user", "content": t} for t in texts]


def test_known_prefix_is_the_equal_leading_part_of_the_last_request():
    cache = PrefixCache(max_bytes=10_000)
    cache.remember(A, msgs("x", "y", "z"), ["hx", "hy", "hz"], size=100)
    assert cache.known_prefix(A, msgs("x", "y", "z", "new")) == ["hx", "hy", "hz"]
    assert cache.known_prefix(A, msgs("x", "edited", "z")) == ["hx"]
    assert cache.known_prefix(B, msgs("x")) == []


def test_the_bound_evicts_least_recently_used_and_refuses_giants():
    # An entry takes PARSED bytes per byte of its body and HASH_BYTES per hash: 2 * 140 + 120 = 400.
    cache = PrefixCache(max_bytes=1_000)
    cache.remember(A, msgs("a"), ["ha"], size=140)
    cache.remember(B, msgs("b"), ["hb"], size=140)
    assert cache.held == 800
    cache.known_prefix(A, msgs("a"))  # A is now the most recently used
    cache.remember(ConversationKey("t", "c"), msgs("c"), ["hc"], size=140)
    assert cache.known_prefix(B, msgs("b")) == [] and cache.known_prefix(A, msgs("a")) == ["ha"]
    assert cache.held == 800
    cache.remember(A, msgs("huge"), ["hh"], size=250)  # over half the bound: not kept, old entry dropped
    assert cache.known_prefix(A, msgs("a")) == [] and cache.known_prefix(A, msgs("huge")) == []
    assert cache.held == 400


def test_the_bound_counts_conversations_too():
    cache = PrefixCache(max_bytes=10**9, max_entries=2)
    for name in ("a", "b", "c"):
        cache.remember(ConversationKey("t", name), msgs(name), ["h"], size=10)
    assert cache.known_prefix(ConversationKey("t", "a"), msgs("a")) == []  # the least recently used went
    assert cache.known_prefix(ConversationKey("t", "c"), msgs("c")) == ["h"]


# -- the body cache: a request that appends items is parsed only where it is new ------------------

import asyncio  # noqa: E402
import json  # noqa: E402

import orjson  # noqa: E402

from proxy.prefix import BodyCache, ParsedBody  # noqa: E402

KEY = ("tenant", "chat", "conversation")


def first(cache: BodyCache, raw: bytes) -> None:
    """A full parse of `raw`, kept as the conversation's last request (its items' hashes made up)."""
    parsed = asyncio.run(cache.full(KEY, raw, orjson.loads(raw), "messages"))
    assert parsed.entry is not None, "where the transcript closes was found"
    cache.remember(KEY, parsed, [f"h{i}" for i in range(len(parsed.body["messages"]))])


def body(messages: list[dict], **after: object) -> bytes:
    """As an SDK sends it: spaces after separators, keys after the transcript."""
    return json.dumps({"model": "m", "messages": messages, **after}).encode()


def test_appended_items_are_parsed_alone_and_the_rest_is_the_last_requests():
    cache = BodyCache()
    old = msgs("a", "b")
    first(cache, body(old, tools=[{"type": "function"}], stream=False))
    new = body([*old, *msgs("c", "d")], tools=[{"type": "function"}], stream=False)
    parsed = cache.extend(KEY, new, "messages")
    assert parsed is not None and parsed.reused == 2 and parsed.hashes == ["h0", "h1"]
    assert parsed.body == json.loads(new)  # what a full parse gives
    assert parsed.body["messages"][0] is parsed.origin.raws[0]  # the previous request's own objects


def test_anything_but_an_append_is_parsed_whole():
    cache = BodyCache()
    old = msgs("a", "b")
    first(cache, body(old, stream=False))
    refused = {
        "an edited item": body([*msgs("a", "B"), *msgs("c")], stream=False),
        "a changed parameter": body([*old, *msgs("c")], stream=True),
        "an item taken out": body(msgs("a"), stream=False),
        "a trailing comma": body(old, stream=False).replace(b"}], ", b"},], "),
        "two arrays": body(old, stream=False).replace(b"}], ", b"}], [1], "),
    }
    for what, raw in refused.items():
        assert cache.extend(KEY, raw, "messages") is None, what
    assert cache.extend(("other", "chat", "conversation"), body([*old, *msgs("c")], stream=False), "messages") is None


def test_the_transcript_end_is_proven_not_guessed():
    """A `]` that looks like the transcript's end but is inside a later value is not taken for it."""
    cache = BodyCache()
    raw = b'{"messages": [{"role": "user", "content": "a"}], "stream": [1], "stream": true}'
    parsed = asyncio.run(cache.full(KEY, raw, orjson.loads(raw), "messages"))
    assert parsed.entry is not None and parsed.entry.tail.startswith(b'], "stream": [1]')
    # Proven without comparing the bodies (no recursion however deep: validation refuses it later).
    deep = b'{"messages": [' + b"[" * 990 + b"]" * 990 + b"]}"
    entry = asyncio.run(cache.full(KEY, deep, orjson.loads(deep), "messages")).entry
    assert entry is not None and entry.tail == b"]}"


def test_the_cache_is_bounded_and_says_what_it_let_go():
    gone = []
    cache = BodyCache(max_bytes=30_000, on_evict=gone.append)
    for i in range(6):
        key = ("t", "chat", f"c{i}")
        raw = body(msgs("x" * 2000))
        parsed = asyncio.run(cache.full(key, raw, orjson.loads(raw), "messages"))
        cache.remember(key, parsed, ["h"])
    assert 0 < len(gone) < 6 and cache.held <= 30_000
    assert cache.extend(("t", "chat", "c0"), body([*msgs("x" * 2000), *msgs("y")]), "messages") is None  # evicted first


def test_a_client_whose_bodies_never_extend_the_last_one_stops_being_split():
    """Claude Code moves its cache breakpoint to the newest message: no body extends the last
    one by bytes, so proving where each transcript closes (a second parse) would buy nothing.
    After two such bodies in a row only every eighth is split; one that extends starts it over."""
    cache = BodyCache()

    def send(raw: bytes) -> ParsedBody:
        parsed = cache.extend(KEY, raw, "messages") or asyncio.run(cache.full(KEY, raw, orjson.loads(raw), "messages"))
        cache.remember(KEY, parsed, ["h"] * len(parsed.body["messages"]))
        return parsed

    history = msgs("task")
    split = []
    for turn in range(12):
        marked = [*history[:-1], {**history[-1], "cache_control": {"type": "ephemeral"}}]
        split.append(send(body(marked)).entry is not None)
        history.append({"role": "user", "content": f"step {turn}"})
    assert split == [True, True, False, False, False, False, False, False, True, False, False, False]
    # Then the client sends plain appends: split again at the next retry, extended from then on.
    while send(body(history)).entry is None:
        history.append({"role": "user", "content": "next"})
    assert len(history) == 17  # split at the 16th miss in a row (a retry), 4 bodies later
    assert send(body([*history, *msgs("more")])).reused == len(history)
    assert send(body([*history, *msgs("more", "again")])).reused == len(history) + 1
