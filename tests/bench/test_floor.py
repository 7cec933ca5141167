"""The bench's floor (bench/forwarder.py --store) keeps what it claims to: for each turn, the
request's new bytes and then the reply, one row each in its own SQLite file, under the run's name
(the conversation header if the client sends one, else its bytes up to the first reply). With
`--count-tokens` (floor-count) each request's row also holds its new text's exact token count,
counted offline.

The floor and the mock upstream run as real processes on loopback; the client is a bench agent."""

from __future__ import annotations

import json
import sqlite3
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.forwarder import COUNT_PIECE, REPLY, REQUEST, cl100k_counter, newest_tokens, reply_markers, run_key
from bench.procs import Proc, free_port
from bench.run import FLOOR_COUNT_BUDGET
from bench.workload import Conversation
from proxy.config import ContextSettings

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def floor(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    yield from _floor(tmp_path, [])


@pytest.fixture
def floor_count(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    yield from _floor(tmp_path, ["--count-tokens", str(BUDGET)])


BUDGET = 2_000  # below a first turn's 200 messages, above a later turn's new bytes


def _floor(tmp_path: Path, extra: list[str]) -> Iterator[tuple[str, Path]]:
    mock_port, floor_port = free_port(), free_port()
    mock = Proc("mock", [sys.executable, "-m", "bench.mock_upstream", "--port", str(mock_port)], mock_port, "/healthz",
                tmp_path / "mock.log", cwd=str(REPO)).start()
    store = tmp_path / "floor"
    fwd = Proc("floor", [sys.executable, "-m", "bench.forwarder", "--port", str(floor_port),
                         "--upstream", f"http://127.0.0.1:{mock_port}/v1", "--store", str(store), *extra],
               floor_port, "/v1/models", tmp_path / "floor.log", cwd=str(REPO)).start()
    try:
        mock.wait_ready(30)
        fwd.wait_ready(30)
        yield f"http://127.0.0.1:{floor_port}/v1/chat/completions", store / "journal.sqlite3"
    finally:
        fwd.stop()
        mock.stop()


def _turn(url: str, conversation: Conversation, headers: dict[str, str]) -> bytes:
    body = conversation.body("bench-s16", False)
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json", **headers})
    with urllib.request.urlopen(request, timeout=30) as reply:
        data = reply.read()
    conversation.advance(json.loads(data)["choices"][0]["message"])
    return body


def _rows(journal: Path) -> list[tuple[bytes, int, bytes]]:
    db = sqlite3.connect(journal)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        return db.execute("SELECT run, kind, data FROM appended ORDER BY id").fetchall()
    finally:
        db.close()


def test_the_floor_appends_each_turns_new_bytes_and_its_reply(floor: tuple[str, Path]) -> None:
    url, journal = floor
    unnamed, named = Conversation("floor-a", "agent200"), Conversation("floor-b", "agent200")
    first = _turn(url, unnamed, {})
    second = _turn(url, unnamed, {})
    _turn(url, named, {"X-Conversation-ID": "floor-b"})

    rows = _rows(journal)
    assert [kind for _, kind, _ in rows] == [REQUEST, REPLY, REQUEST, REPLY, REQUEST, REPLY]
    derived = run_key(None, first)
    assert derived == run_key(None, second)  # the same run, turn after turn, with no header
    assert [run for run, _, _ in rows[:4]] == [derived] * 4
    assert rows[0][2] == first  # a run's first request: all of it
    assert rows[2][2] == second[len(first):]  # a later one: the bytes past the previous request's
    assert json.loads(rows[1][2])["choices"][0]["message"]["tool_calls"]  # the reply as the client got it
    assert rows[4][0] == b"floor-b"  # a named run goes by its name


def test_an_unnamed_run_is_known_by_its_first_reply_in_every_wire_format() -> None:
    """As context-proxy's dialects say (`reply_markers`): a Gemini reply's role is "model", a
    Responses agent's first reply often calls alone."""
    gemini = b'{"contents":[{"role":"user","parts":[{"text":"go"}]},{"role":"model","parts":[]}'
    responses = b'{"input":[{"role":"user","content":"go"},{"type":"function_call","call_id":"c"}'
    for path, body, more in (
        ("/v1beta/models/m:streamGenerateContent?alt=sse", gemini, b',{"role":"user","parts":[{"text":"on"}]}],"tools":[]}'),
        ("/responses", responses, b',{"type":"function_call_output","call_id":"c","output":"ok"}],"tools":[]}'),
    ):
        markers = reply_markers(path)
        assert run_key(None, body + b"]}", markers) == run_key(None, body + more, markers)  # turn after turn
        assert run_key(None, body + b"]}") != run_key(None, body + more)  # by chat's marker: a new run each turn


def test_floor_count_keeps_the_exact_count_of_each_requests_new_text(floor_count: tuple[str, Path]) -> None:
    url, journal = floor_count
    conversation = Conversation("floor-c", "agent200")
    first = _turn(url, conversation, {})
    second = _turn(url, conversation, {})

    db = sqlite3.connect(journal)
    try:
        rows = db.execute("SELECT kind, data, tokens FROM appended ORDER BY id").fetchall()
    finally:
        db.close()
    assert [kind for kind, _, _ in rows] == [REQUEST, REPLY, REQUEST, REPLY]
    assert rows[1][2] is None and rows[3][2] is None  # replies are counted when resent, not here
    count = cl100k_counter()  # the same encoding file, from litellm's wheel (these tests have no network)
    new_text = second[len(first):].decode()
    assert rows[2][1].decode() == new_text
    assert 0 < len(new_text) <= COUNT_PIECE and rows[2][2] == count(new_text)  # a later turn's: all of it, exactly
    # The first turn: its newest pieces until the budget is reached, not the whole 200 messages.
    # (a piece of COUNT_PIECE characters holds fewer tokens than that)
    assert BUDGET <= rows[0][2] < BUDGET + COUNT_PIECE and rows[0][2] < count(first.decode())
    assert rows[0][2] == newest_tokens(count, first.decode(), BUDGET)


def test_floor_counts_up_to_the_shipped_windows_budget() -> None:
    """floor-count stands for the proxy as shipped: its budget is the window's default one."""
    assert FLOOR_COUNT_BUDGET == ContextSettings().history_token_limit
    assert "history_token_limit" not in (REPO / "config.yaml").read_text()  # the shipped config keeps the default
