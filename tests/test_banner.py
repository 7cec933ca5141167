"""What `serve` says at start, as a person and as a log collector see it: a real `python -m proxy
serve` whose output is a pseudo-terminal (as `make serve` in a shell), or a pipe (as Docker,
systemd or a collector)."""

from __future__ import annotations

import json
import os
import pty
import queue
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml
from openai import OpenAI

from proxy.banner import client_address, render, ui_address
from proxy.config import load_settings
from tests.support.harness import ROOT

CLIENT_KEY = "sk-client-key-never-printed-4c1d"
ADMIN_TOKEN = "admin-token-for-the-banner-9e2f"


class Output:
    """A `serve` process's stdout and stderr, both on one terminal or one pipe, read line by line."""

    def __init__(self, config: Path, *, terminal: bool) -> None:
        argv = [sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", "0"]
        env = {**os.environ, "NO_COLOR": "1"}
        if terminal:
            reader, writer = pty.openpty()
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=writer, stdout=writer, stderr=writer)
            os.close(writer)
        else:
            self.proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            assert self.proc.stdout is not None
            reader = self.proc.stdout.fileno()
        self._reader = reader
        self._terminal = terminal
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(self._reader, 65536)
            except OSError:  # a terminal whose other side closed: EIO
                chunk = b""
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                self._lines.put(line.decode().rstrip("\r"))
        if pending:
            self._lines.put(pending.decode().rstrip("\r"))
        self._lines.put(None)

    def until(self, wanted: Callable[[str], bool], timeout: float = 30) -> str:
        """Read lines until one is `wanted`; return it (every line read is in `seen`)."""
        while True:
            line = self._lines.get(timeout=timeout)
            if line is None:
                raise AssertionError(f"serve exited ({self.proc.wait()}) before the line wanted:\n" + "\n".join(self.seen))
            self.seen.append(line)
            if wanted(line):
                return line

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        code = self.proc.wait(15)
        self._thread.join(15)
        if self._terminal and self._reader >= 0:
            os.close(self._reader)
            self._reader = -1
        return code


@pytest.fixture
def serve(tmp_path, upstream):
    started: list[Output] = []

    def start(*, terminal: bool, **sections: dict) -> Output:
        config = {
            "upstream": {"base_url": upstream.base_url, "timeout_s": 30},
            "storage": {"path": str(tmp_path / "data")},
            **sections,
        }
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        output = Output(path, terminal=terminal)
        started.append(output)
        return output

    yield start
    for output in started:
        output.stop()


def _is_json(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def _port_of(banner_line: str) -> int:
    match = re.search(r"listening on http://127\.0\.0\.1:(\d+)$", banner_line)
    assert match, banner_line
    return int(match.group(1))


def test_on_a_terminal_serve_says_where_to_point_each_client_and_logs_text(serve, upstream, tmp_path):
    out = serve(terminal=True, admin={"token": ADMIN_TOKEN})
    port = _port_of(out.until(lambda line: line.startswith("context-proxy listening on ")))
    out.until(lambda line: " listening " in line)
    base = f"http://127.0.0.1:{port}"
    text = "\n".join(out.seen)
    assert f"OPENAI_BASE_URL={base}/v1" in text
    assert f"ANTHROPIC_BASE_URL={base}\n" in text + "\n"
    assert f"GOOGLE_GEMINI_BASE_URL={base}" in text
    assert f"{base}/ui/   (sign in with your admin.token)" in text and ADMIN_TOKEN not in text  # the admin's own
    assert f"diskcache in {(tmp_path / 'data').resolve()}" in text
    assert f"{upstream.base_url}; Anthropic: https://api.anthropic.com" in text
    assert re.search(r"^  pipeline +imitations, truncation, .*pairing$", text, re.MULTILINE)

    client = OpenAI(base_url=f"{base}/v1", api_key=CLIENT_KEY, max_retries=0,
                    default_headers={"X-Conversation-ID": "on-a-terminal"})
    assert client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}]).choices
    line = out.until(lambda line: "/v1/chat/completions" in line)
    assert re.fullmatch(r"\d\d:\d\d:\d\d INFO +POST /v1/chat/completions 200 [\d.]+ ms  .*", line), line
    assert "conversation=on-a-terminal" in line and "format=chat" in line
    assert out.stop() == 0
    assert not any(_is_json(line) for line in out.seen)  # a person reads every line
    assert CLIENT_KEY not in "\n".join(out.seen)


def test_through_a_pipe_every_line_is_json_and_there_is_no_banner(serve):
    out = serve(terminal=False, admin={"token": ADMIN_TOKEN})
    listening = json.loads(out.until(lambda line: _is_json(line) and json.loads(line)["msg"] == "listening"))
    with httpx.Client(base_url=f"http://127.0.0.1:{listening['port']}") as http:
        assert http.get("/healthz").status_code == 200
    out.until(lambda line: '"/healthz"' in line)
    assert out.stop() == 0
    assert out.seen and all(_is_json(line) for line in out.seen), out.seen
    assert ADMIN_TOKEN not in "\n".join(out.seen)  # the token is for a person's terminal, never a log


def test_logging_format_json_keeps_json_on_a_terminal(serve):
    out = serve(terminal=True, logging={"format": "json"})
    out.until(lambda line: _is_json(line) and json.loads(line)["msg"] == "listening")
    assert out.stop() == 0
    # JSON lines, but the one plain line that hands the person the token the proxy made (Jupyter's way).
    lines = [line for line in out.seen if not line.startswith("context-proxy: open http://")]
    assert lines and all(_is_json(line) for line in lines), out.seen


def test_logging_format_text_writes_text_and_the_banner_through_a_pipe(serve, tmp_path):
    out = serve(terminal=False, logging={"format": "text"})
    port = _port_of(out.until(lambda line: line.startswith("context-proxy listening on ")))
    out.until(lambda line: " listening " in line and f"port={port}" in line)
    assert out.stop() == 0
    assert not any(_is_json(line) for line in out.seen)
    # No token configured: the one the proxy made is in the /ui address, as in the file it keeps.
    made = (tmp_path / "data" / "admin-token").read_text().strip()
    assert f"http://127.0.0.1:{port}/ui/?token={made}" in "\n".join(out.seen)


def test_an_unknown_logging_format_stops_start_up_naming_the_setting(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"logging": {"format": "xml"}}))
    done = subprocess.run([sys.executable, "-m", "proxy", "serve", "--config", str(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert "logging.format" in done.stderr


def test_a_wildcard_bind_is_reached_on_loopback_and_secrets_in_urls_stay_out(tmp_path):
    settings = load_settings(None, storage={"backend": "redis", "redis_url": "redis://user:hunter2@cache:6379/0"},
                             upstream={"base_url": "https://proxy-user:s3cret@llm.example/v1"})
    text = render(settings, "0.0.0.0", 8080, admin_token=None, pipeline=["truncation", "window"])
    assert "OPENAI_BASE_URL=http://127.0.0.1:8080/v1" in text
    assert "listening on http://0.0.0.0:8080" in text
    assert "hunter2" not in text and "s3cret" not in text
    assert "redis at redis://***@cache:6379/0" in text
    assert client_address("::1", 9) == "http://[::1]:9"
    assert ui_address("http://h:1", None) == "http://h:1/ui/"
