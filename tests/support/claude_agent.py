"""Claude Code, run headless in a test: offline, loopback only, in a HOME of its own.

`ClaudeAgent(base_url, folder)` runs the `claude` that `scripts/ensure-claude.sh` installs in
`.tools/claude/` with `claude -p "<task>" --output-format json --allowedTools Bash --max-turns 6`
(`resume=` adds `--resume <session_id>`), in a temporary HOME and working folder under `folder`,
with a clean environment (`tests.support.agents.loopback_environment`): ANTHROPIC_BASE_URL, a test key,
the switches that turn off its own traffic (telemetry, error reports, auto-update, non-essential
calls), and HTTP(S)_PROXY pointing at an `EgressRecorder` -- so any attempt to reach past loopback
is seen, and each run fails if one was made. A run that outlives its timeout has its whole process
group killed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.agents import EgressRecorder, TimedOut, loopback_environment, run_in_group

__all__ = ["CLAUDE", "TEST_KEY", "ClaudeAgent", "ClaudeFailed", "EgressRecorder"]

ROOT = Path(__file__).resolve().parents[2]
CLAUDE = ROOT / ".tools" / "claude" / "node_modules" / ".bin" / "claude"
TEST_KEY = "sk-ant-test-claude-code-0123456789"
# Claude Code's own switches for "talk to ANTHROPIC_BASE_URL and nothing else".
OFFLINE = {
    "DISABLE_TELEMETRY": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
}


class ClaudeFailed(AssertionError):
    """Claude Code exited badly, timed out, printed no JSON, or tried to leave loopback."""


class ClaudeAgent:
    """One Claude Code user: a HOME (its sessions live there, so `--resume` finds them) and a
    working folder, pointed at `base_url` (the proxy's root, or the fake's)."""

    def __init__(self, base_url: str, folder: Path, api_key: str = TEST_KEY) -> None:
        if not CLAUDE.exists():
            raise ClaudeFailed(f"{CLAUDE} is missing: run scripts/ensure-claude.sh (make test does)")
        self.home = folder / "home"
        self.work = folder / "work"
        for path in (self.home, self.work, folder / "tmp"):
            path.mkdir(parents=True, exist_ok=True)
        self.egress = EgressRecorder()
        self.env = {
            **loopback_environment(self.home, self.egress),
            "TMPDIR": str(folder / "tmp"),
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": api_key,
            **OFFLINE,
        }

    def __enter__(self) -> ClaudeAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.egress.close()

    def run(
        self, task: str, resume: str | None = None, timeout: float = 120, allowed_tools: str = "Bash"
    ) -> dict[str, Any]:
        """Run one headless turn; return Claude Code's JSON result (`session_id`, `result`,
        `is_error`, `num_turns`, `usage`, ...), whatever its exit code."""
        command = [str(CLAUDE), "-p", task, "--output-format", "json", "--allowedTools", allowed_tools, "--max-turns", "6"]
        if resume is not None:
            command += ["--resume", resume]
        try:
            done = run_in_group(command, self.work, self.env, timeout)
        except TimedOut as exc:
            raise ClaudeFailed(str(exc)) from None
        stdout, stderr = done.stdout, done.stderr
        attempts = self.egress.attempts
        if attempts:
            raise ClaudeFailed(f"claude tried to reach past loopback: {attempts}")
        try:
            return json.loads(stdout)  # also after a failed turn: its JSON says `is_error`
        except ValueError:
            raise ClaudeFailed(
                f"claude exited {done.returncode} without JSON; stdout: {stdout.decode(errors='replace')[-2000:]}; "
                f"stderr: {stderr.decode(errors='replace')[-2000:]}"
            ) from None

