"""The bench's floor (bench/forwarder.py --store) keeps what it claims to: for each turn, the
request's new bytes and then the reply, one row each in its own SQLite file, under the run's name
(the conversation header if the client sends one, else its bytes up to the first reply).

The floor and the mock upstream run as real processes on loopback; the client is a bench agent."""

from __future__ import annotations

import json
import sqlite3
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.forwarder import REPLY, REQUEST, run_key
from bench.procs import Proc, free_port
from bench.workload import Conversation

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def floor(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    mock_port, floor_port = free_port(), free_port()
    mock = Proc("mock", [sys.executable, "-m", "bench.mock_upstream", "--port", str(mock_port)], mock_port, "/healthz",
                tmp_path / "mock.log", cwd=str(REPO)).start()
    store = tmp_path / "floor"
    fwd = Proc("floor", [sys.executable, "-m", "bench.forwarder", "--port", str(floor_port),
                         "--upstream", f"http://127.0.0.1:{mock_port}/v1", "--store", str(store)],
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
