"""Record what Claude Code sends, as the fixtures in tests/samples/claude-*.json.

    .venv/bin/python -m tests.clients.record_claude_samples

runs the installed Claude Code (scripts/ensure-claude.sh) against the fake upstream directly:
a first turn whose scripted reply is a `Bash` tool_use (with thinking), the tool continuation
answered with text, then a `--resume`d turn. Each request is written with its headers (the key
and the device id scrubbed, the temporary folders renamed) exactly as the fake received it.
Re-record when the pinned Claude Code version changes; tests/clients/test_claude_cli.py checks that a live
run still has the recorded shape.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from tests.fakes.fake_upstream import Recorded, Reply, running_in_thread
from tests.support.claude_agent import ClaudeAgent

SAMPLES = Path(__file__).resolve().parents[1] / "samples"
NAMES = ("claude-turn1.json", "claude-tool-continuation.json", "claude-resumed-turn.json")
FIRST_TASK = "Run `echo hello` with Bash and tell me what it printed."
RESUMED_TASK = "Thanks. Now say goodbye."
DROPPED_HEADERS = frozenset({"host", "content-length"})
SECRET_HEADERS = frozenset({"x-api-key", "authorization"})


def script() -> tuple[Reply, ...]:
    """The replies of the recorded session: a Bash call, its summary, the resumed answer."""
    call = json.dumps({"command": "echo hello", "description": "Print hello"})
    return (
        Reply.tool_calls([("Bash", call)], reasoning="The user wants me to run echo hello."),
        Reply.text("It printed `hello`.", reasoning="The command printed hello."),
        Reply.text("Goodbye!", reasoning="The user says goodbye."),
    )


def scrub(record: Recorded, renames: dict[str, str]) -> dict[str, Any]:
    headers = {
        name: ("<redacted>" if name in SECRET_HEADERS else value)
        for name, value in record.headers.items()
        if name not in DROPPED_HEADERS
    }
    body = json.loads(json.dumps(record.body))
    user_id = json.loads(body["metadata"]["user_id"])
    user_id["device_id"] = "<redacted>"
    body["metadata"]["user_id"] = json.dumps(user_id, separators=(",", ":"))
    text = json.dumps(body, ensure_ascii=False)
    for real, shown in renames.items():
        text = text.replace(real, shown)
    query = "&".join(f"{k}={v}" for k, v in record.query.items())
    return {
        "method": record.method,
        "path": record.path + (f"?{query}" if query else ""),
        "headers": headers,
        "body": json.loads(text),
    }


def record() -> list[dict[str, Any]]:
    with running_in_thread() as fake, tempfile.TemporaryDirectory() as folder:
        fake.enqueue(*script())
        with ClaudeAgent(fake.anthropic.base_url, Path(folder)) as agent:
            first = agent.run(FIRST_TASK)
            agent.run(RESUMED_TASK, resume=first["session_id"])
            renames = {str(agent.work): "/home/dev/project", str(agent.home): "/home/dev", folder: "/tmp/claude"}
        records = [r for r in fake.requests if r.path == "/v1/messages"]
        if [r.status_sent for r in records] != [200, 200, 200]:
            raise SystemExit(f"expected three accepted requests, got {[r.status_sent for r in records]}")
        return [scrub(r, renames) for r in records]


def main() -> None:
    SAMPLES.mkdir(exist_ok=True)
    for name, sample in zip(NAMES, record(), strict=True):
        (SAMPLES / name).write_text(json.dumps(sample, indent=2, ensure_ascii=False) + "\n")
        print(f"wrote tests/samples/{name}")


if __name__ == "__main__":
    main()
