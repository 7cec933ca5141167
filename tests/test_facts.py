"""Key facts: which identifiers count, how they rank, and how they carry forward (pure functions;
the same rules through the proxy are in test_summaries.py)."""

from __future__ import annotations

import json

from proxy.compaction.facts import carried_facts, identifiers, key_facts, window_facts
from proxy.compaction.windows import Entry, entries
from proxy.dialects.chat import CHAT
from proxy.store import KeyFact, StoredMessage

WINDOW = (
    "Edited src/proxy/app.py at line 42 and tests/test_app.py; see https://example.com/x?y=1. "
    "Commit 3f2a9bc1d, ticket PROJ-881, Python 3.11.7, port 8080, call_abc123 out_12_abcdef. "
    "Config /etc/nginx/nginx.conf, id 123e4567-e89b-12d3-a456-426614174000.\nline 00017: ok"
)


def stored(seq: int, role: str, content: str | None = None, **fields) -> Entry:
    """A stored chat message, as compaction reads it."""
    return entries(CHAT.codec, [StoredMessage(seq, {"role": role, "content": content, **fields}, "h", "live", 0.0)])[0]


def call(path: str) -> dict:
    return {"tool_calls": [{"id": "c", "type": "function",
                            "function": {"name": "read_file", "arguments": json.dumps({"path": path, "offset": 120})}}]}


def test_identifiers_are_found_without_our_own_ids():
    found = identifiers(WINDOW)
    for fact in ("src/proxy/app.py", "tests/test_app.py", "https://example.com/x?y=1", "3f2a9bc1d", "PROJ-881",
                 "3.11.7", "8080", "42", "/etc/nginx/nginx.conf", "123e4567-e89b-12d3-a456-426614174000"):
        assert fact in found
    assert not any(f.startswith(("call_", "out_")) or f == "00017" for f in found)


def test_identifiers_keep_names_and_drop_noise():
    text = ("edit src/server/main.py (port 8080) per https://docs.example.com/cfg, v2.4.1, PROJ-123, commit 3f9a2c1d; "
            "2024-05-12T12:04:46.403Z took 412 ms, 46.403, 99.5%, 12 KB, 0x7ffd12, de ad be ef 00, UTF-8, "
            "[... 26000 more characters] out_12_0123456789abcdef01234567 call_abc123def456ghi and/or "
            '[context-proxy: this tool output was shortened to the first 2000 of 30000 characters, ref "x".]')
    assert identifiers(text) == [
        "src/server/main.py", "8080", "https://docs.example.com/cfg", "v2.4.1", "PROJ-123", "3f9a2c1d",
    ]
    assert identifiers("order 10234 of 2024-05-12 at 12:04:46", numbers=False) == []
    assert identifiers("00000010: 4865 6c6c 6f20 776f  Hello wo") == []


def test_named_before_seen_then_repeated_then_recent():
    window = [
        stored(1, "user", "task"),
        stored(2, "assistant", None, **call("app/read_once.py")),
        stored(3, "tool", "lib/seen_twice.py lib/seen_once.py", tool_call_id="c"),
        stored(4, "tool", "lib/seen_twice.py", tool_call_id="c"),
        stored(5, "assistant", "Now app/named_twice.py and the table of 48213 rows."),
        stored(6, "user", "yes, app/named_twice.py"),
    ]
    facts = window_facts(window)
    assert facts["app/read_once.py"] == KeyFact("app/read_once.py", 1, 0, 2)
    assert "120" not in facts  # a JSON number in a call's arguments is an offset, not a fact
    ranked = [f.value for f in carried_facts(window, (), "", 0)]
    assert ranked == ["app/named_twice.py", "48213", "app/read_once.py", "lib/seen_twice.py", "lib/seen_once.py"]


def test_key_facts_skip_what_the_summary_shows_and_stay_within_their_budget():
    candidates = carried_facts([stored(1, "assistant", "a/one.py b/two.py c/three.py d/four.py")], (), "", 0)
    assert [f.value for f in key_facts(candidates, "we changed b/two.py", 10, 1000)] == ["a/one.py", "c/three.py", "d/four.py"]
    within = key_facts(candidates, "", 10, 25)  # two lines of 11-13 characters
    assert [f.value for f in within] == ["a/one.py", "b/two.py"]
    assert key_facts(candidates, "", 0, 1000) == []


def test_facts_carry_forward_and_add_up_their_counts():
    previous = [KeyFact("old/kept.py", 2, 1, 3)]
    window = [stored(10, "assistant", "again old/kept.py and new/one.py")]
    carried = {f.value: f for f in carried_facts(window, previous, "the summary named docs/guide.md", 9)}
    assert carried["old/kept.py"] == KeyFact("old/kept.py", 3, 1, 10)
    assert carried["docs/guide.md"] == KeyFact("docs/guide.md", 1, 0, 9)  # what the old text showed comes back
    assert carried["new/one.py"].named == 1
