"""Claude Code, run headless in a test: offline, loopback only, in a HOME of its own.

`ClaudeAgent(base_url, folder)` runs the `claude` that `scripts/ensure-claude.sh` installs in
`.tools/claude/` with `claude -p "<task>" --output-format json --allowedTools Bash --max-turns 6`
(`resume=` adds `--resume <session_id>`), in a temporary HOME and working folder under `folder`,
with a clean environment: ANTHROPIC_BASE_URL, a test key, the switches that turn off its own
traffic (telemetry, error reports, auto-update, non-essential calls), and HTTP(S)_PROXY pointing
at an `EgressRecorder` -- so any attempt to reach past loopback is seen, and each run fails if
one was made. A run that outlives its timeout has its whole process group killed.
"""

from __future__ import annotations

import json
import os
import signal
import socketserver
import subprocess
import threading
from pathlib import Path
from typing import Any

__all__ = ["CLAUDE", "TEST_KEY", "ClaudeAgent", "ClaudeFailed", "EgressRecorder"]

ROOT = Path(__file__).resolve().parent.parent
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


class EgressRecorder:
    """A loopback listener that stands in as the HTTP(S) proxy: it records the request line of
    every connection (`CONNECT api.anthropic.com:443 ...` for HTTPS) and refuses it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._attempts: list[str] = []
        recorder = self

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                line = self.rfile.readline(4096).decode("latin-1").strip()
                with recorder._lock:
                    recorder._attempts.append(line)
                self.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="egress-recorder", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def attempts(self) -> list[str]:
        with self._lock:
            return list(self._attempts)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


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
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "TMPDIR": str(folder / "tmp"),
            "LANG": "C.UTF-8",
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_API_KEY": api_key,
            **OFFLINE,
            **{name: self.egress.url for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")},
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
        }

    def __enter__(self) -> ClaudeAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.egress.close()

    def run(self, task: str, resume: str | None = None, timeout: float = 120) -> dict[str, Any]:
        """Run one headless turn; return Claude Code's JSON result (`session_id`, `result`,
        `is_error`, `num_turns`, `usage`, ...), whatever its exit code."""
        command = [str(CLAUDE), "-p", task, "--output-format", "json", "--allowedTools", "Bash", "--max-turns", "6"]
        if resume is not None:
            command += ["--resume", resume]
        proc = subprocess.Popen(
            command, cwd=self.work, env=self.env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
        )
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            stdout, stderr = proc.communicate()
            raise ClaudeFailed(f"claude timed out after {timeout}s; stderr: {stderr.decode(errors='replace')[-2000:]}")
        finally:
            _kill_group(proc.pid)  # shells its Bash tool left behind
        attempts = self.egress.attempts
        if attempts:
            raise ClaudeFailed(f"claude tried to reach past loopback: {attempts}")
        try:
            return json.loads(stdout)  # also after a failed turn: its JSON says `is_error`
        except ValueError:
            raise ClaudeFailed(
                f"claude exited {proc.returncode} without JSON; stdout: {stdout.decode(errors='replace')[-2000:]}; "
                f"stderr: {stderr.decode(errors='replace')[-2000:]}"
            ) from None


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
