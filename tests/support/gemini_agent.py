"""Gemini CLI, run headless in a test: offline, loopback only, in a HOME of its own.

`GeminiAgent(base_url, folder)` runs the `gemini` that `scripts/ensure-gemini.sh` installs in
`.tools/gemini/` as `gemini -p "<task>" -m <model> --yolo --output-format json` (`resume=True`
adds `--resume latest`), in a temporary HOME and working folder under `folder`, with a clean
environment (`tests.support.agents.loopback_environment`): GOOGLE_GEMINI_BASE_URL, a test key, the
settings GEMINI-RULES.md gives (API-key auth, no telemetry, usage statistics, auto-update, IDE
or sandbox), and HTTP(S)_PROXY pointing at an `EgressRecorder` -- so any attempt to reach past
loopback is seen, and each run fails if one was made. A run that outlives its timeout has its
whole process group killed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.agents import EgressRecorder, TimedOut, loopback_environment, run_in_group

__all__ = ["GEMINI", "TEST_KEY", "GeminiAgent", "GeminiFailed"]

ROOT = Path(__file__).resolve().parents[2]
GEMINI = ROOT / ".tools" / "gemini" / "node_modules" / ".bin" / "gemini"
TEST_KEY = "gemini-test-key-0123456789"
SETTINGS = {
    "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": False}},
    "privacy": {"usageStatisticsEnabled": False},
    "telemetry": {"enabled": False},
    "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False},
    "ide": {"enabled": False},
    "tools": {"sandbox": False},
}


class GeminiFailed(AssertionError):
    """Gemini CLI exited badly, timed out, printed no JSON, or tried to leave loopback."""


class GeminiAgent:
    """One Gemini CLI user: a HOME (its sessions live there, so `--resume` finds them) and a
    working folder, pointed at `base_url` (the proxy's root, or the fake's)."""

    def __init__(self, base_url: str, folder: Path, api_key: str = TEST_KEY) -> None:
        if not GEMINI.exists():
            raise GeminiFailed(f"{GEMINI} is missing: run scripts/ensure-gemini.sh (make test does)")
        self.home = folder / "home"
        self.work = folder / "work"
        for path in (self.home / ".gemini", self.work, folder / "tmp"):
            path.mkdir(parents=True, exist_ok=True)
        (self.home / ".gemini" / "settings.json").write_text(json.dumps(SETTINGS))
        self.egress = EgressRecorder()
        self.env = {
            **loopback_environment(self.home, self.egress),
            "TMPDIR": str(folder / "tmp"),
            "GOOGLE_GEMINI_BASE_URL": base_url,
            "GEMINI_API_KEY": api_key,
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
            "GEMINI_SANDBOX": "false",
            "TERM": "dumb",
        }

    def __enter__(self) -> GeminiAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.egress.close()

    def run(self, task: str, model: str | None = "gemini-2.5-pro", resume: bool = False, timeout: float = 120) -> dict[str, Any]:
        """Run one headless turn (`model` None: the CLI's own router picks one); return Gemini
        CLI's JSON result (`response`, `stats`, and `error` for a failed one) with its exit code
        as `exit_code`."""
        command = [str(GEMINI), "-p", task, *(["-m", model] if model else []), "--yolo", "--output-format", "json"]
        if resume:
            command += ["--resume", "latest"]
        try:
            done = run_in_group(command, self.work, self.env, timeout)
        except TimedOut as exc:
            raise GeminiFailed(str(exc)) from None
        stdout, stderr = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
        attempts = self.egress.attempts
        if attempts:
            raise GeminiFailed(f"gemini tried to reach past loopback: {attempts}")
        start = stdout.find("{")
        try:
            result = json.loads(stdout[start:]) if start >= 0 else None
        except ValueError:
            result = None
        if not isinstance(result, dict):
            raise GeminiFailed(f"gemini exited {done.returncode} without JSON; stdout: {stdout[-2000:]}; stderr: {stderr[-2000:]}")
        return {**result, "exit_code": done.returncode, "stderr": stderr[-4000:]}
