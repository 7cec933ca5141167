"""A bounded soak: `python -m bench.soak [--seconds 600] [--rate 60] [--concurrency 8]`.

Two context-proxy replicas share one Redis (a private redis-server on a free loopback port) in front
of the bench's mock upstream. Agent-like clients run conversations against them, every request
going to the next replica in turn (a load balancer without affinity, the hardest case for shared
state): full-history and proxy-history clients, streamed and not, a tool call in every reply, tool
outputs from 300 to 30,000 characters (the long ones are truncated), a user message every few
turns, some conversations under a `turns` compaction profile. A conversation ends after a number
of turns and the worker starts a new one, so the store keeps growing while each request stays small.

Every interval (default 60 s) it records request latency percentiles and each replica's resident
memory (VmRSS from /proc/<pid>/status), prints a table, checks that every finished conversation's
live transcript in Redis has exactly the client's messages, and says whether memory stayed flat
(the last interval within 10% of the first). It stops by itself after --seconds (hard limit:
--seconds + 120). Everything runs on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from .procs import Proc, free_port, memory_mb
from .stats import percentile

REPO = Path(__file__).resolve().parent.parent
API_KEY = "sk-soak-0000000000000000"
TOOLS = [{"type": "function", "function": {"name": "run_shell", "parameters": {"type": "object", "properties": {}}}}]
FLAT_TOLERANCE = 0.10  # DESIGN.md's memory target: flat within ±10%


# -- processes ---------------------------------------------------------------------------------------------


class Redis:
    """redis-server on a free loopback port, no persistence, in `workdir`."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not on PATH: run scripts/ensure-redis.sh")
        self.port = free_port()
        self.log = workdir / "redis.log"
        self.popen = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(workdir),
                "--daemonize",
                "no",
            ],
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while self.command(b"PING") != b"+PONG":
            if self.popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server did not start: {self.log.read_text()[-1000:]}")
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self, *parts: bytes) -> bytes:
        """One command over a fresh connection; the reply's payload (b"" if Redis is unreachable)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                s.sendall(b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts))
                data = b""
                while b"\r\n" not in data:
                    data += s.recv(65536)
                head, _, rest = data.partition(b"\r\n")
                if not head.startswith(b"$"):
                    return head  # a simple reply: +PONG, -ERR ...
                size = int(head[1:])
                while len(rest) < size + 2:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    rest += chunk
                return rest[:size]
        except (OSError, ValueError):
            return b""

    def rss_mb(self) -> float:
        info = self.command(b"INFO", b"memory").decode(errors="replace")
        for line in info.splitlines():
            if line.startswith("used_memory_rss:"):
                return int(line.split(":")[1]) / 2**20
        return float("nan")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()


def write_config(workdir: Path, upstream_port: int, redis_url: str) -> Path:
    config = {
        "upstream": {"base_url": f"http://127.0.0.1:{upstream_port}/v1", "timeout_s": 30},
        "storage": {"backend": "redis", "redis_url": redis_url},
        "logging": {"level": "INFO"},
        "profiles": {"compacting": {"compaction": {"strategy": "turns", "turns": {"every_n_user_messages": 3}}}},
    }
    path = workdir / "config.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


# -- the clients -------------------------------------------------------------------------------------------


@dataclass
class Stats:
    started: float
    interval: float
    last: int  # the last interval's index: requests finishing just after the deadline count there
    latencies: dict[int, list[float]] = field(default_factory=dict)  # interval -> ms
    errors: dict[int, int] = field(default_factory=dict)
    streamed: dict[int, int] = field(default_factory=dict)
    error_samples: list[str] = field(default_factory=list)

    def bucket(self) -> int:
        return min(int((time.monotonic() - self.started) // self.interval), self.last)

    def ok(self, ms: float, stream: bool) -> None:
        b = self.bucket()
        self.latencies.setdefault(b, []).append(ms)
        if stream:
            self.streamed[b] = self.streamed.get(b, 0) + 1

    def error(self, text: str) -> None:
        b = self.bucket()
        self.errors[b] = self.errors.get(b, 0) + 1
        if len(self.error_samples) < 10:
            self.error_samples.append(text[:300])


class Agent:
    """One conversation: full or proxy history, its own transcript, a tool result after each reply."""

    ids = itertools.count()

    def __init__(self, rng: random.Random) -> None:
        self.cid = f"soak-{next(self.ids)}-{rng.randrange(16**6):06x}"
        self.mode = "proxy" if rng.random() < 0.3 else "full"
        self.profile = "compacting" if rng.random() < 0.25 else None
        self.stream_share = rng.choice([0.0, 0.5, 1.0])
        self.turns_left = rng.randint(15, 40)
        self.system = {"role": "system", "content": "You are a careful coding agent. " * 20}
        self.transcript: list[dict[str, Any]] = [
            self.system,
            {"role": "user", "content": f"Task {self.cid}: fix the failing tests."},
        ]
        self.new: list[dict[str, Any]] = self.transcript[1:]  # what a proxy-history client sends next
        self.turn = 0

    def headers(self) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {API_KEY}", "X-Conversation-ID": self.cid}
        if self.mode == "proxy":
            headers["X-History"] = "proxy"
        if self.profile:
            headers["X-Context-Profile"] = self.profile
        return headers

    def body(self, stream: bool) -> dict[str, Any]:
        messages = self.transcript if self.mode == "full" else [self.system, *self.new]
        body: dict[str, Any] = {"model": "bench-s16" if stream else "bench", "messages": messages, "tools": TOOLS}
        if stream:
            body["stream"] = True
        return body

    def replied(self, message: dict[str, Any], rng: random.Random) -> None:
        self.turn += 1
        self.turns_left -= 1
        self.transcript.append(message)
        size = rng.choice([300, 800, 2000, 5000, 30_000]) if rng.random() < 0.9 else 15_000
        follow = [
            {
                "role": "tool",
                "tool_call_id": call["id"],
                "content": f"[{self.turn}] " + "line of output\n" * (size // 15),
            }
            for call in message.get("tool_calls") or []
        ]
        if self.turn % 4 == 0:
            follow.append({"role": "user", "content": f"Progress check {self.turn}: keep going."})
        self.transcript += follow
        self.new = follow


async def complete(session: aiohttp.ClientSession, url: str, agent: Agent, stream: bool) -> dict[str, Any]:
    async with session.post(url, json=agent.body(stream), headers=agent.headers()) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:200]}")
        if not stream:
            raw = (await response.json())["choices"][0]["message"]
            message = {"role": "assistant", "content": raw.get("content")}
            if raw.get("tool_calls"):
                message["tool_calls"] = [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]},
                    }
                    for c in raw["tool_calls"]
                ]
            return message
        content: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        done = False
        buffer = b""
        async for chunk in response.content.iter_any():
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                if not line.startswith(b"data: "):
                    continue
                payload = line[6:].strip()
                if payload == b"[DONE]":
                    done = True
                    continue
                event = json.loads(payload)
                if "error" in event:
                    raise RuntimeError(f"stream error: {event['error']}")
                for choice in event.get("choices") or []:
                    delta = choice.get("delta") or {}
                    content.append(delta.get("content") or "")
                    for d in delta.get("tool_calls") or []:
                        slot = calls.setdefault(
                            d["index"], {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                        )
                        slot["id"] += d.get("id") or ""
                        slot["function"]["name"] += (d.get("function") or {}).get("name") or ""
                        slot["function"]["arguments"] += (d.get("function") or {}).get("arguments") or ""
        if not done:
            raise RuntimeError("stream ended without [DONE]")
        message = {"role": "assistant", "content": "".join(content) or None}
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        return message


async def worker(
    robin: itertools.cycle, stats: Stats, deadline: float, period: float, finished: list[Agent], rng: random.Random
) -> None:
    """One client: conversation after conversation, one request every `period` seconds at most."""
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        agent = Agent(rng)
        next_at = time.monotonic() + rng.uniform(0, period)
        while True:
            now = time.monotonic()
            if now >= deadline:
                return
            if next_at > now:
                await asyncio.sleep(min(next_at - now, deadline - now))
                continue
            next_at = max(next_at + period, time.monotonic() - period)  # pace, without bursts to catch up
            stream = rng.random() < agent.stream_share
            url = next(robin)
            began = time.perf_counter()
            try:
                message = await complete(session, url, agent, stream)
            except (TimeoutError, aiohttp.ClientError, RuntimeError, ValueError, KeyError) as exc:
                stats.error(f"{agent.cid} turn {agent.turn}: {type(exc).__name__}: {exc}")
                agent = Agent(rng)  # its transcript is no longer known for sure: start afresh
                continue
            stats.ok((time.perf_counter() - began) * 1000, stream)
            agent.replied(message, rng)
            if agent.turns_left <= 0:
                finished.append(agent)
                agent = Agent(rng)


# -- sampling, checking, reporting ------------------------------------------------------------------------


async def sample_memory(
    procs: list[Proc], redis: Redis, stats: Stats, deadline: float, samples: list[dict[str, Any]]
) -> None:
    """RSS of each replica (and Redis) before any traffic, then at the end of every interval."""

    def take(label: int) -> None:
        row: dict[str, Any] = {"interval": label, "t": round(time.monotonic() - stats.started, 1)}
        for proc in procs:
            row[proc.name] = round(memory_mb(proc.pid)["rss"], 1)
        row["redis"] = round(redis.rss_mb(), 1)
        samples.append(row)

    take(-1)
    k = 1
    while True:
        edge = stats.started + k * stats.interval
        if edge >= deadline - 0.5:  # the last interval (maybe a short one) ends at the deadline
            await asyncio.sleep(max(deadline - time.monotonic(), 0))
            take(k - 1)
            return
        await asyncio.sleep(max(edge - time.monotonic(), 0))
        take(k - 1)
        k += 1


async def check_transcripts(admin_url: str, finished: list[Agent], limit: int) -> tuple[int, list[str]]:
    """Every finished conversation's live transcript holds exactly the client's messages, once."""
    problems = []
    checked = 0
    async with aiohttp.ClientSession() as session:
        for agent in finished[-limit:]:
            url = f"{admin_url}/v1/conversations/{agent.cid}/messages"
            async with session.get(
                url, params={"limit": "1000"}, headers={"Authorization": f"Bearer {API_KEY}"}
            ) as response:
                data = (await response.json())["data"]
            stored = [{k: v for k, v in m.items() if k not in ("seq", "created_at")} for m in data]
            # The last tool results were never sent (the conversation ended on a reply).
            expected = agent.transcript[: len(agent.transcript) - len(agent.new)]
            checked += 1
            if stored != expected:
                problems.append(f"{agent.cid}: stored {len(stored)} messages, the client has {len(expected)}")
            elif [m["seq"] for m in data] != sorted({m["seq"] for m in data}):
                problems.append(f"{agent.cid}: seqs out of order or repeated")
    return checked, problems


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def report(stats: Stats, samples: list[dict[str, Any]], names: list[str], seconds: float) -> dict[str, Any]:
    buckets = sorted(set(stats.latencies) | set(stats.errors))
    rows = []
    for b in buckets:
        values = stats.latencies.get(b, [])
        end = next((s for s in reversed(samples) if s["interval"] == b), None)
        span = min(stats.interval, seconds - b * stats.interval)
        rows.append(
            {
                "interval": b + 1,
                "requests": len(values),
                "rps": len(values) / span if span > 0 else 0.0,
                "streamed": stats.streamed.get(b, 0),
                "errors": stats.errors.get(b, 0),
                "p50": percentile(values, 50),
                "p90": percentile(values, 90),
                "p99": percentile(values, 99),
                "max": max(values) if values else None,
                **{f"rss_{n}": (end or {}).get(n) for n in names},
                "rss_redis": (end or {}).get("redis"),
            }
        )
    head = ["int", "requests", "req/s", "streamed", "errors", "p50 ms", "p90 ms", "p99 ms", "max ms"]
    head += [f"RSS {n} MB" for n in names] + ["Redis MB"]
    print("\n| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        cells = [
            str(r["interval"]),
            str(r["requests"]),
            f"{r['rps']:.1f}",
            str(r["streamed"]),
            str(r["errors"]),
            fmt(r["p50"]),
            fmt(r["p90"]),
            fmt(r["p99"]),
            fmt(r["max"]),
        ]
        cells += [fmt(r[f"rss_{n}"]) for n in names] + [fmt(r["rss_redis"])]
        print("| " + " | ".join(cells) + " |")
    start = next((s for s in samples if s["interval"] == -1), None)
    first = next((s for s in samples if s["interval"] == 0), None)
    last = samples[-1] if samples else None
    verdicts = {}
    for n in names:
        if first and last and first is not last:
            growth = (last[n] - first[n]) / first[n]
            verdicts[n] = {
                "idle": start[n] if start else None,
                "after_first_interval": first[n],
                "end": last[n],
                "growth_pct": round(growth * 100, 1),
                "flat": abs(growth) <= FLAT_TOLERANCE,
            }
    return {"rows": rows, "memory": verdicts, "samples": samples}


async def soak(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="cp-soak-"))
    redis = Redis(workdir)
    upstream_port = free_port()
    mock = Proc(
        "mock",
        [sys.executable, "-m", "bench.mock_upstream", "--port", str(upstream_port), "--gap-ms", str(args.gap_ms)],
        upstream_port,
        "/healthz",
        workdir / "mock.log",
        cwd=str(REPO),
    )
    config = write_config(workdir, upstream_port, redis.url)
    replicas = []
    for name in ("A", "B"):
        port = free_port()
        replicas.append(
            Proc(
                name,
                [sys.executable, "-m", "proxy", "serve", "--config", str(config), "--port", str(port)],
                port,
                "/healthz",
                workdir / f"replica-{name}.log",
                cwd=str(REPO),
            )
        )
    procs = [mock, *replicas]
    try:
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.wait_ready(30)
        names = [p.name for p in replicas]
        urls = [f"http://127.0.0.1:{p.port}/v1/chat/completions" for p in replicas]
        print(
            f"soak: {args.seconds:.0f}s, {args.concurrency} clients, ~{args.rate:g} req/s, replicas "
            f"{', '.join(f'{p.name}=:{p.port} (pid {p.pid})' for p in replicas)}, redis :{redis.port}, mock :{upstream_port}"
        )
        stats = Stats(time.monotonic(), args.interval, max(math.ceil(args.seconds / args.interval) - 1, 0))
        deadline = stats.started + args.seconds
        rng = random.Random(args.seed)
        finished: list[Agent] = []
        samples: list[dict[str, Any]] = []
        robin = itertools.cycle(urls)
        period = args.concurrency / args.rate
        tasks = [
            worker(robin, stats, deadline, period, finished, random.Random(rng.random()))
            for _ in range(args.concurrency)
        ]
        await asyncio.gather(sample_memory(replicas, redis, stats, deadline, samples), *tasks)
        elapsed = time.monotonic() - stats.started
        result = report(stats, samples, names, elapsed)
        checked, problems = await check_transcripts(f"http://127.0.0.1:{replicas[1].port}", finished, args.check)
        total = sum(len(v) for v in stats.latencies.values())
        errors = sum(stats.errors.values())
        everything = [ms for v in stats.latencies.values() for ms in v]
        print(
            f"\n{total} requests in {elapsed:.0f}s ({total / elapsed:.1f}/s), {errors} errors; overall p50 "
            f"{fmt(percentile(everything, 50))} ms, p99 {fmt(percentile(everything, 99))} ms; "
            f"{len(finished)} conversations finished"
        )
        for sample in stats.error_samples:
            print("  error:", sample)
        print(f"transcripts checked: {checked}, mismatches: {len(problems)}")
        for problem in problems[:10]:
            print("  mismatch:", problem)
        for name, verdict in result["memory"].items():
            print(
                f"memory {name}: idle {verdict['idle']} MB, after the first interval {verdict['after_first_interval']} MB, "
                f"end {verdict['end']} MB ({verdict['growth_pct']:+.1f}%): {'flat' if verdict['flat'] else 'NOT flat'}"
            )
        flat = all(v["flat"] for v in result["memory"].values()) if result["memory"] else None
        print(
            "memory stayed flat"
            if flat
            else ("memory did NOT stay flat" if flat is False else "memory: run too short to judge")
        )
        if args.json:
            Path(args.json).write_text(
                json.dumps(
                    {
                        "args": vars(args),
                        **result,
                        "requests": total,
                        "errors": errors,
                        "checked": checked,
                        "mismatches": problems,
                    },
                    indent=1,
                )
            )
        return 0 if not problems and errors == 0 and flat is not False else 1
    finally:
        for proc in procs:
            proc.stop()
        redis.stop()
        if args.keep:
            print(f"logs and config kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600, help="how long to run (default 600 = 10 minutes)")
    parser.add_argument("--interval", type=float, default=60, help="seconds per row of the table (default 60)")
    parser.add_argument("--rate", type=float, default=60, help="target requests per second, all clients together")
    parser.add_argument("--concurrency", type=int, default=8, help="concurrent clients (conversations at a time)")
    parser.add_argument("--gap-ms", type=float, default=2.0, help="the mock's pause between streamed chunks")
    parser.add_argument(
        "--check", type=int, default=300, help="finished conversations whose stored transcript is checked"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--keep", action="store_true", help="keep the work dir (logs, config)")
    args = parser.parse_args()
    try:
        code = asyncio.run(asyncio.wait_for(soak(args), args.seconds + 120))
    except TimeoutError:
        print("soak: hard time limit reached, stopped", file=sys.stderr)
        code = 2
    sys.exit(code)


if __name__ == "__main__":
    main()
