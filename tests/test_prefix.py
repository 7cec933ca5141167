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
    cache = PrefixCache(max_bytes=1_000)
    cache.remember(A, msgs("a"), ["ha"], size=400)
    cache.remember(B, msgs("b"), ["hb"], size=400)
    cache.known_prefix(A, msgs("a"))  # A is now the most recently used
    cache.remember(ConversationKey("t", "c"), msgs("c"), ["hc"], size=400)
    assert cache.known_prefix(B, msgs("b")) == [] and cache.known_prefix(A, msgs("a")) == ["ha"]
    cache.remember(A, msgs("huge"), ["hh"], size=900)  # over half the bound: not kept, old entry dropped
    assert cache.known_prefix(A, msgs("a")) == [] and cache.known_prefix(A, msgs("huge")) == []
