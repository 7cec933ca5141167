"""Real servers for the tests: the fake upstream and the proxy, on loopback.

They run on an event loop in a background thread, so a test can drive them with the sync
`openai` client as well as the async one, exactly as a user's agent would. `ProxyProcess` runs the
proxy as a separate `python -m proxy serve` process, for what only a process can show (restarts,
its logs, the CLI).
"""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import subprocess
import sys
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import httpx
from aiohttp import web

from proxy.app import build_app, runner_options
from proxy.config import Settings, load_settings
from proxy.connections import start_site
from proxy.state import ADMIN_TOKEN

T = TypeVar("T")
UI_URL = re.compile(rb"context-proxy: open http://\S+/ui/\?token=(\S+)")
ROOT = Path(__file__).resolve().parents[2]


ADMIN_PATHS = ("/v1/conversations", "/v1/knowledge", "/ui", "/metrics")


class AdminAuth(httpx.Auth):
    """An httpx client's auth that signs its admin API calls with the admin token (unless the call
    names its own Authorization), and nothing else: a turn it sends goes upstream without it."""

    def __init__(self, token: str | None) -> None:
        self.token = token

    def auth_flow(self, request: httpx.Request):  # type: ignore[no-untyped-def]
        if self.token and "Authorization" not in request.headers and request.url.path.startswith(ADMIN_PATHS):
            request.headers["Authorization"] = f"Bearer {self.token}"
        yield request


class LoopThread:
    """An asyncio loop running forever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="servers", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


async def serve_on_loopback(app: web.Application, **runner_options: Any) -> tuple[web.AppRunner, int]:
    """Serve `app` on 127.0.0.1:<a free port>; returns its runner (cleanup() stops it) and the port."""
    runner = web.AppRunner(app, **runner_options)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, runner.addresses[0][1]


class ProxyServer:
    """The proxy app served by aiohttp on 127.0.0.1:<free port>, in the loop thread."""

    def __init__(self, loop: LoopThread, settings: Settings) -> None:
        self.loop = loop
        self.settings = settings
        self.app: web.Application | None = None
        self._runner: web.AppRunner | None = None
        self.port = 0

    def start(self) -> ProxyServer:
        self.loop.run(self._start())
        return self

    async def _start(self) -> None:
        self.app = build_app(self.settings)
        self._runner = web.AppRunner(self.app, **runner_options(self.settings))
        await self._runner.setup()
        await start_site(self._runner, "127.0.0.1", 0)
        self.port = self._runner.addresses[0][1]

    def stop(self) -> None:
        if self._runner is not None:
            self.loop.run(self._runner.cleanup())
            self._runner = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def admin_token(self) -> str:
        """The admin token it uses: configured, or the one it made in its store folder."""
        assert self.app is not None
        return self.app[ADMIN_TOKEN].value

    @property
    def admin_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.admin_token}"}

    @property
    def admin_auth(self) -> AdminAuth:
        return AdminAuth(self.admin_token)

    @property
    def base_url(self) -> str:
        return self.url + "/v1"


def proxy_settings(upstream_base_url: str, data_dir: Path, **sections: dict[str, Any]) -> Settings:
    """Settings for a test proxy: the given upstream, a private data dir, short timeouts."""
    merged: dict[str, dict[str, Any]] = {
        "upstream": {"base_url": upstream_base_url, "timeout_s": 30},
        "storage": {"path": str(data_dir)},
    }
    for name, values in sections.items():
        merged.setdefault(name, {}).update(values)
    return load_settings(None, **merged)


class ProxyProcess:
    """`python -m proxy serve` in a child process; its log lines are copied to `log_path`."""

    def __init__(
        self, config: Path, log_path: Path, env: dict[str, str] | None = None, argv: list[str] | None = None
    ) -> None:
        self.log_path, self.env = log_path, env or {}
        self.argv = argv or [sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", "0"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self.admin_token: str | None = None  # the one it made and printed at start-up (None: configured)

    def start(self, timeout: float = 30) -> ProxyProcess:
        self.proc = subprocess.Popen(
            self.argv,
            cwd=ROOT,
            env={**os.environ, **self.env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        listening: queue.Queue[int | None] = queue.Queue()
        self._reader = threading.Thread(target=self._copy_log, args=(self.proc, listening), daemon=True)
        self._reader.start()
        port_seen = listening.get(timeout=timeout)
        if port_seen is None:
            raise RuntimeError(f"proxy exited with {self.proc.wait()}: {self.log_path.read_text()}")
        self.port = port_seen
        return self

    def _copy_log(self, proc: subprocess.Popen[bytes], listening: queue.Queue[int | None]) -> None:
        """Copy every line to the log file; report the port from the 'listening' line, or None at exit."""
        assert proc.stdout is not None
        with open(self.log_path, "ab") as log:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                if found := UI_URL.search(line):
                    self.admin_token = found.group(1).decode()
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                if isinstance(entry, dict) and entry.get("msg") == "listening":
                    listening.put(int(entry["port"]))
        listening.put(None)

    def stop(self) -> int:
        assert self.proc is not None
        self.proc.terminate()
        code = self.proc.wait(15)
        self._reader.join(15)
        return code

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def admin_headers(self) -> dict[str, str]:
        """The Bearer of the token it made ({} when admin.token is configured: the test knows that one)."""
        return {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}

    @property
    def admin_auth(self) -> AdminAuth:
        return AdminAuth(self.admin_token)


# -- Helpers for multi-process tests (replicas, faults, security) --------------------------------


def write_config(path: Path, **sections: Any) -> Path:
    """A YAML config file holding `sections` (e.g. storage={...}, upstream={...})."""
    import yaml

    path.write_text(yaml.safe_dump(sections))
    return path


def start_processes(*procs: ProxyProcess, timeout: float = 30) -> list[ProxyProcess]:
    """Start several proxy processes at once (each start waits for its 'listening' line)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(procs)) as pool:
        return list(pool.map(lambda p: p.start(timeout), procs))


def peak_rss_kb(proc: ProxyProcess) -> int:
    """The process's peak resident set so far (VmHWM), in KB."""
    assert proc.proc is not None
    status = Path(f"/proc/{proc.proc.pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1])


def kill_process(proc: ProxyProcess) -> int:
    """SIGKILL: no shutdown code runs, as in a crash or an OOM kill."""
    assert proc.proc is not None
    proc.proc.kill()
    code = proc.proc.wait(15)
    proc._reader.join(15)
    return code


def wait_until(predicate: Any, timeout: float = 10, interval: float = 0.02, what: str = "condition") -> Any:
    """Poll `predicate` until it returns something truthy (returned), or fail after `timeout` s."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class ChatResult:
    """One chat completion as a client saw it: status, the assistant message, or the error."""

    def __init__(
        self, status: int, headers: Any, message: dict[str, Any] | None, error: dict[str, Any] | None, done: bool
    ) -> None:
        self.status, self.headers, self.message, self.error, self.done = status, headers, message, error, done

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.message is not None and self.error is None


def chat(http: Any, messages: list[dict[str, Any]], *, stream: bool = False, headers: dict[str, str] | None = None,
         tools: list[dict[str, Any]] | None = None, model: str = "gpt-4o-mini") -> ChatResult:
    """POST /v1/chat/completions with an httpx.Client; streamed replies are assembled like an SDK does."""
    body: dict[str, Any] = {"model": model, "messages": messages}
    if tools:
        body["tools"] = tools
    if stream:
        body["stream"] = True
    if not stream:
        response = http.post("/v1/chat/completions", json=body, headers=headers or {})
        data = response.json()
        if response.status_code != 200:
            return ChatResult(response.status_code, response.headers, None, data.get("error"), False)
        raw = data["choices"][0]["message"]
        message = {"role": "assistant", "content": raw.get("content")}
        if raw.get("tool_calls"):
            message["tool_calls"] = [
                {"id": c["id"], "type": "function", "function": {k: c["function"][k] for k in ("name", "arguments")}}
                for c in raw["tool_calls"]
            ]
        return ChatResult(200, response.headers, message, None, False)
    with http.stream("POST", "/v1/chat/completions", json=body, headers=headers or {}) as response:
        if response.status_code != 200:
            response.read()
            return ChatResult(response.status_code, response.headers, None, response.json().get("error"), False)
        content: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        error, done, finished = None, False, False
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[len("data: "):]
            if payload == "[DONE]":
                done = True
                continue
            event = json.loads(payload)
            if "error" in event:
                error = event["error"]
                continue
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                content.append(delta.get("content") or "")
                for d in delta.get("tool_calls") or []:
                    blank = {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                    slot = calls.setdefault(d["index"], blank)
                    slot["id"] += d.get("id") or ""
                    slot["function"]["name"] += (d.get("function") or {}).get("name") or ""
                    slot["function"]["arguments"] += (d.get("function") or {}).get("arguments") or ""
                finished = finished or choice.get("finish_reason") is not None
        if error is not None or not finished:
            return ChatResult(200, response.headers, None, error or {"message": "stream ended early"}, done)
        message = {"role": "assistant", "content": "".join(content) or None}
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        return ChatResult(200, response.headers, message, None, done)


def stored_form(message: dict[str, Any]) -> dict[str, Any]:
    """A message as the admin API shows it, without our bookkeeping fields (seq, created_at, status, ref)."""
    return {k: v for k, v in message.items() if k not in ("seq", "created_at", "status", "ref")}


def merge_sections(base: dict[str, dict[str, Any]], extra: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Settings sections of `base` updated key by key with those of `extra`."""
    out = {name: dict(values) for name, values in base.items()}
    for name, values in extra.items():
        out.setdefault(name, {}).update(values)
    return out
