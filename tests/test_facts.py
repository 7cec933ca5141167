"""Key facts: which identifiers a summary must keep, and which it lost."""

from __future__ import annotations

from proxy.compaction.facts import identifiers, missing_facts, with_key_facts

WINDOW = (
    "Edited src/proxy/app.py at line 42 and tests/test_app.py; see https://example.com/x?y=1. "
    "Commit 3f2a9bc1d, ticket PROJ-881, Python 3.11.7, port 8080, call_abc123 out_12_abcdef. "
    "Config /etc/nginx/nginx.conf, id 123e4567-e89b-12d3-a456-426614174000.\nline 00017: ok"
)


def test_identifiers_are_found_without_our_own_ids():
    found = identifiers(WINDOW)
    for fact in ("src/proxy/app.py", "tests/test_app.py", "https://example.com/x?y=1", "3f2a9bc1d", "PROJ-881",
                 "3.11.7", "8080", "42", "/etc/nginx/nginx.conf", "123e4567-e89b-12d3-a456-426614174000"):
        assert fact in found
    assert not any(f.startswith(("call_", "out_")) for f in found)


def test_missing_facts_put_names_first_and_skip_log_counters():
    missing = missing_facts(WINDOW, "The agent edited src/proxy/app.py.", limit=40)
    assert "src/proxy/app.py" not in missing and "00017" not in missing
    assert missing.index("PROJ-881") < missing.index("8080")  # names before bare numbers
    assert missing_facts(WINDOW, "", limit=3) == [f for f in missing if not f.isdigit()][-3:]
    assert missing_facts(WINDOW, "", limit=0) == []


def test_key_facts_are_appended_verbatim():
    text = with_key_facts("Summary.", ["src/a.py", "8080"])
    assert text.endswith("Key facts (kept verbatim from the summarized messages):\n- src/a.py\n- 8080")
    assert with_key_facts("Summary.", []) == "Summary."
