"""A conversation's words for people: its task, read through the real codecs from real first
requests (tests/samples), its title, and the client named from a User-Agent; and the usage
figures of every wire format in one shape."""

from __future__ import annotations

import json

import pytest

from proxy.clients import client_name
from proxy.dialects.chat import CHAT
from proxy.dialects.messages import MESSAGES
from proxy.dialects.responses import RESPONSES
from proxy.errors import InvalidRequest
from proxy.titles import MAX_OPENINGS, MAX_TASK_CHARS, check_title, task_of, title_from_task, without_wrapped_blocks
from proxy.usage import TokenUsage
from tests.support.harness import ROOT

SAMPLES = ROOT / "tests" / "samples"


def test_codex_s_task_is_what_the_person_typed_not_its_environment_block():
    body = json.loads((SAMPLES / "codex-session.json").read_text())["turn_1"]["body"]
    assert task_of(RESPONSES.codec, RESPONSES.transcript(body)) == "Run `echo hello` in the shell, then say what it printed."


@pytest.mark.parametrize("sample", ["claude-turn1.json", "claude-tool-continuation.json", "claude-resumed-turn.json"])
def test_claude_code_s_task_is_what_the_person_typed_not_its_reminders(sample):
    body = json.loads((SAMPLES / sample).read_text())
    body = body.get("body", body)
    assert task_of(MESSAGES.codec, MESSAGES.transcript(body)) == "Run `echo hello` with Bash and tell me what it printed."


def test_a_chat_task_skips_system_prompts_and_wrapped_blocks_and_is_cut():
    raws = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": "<system-reminder>\nbe nice\n</system-reminder>\n"},  # nothing but a block
        {"role": "user", "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>\nfix   the\nbuild <b>now</b>"}]},
    ]
    assert task_of(CHAT.codec, raws) == "fix the build <b>now</b>"  # a tag inside the sentence stays
    assert task_of(CHAT.codec, [{"role": "user", "content": "word " * 200}]) == ("word " * 200)[:MAX_TASK_CHARS].strip()
    assert task_of(CHAT.codec, [{"role": "system", "content": "only a system prompt"}]) is None


def test_openings_never_closed_stay_and_blocks_are_cut_within_a_bound():
    # Openings with no closing are the user's text (a regex over whole blocks rescanned the rest
    # of the message from each of them: seconds of the event loop for this one).
    assert task_of(CHAT.codec, [{"role": "user", "content": "<a>\n" * 16000}]) == ("<a> " * 75).strip()
    assert without_wrapped_blocks("<r>\nq\n</r>\n<a>\nfix <r>it</r>\n<b k='1'>\nx\n</b>done") == " \n<a>\nfix <r>it</r>\n done"
    blocks = "<r>x</r>\n" * (MAX_OPENINGS + 1)  # one more block than are looked at: it stays
    assert task_of(CHAT.codec, [{"role": "user", "content": blocks + "the task"}]) == "<r>x</r> the task"


def test_a_title_from_a_long_task_ends_at_a_word():
    assert title_from_task("short task") == "short task"
    long = "reconcile the quarterly ledger of every subsidiary against the bank statements and report the gaps"
    title = title_from_task(long)
    assert title == "reconcile the quarterly ledger of every subsidiary against the bank statements…"
    assert title_from_task(None) is None


@pytest.mark.parametrize(
    ("value", "expected"), [("  Q3 books ", "Q3 books"), ("", None), ("   ", None), (None, None), ("é" * 200, "é" * 200)]
)
def test_a_set_title_is_trimmed_and_empty_means_none(value, expected):
    assert check_title(value, "title") == expected


@pytest.mark.parametrize("value", ["x" * 201, 3, ["a"], "tab\there", "\udcff"])
def test_a_bad_title_is_refused_naming_where_it_came_from(value):
    with pytest.raises(InvalidRequest, match="X-Conversation-Title"):
        check_title(value, "X-Conversation-Title")


@pytest.mark.parametrize(
    ("agent", "name"),
    [
        ("codex_exec/0.171.0 (Debian 12.0.0; x86_64) unknown (codex_exec; 0.171.0)", "Codex 0.171.0"),
        ("codex_cli_rs/0.46.0 (Mac OS 15.1.0; arm64) iTerm.app/3.5.10", "Codex 0.46.0"),
        ("claude-cli/2.1.332 (external, sdk-cli)", "Claude Code 2.1.332"),
        ("Agents/Python 0.24.0", "OpenAI Agents SDK 0.24.0"),
        ("OpenAI/Python 1.99.1", "OpenAI Python SDK 1.99.1"),
        ("AsyncOpenAI/Python 1.99.1", "OpenAI Python SDK 1.99.1"),
        ("OpenAI/JS 4.104.0", "OpenAI Node SDK 4.104.0"),
        ("Anthropic/Python 0.72.0", "Anthropic Python SDK 0.72.0"),
        ("Anthropic/JS 0.128.0", "Anthropic TypeScript SDK 0.128.0"),
        ("curl/8.14.1", "curl 8.14.1"),
        ("python-httpx/0.28.1", "httpx 0.28.1"),
        ("my-agent/1.2 (linux)", "my-agent/1.2"),
        ("x" * 300, "x" * 64),
        ("", None),
        (None, None),
    ],
)
def test_the_client_is_named_from_its_user_agent(agent, name):
    assert client_name(agent) == name


@pytest.mark.parametrize(
    ("usage", "figures"),
    [
        # Chat Completions: cache reads inside prompt_tokens.
        ({"prompt_tokens": 120, "completion_tokens": 8, "prompt_tokens_details": {"cached_tokens": 100}}, TokenUsage(120, 8, 100)),
        # Responses: the same, under other names.
        ({"input_tokens": 90, "output_tokens": 5, "input_tokens_details": {"cached_tokens": 64}}, TokenUsage(90, 5, 64)),
        # Anthropic: input_tokens leaves the cache out; the whole prompt is the three together.
        (
            {"input_tokens": 10, "output_tokens": 7, "cache_read_input_tokens": 200, "cache_creation_input_tokens": 30},
            TokenUsage(240, 7, 200, 30),
        ),
        ({"input_tokens": 10, "output_tokens": 7, "cache_read_input_tokens": None}, TokenUsage(10, 7, 0, 0)),
        ({"prompt_tokens": True, "completion_tokens": -3}, TokenUsage(0, 0, 0)),  # nonsense counts as nothing
        ({"total_tokens": 5}, None),
        (None, None),
    ],
)
def test_usage_in_every_format_is_one_shape_with_cache_reads_inside_the_input(usage, figures):
    assert TokenUsage.reported(usage) == figures
