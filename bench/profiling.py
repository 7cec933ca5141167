"""Where the proxy's CPU goes: py-spy samples of the running proxy, folded into top-function lists.

py-spy (`pip install py-spy` into the project venv) attaches to the proxy's pid, samples its
stacks 1,000 times a second without pausing it (--nonblocking), and writes folded stacks ("raw"
format: `frame;frame;...;leaf count`). Idle threads and an event loop waiting in epoll are not
sampled (py-spy's default), so the percentages are shares of the proxy's on-CPU time. One caveat:
the proxy's threads share one core, and a thread that is runnable but waiting for the core is
sampled as busy, so samples can exceed the CPU really spent (compare samples/request with the
table's CPU/request); the ranking is what to read.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")
_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def py_spy() -> str | None:
    """The py-spy executable next to this interpreter, or on PATH."""
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


@dataclass
class Recording:
    popen: subprocess.Popen[bytes]
    output: Path
    log: Path

    def stop(self) -> None:
        # py-spy writes its file when interrupted, like Ctrl-C.
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
        try:
            self.popen.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


def record(pid: int, output: Path, cpus: set[int] | None) -> Recording | None:
    exe = py_spy()
    if exe is None:
        return None
    output.parent.mkdir(parents=True, exist_ok=True)
    log = output.with_suffix(".log")
    with open(log, "wb") as out:
        popen = subprocess.Popen(
            [exe, "record", "--pid", str(pid), "--format", "raw", "--rate", "1000", "--nonblocking",
             "--nolineno", "--output", str(output)],
            stdout=out, stderr=subprocess.STDOUT,
            # On the client core: the sampler must not take CPU from the process it samples.
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,  # noqa: PLW1509  # no threads here
        )
    return Recording(popen, output, log)


def _name(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    path = m.group("file")
    for marker in ("site-packages/", "lib/python3."):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{m.group('fn')} ({path})"


# Leaf frames by where the time goes, first match wins.
CATEGORIES = [
    ("json encode (json.dumps)", ("json/encoder.py", "dumps (json/")),
    ("json decode (json.loads)", ("json/decoder.py", "loads (json/")),
    ("diskcache / sqlite", ("diskcache/", "sqlite3")),
    ("pickle", ("pickle",)),
    ("hashing", ("hashlib", "sha256")),
    ("thread hops (call_soon_threadsafe, futures)", ("_write_to_self", "concurrent/futures", "call_soon_threadsafe", "threading.py")),
    ("event loop + sockets (asyncio, selectors)", ("asyncio/", "selectors.py", "socket.py")),
    ("aiohttp (http parsing, client, server)", ("aiohttp/", "multidict", "yarl/")),
    ("logging", ("logging/",)),
    ("proxy code itself", ("(proxy/",)),
]


# Leaves that are waiting, not working: the event loop in epoll_wait and an executor thread blocked
# on its queue. py-spy's idle detection misses them when the loop wakes every millisecond (a
# stream), so they are dropped here; what is left matches the CPU the table measures.
WAITING = ("EpollSelector.select (selectors.py)", "_worker (concurrent/futures/thread.py)")


def _category(leaf: str) -> str:
    for name, needles in CATEGORIES:
        if any(n in leaf for n in needles):
            return name
    return "other"


def top(folded: Path, n: int = 12) -> dict[str, Any]:
    """Hot spots of a folded-stack file, four ways:
    self: the leaf functions (where the CPU literally is);
    proxy: each sample charged to the deepest proxy/ frame on its stack, i.e. the proxy function
      whose own code or library calls (json, diskcache, ...) spent the time: what to fix;
    category: leaves grouped by kind of work; thread: main (event loop) vs worker threads."""
    self_time: Counter[str] = Counter()
    proxy: Counter[str] = Counter()
    category: Counter[str] = Counter()
    thread: Counter[str] = Counter()
    total = waiting = 0
    for line in folded.read_text(errors="replace").splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        count = int(m.group("count"))
        frames = [_name(f) for f in m.group("stack").split(";")]
        if frames[-1] in WAITING:
            waiting += count
            continue
        total += count
        self_time[frames[-1]] += count
        owner = next((f for f in reversed(frames) if "(proxy/" in f), None)
        if owner is None:
            owner = "(no proxy/ frame: worker thread plumbing, futures, loop wake-ups)"
        elif "(proxy/cli.py)" in owner:
            owner = "(event loop and aiohttp outside any handler)"
        proxy[owner] += count
        category[_category(frames[-1])] += count
        thread["worker threads (diskcache executor)" if any("Thread._bootstrap" in f for f in frames) else "main thread (event loop)"] += count
    if not total:
        return {"samples": 0, "waiting": waiting, "self": [], "proxy": [], "category": [], "thread": []}

    def ranked(c: Counter[str], k: int = n) -> list[dict[str, Any]]:
        return [{"function": f, "pct": round(100 * v / total, 1), "samples": v} for f, v in c.most_common(k)]

    return {"samples": total, "waiting": waiting, "self": ranked(self_time), "proxy": ranked(proxy), "category": ranked(category, 20), "thread": ranked(thread)}
