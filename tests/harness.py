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
import subprocess
import sys
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from proxy.app import RUNNER_OPTIONS, build_app
from proxy.config import Settings, load_settings

T = TypeVar("T")
ROOT = Path(__file__).resolve().parent.parent


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
        self._runner = web.AppRunner(self.app, **RUNNER_OPTIONS)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]

    def stop(self) -> None:
        if self._runner is not None:
            self.loop.run(self._runner.cleanup())
            self._runner = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

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
