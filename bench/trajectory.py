"""What a trajectory file (`storage.trajectory_dir`) costs per turn, late in a long run.

    .venv/bin/python -m bench.trajectory [--turns 1000] [--mb 2.5] [--redis redis://127.0.0.1:6379/0]

Builds one conversation of `--turns` turns (a user message or tool output, then the reply) whose
transcript totals `--mb` megabytes, in a real store, then measures writing its file after a turn:

- whole: what rebuilding the file from scratch costs (read every message, encode, write), i.e.
  what the writer does once for a conversation it has not seen since start-up;
- incremental: the writer after one more turn, with the conversation's parts in memory.

For each: wall time until the file is on disk, CPU spent on the event loop's thread, and the
longest the event loop was kept from running (a 1 ms ticker's worst lateness).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from proxy.identity import ConversationKey
from proxy.messages import message_hash
from proxy.refs import RefSigner
from proxy.store import LIVE, PENDING, Store, TurnRecord
from proxy.store.disk import DiskStore
from proxy.trajectory import build_trajectory, encode
from proxy.trajectory_files import TrajectoryWriter, _write_file

KEY = ConversationKey("b" * 24, "long-run")


async def one_turn(store: Store, n: int, chars: int) -> None:
    call = f"call_{n}"
    if n % 2:
        sent: dict[str, Any] = {"role": "tool", "tool_call_id": call, "content": f"output {n}: " + "x" * chars}
        reply: dict[str, Any] = {"role": "assistant", "content": f"step {n} done"}
    else:
        sent = {"role": "user", "content": f"turn {n}: " + "y" * (chars // 8)}
        reply = {"role": "assistant", "content": None, "tool_calls": [
            {"id": f"call_{n + 1}", "type": "function", "function": {"name": "sh", "arguments": '{"cmd": "make test"}'}}
        ]}
    [seq] = await store.append(KEY, [sent], [message_hash(sent)], PENDING)
    record = TurnRecord(created_at=time.time(), model="m", sent_seqs=list(range(max(1, seq - 60), seq + 1)), tokens_sent=9000)
    await store.finish_turn(KEY, {seq: LIVE}, [(reply, message_hash(reply))], LIVE, record)


class LoopLag:
    """The longest the loop was late for a 1 ms tick while running."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._task: asyncio.Task[None] | None = None

    async def _tick(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(0.001)
            self.worst = max(self.worst, time.perf_counter() - start - 0.001)

    def __enter__(self) -> LoopLag:
        self._task = asyncio.create_task(self._tick())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def measure(action: Any, prepare: Any = None) -> tuple[float, float, float]:
    """(wall ms, loop-thread CPU ms, worst loop lag ms) of awaiting `action()` (after `prepare()`,
    not measured). The lag comes from a second run of its own, so the ticker's CPU is not counted."""
    results = []
    for ticking in (False, True):
        if prepare is not None:
            await prepare()
        await asyncio.sleep(0.01)
        with LoopLag() if ticking else contextlib.nullcontext() as lag:
            await asyncio.sleep(0.005 if ticking else 0)
            wall, cpu = time.perf_counter(), time.thread_time()
            await action()
            results.append(((time.perf_counter() - wall) * 1000, (time.thread_time() - cpu) * 1000))
    return results[0][0], results[0][1], lag.worst * 1000


async def run(turns: int, mb: float, redis_url: str | None, samples: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        if redis_url:
            from proxy.store.redis import RedisStore

            store: Store = RedisStore(redis_url, prefix=f"bench-traj-{uuid.uuid4().hex[:8]}:")
        else:
            store = DiskStore(Path(tmp) / "store")
        chars = int(mb * 2**20 / (turns / 2) / 1.19)  # per two turns: a tool output, a user message an eighth of it
        await store.append(KEY, [{"role": "system", "content": "You are a coding agent."}], ["h"], LIVE)
        for n in range(turns):
            await one_turn(store, n, chars)
        refs = RefSigner(await store.secret())
        root = Path(tmp) / "files"
        writer = TrajectoryWriter(root, store, refs, cache_bytes=256 * 2**20)
        path = writer.path(KEY)
        loop = asyncio.get_running_loop()

        async def whole() -> None:
            conversation = await store.get(KEY)
            assert conversation is not None
            document = await build_trajectory(store, refs, conversation)
            await loop.run_in_executor(None, _write_file, root, path, document)

        async def via_writer() -> None:
            await writer.after_turn(KEY)
            await writer.idle()

        async def nothing() -> None:
            await asyncio.sleep(0.05)

        rows = [("nothing (this machine's own loop lag)", [await measure(nothing) for _ in range(3)])]
        rows.append(("whole rebuild (read, encode, write)", [await measure(whole) for _ in range(samples)]))

        async def forget() -> None:
            writer._drop(KEY)  # as after a restart: nothing of the conversation in memory

        async def next_turn() -> None:
            nonlocal turn
            await one_turn(store, turn, chars)
            turn += 1

        turn = turns
        rows.append(("writer, first write (cold: same work)", [await measure(via_writer, forget) for _ in range(samples)]))
        incremental = [await measure(via_writer, next_turn) for _ in range(samples)]
        rows.append(("writer, after one more turn (incremental)", incremental))
        stored = await store.messages(KEY, live_only=False)
        transcript = sum(len(encode(m.message)) for m in stored)
        print(f"{turns} turns, {len(stored)} messages, transcript {transcript / 2**20:.2f} MB, file "
              f"{path.stat().st_size / 2**20:.2f} MB ({'redis' if redis_url else 'diskcache'})")
        print(f"{'':44} {'wall ms':>9} {'loop CPU ms':>12} {'loop lag ms':>12}   (median of {samples}; max lag)")
        for name, results in rows:
            walls, cpus, lags = zip(*results, strict=True)
            print(f"{name:44} {statistics.median(walls):9.2f} {statistics.median(cpus):12.2f} {max(lags):12.2f}")
        await writer.close()
        await store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--mb", type=float, default=2.5, help="transcript size at the end")
    parser.add_argument("--redis", default=None, help="measure on this Redis instead of diskcache")
    parser.add_argument("--samples", type=int, default=9)
    args = parser.parse_args()
    asyncio.run(run(args.turns, args.mb, args.redis, args.samples))


if __name__ == "__main__":
    main()
