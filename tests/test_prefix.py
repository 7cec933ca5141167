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
from typing import Any  # noqa: E402

import orjson  # noqa: E402
import pytest  # noqa: E402

from proxy.prefix import OPENING_SLOTS, VOLATILE_BYTES, BodyCache, ParsedBody, _proven  # noqa: E402
from proxy.request_limits import OFFLOAD_BYTES  # noqa: E402

KEY = ("tenant", "chat", "conversation")


def extend(cache: BodyCache, *args: Any) -> ParsedBody | None:
    return asyncio.run(cache.extend(*args))


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
    parsed = extend(cache, KEY, new, "messages")
    assert parsed is not None and parsed.reused == 2 and parsed.hashes == ["h0", "h1"]
    assert parsed.body == json.loads(new)  # what a full parse gives
    assert parsed.body["messages"][0] is parsed.origin.raws[0]  # the previous request's own objects


def test_anything_but_an_append_or_a_resent_tail_is_parsed_whole():
    cache = BodyCache()
    old = msgs("a", "b")
    first(cache, body(old, stream=False))
    refused = {
        "an edited item before the last ones": body([*msgs("A", "b"), *msgs("c")], stream=False),
        "a changed parameter": body([*old, *msgs("c")], stream=True),
        "an item taken out": body(msgs("a"), stream=False),
        "a trailing comma": body(old, stream=False).replace(b"}], ", b"},], "),
        "two arrays": body(old, stream=False).replace(b"}], ", b"}], [1], "),
    }
    for what, raw in refused.items():
        assert extend(cache, KEY, raw, "messages") is None, what
    assert extend(cache, ("other", "chat", "conversation"), body([*old, *msgs("c")], stream=False), "messages") is None


def test_the_transcript_end_is_proven_not_guessed():
    """A `]` that looks like the transcript's end but is inside a later value is not taken for it.
    A full parse only guesses where the transcript closes; the first request that would extend
    the body at that guess has it proven first (one more parse), and the real end found."""
    cache = BodyCache()
    raw = b'{"messages": [{"role": "user", "content": "a"}], "stream": [1], "stream": true}'
    parsed = asyncio.run(cache.full(KEY, raw, orjson.loads(raw), "messages"))
    cache.remember(KEY, parsed, ["h0"])
    guessed = parsed.entry
    assert guessed is not None and not guessed.proven and guessed.tail == b'], "stream": true}'  # the `]` of [1]
    at_the_guess = raw[: len(guessed.head)] + b', {"role": "user", "content": "b"}' + raw[len(guessed.head) :]
    assert extend(cache, KEY, at_the_guess, "messages") is None  # no message was added: parsed whole
    assert guessed.proven and guessed.tail.startswith(b'], "stream": [1]')  # the transcript's own end
    appended = raw.replace(b'"a"}]', b'"a"}, {"role": "user", "content": "b"}]')
    extended = extend(cache, KEY, appended, "messages")
    assert extended is not None and extended.reused == 1 and extended.body == orjson.loads(appended)
    # Proven without comparing the bodies (no recursion however deep: validation refuses it later).
    deep = b'{"messages": [' + b"[" * 990 + b"]" * 990 + b"]}"
    parsed = asyncio.run(cache.full(KEY, deep, orjson.loads(deep), "messages"))
    cache.remember(KEY, parsed, ["h0"])
    assert parsed.entry is not None and parsed.entry.tail == b"]}"
    deeper = deep[:-2] + b", [[1]]]}"
    extended = extend(cache, KEY, deeper, "messages")
    assert extended is not None and parsed.entry.proven and extended.body["messages"][-1] == [[1]]


def test_a_body_no_request_extends_is_parsed_once():
    """What a full parse keeps costs no second parse until a request would extend it, or its
    turn is over (`prove_soon`: below)."""
    cache = BodyCache()
    raw = body(msgs("a", "b", "c"), stream=False)
    parsed = asyncio.run(cache.full(KEY, raw, orjson.loads(raw), "messages"))
    cache.remember(KEY, parsed, ["h0", "h1", "h2"])
    assert parsed.entry is not None and not parsed.entry.proven and parsed.entry.separators  # guessed, unproven
    assert extend(cache, KEY, body(msgs("A", "b", "c", "d"), stream=False), "messages") is None  # no extension: no proof
    assert not parsed.entry.proven
    extended = extend(cache, KEY, body(msgs("a", "b", "c", "d"), stream=False), "messages")
    assert extended is not None and extended.reused == 3 and parsed.entry.proven


def test_a_body_parsed_whole_is_proven_after_its_turn_not_on_the_next_ones_path():
    """`prove_soon` (the engine's, once a turn has answered) proves the body in a task of its
    own: the next request finds it proven, where the guess moved too. A request that comes while
    the proof runs (a large body's, in a thread) waits for that proof and gets the same result."""

    async def scenario() -> None:
        cache = BodyCache()
        raw = b'{"messages": [{"role": "user", "content": "a"}], "stream": [1], "stream": true}'
        parsed = await cache.full(KEY, raw, orjson.loads(raw), "messages")
        cache.remember(KEY, parsed, ["h0"])
        assert parsed.entry is not None and not parsed.entry.proven
        cache.prove_soon(KEY, "messages")
        assert not parsed.entry.proven  # not on the turn's own path
        await cache.idle()
        assert parsed.entry.proven and parsed.entry.tail.startswith(b'], "stream": [1]')  # the transcript's own end
        appended = raw.replace(b'"a"}]', b'"a"}, {"role": "user", "content": "b"}]')
        extended = await cache.extend(KEY, appended, "messages")
        assert extended is not None and extended.reused == 1 and extended.body == orjson.loads(appended)

        large = body(msgs(*("x" * 2_000 for _ in range(600))), stream=False)  # over OFFLOAD_BYTES: proven in a thread
        assert len(large) > OFFLOAD_BYTES
        parsed = await cache.full(KEY, large, orjson.loads(large), "messages")
        cache.remember(KEY, parsed, [f"h{i}" for i in range(600)])
        cache.prove_soon(KEY, "messages")
        proving = parsed.entry.proving
        extended = await cache.extend(KEY, body(msgs(*("x" * 2_000 for _ in range(600)), "y"), stream=False), "messages")
        assert extended is not None and extended.reused == 600 and extended.body["messages"][-1]["content"] == "y"
        assert proving is not None and proving.done() and parsed.entry.proven and parsed.entry.proving is proving

    asyncio.run(scenario())


def test_the_cache_is_bounded_and_says_what_it_let_go():
    gone = []
    cache = BodyCache(max_bytes=30_000, on_evict=gone.append)
    for i in range(6):
        key = ("t", "chat", f"c{i}")
        raw = body(msgs("x" * 2000))
        parsed = asyncio.run(cache.full(key, raw, orjson.loads(raw), "messages"))
        cache.remember(key, parsed, ["h"])
    assert 0 < len(gone) < 6 and cache.held <= 30_000
    assert extend(cache, ("t", "chat", "c0"), body([*msgs("x" * 2000), *msgs("y")]), "messages") is None  # evicted first


def test_a_body_out_of_the_cache_is_freed_though_its_turn_still_runs():
    """The turn that extended a body, and the fast path's memo of the turn before, name the
    previous entry until that turn ends; its bytes must not live as long (a whole body per turn
    in flight: 16 of the bench's 330 KB bodies at once). Replaced or evicted, an entry keeps its
    parsed objects (the turn reuses them) but not its body's bytes."""
    import tracemalloc

    filler = "x" * 1_000_000  # one large item: the body's bytes are ~1 MB
    cache = BodyCache()
    tracemalloc.start()
    try:
        first(cache, body(msgs(filler)))
        held = tracemalloc.get_traced_memory()[0]
        parsed = extend(cache, KEY, body(msgs(filler, "next")), "messages")
        assert parsed is not None and parsed.origin is not None
        cache.remember(KEY, parsed, ["h0", "h1"])
        # The previous body (1 MB) is gone though `parsed.origin`, its entry, is still named here;
        # what is held is the new body and the one parsed item both share.
        assert tracemalloc.get_traced_memory()[0] < held + 100_000
        assert len(parsed.origin.head) == 0 and parsed.origin.raws[0] is parsed.entry.raws[0]
    finally:
        tracemalloc.stop()
    # Evicted: its bytes go too, and nothing can be extended from it any more.
    small = BodyCache(max_bytes=6_000)  # an entry takes 3 bytes per byte of its body: room for two of these
    kept = []
    for name in ("one", "two", "three"):
        raw = body(msgs((name * 300)[:700]))
        kept.append(asyncio.run(small.full(("t", "chat", name), raw, orjson.loads(raw), "messages")))
        small.remember(("t", "chat", name), kept[-1], ["h"])
    assert [len(parsed.entry.head) == 0 for parsed in kept] == [True, False, False]
    assert extend(small, ("t", "chat", "one"), body(msgs(("one" * 300)[:700], "next")), "messages") is None


def send(cache: BodyCache, raw: bytes) -> ParsedBody:
    """`raw` read as the handler reads it, and kept (its items' hashes made up)."""
    parsed = extend(cache, KEY, raw, "messages") or asyncio.run(cache.full(KEY, raw, orjson.loads(raw), "messages"))
    cache.remember(KEY, parsed, ["h"] * len(parsed.body["messages"]))
    return parsed


def test_a_client_whose_bodies_never_extend_the_last_one_stops_being_split():
    """A client that rewrites the start of its history every turn (say, a clock in its first
    message): no body extends the last one, so keeping each (its memory, and finding where its
    transcript closes) would buy nothing. After two such bodies in a row only every eighth is
    split; one that extends starts it over."""
    cache = BodyCache()
    history = msgs("task")
    split = []
    for turn in range(12):
        stamped = [{**history[0], "content": f"task (turn {turn})"}, *history[1:]]
        split.append(send(cache, body(stamped)).entry is not None)
        history.append({"role": "user", "content": f"step {turn}"})
    assert split == [True, True, False, False, False, False, False, False, True, False, False, False]
    # Then the client sends plain appends: split again at the next retry, extended from then on.
    while send(cache, body(history)).entry is None:
        history.append({"role": "user", "content": "next"})
    assert len(history) == 17  # split at the 16th miss in a row (a retry), 4 bodies later
    assert send(cache, body([*history, *msgs("more")])).reused == len(history)
    assert send(cache, body([*history, *msgs("more", "again")])).reused == len(history) + 1


# -- a body whose last items come back changed (Claude Code's moving cache breakpoint) -----------

BREAKPOINT = {"type": "ephemeral"}


def marked(message: dict) -> dict:
    """As Claude Code marks its newest messages: a breakpoint on the last block (a string becomes a block)."""
    content = message["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    return {**message, "content": [*blocks[:-1], {**blocks[-1], "cache_control": BREAKPOINT}]}


def test_last_messages_sent_again_changed_are_parsed_from_a_separator_on():
    cache = BodyCache()
    old = msgs("a", "b", "c")
    first(cache, body([*old[:-1], marked(old[-1])], stream=True))
    raw = body([*old, *msgs("d"), marked(msgs("e")[0])], stream=True)  # "c" lost its breakpoint, two new
    parsed = extend(cache, KEY, raw, "messages")
    assert parsed is not None and parsed.body == json.loads(raw)
    assert parsed.reused == 2 and parsed.hashes == ["h0", "h1"]  # "c" is parsed again, from its new bytes
    assert parsed.body["messages"][1] is parsed.origin.raws[1]
    assert parsed.fresh == raw.rindex(b"]") - raw.index(b', {"role": "user", "content": "c"}')  # from the separator on


@pytest.mark.parametrize("dumps", [json.dumps, orjson.dumps], ids=["spaced", "compact"])
def test_a_claude_code_client_is_parsed_only_where_its_body_changed_turn_after_turn(dumps: Any):
    """Over a long run that moves one or two breakpoints each turn (or none: a plain append),
    sends a message as a string again or as blocks, and now and then edits an older message:
    every body read is exactly what a full parse gives; only the newest messages are parsed
    again, but for an edit a few messages back (parsed from a separator before it) or of the
    task (before any separator: parsed whole). Spaced as Python's json writes it, or compact as
    Claude Code (JavaScript) does: its separators are then found by its messages' dumps."""
    import random

    rng = random.Random(16)
    cache = BodyCache()
    history: list[dict] = [{"role": "user", "content": "task"}]
    whole = resent = 0
    for turn in range(60):
        edit = rng.choice([None, 0, -5]) if turn > 5 and rng.random() < 0.2 else None
        if edit is not None:
            history[edit] = {**history[edit], "content": f"{history[edit]['content']} (edited)"}
        history += [{"role": "assistant", "content": [{"type": "text", "text": f"answer {turn}, {{not a separator}}"}]},
                    {"role": "user", "content": f"result {turn}" + ' "quoted", [x], {y}' * rng.randrange(3)}]
        marks = rng.choice([0, 1, 1, 2])
        sent = [*history[: len(history) - marks], *map(marked, history[len(history) - marks :])]
        raw = dumps({"model": "m", "messages": sent, "tools": [{"name": "run"}], "stream": True})
        raw = raw if isinstance(raw, bytes) else raw.encode()
        parsed = extend(cache, KEY, raw, "messages")
        if parsed is None:
            whole += 1
            assert edit == 0 or turn == 0, turn
            parsed = asyncio.run(cache.full(KEY, raw, orjson.loads(raw), "messages"))
        else:
            assert edit != 0 and parsed.body == json.loads(raw), turn
            assert parsed.reused >= len(history) - (7 if edit else 4), turn
            reused = parsed.body["messages"][: parsed.reused]
            assert all(a is b for a, b in zip(reused, parsed.origin.raws, strict=False))
            resent += parsed.reused < len(parsed.origin.raws)
        cache.remember(KEY, parsed, [f"h{i}" for i in range(len(parsed.body["messages"]))])
    assert 1 < whole < 15 and resent > 30, (whole, resent)


def test_separators_read_off_the_elements_dumps_are_the_scans():
    """`_separators` given the parsed elements finds each compact one's end by its dump, and scans
    the rest: the same separators as the scan alone, however the elements are written and
    spaced (a dump that is not their bytes, a look-alike of one inside a string)."""
    import random

    from proxy.prefix import _separators

    rng = random.Random(7)
    writers = [orjson.dumps, lambda v: json.dumps(v).encode(), lambda v: json.dumps(v, ensure_ascii=False, indent=1).encode()]
    for _ in range(200):
        elements: list[Any] = []
        for i in range(rng.randrange(1, 8)):
            text = rng.choice(["plain", "é and \"quoted\"", '{"role":"user"},{', "x" * rng.randrange(50)])
            elements.append(rng.choice([{"role": "user", "content": text}, [i, {"k": text}], {"n": i, "f": 1.5}]))
        raw = b"[" + b"".join(
            (rng.choice([b",", b", ", b",\n  "]) if n else b"") + rng.choice(writers)(e) for n, e in enumerate(elements)
        ) + b"]"
        assert json.loads(raw) == elements
        start = rng.randrange(len(elements))
        at = 1 if start == 0 else _separators(raw, 1, len(raw) - 1, 0, start)[-1][0] + 1
        most = rng.randrange(len(elements) + 1)
        view = memoryview(raw)[: len(raw) - 1]
        scanned = _separators(view, at, len(view), start, most)
        assert _separators(view, at, len(view), start, most, elements) == scanned
        assert len(scanned) == min(most, len(elements) - 1 - start)


def test_a_separator_is_proven_not_guessed():
    """The separator a full parse found is proven with the transcript's end, in one parse with an
    item inserted at each: one inside a string or a block list is refused."""
    blocks = [{"type": "text", "text": "x, {y}"}, {"type": "text"}]
    raw = body([{"role": "user", "content": "a"}, {"role": "user", "content": blocks}])
    parsed = orjson.loads(raw)
    end = raw.rindex(b"]")  # the transcript is the body's last key
    top = raw.index(b", {", raw.index(b'"a"'))
    in_string, in_blocks = raw.index(b", {y}"), raw.index(b', {"type": "text"}')
    assert _proven(raw, end, parsed, "messages", (top, 1))
    assert not _proven(raw, end, parsed, "messages", (in_string, 1))
    assert not _proven(raw, end, parsed, "messages", (in_blocks, 1))
    entry = asyncio.run(BodyCache().full(KEY, raw, parsed, "messages")).entry
    assert entry is not None and entry.separators == ((top, 1),)


def test_an_unnamed_run_is_named_by_its_bytes_up_to_the_earliest_reply_marker():
    from proxy.prefix import run_fingerprint

    markers = (b'"function_call"', b'"assistant"')
    head = b'{"input":[{"role":"user","content":"say \\"assistant\\" or \\"function_call\\""},'
    chatty = head + b'{"role":"assistant","content":"ok"},{"type":"function_call","name":"ls"}'
    calling = head + b'{"type":"function_call","name":"ls"},{"role":"assistant","content":"ok"}'
    # The earliest marker wins whatever their order; a string's escaped quotes are no marker.
    assert run_fingerprint(chatty + b"]}", markers) == run_fingerprint(chatty + b',{"role":"user"}]}', markers) == hash(head + b'{"role":')
    assert run_fingerprint(calling + b"]}", markers) == hash(head + b'{"type":')
    # No reply yet: nothing names the run apart from others' first requests.
    assert run_fingerprint(head + b"]}", markers) is None


def test_a_runs_second_request_finds_its_first_in_an_opening_slot_and_takes_it_over():
    """A run's first request has no reply to name its run by: it is kept in a slot of its
    session's opening key, where the second request (named by its bytes up to that reply) looks
    when its own key holds nothing. Runs started together (a main thread, its subagent) each have
    a slot; a request that extends none of them is parsed whole."""
    cache = BodyCache()
    opening = ("tenant", "chat", "session")

    def start(*texts: str) -> ParsedBody:
        raw = body(msgs(*texts), stream=False)
        parsed = asyncio.run(cache.full(cache.opening_slot(opening), raw, orjson.loads(raw), "messages"))
        cache.remember(parsed.key, parsed, [f"h{i}" for i in range(len(texts))])
        return parsed

    main, sub = start("main task"), start("sub task")
    assert main.key != sub.key and cache.held == main.entry.size + sub.entry.size
    assert extend(cache, (*opening, 18), body(msgs("other task", "b"), stream=False), "messages", None, opening) is None
    run = (*opening, 17)
    second = extend(cache, run, body(msgs("main task", "b"), stream=False), "messages", None, opening)
    assert second is not None and second.reused == 1 and second.key == run
    assert second.origin is main.entry and cache._entries.get(run) is main.entry  # moved, not copied
    assert main.key not in cache._entries and cache._entries.get(sub.key) is sub.entry
    cache.remember(run, second, ["h0", "h1"])
    assert cache._entries.get(run) is second.entry and cache.held == second.entry.size + sub.entry.size
    third = extend(cache, run, body(msgs("main task", "b", "c"), stream=False), "messages", None, opening)
    assert third is not None and third.reused == 2
    slots = {cache.opening_slot(opening) for _ in range(OPENING_SLOTS * 2)}
    assert len(slots) == OPENING_SLOTS  # taken in turn: the oldest first request goes first


def test_a_body_whose_volatile_fields_alone_changed_at_its_end_still_extends_the_last_one():
    """Codex ends its bodies with `client_metadata`, new every request: the tail may differ in
    the dialect's volatile fields alone, found exactly (a look-alike in a new value or item is
    no place to split), and nowhere else."""
    cache, volatile = BodyCache(), frozenset({"meta"})

    def raw(messages: list[dict], meta: Any, tools: Any = ("ls",)) -> bytes:
        return orjson.dumps({"model": "m", "messages": messages, "tools": list(tools), "meta": meta})

    first_raw = raw(msgs("a", "b"), {"turn": 1, "at": 5})
    parsed = asyncio.run(cache.full(KEY, first_raw, orjson.loads(first_raw), "messages"))
    cache.remember(KEY, parsed, ["h0", "h1"])
    later = raw(msgs("a", "b", "c"), {"at": 6, "turn": 2})
    extended = extend(cache, KEY, later, "messages", None, None, volatile)
    assert extended is not None and extended.reused == 2 and extended.body == orjson.loads(later)
    assert list(extended.body) == ["model", "messages", "tools", "meta"] and bytes(extended.entry.head) + extended.entry.tail == later
    assert extend(cache, KEY, raw(msgs("a", "b", "c"), {"turn": 2}, tools=("ls", "cat")), "messages", None, None, volatile) is None
    assert extend(cache, KEY, later, "messages") is None  # the dialect says no field is volatile
    # A new value holding the previous tail's bytes before `meta` as structure, and `"meta"` itself
    # as a key of its own: the top-level one is where the tail's bytes stand right before it.
    lookalike = raw(msgs("a", "b", "c", "d"), {"q": [1], "tools": ["ls"], "meta": {"turn": 3}})
    assert b'],"tools":["ls"],"meta"' in lookalike
    found = extend(cache, KEY, lookalike, "messages", None, None, volatile)
    assert found is not None and found.reused == 2 and found.body == orjson.loads(lookalike)
    # Volatile fields over VOLATILE_BYTES are not looked through: the body is parsed whole.
    assert extend(cache, KEY, raw(msgs("a", "b", "c"), {"turn": "x" * VOLATILE_BYTES}), "messages", None, None, volatile) is None
    # The same bytes in a new item's string are escaped: no look-alike there.
    quoted = raw([*msgs("a", "b"), {"role": "user", "content": '],"tools":["ls"],'}], {"turn": 3})
    found = extend(cache, KEY, quoted, "messages", None, None, volatile)
    assert found is not None and found.body == orjson.loads(quoted)


def test_a_conversation_keeps_one_body_the_one_its_last_turn_sent():
    """A run whose first bytes changed (a client that turned to streaming: its run's key is its
    bytes up to its first reply) leaves no body behind under its old key, where no request of
    it looks again; a body kept there for another conversation since stays."""
    cache = BodyCache()
    mine, theirs = ConversationKey("t", "a"), ConversationKey("t", "b")
    before, after, later = ("t", "chat", None, 1), ("t", "chat", None, 2), ("t", "chat", None, 3)

    def keep(key: tuple, raw: bytes, conversation: ConversationKey) -> None:
        parsed = asyncio.run(cache.full(key, raw, orjson.loads(raw), "messages"))
        cache.remember(key, parsed, [f"h{i}" for i in range(len(parsed.body["messages"]))], conversation)

    keep(before, body(msgs("a"), stream=False), mine)
    keep(after, body(msgs("a", "b"), stream=True), mine)
    assert extend(cache, before, body(msgs("a", "c"), stream=False), "messages") is None  # let go
    assert extend(cache, after, body(msgs("a", "b", "c"), stream=True), "messages") is not None
    assert cache.held == cache._entries[after].size
    keep(before, body(msgs("x"), stream=False), theirs)
    keep(later, body(msgs("a", "b", "c"), stream=False), mine)  # mine moves on from `after`
    assert extend(cache, after, body(msgs("a", "b", "c", "d"), stream=True), "messages") is None
    assert extend(cache, before, body(msgs("x", "y"), stream=False), "messages") is not None  # theirs stays
