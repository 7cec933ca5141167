"""Real agent CLIs in tests, run against a base URL we give them and nothing else.

What every CLI harness needs (Codex here, Claude Code in `claude_agent`): an `EgressRecorder`, a
loopback listener that HTTP(S)_PROXY points at and that records and refuses every connection, so
anything a CLI tries to reach beyond loopback shows up in its `attempts` (NO_PROXY lets
127.0.0.1 and localhost through); `loopback_environment`, a clean environment that says so; and
`run_in_group`, which runs the CLI in a process group of its own and kills the group when it
times out and when it ends.

`CodexSession` gives one Codex session a temporary `CODEX_HOME` whose config names a custom
Responses provider (the given `/v1` base URL, the key from an environment variable, no retries),
a temporary working folder and an egress recorder, `guard`. `exec` runs
`codex exec --json --skip-git-repo-check <task>`, `resume` runs `codex exec resume --last <next>`
in the same folder (both with `--strict-config`, so a config key Codex does not know fails the run
instead of being ignored); both return the parsed `--json` events as a `CodexRun`, and kill the
process group on timeout.

Codex is installed by scripts/ensure-codex.sh (`make test` runs it).
"""

from __future__ import annotations

import json
import os
import signal
import socketserver
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CODEX = ROOT / ".tools" / "codex" / "node_modules" / ".bin" / "codex"
CODEX_VERSION = "0.171.0"
KEY_VARIABLE = "CODEX_TEST_API_KEY"  # not CONTEXT_PROXY_*: that prefix is the proxy's settings
PROVIDER = "context-proxy-test"

# Without the two switches, Codex 0.171.0 syncs its curated plugins from github.com /
# api.github.com / chatgpt.com and exports metrics to ab.chatgpt.com at every run.
CONFIG = """\
model = "{model}"
model_provider = "{provider}"

[features]
plugins = false

[analytics]
enabled = false

[model_providers.{provider}]
name = "context-proxy tests"
base_url = "{base_url}"
env_key = "{key_variable}"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
"""


class EgressRecorder:
    """A loopback listener that stands in as the HTTP(S) proxy: it records the request line of
    every connection (`CONNECT github.com:443 HTTP/1.1` for HTTPS) and refuses it."""

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


def loopback_environment(home: Path, egress: EgressRecorder) -> dict[str, str]:
    """A clean environment for a CLI: none of the developer's settings, profile or proxies; a
    HOME of its own; every proxy variable pointing at `egress`, except for loopback."""
    proxies = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        **{name: egress.url for name in proxies},
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


class TimedOut(AssertionError):
    """A CLI outlived its timeout; its process group was killed."""


def run_in_group(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[bytes]:
    """Run `argv` with stdin closed in a process group of its own; kill the whole group when it
    times out (raising `TimedOut` with the end of its stderr), and when it ends (the shells its
    tools left behind)."""
    process = subprocess.Popen(
        argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        _, stderr = process.communicate()
        raise TimedOut(
            f"{Path(argv[0]).name} {' '.join(argv[1:3])} did not finish in {timeout} s; stderr:\n"
            + stderr.decode(errors="replace")[-4000:]
        ) from None
    finally:
        _kill_group(process.pid)
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@dataclass
class CodexRun:
    """One `codex exec` as it ended: its exit code, its `--json` events, its stderr."""

    returncode: int
    events: list[dict[str, Any]]
    stderr: str
    other_output: list[str] = field(default_factory=list)  # stdout lines that were not JSON

    @property
    def thread_id(self) -> str | None:
        return next((e["thread_id"] for e in self.events if e.get("type") == "thread.started"), None)

    def items(self, item_type: str) -> list[dict[str, Any]]:
        """The completed items of one type (`command_execution`, `agent_message`, `reasoning`...)."""
        return [e["item"] for e in self.events if e.get("type") == "item.completed" and e["item"]["type"] == item_type]

    @property
    def commands(self) -> list[dict[str, Any]]:
        """The shell commands it ran: `command`, `aggregated_output`, `exit_code`."""
        return self.items("command_execution")

    @property
    def messages(self) -> list[str]:
        return [item["text"] for item in self.items("agent_message")]

    @property
    def completed(self) -> bool:
        return self.returncode == 0 and any(e.get("type") == "turn.completed" for e in self.events)


class CodexSession:
    """One Codex CLI session in `workdir`, configured in `home`, talking to `base_url` only."""

    def __init__(
        self, base_url: str, api_key: str, home: Path, workdir: Path, guard: EgressRecorder,
        model: str = "mock-model", timeout: float = 60,
    ) -> None:
        self.home, self.workdir, self.guard, self.timeout = home, workdir, guard, timeout
        (home / "codex").mkdir(parents=True, exist_ok=True)
        workdir.mkdir(parents=True, exist_ok=True)
        config = CONFIG.format(model=model, provider=PROVIDER, base_url=base_url, key_variable=KEY_VARIABLE)
        (self.codex_home / "config.toml").write_text(config)
        self._api_key = api_key

    @property
    def codex_home(self) -> Path:
        return self.home / "codex"

    def exec(self, task: str) -> CodexRun:
        """A new session: `codex exec --json --skip-git-repo-check <task>`."""
        return self._run(["exec", "--json", "--skip-git-repo-check", "--strict-config", task])

    def resume(self, task: str) -> CodexRun:
        """The next turn of the newest session in this folder: `codex exec resume --last <task>`."""
        return self._run(["exec", "resume", "--last", "--json", "--skip-git-repo-check", "--strict-config", task])

    def _run(self, arguments: list[str]) -> CodexRun:
        if not CODEX.exists():
            raise RuntimeError(f"Codex CLI is not installed at {CODEX}: run scripts/ensure-codex.sh")
        env = {**loopback_environment(self.home, self.guard), "CODEX_HOME": str(self.codex_home),
               KEY_VARIABLE: self._api_key}
        done = run_in_group([str(CODEX), *arguments], self.workdir, env, self.timeout)
        events, other = [], []
        for line in done.stdout.decode(errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                other.append(line)
        return CodexRun(done.returncode, events, done.stderr.decode(errors="replace"), other)


@contextmanager
def codex_session(base_url: str, api_key: str, tmp_path: Path, **options: Any) -> Iterator[CodexSession]:
    """A `CodexSession` under `tmp_path` with its egress recorder running for the `with` block."""
    guard = EgressRecorder()
    try:
        yield CodexSession(base_url, api_key, tmp_path / "codex-home", tmp_path / "work", guard, **options)
    finally:
        guard.close()
