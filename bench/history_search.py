"""One history search (`Store.search`, what search_history and GET .../search run) at 2,000 messages.

    .venv/bin/python -m bench.history_search [--messages 2000] [--queries 60] [--backend diskcache,redis]

A conversation of agent-like messages (user turns, assistant sentences, tool outputs of 200 B to
30 KB: code, logs, JSON) is written to a real store; then the first search (which builds the index
from the log) is timed once, and a warm search (the index kept up, the catch-up read of the log's
end, the hits' messages read back) over varied queries: median and p95 of wall time. Redis needs
a redis-server (scripts/ensure-redis.sh); it is skipped when none answers.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

from proxy.config import StorageSettings
from proxy.identity import ConversationKey
from proxy.messages import message_hash
from proxy.store import LIVE, Store, open_store

KEY = ConversationKey("bench-tenant", "search")
WORDS = ("invoice ledger rounding credit refund payout mandate export tax currency batch retry webhook audit "
         "merchant account drift import nightly handler module test cache worker queue").split()


def messages(n: int, rng: random.Random) -> list[dict]:
    out: list[dict] = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append({"role": "user", "content": f"Next: look at the {rng.choice(WORDS)} {rng.choice(WORDS)} ({i})."})
        elif kind == 1:
            sentence = " ".join(rng.choices(WORDS, k=12))
            out.append({"role": "assistant", "content": f"I found that {sentence} in services/{rng.choice(WORDS)}_{i}.py."})
        else:
            size = rng.choice((200, 800, 1500, 3000, 6000, 12000, 30000))
            lines, chars = [], 0
            while chars < size:
                line = f"2024-05-01T10:{i % 60:02d}:00Z INFO {rng.choice(WORDS)} {rng.randint(10000, 99999)} done in {rng.randint(1, 900)} ms"
                lines.append(line)
                chars += len(line) + 1
            out.append({"role": "tool", "tool_call_id": f"call_{i}", "content": "\n".join(lines)})
    return out


async def measure(store: Store, n: int, queries: int, rng: random.Random) -> dict[str, float]:
    batch = messages(n, rng)
    for start in range(0, n, 200):
        part = batch[start : start + 200]
        await store.append(KEY, part, [message_hash(m) for m in part], LIVE)
    started = time.perf_counter()
    await store.search(KEY, "ledger drift nightly import")
    first = time.perf_counter() - started
    times = []
    for _ in range(queries):
        query = " ".join(rng.choices(WORDS, k=rng.randint(2, 8)))
        started = time.perf_counter()
        hits = await store.search(KEY, query, limit=5)
        times.append(time.perf_counter() - started)
        assert hits
    times.sort()
    return {"first_ms": first * 1000, "median_ms": statistics.median(times) * 1000,
            "p95_ms": times[int(len(times) * 0.95) - 1] * 1000}


async def main_async(args: argparse.Namespace) -> None:
    rows = []
    for backend in args.backend.split(","):
        rng = random.Random(7)
        with tempfile.TemporaryDirectory() as folder:
            if backend == "redis":
                from proxy.store.redis import RedisStore

                store: Store = RedisStore(args.redis_url, prefix=f"cp-bench-search-{rng.randint(0, 10**9)}:")
                try:
                    await store.get(KEY)
                except Exception as exc:  # noqa: BLE001  (no server: say so, measure the rest)
                    print(f"redis: skipped ({exc})")
                    continue
            else:
                store = open_store(StorageSettings(backend="diskcache", path=Path(folder) / "store"))
            try:
                rows.append((backend, await measure(store, args.messages, args.queries, rng)))
                if backend == "redis":
                    await store.delete(KEY)
            finally:
                await store.close()
    print(f"History search, {args.messages} messages, {args.queries} queries, top 5 (target: one search <= 5 ms)\n")
    print("| backend | first search (builds the index) | search median | search p95 |")
    print("| --- | --- | --- | --- |")
    for backend, r in rows:
        print(f"| {backend} | {r['first_ms']:.1f} ms | {r['median_ms']:.2f} ms | {r['p95_ms']:.2f} ms |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=60)
    parser.add_argument("--backend", default="diskcache,redis")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
