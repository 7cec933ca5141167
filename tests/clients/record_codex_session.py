"""Record what Codex CLI sends in one session, as tests/samples/codex-session.json.

    .venv/bin/python -m tests.clients.record_codex_session

Codex runs straight against a fresh fake upstream (no proxy in between): turn 1 (the fake answers
with reasoning and an `exec_command` call), the tool continuation that carries the command's
output, and `codex exec resume --last`. Each request is kept exactly as received, body and
headers, with the key scrubbed. Re-record when the pinned Codex version changes; the reasoning it
echoes was sealed by the fake's fixed key, so the bodies replay against any fake.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests.fakes.fake_upstream import FakeUpstream, Recorded, Reply, running_in_thread
from tests.support.agents import CODEX_VERSION, codex_session

SAMPLE = Path(__file__).resolve().parents[1] / "samples" / "codex-session.json"
TURNS = ("turn_1", "tool_continuation", "resumed_turn")
# Not headers of Codex's own: what the transport adds.
TRANSPORT_HEADERS = ("host", "content-length")


def script(fake: FakeUpstream) -> None:
    fake.enqueue(
        Reply.tool_calls([("exec_command", json.dumps({"cmd": "echo hello"}))], reasoning="Run the command."),
        Reply.text("It printed hello.", reasoning="The command succeeded."),
        Reply.text("Still here."),
    )


def scrubbed(record: Recorded) -> dict[str, Any]:
    headers = {name: value for name, value in record.headers.items() if name not in TRANSPORT_HEADERS}
    if "authorization" in headers:
        headers["authorization"] = "Bearer <redacted>"
    return {"method": record.method, "path": record.path, "headers": headers, "body": record.body}


def record() -> dict[str, Any]:
    with running_in_thread() as fake, tempfile.TemporaryDirectory() as tmp:
        script(fake)
        with codex_session(fake.base_url, "sk-recording-key", Path(tmp)) as codex:
            first = codex.exec("Run `echo hello` in the shell, then say what it printed.")
            resumed = codex.resume("Are you still there?")
            attempts = list(codex.guard.attempts)
        if not (first.completed and resumed.completed) or attempts:
            sys.exit(f"the session did not run cleanly: {attempts=}\n{first.stderr}\n{resumed.stderr}")
        records = [r for r in fake.requests if r.path == "/v1/responses"]
        if len(records) != len(TURNS) or any(r.status_sent != 200 for r in records):
            sys.exit(f"expected {len(TURNS)} accepted requests, got {[r.status_sent for r in records]}")
        return {
            "client": f"codex-cli {CODEX_VERSION} (codex exec / exec resume --last, custom provider, "
            "wire_api=responses), recorded by tests/clients/record_codex_session.py",
            "commands": [c["command"] for c in first.commands],
            **{turn: scrubbed(r) for turn, r in zip(TURNS, records)},
        }


if __name__ == "__main__":
    SAMPLE.parent.mkdir(exist_ok=True)
    SAMPLE.write_text(json.dumps(record(), indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {SAMPLE}")
