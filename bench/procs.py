"""Processes of the bench: start them pinned to a core, wait until they answer, measure, stop them.

Pinning on a 2-core machine: core 0 is the client side (run.py, the load generator and the mock
upstream), core 1 is the process under test (the forwarder, context-proxy or LiteLLM) and all of
its threads. A target's CPU and throughput are then one core's worth, undisturbed by the client,
as DESIGN.md's "on one core" asks. Affinity is set with os.sched_setaffinity in the child before
exec, i.e. what `taskset -c 1 python -m proxy serve ...` does; threads inherit it.

CPU comes from /proc/<pid>/stat (utime + stime, in clock ticks, whole thread group, exited threads
included) summed over the process and its descendants; /proc/<pid>/task/*/schedstat gives the same
in nanoseconds, which single-request measurements (scaling) need. Memory is VmRSS / VmHWM.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")
LOOPBACK = "127.0.0.1"


def cores() -> tuple[set[int] | None, set[int] | None]:
    """(client cores, target cores): {0} and {1} when there are two or more, else no pinning."""
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        return None, None
    return {available[0]}, {available[1]}


def pin_self(cpus: set[int] | None) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a bench process: nothing that could send a request off this machine."""
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy") and not k.startswith("CONTEXT_PROXY_")}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(extra or {})
    return env


@dataclass
class Proc:
    name: str
    argv: list[str]
    port: int
    ready_path: str  # GET this until it answers 2xx
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    cpus: set[int] | None = None
    popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def start(self) -> Proc:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        cpus = self.cpus
        with open(self.log, "wb") as log:
            self.popen = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=clean_env(self.env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # The bench starts no threads, so preexec_fn is safe: it pins the child before exec.
                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,  # noqa: PLW1509
            )
        return self

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if self.popen is not None and self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.popen.returncode} at start-up; log: {self.log}\n{self.tail()}")
            try:
                conn = http.client.HTTPConnection(LOOPBACK, self.port, timeout=2)
                conn.request("GET", self.ready_path)
                status = conn.getresponse().status
                conn.close()
                if 200 <= status < 300:
                    return
                last = f"HTTP {status}"
            except OSError as exc:
                last = str(exc)
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f}s ({last}); log: {self.log}\n{self.tail()}")

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM this process and its descendants, by pid; SIGKILL what is left after 10 s."""
        if self.popen is None or self.popen.poll() is not None:
            return
        pids = [self.pid, *descendants(self.pid)]
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        for pid in pids:
            if pid == self.pid and self.popen.poll() is not None:
                continue
            if pid != self.pid and not Path(f"/proc/{pid}").exists():
                continue
            _signal(pid, signal.SIGKILL)
        self.popen.wait(timeout=5)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                children = Path(f"/proc/{p}/task/{tid}/children").read_text().split()
            except OSError:
                continue
            for c in map(int, children):
                out.append(c)
                todo.append(c)
    return out


def _tree(pid: int) -> list[int]:
    return [pid, *descendants(pid)]


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine spent busy since boot (/proc/stat, all but idle/iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def cpu_split(pid: int) -> tuple[float, float]:
    """(utime, stime) of the process tree in seconds, from /proc/<pid>/stat (clock-tick resolution)."""
    user = system = 0
    for p in _tree(pid):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        user += int(fields[11])  # utime: field 14 of stat(5)
        system += int(fields[12])  # stime: field 15
    return user / CLK_TCK, system / CLK_TCK


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process tree, from /proc/<pid>/stat."""
    return sum(cpu_split(pid))


def cpu_ns(pid: int) -> int:
    """On-CPU time of the live threads of the process tree, from schedstat (nanoseconds)."""
    total = 0
    for p in _tree(pid):
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                total += int(Path(f"/proc/{p}/task/{tid}/schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return total


_MEMORY_FIELDS = {"VmRSS:": "rss", "VmHWM:": "hwm", "RssAnon:": "anon", "RssFile:": "file"}


def memory_mb(pid: int) -> dict[str, float]:
    """In MB, summed over the process tree: rss (VmRSS), hwm (VmHWM, the peak), and rss split into
    anon (the heap: Python objects, caches) and file (mapped files, e.g. SQLite's mmap of its db)."""
    kb = dict.fromkeys(_MEMORY_FIELDS.values(), 0)
    for p in _tree(pid):
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            name = _MEMORY_FIELDS.get(line.split(None, 1)[0] if line else "")
            if name:
                kb[name] += int(line.split()[1])
    return {k: v / 1024 for k, v in kb.items()}


def context_switches(pid: int) -> int:
    """Voluntary + involuntary context switches of the live threads of the process tree: every
    hop between the event loop and a worker thread costs (at least) two of them on one core."""
    total = 0
    for p in _tree(pid):
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                for line in Path(f"/proc/{p}/task/{tid}/status").read_text().splitlines():
                    if line.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                        total += int(line.split()[1])
            except (OSError, ValueError, IndexError):
                continue
    return total


@dataclass
class CpuReading:
    stat_s: float  # /proc/<pid>/stat utime + stime
    sys_s: float  # the stime part: the kernel (syscalls, wake-ups) on the process's behalf
    sched_s: float  # schedstat, nanosecond resolution
    switches: int  # context switches


class CpuMeter:
    """CPU (both clocks) and context switches of a process tree between start() and stop()."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._start = CpuReading(0.0, 0.0, 0.0, 0)

    def _read(self) -> CpuReading:
        user, system = cpu_split(self.pid)
        return CpuReading(user + system, system, cpu_ns(self.pid) / 1e9, context_switches(self.pid))

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> CpuReading:
        now = self._read()
        return CpuReading(
            now.stat_s - self._start.stat_s, now.sys_s - self._start.sys_s,
            now.sched_s - self._start.sched_s, now.switches - self._start.switches,
        )
