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


LOG = "\n".join(f"2024-05-01T10:{i % 60:02d}:00Z INFO order {10000 + i} processed in {i % 90} ms" for i in range(300))
CODE = "\n".join(f"    def value_{i % 50}(self, amount) -> Decimal:" if i % 7 else f"    return round(amount, {i % 4})" for i in range(400))
REPEATED = "src/invoicing/models.py src/invoicing/api.py src/invoicing/tax.py"


def facts_of(window) -> list[str]:
    return [f.value for f in carried_facts(window, (), "", 0)]


def test_key_facts_are_the_lines_unlike_their_neighbours_not_bare_tokens():
    log = LOG.replace("INFO order 10100 processed in 10 ms", "WARN ledger drift totals 48213 cents since the import")
    code = CODE.replace("    return round(amount, 2)", "    # NOTE: refunds are booked on the day they clear, not the day asked", 1)
    result = json.dumps({"id": 41, "status": "ok", "rows": [1, 2, 3], "note": "Refunds above the limit go to manual review."})
    found = facts_of([stored(1, "user", "task"), stored(2, "tool", log, tool_call_id="c"),
                      stored(3, "tool", code, tool_call_id="c"), stored(4, "tool", result, tool_call_id="c")])
    # The warning without its timestamp, the comment without its marker, the prose field with its key.
    assert set(found) == {"WARN ledger drift totals 48213 cents since the import",
                          "NOTE: refunds are booked on the day they clear, not the day asked",
                          "note: Refunds above the limit go to manual review."}


def test_the_assistants_findings_and_rare_names_count_while_filler_and_repeated_names_do_not():
    filler = "Done with this part: the change is in and the tests pass locally."
    window = [
        stored(1, "user", "task: fix the ledger"),
        *[stored(2 + i, "tool", REPEATED, tool_call_id="c") for i in range(4)],  # every listing names these
        stored(6, "assistant", None, **call("src/invoicing/models.py")),  # a file read again and again
        stored(7, "assistant", None, **call("src/exports/sepa_42.py")),  # a file read once
        *[stored(8 + i, "assistant", filler) for i in range(3)],
        stored(11, "assistant", "This is tracked as PAY-4821. I will look at the handler next."),
        stored(12, "assistant", "The root cause is in the rounding of credit notes."),
    ]
    found = facts_of(window)
    assert "This is tracked as PAY-4821." in found and "The root cause is in the rounding of credit notes." in found
    assert any("src/exports/sepa_42.py" in f for f in found)
    assert not any("src/invoicing/models.py" in f or filler in f or f == "task: fix the ledger" for f in found), found
    assert not any(f in ("PAY-4821", "src/exports/sepa_42.py") for f in found)  # statements, not tokens
    assert found.index("This is tracked as PAY-4821.") < found.index("The root cause is in the rounding of credit notes.")


def test_key_facts_skip_what_the_summary_shows_and_stay_within_their_budget():
    window = [stored(i, "assistant", f"The drift is in services/ledger/part_{i}.py for sure.") for i in range(1, 5)]
    candidates = carried_facts(window, (), "", 0)
    kept = key_facts(candidates, "we looked at services/ledger/part_2.py", 10, 1000)
    assert [f.value for f in kept] == [f"The drift is in services/ledger/part_{i}.py for sure." for i in (4, 3, 1)]
    within = key_facts(candidates, "", 10, 110)  # two lines of 52 characters
    assert len(within) == 2 and key_facts(candidates, "", 0, 1000) == []


def test_facts_carry_forward_keeping_their_best_score():
    previous = [KeyFact("The drift is in services/ledger/old.py.", 9, 1, 3)]
    window = [stored(10, "assistant", "The drift is in services/ledger/old.py. And services/ledger/new.py too, it turns out.")]
    carried = {f.value: f for f in carried_facts(window, previous, "", 9)}
    assert carried["The drift is in services/ledger/old.py."].named == 9
    assert carried["The drift is in services/ledger/old.py."].last_seq == 10
    assert "And services/ledger/new.py too, it turns out." in carried


def test_a_log_line_whose_level_is_not_its_neighbours_counts_whatever_the_log_format():
    lines = LOG.splitlines()
    lines[50] = '2024-05-01T10:50:00Z level=warn msg="retry budget exhausted while calling services/payouts/sepa_12.py"'
    lines[150] = "2024-05-01T10:30:00Z E [sepa] mandate store refused the batch of merchant 48213"
    lines[250] = "2024-05-01T10:10:00Z DEBUG cache warmed for tenant 48214"  # quiet levels stay noise
    found = facts_of([stored(1, "tool", "\n".join(lines), tool_call_id="c")])
    assert set(found) == {'level=warn msg="retry budget exhausted while calling services/payouts/sepa_12.py"',
                          "E [sepa] mandate store refused the batch of merchant 48213"}
