"""Token counting: plausible counts, one tokenization per distinct message, offline, context windows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tiktoken

from proxy.tokens import (
    MODEL_PRICES_FILE,
    PER_MESSAGE,
    PER_NAME,
    TokenCounter,
    context_windows,
    encoding_name,
    litellm_dir,
    lookup_names,
    use_bundled_encodings,
)

ROOT = Path(__file__).resolve().parent.parent


def o200k() -> tiktoken.Encoding:
    use_bundled_encodings()  # as the counter does: no download, whatever ran before
    return tiktoken.get_encoding("o200k_base")


# openai-cookbook "How to count tokens with tiktoken": the API bills this prompt 129 tokens on
# gpt-4 / gpt-3.5-turbo and 124 on gpt-4o / gpt-4o-mini (3 of them prime the reply).
COOKBOOK = [
    {
        "role": "system",
        "content": "You are a helpful, pattern-following assistant that translates corporate jargon into plain English.",
    },
    {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
    {"role": "system", "name": "example_assistant", "content": "Things working well together will increase revenue."},
    {
        "role": "system",
        "name": "example_user",
        "content": "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Let's talk later when we're less busy about how to do better.",
    },
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean for the client deliverable.",
    },
]


@pytest.mark.parametrize(
    ("model", "billed"), [("gpt-4", 129), ("gpt-3.5-turbo", 129), ("gpt-4o", 124), ("gpt-4o-mini", 124)]
)
def test_counts_match_what_openai_bills(model: str, billed: int) -> None:
    counter = TokenCounter()
    assert sum(counter.count(m, model) for m in COOKBOOK) + 3 == billed


def test_a_message_is_its_text_plus_the_framing() -> None:
    text = "The quick brown fox jumps over the lazy dog. " * 20
    n = len(o200k().encode(text))
    counter = TokenCounter()
    assert counter.count({"role": "user", "content": text}, "gpt-4o") == n + 1 + PER_MESSAGE
    parts = {"role": "user", "content": [{"type": "text", "text": text}, {"type": "text", "text": text}]}
    assert counter.count(parts, "gpt-4o") == 2 * n + 1 + PER_MESSAGE
    named = {"role": "user", "name": "alice", "content": text}
    assert counter.count(named, "gpt-4o") == n + 1 + 1 + PER_NAME + PER_MESSAGE


def test_tool_calls_and_results_are_counted() -> None:
    counter = TokenCounter()
    args = json.dumps({"path": "src/proxy/tokens.py", "pattern": "def count", "context": 5})
    call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_abc123", "type": "function", "function": {"name": "grep", "arguments": args}}],
    }
    two_calls = {**call, "tool_calls": call["tool_calls"] * 2}
    result = {"role": "tool", "tool_call_id": "call_abc123", "content": "src/proxy/tokens.py:42: def count(...)"}
    one = counter.count(call, "gpt-4o")
    assert len(o200k().encode(args)) < one < 60
    assert counter.count(two_calls, "gpt-4o") > 2 * one - 10
    assert 15 < counter.count(result, "gpt-4o") < 40


def test_images_count_without_their_url_bytes() -> None:
    counter = TokenCounter()
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 100_000}}
    low = {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}}
    assert 700 < counter.count({"role": "user", "content": [image]}, "gpt-4o") < 800
    assert 80 < counter.count({"role": "user", "content": [low]}, "gpt-4o") < 100


@pytest.mark.parametrize(
    ("model", "encoding"),
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-4o-mini-2024-07-18", "o200k_base"),
        ("gpt-4.1-mini", "o200k_base"),
        ("gpt-5", "o200k_base"),
        ("o3-mini", "o200k_base"),
        ("openai/gpt-4o", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("text-davinci-003", "cl100k_base"),  # p50k is not bundled: cl100k rather than a download
        ("claude-3-5-sonnet-20241022", "cl100k_base"),
        ("my-local-model", "cl100k_base"),
    ],
)
def test_tokenizer_by_model(model: str, encoding: str) -> None:
    assert TokenCounter().tokenizer_name(model) == encoding


def test_non_openai_models_go_to_litellm_only_when_asked() -> None:
    assert encoding_name("anthropic/claude-sonnet-4") is None
    assert (
        TokenCounter(use_litellm=True).tokenizer_name("anthropic/claude-sonnet-4")
        == "litellm:anthropic/claude-sonnet-4"
    )
    assert TokenCounter(use_litellm=True).tokenizer_name("gpt-4o") == "o200k_base"


def test_same_message_is_tokenized_once() -> None:
    counter = TokenCounter()
    msg = {"role": "tool", "tool_call_id": "call_1", "content": "x = 1\n" * 1000}
    first = counter.count(msg, "gpt-4o")
    assert counter.count(msg, "gpt-4o") == first
    assert counter.count(json.loads(json.dumps(msg)), "gpt-4o") == first  # an equal copy: same entry
    assert counter.count({**msg, "refusal": None}, "gpt-4o") == first  # nothing counted changed
    assert counter.encodes == 1
    counter.count(msg, "gpt-4")  # another encoding is another count
    counter.count({**msg, "content": msg["content"] + "y"}, "gpt-4o")
    assert counter.encodes == 3


def test_cache_is_a_bounded_lru() -> None:
    counter = TokenCounter(max_entries=2)
    a, b, c = ({"role": "user", "content": s} for s in "abc")
    counter.count(a, "gpt-4o")
    counter.count(b, "gpt-4o")
    counter.count(a, "gpt-4o")  # a is now the most recent: b goes first
    counter.count(c, "gpt-4o")
    assert counter.encodes == 3
    counter.count(a, "gpt-4o")
    assert counter.encodes == 3
    counter.count(b, "gpt-4o")
    assert counter.encodes == 4


def test_context_windows_from_litellms_table() -> None:
    counter = TokenCounter()
    assert counter.context_window("gpt-4o-mini") == 128_000
    assert counter.context_window("openai/gpt-4o-mini") == 128_000
    assert counter.context_window("ft:gpt-4o-mini-2024-07-18:acme::abc123") == 128_000
    assert counter.context_window("gpt-4") == 8192
    assert counter.context_window("no-such-model-anywhere") is None
    assert counter.context_window("") is None


def test_the_windows_read_while_parsing_are_the_whole_tables() -> None:
    """context_windows drops each model's entry as the table is parsed (for memory): what it
    keeps must be what reading the whole table gives, every model with a positive window."""
    path = litellm_dir() / MODEL_PRICES_FILE
    table = json.loads(path.read_bytes())
    whole = {
        name: entry["max_input_tokens"] for name, entry in table.items()
        if isinstance(entry, dict) and type(entry.get("max_input_tokens")) is int and entry["max_input_tokens"] > 0
    }
    assert len(whole) > 1000  # the bundled table, not an empty one
    assert context_windows() == whole


def test_lookup_names() -> None:
    assert list(lookup_names("openrouter/openai/gpt-4o")) == ["openrouter/openai/gpt-4o", "openai/gpt-4o", "gpt-4o"]


OFFLINE_PROBE = """
import json, os, sys
from proxy.tokens import TokenCounter
c = TokenCounter()
msg = {"role": "user", "content": "hello world"}
print(json.dumps({
    "gpt-4o": c.count(msg, "gpt-4o"),
    "gpt-4": c.count(msg, "gpt-4"),
    "window": c.context_window("gpt-4o-mini"),
    "cache_dir": os.environ.get("TIKTOKEN_CACHE_DIR"),
    "litellm_imported": "litellm" in sys.modules,
}))
"""


def offline_env(tmp_path: Path) -> dict[str, str]:
    """No network (proxies on a closed port), a fresh HOME and temp dir, no tiktoken cache chosen."""
    closed = "http://127.0.0.1:9"
    env = {
        k: v for k, v in os.environ.items() if k.upper() not in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR", "NO_PROXY")
    }
    env.update(
        HOME=str(tmp_path),
        TMPDIR=str(tmp_path),
        HTTPS_PROXY=closed,
        HTTP_PROXY=closed,
        https_proxy=closed,
        http_proxy=closed,
        ALL_PROXY=closed,
        HF_HUB_OFFLINE="1",
    )
    return env


def test_counts_offline_from_the_encodings_litellm_ships(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", OFFLINE_PROBE],
        cwd=ROOT,
        env=offline_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    probe = json.loads(out.stdout)
    assert probe["gpt-4o"] == probe["gpt-4"] == 2 + 1 + PER_MESSAGE
    assert probe["window"] == 128_000
    assert probe["cache_dir"].endswith(os.path.join("litellm", "litellm_core_utils", "tokenizers"))
    assert not probe["litellm_imported"]  # found and read, never imported
    assert "cannot load" not in out.stderr


def test_litellm_counter_when_asked(tmp_path: Path) -> None:
    # In a subprocess: importing litellm takes seconds and ~190 MB the test process need not hold.
    probe = (
        "import sys; from proxy.tokens import TokenCounter\n"
        "msg = {'role': 'user', 'content': 'hello world, how are you today?'}\n"
        "print(TokenCounter(use_litellm=True).count(msg, 'anthropic/claude-sonnet-4'), TokenCounter().count(msg, 'gpt-4'),"
        " 'litellm' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env=offline_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    litellm_count, cl100k_count, imported = out.stdout.split()
    assert imported == "True"
    assert abs(int(litellm_count) - int(cl100k_count)) <= 2


def test_a_message_repeated_in_one_prompt_is_counted_once() -> None:
    counter = TokenCounter()
    same = [{"role": "assistant", "content": "ok, continuing"} for _ in range(5)]
    counter.count_many(same, "gpt-4o-mini")
    counter.count_many(same, "gpt-4o-mini")
    assert counter.encodes == 1


def test_short_texts_are_counted_once_in_a_bounded_memo() -> None:
    """A role, a tool's name, a call id: tiktoken's cost is the call, so their counts are kept,
    the same as tiktoken's own, at most SHORT_TEXTS of them (then the memo starts again)."""
    from proxy.tokens import SHORT_TEXT_CHARS, SHORT_TEXTS, _counter

    class Counted:  # the real encoding, its calls counted
        def __init__(self) -> None:
            self.encoding, self.calls = o200k(), 0

        def encode_ordinary(self, text: str) -> list[int]:
            self.calls += 1
            return self.encoding.encode_ordinary(text)

    enc = Counted()
    count = _counter(enc)
    texts = ["assistant", "<|endoftext|>", "call_\ud800x", "x" * SHORT_TEXT_CHARS, "y" * (SHORT_TEXT_CHARS + 1)]
    assert [count(t) for t in texts] == [len(enc.encoding.encode_ordinary(t)) for t in texts]
    enc.calls = 0
    assert [count(t) for t in texts] == [count(t) for t in texts]
    assert enc.calls == 2  # only the long text, each time
    for i in range(SHORT_TEXTS):
        count(f"id_{i}")
    enc.calls = 0
    count("assistant")
    assert enc.calls == 1  # the memo filled and started again: bounded
