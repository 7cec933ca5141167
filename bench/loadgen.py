"""The load generator: its own process, driven by JSON lines on stdin, answering on stdout.

`python -m bench.loadgen` (run.py starts it pinned to the client core). Commands, one per line:

  {"op": "open", "pool": P, "kind": "agent200|small|empty", "ids": [...], "url": BASE_URL, "wire": W,
   "named": bool}
        full-history conversations in wire format W (chat, responses or messages: bench/wires.py;
        chat by default) and one keep-alive HTTP session; named (default true): each request names
        its conversation by the wire's header (X-Conversation-ID, Claude Code's session id), else
        by nothing (the zero-code-change agent: the proxy derives its conversation)
  {"op": "run", "pool": P, "requests": N, "concurrency": C, "warmup": W, "stream": bool, "model": M,
   "gap_ms": G}
        C workers; worker w owns conversations w, w+C, ... and takes turns on them round-robin.
        Each worker first sends W unmeasured requests (so every connection is open and warm),
        all wait for each other, then the clock starts and N requests are shared among them,
        each worker idle G ms before each of its requests (0: back to back), as an agent's turns
        come with the model's and the tools' time between them.
  {"op": "json_rt", "pool": P, "repeat": K}  the best time of json.loads + json.dumps of
        conversation 0's next body (the "JSON round trip" reference of DESIGN.md's targets)
  {"op": "close", "pool": P}    {"op": "quit"}

Why a process of its own, driven like this: the client must not share an interpreter (or a GIL)
with the processes it measures, and run.py must be able to read /proc between two requests (the
scaling run measures single turns) without paying a process start-up per measurement.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from .stats import summary
from .wires import WIRES, CutShort, Wire

# One tenant for the whole bench; also the master key of the LiteLLM target (it refuses to start without one).
API_KEY = "sk-bench-5f1c0e7a9b2d4c6e8f0a1b3c5d7e9f10"
ID_HEADER = "X-Conversation-ID"


@dataclass
class Pool:
    conversations: list[Any]  # the wire's full-history clients
    url: str  # the target's base URL
    session: aiohttp.ClientSession
    wire: Wire
    named: bool = True  # whether requests carry the conversation's id in a header


@dataclass
class Outcome:
    first: list[float] = field(default_factory=list)  # ms, first turn of a conversation (stores it all)
    later: list[float] = field(default_factory=list)  # ms, later turns (stored prefix + 2 new messages)
    ttfb: list[float] = field(default_factory=list)  # ms to the first body byte (streams)
    reads: list[int] = field(default_factory=list)  # reads per stream: chunks arrived separately?
    sent_bytes: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)

    def error(self, text: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 3:
            self.error_samples.append(text[:300])


async def one_request(pool: Pool, conv: Any, model: str, stream: bool, out: Outcome | None) -> None:
    body = conv.body(model, stream)
    headers = {"Content-Type": "application/json", **pool.wire.headers(API_KEY, conv.id if pool.named else None)}
    first_turn = conv.turn == 0
    start = time.perf_counter()
    try:
        async with pool.session.post(pool.wire.url(pool.url, model, stream), data=body, headers=headers) as resp:
            if stream and resp.status == 200:
                reads, first_byte, buf = 0, None, bytearray()
                async for chunk in resp.content.iter_any():
                    if first_byte is None:
                        first_byte = time.perf_counter()
                    reads += 1
                    buf += chunk
                end = time.perf_counter()
                data = bytes(buf)
                if out is not None and first_byte is not None:
                    out.ttfb.append((first_byte - start) * 1000)
                    out.reads.append(reads)
            else:
                data = await resp.read()
                end = time.perf_counter()
                if resp.status != 200:
                    if out is not None:
                        out.error(f"HTTP {resp.status}: {data[:200]!r}")
                    return
        pool.wire.advance(conv, data, stream)
    except CutShort as exc:
        if out is not None:
            out.error(f"reply without a tool call (stream cut short?): {exc}")
        return
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError) as exc:
        if out is not None:
            out.error(f"{type(exc).__name__}: {exc}")
        return
    if out is not None:
        (out.first if first_turn else out.later).append((end - start) * 1000)
        out.sent_bytes += len(body)


async def run(
    pool: Pool, requests: int, concurrency: int, warmup: int, stream: bool, model: str, gap_ms: float = 0,
) -> dict[str, Any]:
    convs = pool.conversations
    if concurrency > len(convs):
        raise ValueError(f"concurrency {concurrency} needs at least as many conversations (have {len(convs)})")
    # Fixed quotas, not a shared counter: in a "first turn" run each conversation gets exactly one.
    quotas = [requests // concurrency + (1 if w < requests % concurrency else 0) for w in range(concurrency)]
    out = Outcome()
    ready = asyncio.Barrier(concurrency + 1)
    go = asyncio.Event()

    async def worker(w: int) -> None:
        mine = convs[w::concurrency]
        for i in range(warmup):
            await one_request(pool, mine[i % len(mine)], model, stream, None)
        await ready.wait()
        await go.wait()
        for i in range(quotas[w]):
            if gap_ms:
                await asyncio.sleep(gap_ms / 1000)
            await one_request(pool, mine[(warmup + i) % len(mine)], model, stream, out)

    tasks = [asyncio.create_task(worker(w)) for w in range(concurrency)]
    await ready.wait()
    start = time.perf_counter()
    go.set()
    await asyncio.gather(*tasks)
    wall = time.perf_counter() - start
    done = len(out.first) + len(out.later)
    return {
        "sent": requests + warmup * concurrency,  # every request the target handled (CPU is per sent request)
        "measured": requests,
        "completed": done,
        "wall_s": wall,
        "rps": done / wall if wall > 0 else None,
        "first": summary(out.first),
        "later": summary(out.later),
        "all": summary(out.first + out.later),
        "ttfb": summary(out.ttfb),
        "reads_per_stream": summary(out.reads),
        "mean_body_bytes": out.sent_bytes / done if done else None,
        "messages": convs[0].messages,
        "errors": out.errors,
        "error_samples": out.error_samples,
    }


def json_round_trip(pool: Pool, repeat: int) -> dict[str, Any]:
    """What parsing and re-serializing this body costs one core of this machine, at best."""
    body = pool.conversations[0].body("bench-s16", False)
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        json.dumps(json.loads(body), ensure_ascii=False).encode()
        best = min(best, time.process_time() - t0)
    return {"ms": best * 1000, "bytes": len(body)}


async def handle(pools: dict[str, Pool], cmd: dict[str, Any]) -> dict[str, Any]:
    op = cmd["op"]
    if op == "open":
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=False),
            timeout=aiohttp.ClientTimeout(total=300),
        )
        wire = WIRES[cmd.get("wire", "chat")]
        url = cmd["url"].rstrip("/")  # the wire's path goes after it, per request (Wire.url)
        conversations = [wire.make(c, cmd["kind"], n) for n, c in enumerate(cmd["ids"])]
        pools[cmd["pool"]] = Pool(conversations, url, session, wire, cmd.get("named", True))
        return {}
    if op == "run":
        return await run(
            pools[cmd["pool"]], cmd["requests"], cmd.get("concurrency", 1), cmd.get("warmup", 0),
            cmd.get("stream", False), cmd.get("model", "bench-s16"), cmd.get("gap_ms", 0),
        )
    if op == "json_rt":
        return json_round_trip(pools[cmd["pool"]], cmd.get("repeat", 5))
    if op == "close":
        pool = pools.pop(cmd["pool"], None)
        if pool is not None:
            await pool.session.close()
        return {}
    raise ValueError(f"unknown op {op!r}")


async def main() -> None:
    pools: dict[str, Pool] = {}
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line or not line.strip():
            if not line:
                break
            continue
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        try:
            answer = {"ok": True, **(await handle(pools, cmd))}
        except Exception as exc:  # noqa: BLE001  # report, keep serving: run.py decides what a failure means
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    for pool in pools.values():
        await pool.session.close()


if __name__ == "__main__":
    asyncio.run(main())
