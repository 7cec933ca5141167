"""The wire-format bench (bench/formats.py, part of `make bench`) works end to end in a tiny run,
and the Messages and Gemini transcripts it sends are ones the real APIs accept, turn after turn."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.gemini_workload import GeminiConversation
from bench.messages_workload import MessagesConversation
from bench.responses_workload import ResponsesConversation
from bench.mock_upstream import CALL_ARGS, CALL_NAME
from tests.fakes.anthropic_rules import check_messages_request
from tests.fakes.gemini_rules import SignatureIssuer, check_generate_request
from tests.fakes.responses_checks import check_request

REPO = Path(__file__).resolve().parents[2]


class NoThinking:
    """The bench's model never thinks: no signature is valid."""

    def signature_valid(self, thinking: str, signature: str) -> bool:
        return False

    def redacted_valid(self, data: str) -> bool:
        return False

    def issued_before(self, tool_use_id: str) -> dict | None:
        return None


def test_the_messages_transcript_is_valid_and_moves_its_breakpoint(tmp_path: Path) -> None:
    conversation = MessagesConversation("bench-1", "agent200")
    bodies = []
    for turn in range(3):
        body = json.loads(conversation.body("bench-s16", stream=False))
        assert check_messages_request(body, frozenset(), NoThinking()) is None, turn
        bodies.append(body)
        reply = [{"type": "text", "text": "Next."}, {"type": "tool_use", "id": f"toolu_{turn}", "name": CALL_NAME, "input": json.loads(CALL_ARGS)}]
        conversation.advance(reply)
    assert len(bodies[0]["messages"]) == 199 and bodies[0]["messages"][0]["content"].startswith("[bench-1]")
    marked = [[i for i, m in enumerate(b["messages"]) if "cache_control" in json.dumps(m)] for b in bodies]
    assert marked == [[198], [200], [202]]  # one breakpoint, on the newest message
    assert bodies[1]["messages"][-1]["content"][0]["tool_use_id"] == "toolu_0"


def test_the_responses_transcript_is_valid_turn_after_turn() -> None:
    """As Codex sends it (tests/samples/codex-session.json): its fields in its order, but its session
    id (the bench's no-header agents name none) and reasoning settings; `client_metadata` last,
    new every request, its keys in another order."""
    conversation = ResponsesConversation("bench-1", "agent200")
    codex = json.loads((Path(__file__).resolve().parents[1] / "samples" / "codex-session.json").read_text())["turn_1"]["body"]
    metadata = []
    for turn in range(3):
        body = json.loads(conversation.body("bench-s16", stream=False))
        assert check_request(body) is None, turn
        assert list(body) == [k for k in codex if k not in ("reasoning", "prompt_cache_key")]
        metadata.append(list(body["client_metadata"].items()))
        call = {"type": "function_call", "id": f"fc_{turn}", "status": "completed", "call_id": f"call_r{turn}",
                "name": CALL_NAME, "arguments": CALL_ARGS}
        conversation.advance([{"type": "message", "id": f"msg_{turn}", "role": "assistant",
                               "content": [{"type": "output_text", "text": "Next.", "annotations": []}]}, call])
    assert body["input"][0]["role"] == "developer" and body["input"][-1]["call_id"] == "call_r1"
    assert len({tuple(m) for m in metadata}) == 3 and len({tuple(k for k, _ in m) for m in metadata}) == 3


def test_the_gemini_transcript_is_valid_turn_after_turn() -> None:
    conversation = GeminiConversation("bench-1", "agent200")
    for turn in range(3):
        body = json.loads(conversation.body("bench-s16", stream=False))
        check_generate_request(body, "bench-s16", SignatureIssuer())  # raises what the real API refuses
        conversation.advance([{"text": "Next."}, {"functionCall": {"name": CALL_NAME, "args": json.loads(CALL_ARGS)}}])
    assert len(body["contents"]) == 199 + 4 and body["contents"][0]["parts"][0]["text"].startswith("[bench-1]")
    answer = body["contents"][-1]["parts"][0]["functionResponse"]
    assert answer["id"] == body["contents"][-2]["parts"][1]["functionCall"]["id"]  # the client's own id, on both


def test_the_formats_bench_runs_and_prints_its_table(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.formats", "-n", "2", "--repeats", "1", "--conversations", "1", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r.split("|")[1].strip() for r in rows[1:]] == [
        "chat completions json", "messages json", "responses json", "gemini json",
        "chat completions stream", "messages stream", "responses stream", "gemini stream",
    ]
    data = json.loads((tmp_path / "formats-latest.json").read_text())
    assert set(data["vs_chat"]) == {f"{name} vs chat completions, {mode}" for name in ("messages", "responses", "gemini") for mode in ("json", "stream")}
    assert all(row["cpu_ms"] > 0 for row in data["rows"].values())
