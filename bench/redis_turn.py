"""What one turn costs the Redis store (proxy/store/redis/), by conversation size.

    python -m bench.redis_turn                       # a throwaway redis-server on a free loopback port
    python -m bench.redis_turn --redis-url redis://127.0.0.1:6379/0 --turns 50

A turn is what the engine and proxy/turns.py's TurnWriter do to the store under the
conversation's lock: `get`, `append` of the turn's new item as pending, then `finish_turn` (the
item live, the reply appended, a turn record as proxy/engine/report.py builds it, one upstream
call and its first-forwarded mark). Scenarios:

  first 200        a new conversation: the whole 200-message transcript stored in its first turn
  turn @200        later turns of a conversation of ~200 messages (each adds a tool result and a reply)
  turn @2000       the same at ~2,000 messages
  alternating @2000  the same, turns alternating between two RedisStore instances (two replicas
                   behind a round-robin load balancer): each `get` follows the other replica's writes

Figures per turn, of the three store calls only: this process's CPU (time.process_time, the
client side: encoding, parsing, building the Conversation) and wall time, median and p90 over the
measured turns, the median of each call, and the Redis server's CPU per turn (INFO cpu before and
after the scenario). Messages are the bench's agent transcript (bench/workload.py), repeated past
200 with fresh tool-call ids. Keys go under a prefix of their own, deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import redis as sync_redis

from proxy.identity import ConversationKey
from proxy.messages import message_hash
from proxy.store import LIVE, PENDING, TurnRecord
from proxy.store.redis import RedisStore

from .procs import LOOPBACK, free_port
from .workload import base_parts, tool_pool

CALL = {"name": "read_file", "arguments": '{"path": "proxy/turns.py"}'}
T = TypeVar("T")
REPLY = {"role": "assistant", "content": None,
         "tool_calls": [{"id": "call_reply", "type": "function", "function": CALL}]}


@contextmanager
def throwaway_redis() -> Iterator[str]:
    """A redis-server of its own on a free loopback port, no persistence; its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not on PATH: run scripts/ensure-redis.sh, or pass --redis-url")
    port, folder = free_port(), tempfile.mkdtemp(prefix="cp-bench-redis-")
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", LOOPBACK, "--save", "", "--appendonly", "no", "--dir", folder],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )
    url = f"redis://{LOOPBACK}:{port}/0"
    try:
        client = sync_redis.Redis.from_url(url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except sync_redis.ConnectionError:
                if process.poll() is not None or time.monotonic() > deadline:
                    sys.exit("redis-server did not start")
                time.sleep(0.01)
        client.close()
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


def transcript(n: int) -> list[dict[str, Any]]:
    """n messages of the bench's agent transcript (past 200: its tool steps again, new call ids)."""
    base = [json.loads(part) for part in base_parts("agent200")]
    out = list(base[:n])
    copy = 0
    while len(out) < n:
        copy += 1
        for m in base[2:]:
            m = json.loads(json.dumps(m))
            if m.get("tool_calls"):
                m["tool_calls"][0]["id"] += f"-{copy}"
            elif m.get("tool_call_id"):
                m["tool_call_id"] += f"-{copy}"
            out.append(m)
            if len(out) == n:
                break
    return out


def tool_result(i: int) -> dict[str, Any]:
    """A turn's new item: the result of the reply's tool call (the bench's tool outputs in turn)."""
    pool = tool_pool()
    return {"role": "tool", "tool_call_id": "call_reply", "content": pool[i % len(pool)]}


def record(live: list[int], new: list[int], turn: int) -> TurnRecord:
    """A turn record shaped as TurnReport.record makes it (sent_seqs: the whole live transcript)."""
    return TurnRecord(**{
        "created_at": time.time(), "format": "chat", "model": "bench-model", "sent_seqs": live,
        "tokens_sent": 40_000, "tokens_sent_total": 40_000 * turn, "messages_left_out": 0, "truncated": 0,
        "masked": 0, "summary_id": None, "repairs": 0, "llm_calls": 1, "llm_call_limit": None,
        "read_rounds": 0, "response_id": f"chatcmpl-{uuid.uuid4().hex}", "inbox": [], "knowledge": None,
        "status": LIVE, "new_seqs": new, "client": "bench/1.0",
        "usage": {"prompt_tokens": 40_000, "completion_tokens": 30}, "error": None,
    })


@dataclass
class Figures:
    name: str
    cpu_ms: list[float] = field(default_factory=list)
    wall_ms: list[float] = field(default_factory=list)
    calls: dict[str, list[float]] = field(default_factory=dict)  # call -> CPU ms per turn
    server_ms: float = 0.0  # Redis's CPU per turn

    def line(self) -> str:
        def p90(xs: list[float]) -> float:
            return sorted(xs)[int(0.9 * (len(xs) - 1))]

        calls = " ".join(f"{name} {statistics.median(xs):.2f}" for name, xs in self.calls.items())
        return (
            f"| {self.name} | {statistics.median(self.cpu_ms):.2f} | {p90(self.cpu_ms):.2f} | "
            f"{statistics.median(self.wall_ms):.2f} | {p90(self.wall_ms):.2f} | {self.server_ms:.2f} | {calls} |"
        )


class Bench:
    def __init__(self, url: str, turns: int) -> None:
        self.url, self.turns = url, turns
        self.prefix = f"cp-bench-{uuid.uuid4().hex[:8]}:"
        self.stores: list[RedisStore] = []
        self.info = sync_redis.Redis.from_url(url)

    def store(self) -> RedisStore:
        store = RedisStore(self.url, prefix=self.prefix)
        self.stores.append(store)
        return store

    def server_cpu_s(self) -> float:
        cpu = self.info.info("cpu")
        return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])

    async def turn(self, store: RedisStore, key: ConversationKey, new: list[dict[str, Any]], fig: Figures) -> None:
        """One turn; only the three store calls are timed (the engine hashes, and builds the record)."""
        hashes = [message_hash(m) for m in new]
        reply_hash = message_hash(REPLY)
        cpu: dict[str, float] = {}
        wall = 0.0

        async def timed(name: str, call: Awaitable[T]) -> T:
            nonlocal wall
            started_wall, started = time.perf_counter(), time.process_time()
            result = await call
            cpu[name] = (time.process_time() - started) * 1000
            wall += (time.perf_counter() - started_wall) * 1000
            return result

        conversation = await timed("get", store.get(key))
        seqs = await timed("append", store.append(key, new, hashes, PENDING))
        live = [seq for seq, _ in conversation.live] if conversation else []
        turn = (conversation.turns if conversation else 0) + 1
        calls = (conversation.llm_calls if conversation else 0) + 1
        turn_record = record(live + seqs, seqs, turn)
        await timed("finish", store.finish_turn(
            key, dict.fromkeys(seqs, LIVE), [(REPLY, reply_hash)], LIVE, turn_record,
            llm_calls=1, forwarded=dict.fromkeys(seqs, calls),
        ))
        fig.cpu_ms.append(sum(cpu.values()))
        fig.wall_ms.append(wall)
        for name, ms in cpu.items():
            fig.calls.setdefault(name, []).append(ms)

    async def grow(self, store: RedisStore, key: ConversationKey, messages: list[dict[str, Any]]) -> None:
        """Store `messages` as turns of up to 200 items would have (live, forwarded), untimed."""
        for i in range(0, len(messages), 200):
            await self.turn(store, key, messages[i : i + 200], Figures("setup"))

    async def first(self, size: int) -> Figures:
        fig, store, messages = Figures(f"first {size}"), self.store(), transcript(size)
        for i in range(3):  # warm-up: scripts loaded, connections made
            await self.turn(store, ConversationKey("bench", f"warm-{i}"), messages, Figures("warm"))
        server = self.server_cpu_s()
        for i in range(self.turns):
            await self.turn(store, ConversationKey("bench", f"first-{uuid.uuid4().hex[:6]}-{i}"), messages, fig)
        fig.server_ms = (self.server_cpu_s() - server) * 1000 / self.turns
        return fig

    async def later(self, size: int, *, replicas: int = 1) -> Figures:
        name = f"turn @{size}" if replicas == 1 else f"alternating @{size}"
        fig, stores = Figures(name), [self.store() for _ in range(replicas)]
        key = ConversationKey("bench", f"later-{size}-{replicas}-{uuid.uuid4().hex[:6]}")
        await self.grow(stores[0], key, transcript(size))
        for i in range(3):  # warm-up
            await self.turn(stores[i % replicas], key, [tool_result(i)], Figures("warm"))
        server = self.server_cpu_s()
        for i in range(self.turns):
            await self.turn(stores[i % replicas], key, [tool_result(i)], fig)
        fig.server_ms = (self.server_cpu_s() - server) * 1000 / self.turns
        return fig

    async def close(self) -> None:
        for store in self.stores:
            await store.close()
        for key in self.info.scan_iter(match=f"{self.prefix}*", count=1000):
            self.info.unlink(key)
        self.info.close()


async def run(url: str, turns: int) -> list[Figures]:
    bench = Bench(url, turns)
    try:
        return [
            await bench.first(200),
            await bench.later(200),
            await bench.later(2000),
            await bench.later(2000, replicas=2),
        ]
    finally:
        await bench.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--redis-url", help="an existing Redis (default: start a throwaway redis-server)")
    p.add_argument("--turns", type=int, default=40, help="measured turns per scenario")
    args = p.parse_args(argv)
    if args.redis_url:
        results = asyncio.run(run(args.redis_url, args.turns))
    else:
        with throwaway_redis() as url:
            results = asyncio.run(run(url, args.turns))
    print("| scenario | CPU ms p50 | CPU ms p90 | wall ms p50 | wall ms p90 | Redis CPU ms | CPU ms p50 by call |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for fig in results:
        print(fig.line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
