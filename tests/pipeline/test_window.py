"""The token window: which history goes upstream, by hand-built transcripts and by properties of
generated agent transcripts."""

from __future__ import annotations

import asyncio
import re
from types import SimpleNamespace
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from proxy.compaction.render import QUOTES_HEADER
from proxy.config import ContextSettings, Profile, Settings
from proxy.dialects.chat import CHAT
from proxy.engine.report import TurnReport
from proxy.identity import ConversationKey
from proxy.marks import Marks
from proxy.pipeline.base import Notes, StageRun
from proxy.pipeline.window import TokenWindow, build, effective_limit
from proxy.pipeline.window import select_window as select_items
from proxy.refs import RefSigner
from proxy.tokens import TokenCounter
from proxy.transcript import Item, Origin, Role, instructions_in, is_instruction, units
from tests.fakes.fake_upstream import validate_chat_request

Msg = dict[str, Any]
COUNTER = TokenCounter()  # shared: its cache makes the stage tests cheap


def system(text: str = "You are an agent.") -> Msg:
    return {"role": "system", "content": text}


def user(text: str = "do it") -> Msg:
    return {"role": "user", "content": text}


def say(text: str = "ok") -> Msg:
    return {"role": "assistant", "content": text}


def calls(*ids: str) -> Msg:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": i, "type": "function", "function": {"name": "run", "arguments": "{}"}} for i in ids],
    }


def result(call_id: str, text: str = "done") -> Msg:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def as_items(messages: list[Msg]) -> list[Item]:
    return CHAT.codec.items(messages, list(range(len(messages))), [None] * len(messages))


def select_window(messages: list[Msg], counts: list[int], limit: int) -> list[int]:
    return select_items(as_items(messages), counts, limit)


def history_blocks(messages: list[Msg], start: int) -> list[tuple[int, int]]:
    return units(as_items(messages), start)


def reply_reserve(body: dict[str, Any]) -> int:
    return CHAT.reply_reserve(body)


def roles(messages: list[Msg], kept: list[int]) -> list[str]:
    return [messages[i]["role"] for i in kept]


# -- the rules, by hand ---------------------------------------------------------------------------


def test_everything_fits_everything_goes() -> None:
    msgs = [system(), user(), calls("a"), result("a"), say(), user()]
    assert select_window(msgs, [10] * 6, 1000) == list(range(6))


def test_system_prefix_is_kept_and_not_counted() -> None:
    msgs = [system(), {"role": "developer", "content": "summary"}, user(), say(), user()]
    assert select_window(msgs, [1000, 1000, 10, 10, 10], 30) == [0, 1, 2, 3, 4]


def test_starts_on_a_user_message() -> None:
    msgs = [system(), user(), say(), user(), say(), say(), user()]
    # the last 4 fit (say, say, user + the user before them); the window starts on that user
    assert select_window(msgs, [5, 10, 10, 10, 10, 10, 10], 45) == [0, 3, 4, 5, 6]


def test_drops_assistant_messages_before_the_oldest_user_message_that_fits() -> None:
    msgs = [user(), say(), say(), user(), say()]
    # 4 messages would fit, but the 4th from the end is an assistant: start on the user after it
    assert select_window(msgs, [10] * 5, 40) == [3, 4]


def test_never_starts_with_a_tool_result_and_keeps_parallel_calls_whole() -> None:
    msgs = [user(), calls("a", "b", "c"), result("a"), result("b"), result("c"), say("summary of results")]
    # the three results fit without their call but never go without it; no user message fits, so
    # the longest valid suffix is the last assistant message alone
    kept = select_window(msgs, [10, 10, 10, 10, 10, 10], 45)
    assert kept == [5]
    kept = select_window(msgs, [10, 10, 10, 10, 10, 10], 50)
    assert kept == [1, 2, 3, 4, 5]


def test_a_tool_block_at_the_end_goes_whole() -> None:
    msgs = [user(), say(), user("go"), calls("a", "b"), result("a"), result("b")]
    assert select_window(msgs, [10] * 6, 40) == [2, 3, 4, 5]
    assert select_window(msgs, [10] * 6, 30) == [3, 4, 5]


def test_a_follow_up_after_a_tool_loop_keeps_the_end_of_the_loop() -> None:
    msgs = [user("task"), calls("a"), result("a"), say("step 1"), calls("b"), result("b"), say("step 2"), user("again")]
    # the task does not fit with everything after it: the newest user message comes with the
    # longest valid run before it, not alone
    assert select_window(msgs, [10] * 8, 55) == [3, 4, 5, 6, 7]
    assert select_window(msgs, [10] * 8, 45) == [4, 5, 6, 7]
    assert select_window(msgs, [10] * 8, 35) == [6, 7]  # the call block would not fit whole
    assert select_window(msgs, [10] * 8, 80) == list(range(8))


def test_everything_before_the_newest_user_message_goes_when_it_fits() -> None:
    msgs = [system(), say("Hi! How can I help?"), user()]
    assert select_window(msgs, [10, 10, 10], 100) == [0, 1, 2]


def test_newest_message_always_goes_even_over_the_limit() -> None:
    msgs = [system(), user(), say(), user("a very long question")]
    assert select_window(msgs, [5, 10, 10, 5000], 100) == [0, 3]


def test_an_over_limit_newest_tool_block_goes_whole_and_alone() -> None:
    msgs = [system(), user(), calls("a", "b"), result("a", "huge"), result("b")]
    assert select_window(msgs, [5, 10, 10, 9000, 10], 100) == [0, 2, 3, 4]


def test_only_system_messages() -> None:
    msgs = [system(), system("more")]
    assert select_window(msgs, [10, 10], 0) == [0, 1]
    assert select_window([], [], 10) == []


def test_blocks() -> None:
    msgs = [system(), user(), calls("a", "b"), result("a"), result("b"), say(), result("orphan"), user()]
    assert history_blocks(msgs, 1) == [(1, 2), (2, 5), (5, 6), (6, 7), (7, 8)]


def test_an_orphan_tool_result_never_starts_the_window_unless_it_is_the_newest() -> None:
    msgs = [user(), say(), result("orphan"), say()]
    assert select_window(msgs, [10] * 4, 25) == [3]
    assert select_window([say(), result("orphan")], [10, 10], 5) == [1]


def test_limit_is_capped_by_the_context_window() -> None:
    assert effective_limit(10_000, None, 4000, 500) == 10_000
    assert effective_limit(10_000, 128_000, 4000, 500) == 10_000
    assert effective_limit(10_000, 8192, 4000, 500) == 3692
    assert effective_limit(10_000, 8192, 9000, 0) == 0
    assert reply_reserve({"max_tokens": 100, "max_completion_tokens": 300}) == 300
    assert reply_reserve({"max_tokens": None, "max_completion_tokens": True}) == 0


# -- the stage --------------------------------------------------------------------------------------


def turn(
    model: str = "gpt-4o-mini", limit: int = 10_000, refill: float = 1.0, marks: dict | None = None, **body: Any
) -> SimpleNamespace:
    """What the stage reads of a Turn (by default a window that slides, for the rules' tests)."""
    profile = Profile(context=ContextSettings(history_token_limit=limit, window_refill=refill))
    report = TurnReport(ConversationKey("t", "c"), "chat", model)
    return SimpleNamespace(
        model=model, profile=profile, counter=COUNTER, codec=CHAT.codec, report=report,
        reply_reserve=CHAT.reply_reserve(body), fixed_tokens=0, proxy_tool_tokens=0, marks=Marks(marks),
        summary=None, key=report.key, refs=RefSigner(b"k" * 32), notes=Notes(),
    )


def run(stage: TokenWindow, t: SimpleNamespace, messages: list[Msg]) -> list[Item]:
    items = as_items(messages)
    frozen = [dict(m) for m in messages]
    out = asyncio.run(stage(t, items))  # type: ignore[arg-type]
    assert messages == frozen  # messages are never edited
    return out


def agent_run(steps: int, output: str) -> list[Msg]:
    msgs = [system(), user("fix the failing test")]
    for i in range(steps):
        msgs += [calls(f"c{i}a", f"c{i}b"), result(f"c{i}a", output), result(f"c{i}b", output), say(f"step {i}")]
    return [*msgs, user("now run it again")]


def test_stage_sends_the_window_and_notes_tokens_and_left_out() -> None:
    msgs = agent_run(30, "line of output\n" * 40)
    t = turn(limit=2000)
    out = run(build(Settings()), t, msgs)
    sent = [item.raw for item in out]
    assert sent[0] == msgs[0] and sent[-1] == msgs[-1]
    assert sent[1] == msgs[1] and out[1].pinned  # the task: left out by the window, so pinned
    assert sent[2]["role"] != "tool"
    assert validate_chat_request({"model": "gpt-4o-mini", "messages": sent}) is None
    counts = [COUNTER.count(m, "gpt-4o-mini") for m in sent]
    assert t.report.tokens_sent == sum(counts)
    assert sum(counts[1:]) <= 2000
    assert t.report.messages_left_out == len(msgs) - len(sent) > 0
    assert [item.seq for item in out] == [0, 1, *range(len(msgs) - len(sent) + 2, len(msgs))]


def test_user_messages_the_window_leaves_out_are_quoted_in_a_note_after_the_system_prompt() -> None:
    msgs = [system(), user("fix the parser"), say("on it"), user("never touch legacy/ please"), say("ok " * 300),
            user("x " * 300), say("y " * 300), user("and now?")]
    t = turn(limit=700)
    out = run(TokenWindow(), t, msgs)
    note = out[1].raw["content"]
    assert out[1].origin == "summary" and out[1].raw["role"] == "system"
    assert "never touch legacy/ please" in note and "fix the parser" not in note  # the task is pinned, not quoted
    assert out[2].raw == msgs[1] and out[-1].raw == msgs[-1]
    assert all(m.raw != msgs[3] for m in out[2:])  # left out of the window, kept in the note
    counts = [COUNTER.count(i.raw, "gpt-4o-mini") for i in out]
    assert t.report.tokens_sent == sum(counts)


def test_the_clients_instructions_anywhere_in_the_transcript_are_never_left_out() -> None:
    """A system message after the task (Claude Code's environment block) or mid-conversation is
    an instruction, not history: the window pins it in its place among the pinned, as the task."""
    env, later = system("# Environment\n - cwd: /home/dev/project"), system("From now on answer in French.")
    msgs = [system(), user("fix the parser"), env, say("y " * 300), later, user("x " * 300), say("z " * 300), user("go on")]
    t = turn(limit=200)
    out = run(TokenWindow(), t, msgs)
    sent = [item.raw for item in out]
    assert out[1].origin == "summary"  # the note quoting the user message it left out
    assert [sent[0], *sent[2:5]] == [msgs[0], msgs[1], env, later] and all(item.pinned for item in out[2:5])
    assert sent[-1] == msgs[-1] and msgs[3] not in sent  # history still cut
    assert t.report.messages_left_out == 3


def test_the_clients_instructions_in_the_transcript_take_nothing_from_the_history_budget() -> None:
    """Claude Code's environment block (~2k tokens, after the task) with a short tool loop and the
    fixed parts leaving little room: the instruction counts as the leading system items do, so
    the window cuts nothing, moves nothing, and sends the whole transcript as it came."""
    env = system("# Environment\n - Primary working directory: /home/dev/project\n" + "Be careful. " * 400)
    msgs = [user("Run echo hello"), env, calls("a"), result("a", "hello"), say("It printed hello."), user("Now say goodbye.")]
    t = turn(limit=600)
    out = run(TokenWindow(), t, msgs)
    assert [item.raw for item in out] == msgs
    assert t.report.messages_left_out == 0
    assert t.report.tokens_sent > 600  # the instruction is sent, and counted as sent
    # Past the limit, history is still cut; the instruction stays, pinned after the task.
    long = [user("Run echo hello"), env, say("x " * 700), user("go on")]
    out = run(TokenWindow(), turn(limit=600), long)
    assert [item.raw for item in out if item.origin is None] == [long[0], env, long[3]]


def test_a_new_instruction_is_never_added_by_the_fast_path_but_counted_by_the_whole_window() -> None:
    """`extend` adds new history items to a window that sent everything; an instruction is not
    history (it takes nothing from the history budget), so it takes the whole pipeline's count."""
    msgs = [system(), user("fix the parser"), say("on it")]
    t = turn(limit=1000, refill=0.5)
    stage = TokenWindow()
    out = run(stage, t, msgs)
    run_of = StageRun(as_items(msgs), out, t.notes)
    later = as_items([*msgs, user("go on"), system("From now on answer in French.")])
    assert asyncio.run(stage.extend(t, run_of, later[3:4])) == later[3:4]  # history: added
    assert asyncio.run(stage.extend(t, run_of, later[3:])) is None  # an instruction among them: the whole window


def test_stage_adds_to_what_earlier_stages_left_out() -> None:
    t = turn(limit=64)
    t.report.messages_left_out = 7
    out = run(TokenWindow(), t, [system(), user("x " * 200), say("y " * 200), user()])
    assert [i.raw["role"] for i in out] == ["system", "user", "user"]  # the task pinned, the newest
    assert t.report.messages_left_out == 8


def test_stage_keeps_everything_under_the_limit() -> None:
    msgs = agent_run(3, "short")
    t = turn()
    out = run(TokenWindow(), t, msgs)
    assert [item.raw for item in out] == msgs
    assert t.report.messages_left_out == 0


def test_stage_limit_leaves_room_for_the_reply_in_the_context_window() -> None:
    msgs = agent_run(40, "word " * 200)  # ~17k tokens of history
    big_system = system("rules " * 3000)  # ~3k tokens
    msgs[0] = big_system
    t = turn(model="gpt-4", limit=100_000, max_tokens=2000)  # gpt-4: 8192 tokens of context
    run(TokenWindow(), t, msgs)
    assert 8192 - 2000 - 1000 < t.report.tokens_sent <= 8192 - 2000


def test_stage_with_unknown_model_uses_the_configured_limit() -> None:
    msgs = agent_run(40, "word " * 200)
    t = turn(model="some-local-model", limit=5000, max_tokens=100_000)
    run(TokenWindow(), t, msgs)
    history = t.report.tokens_sent - COUNTER.count(msgs[0], "some-local-model")
    assert 4000 < history <= 5000


# -- properties of generated agent transcripts ------------------------------------------------------

text = st.text(alphabet="abc xyz\n", min_size=1, max_size=20)


@st.composite
def transcripts(draw: st.DrawFn) -> list[Msg]:
    """System prefix, then user / assistant text / assistant with 1-3 parallel calls, each
    followed by all its results, in any order and length."""
    msgs: list[Msg] = [
        {"role": draw(st.sampled_from(["system", "developer"])), "content": draw(text)}
        for _ in range(draw(st.integers(0, 2)))
    ]
    next_id = 0
    for kind in draw(st.lists(st.sampled_from(["user", "say", "calls"]), min_size=1, max_size=25)):
        if kind == "user":
            msgs.append(user(draw(text)))
        elif kind == "say":
            msgs.append(say(draw(text)))
        else:
            ids = [f"call_{next_id + k}" for k in range(draw(st.integers(1, 3)))]
            next_id += len(ids)
            msgs.append(calls(*ids))
            msgs += [result(i, draw(text)) for i in ids]
    return msgs


@st.composite
def windows(draw: st.DrawFn) -> tuple[list[Msg], list[int], int]:
    msgs = draw(transcripts())
    counts = draw(st.lists(st.integers(0, 50), min_size=len(msgs), max_size=len(msgs)))
    return msgs, counts, draw(st.integers(0, 400))


def newest_block_tokens(msgs: list[Msg], counts: list[int]) -> int:
    n_system = next((i for i, m in enumerate(msgs) if m["role"] not in ("system", "developer")), len(msgs))
    blocks = history_blocks(msgs, n_system)
    return sum(counts[blocks[-1][0] :]) if blocks else 0


@settings(max_examples=300, deadline=None)
@given(windows())
def test_window_properties(case: tuple[list[Msg], list[int], int]) -> None:
    msgs, counts, limit = case
    kept = select_window(msgs, counts, limit)
    n_system = next((i for i, m in enumerate(msgs) if m["role"] not in ("system", "developer")), len(msgs))
    history = kept[n_system:]

    # (a) the strict upstream accepts it
    assert validate_chat_request({"model": "gpt-4o-mini", "messages": [msgs[i] for i in kept]}) is None
    # (c) the system prefix, then a suffix of the rest
    assert kept[:n_system] == list(range(n_system))
    assert history == list(range(history[0], len(msgs))) if history else n_system == len(msgs)
    # (d) the newest message goes
    assert kept[-1] == len(msgs) - 1
    # (b) within the limit whenever the newest block is
    used = sum(counts[i] for i in history)
    if newest_block_tokens(msgs, counts) <= limit:
        assert used <= limit
    if history:
        # never on a tool result; before the newest block, on the oldest user message that fits
        # with everything after it, if any; else as far back as fits
        assert msgs[history[0]]["role"] != "tool"
        newest = history_blocks(msgs, n_system)[-1][0]
        fitting_users = [i for i in range(n_system, newest) if msgs[i]["role"] == "user" and sum(counts[i:]) <= limit]
        if fitting_users:
            assert history[0] == fitting_users[0]
        elif history[0] > n_system:
            before = history_blocks(msgs, n_system)
            previous = max(s for s, _ in before if s < history[0])
            assert sum(counts[previous:]) > limit or msgs[previous]["role"] == "tool"


def history_of(out: list[Item]) -> list[Item]:
    """What the window chose from the history: the output without system items, the pinned task, notes."""
    return [i for i in out if i.raw.get("role") not in ("system", "developer") and not i.pinned]


UNSETTLED = [  # found by hypothesis: the quotes had not settled by the last pass, which left "aa" out untraced
    *[{"role": "user", "content": "a"}] * 7,
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "run", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_0", "content": "a"},
    {"role": "user", "content": "aa"},
    {"role": "user", "content": "a"},
]


@settings(max_examples=100, deadline=None)
@given(transcripts(), st.integers(64, 2000))
@example(UNSETTLED, 64)
def test_stage_properties_with_real_counts(msgs: list[Msg], limit: int) -> None:
    t = turn(limit=limit)
    out = run(TokenWindow(), t, msgs)
    sent = [item.raw for item in out]
    assert validate_chat_request({"model": "gpt-4o-mini", "messages": sent}) is None
    assert sent[-1] is msgs[-1]
    notes = [i for i in out if i.origin == "summary"]
    assert t.report.messages_left_out == len(msgs) + len(notes) - len(sent)
    assert t.report.tokens_sent == sum(COUNTER.count(m, "gpt-4o-mini") for m in sent)
    users = [m for m in msgs if m["role"] == "user"]
    if users:  # the task goes, and every other user message goes, is quoted in the note or counted there
        assert any(m is users[0] for m in sent)
        note = notes[0].raw["content"] if notes else ""
        quoted = note.split(QUOTES_HEADER, 1)[-1] if QUOTES_HEADER in note else ""
        missing = [m for m in users[1:] if not any(m is s for s in sent) and f"- {m['content']}" not in quoted]
        counted = re.search(r"\((\d+) earlier user messages are not shown", note)
        assert len(missing) <= (int(counted.group(1)) if counted else 0)


class CountingEverything(TokenWindow):
    """The window as it would be if it counted every message: the reference for the one that
    counts only as far back as it can reach."""

    @staticmethod
    async def _tail_counts(items, head, limit, counted):  # type: ignore[override]
        return [0] * head + await counted(items[head:]), head


@settings(max_examples=100, deadline=None)
@given(transcripts(), st.integers(64, 2000))
def test_stage_counting_only_the_tail_chooses_what_counting_everything_would(msgs: list[Msg], limit: int) -> None:
    """The stage counts the newest messages only (as far back as the window can reach): the same
    window as counting every message's tokens."""
    expected = run(CountingEverything(), turn(limit=limit), msgs)
    out = run(TokenWindow(), turn(limit=limit), msgs)
    assert [(item.seq, item.raw) for item in out] == [(item.seq, item.raw) for item in expected]


def test_a_long_conversation_counts_only_its_window() -> None:
    msgs = agent_run(400, "line of output\n" * 5)  # 1,600 messages
    counter = TokenCounter()
    t = turn(limit=500)
    t.counter = counter
    run(TokenWindow(), t, msgs)
    assert counter.encodes < 200  # the window's reach, not the 1,600 messages


# -- cuts in steps ----------------------------------------------------------------------------------


def test_the_window_cuts_in_steps_and_keeps_its_start_until_the_limit_is_reached_again() -> None:
    """Between cuts each prompt extends the previous one; a cut fills only `refill` of the limit."""
    msgs = agent_run(60, "line of output\n" * 20)
    marks: dict[str, int] = {}
    starts, cuts = [], 0
    for end in range(42, len(msgs) - 1, 4):  # the conversation grows by one agent step a turn
        transcript = [*msgs[:end], user(f"turn {end}")]
        t = turn(limit=3000, refill=0.5, marks=dict(marks))
        out = run(TokenWindow(), t, transcript)
        history = history_of(out)
        assert sum(COUNTER.count(i.raw, "gpt-4o-mini") for i in history) <= 3000
        if t.report.marks:  # a cut: the new start fills about half the limit
            cuts += 1
            marks.update(t.report.marks)
            assert sum(COUNTER.count(i.raw, "gpt-4o-mini") for i in history) <= 1500 + COUNTER.count(transcript[-1], "gpt-4o-mini")
        starts.append(history[0].seq)
        assert validate_chat_request({"model": "gpt-4o-mini", "messages": [i.raw for i in out]}) is None
    # The start moves only at cuts, and then forward.
    assert cuts >= 2 and len(set(starts)) == cuts + (starts[0] == 1)
    assert starts == sorted(starts)


def test_a_start_that_is_gone_is_cut_again() -> None:
    msgs = agent_run(30, "line of output\n" * 20)
    t = turn(limit=2000, refill=0.5, marks={"window_start": 10_000})  # beyond the transcript (a rewound branch)
    out = run(TokenWindow(), t, msgs)
    assert t.report.marks["window_start"] == history_of(out)[0].seq


def test_a_first_turn_tokenizes_about_its_limit_not_its_transcript() -> None:
    """Counting goes back from the newest message only until the limit is passed, in batches sized
    from the tokens per message seen so far: a new conversation's first turn tokenizes little more
    than `limit` tokens of its transcript (tokenizing is most of such a turn's CPU)."""
    msgs = agent_run(100, "line of output\n" * 40)  # 402 messages, ~30,000 tokens
    counter = TokenCounter()
    t = turn(limit=3000)
    t.counter = counter
    run(TokenWindow(), t, msgs)
    tokens = [COUNTER.count(m, "gpt-4o-mini") for m in msgs]
    newest = counter.encodes - 2  # the system prompt and the task are counted too
    assert sum(tokens[-newest:]) <= 1.15 * 3000
    assert sum(tokens[-newest:]) > 3000  # as far back as the window could reach


@given(st.lists(st.tuples(st.sampled_from(list(Role)), st.sampled_from([None, *Origin])), max_size=30), st.data())
def test_the_scan_for_instructions_names_what_is_instruction_names(kinds: list[tuple[Role, Origin | None]], data: Any) -> None:
    """The window finds the client's instructions with `instructions_in` (the rule inline, no call
    per item): the same items `is_instruction` names, in order, within the range asked."""
    items = [Item(raw={}, role=role, origin=origin) for role, origin in kinds]
    start = data.draw(st.integers(0, len(items)))
    end = data.draw(st.integers(start, len(items)))
    assert instructions_in(items, start, end) == [i for i in range(start, end) if is_instruction(items[i])]
