"""What one turn's store writes cost on the diskcache store, A/B between source trees.

    python -m bench.store_turn [--src /path/to/before] [--src .] [--messages 200 2000]
                               [--turns 200] [--firsts 20] [--rounds 3] [--api] [--profile]

A turn writes twice (proxy/turns.py): `stage` of its new items as pending before it forwards
them (`append` in trees before it), then `finish_turn` (their statuses, the reply, the turn
record) once the upstream answered: one commit, where the store held the staged items for it.
Two scenarios, each in a fresh store in a process of its own per tree (its `proxy` package first
on the path), the trees taking turns round by round so drift on a busy machine hits them alike:

- first: the first turn of a new conversation of `--messages` items (tool outputs of 1,000
  characters, as an agent's transcript is mostly): all of them appended pending, then flipped
  live with a one-item reply, a turn record (naming every seq sent, as the engine's does) and
  every item's first-forwarded mark. Repeated for `--firsts` new conversations in one store.
- later: a conversation built turn by turn to `--messages` items (a first turn of up to 200, then
  turns of one tool output of 2,400 characters and a one-item reply), then `--turns` more such
  turns measured (each adds two items: a figure "at 2,000" is from 2,000 to 2,000 + 2 x turns).

The figure is CPU per turn (both writes), the median over rounds. By default the store thread's
own functions are called directly on the bench's thread (`store._written(store._append, ...)`,
what the store thread runs: no executor hop, no event loop); `--api` goes through the public async API instead (process CPU,
every thread: the hop included). The garbage collector is set as `serve` sets it. `--profile`
prints the last tree's cProfile of one round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TOOL_OUTPUT = 1000  # characters of each item of a first turn
LATER_OUTPUT = 2400  # characters of a later turn's tool output
FIRST_TURN_MAX = 200  # the first turn of a "later" conversation, the rest added turn by turn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", action="append", help="a source tree (default: this one); repeat to compare")
    parser.add_argument("--messages", type=int, nargs="+", default=[200, 2000])
    parser.add_argument("--turns", type=int, default=200, help="later turns measured per round")
    parser.add_argument("--firsts", type=int, default=20, help="first turns measured per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--api", action="store_true", help="through the async API (the executor hop included)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--worker", nargs=3, metavar=("SCENARIO", "MESSAGES", "COUNT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        scenario, n, count = args.worker[0], int(args.worker[1]), int(args.worker[2])
        print(json.dumps(_worker(scenario, n, count, api=args.api, profile=args.profile)))
        return
    trees = [Path(s).resolve() for s in args.src or [str(REPO)]]
    cases = [("first", n, args.firsts) for n in args.messages] + [("later", n, args.turns) for n in args.messages]
    results: dict[tuple[Path, str, int], list[float]] = {}
    for round_no in range(args.rounds):
        for scenario, n, count in cases:
            for tree in trees:
                profile = args.profile and round_no == args.rounds - 1 and tree == trees[-1]
                ms = _run_worker(tree, scenario, n, count, api=args.api, profile=profile)
                results.setdefault((tree, scenario, n), []).append(ms)
    mode = "async API, process CPU" if args.api else "store thread's functions, called directly"
    print(f"\nCPU per turn, ms (median of {args.rounds} rounds; {mode}):")
    names = [chr(ord("A") + i) for i in range(len(trees))]
    for name, tree in zip(names, trees, strict=True):
        print(f"  {name}: {tree}")
    print(f"{'':<22}" + "".join(f"{name:>10}" + " " * 8 for name in names))
    for scenario, n, _ in cases:
        row = [statistics.median(results[(t, scenario, n)]) for t in trees]
        cells = "".join(f"{v:>10.3f}" + (f" ({v / row[0]:.2f}x)" if i else " " * 8) for i, v in enumerate(row))
        print(f"{f'{scenario} turn at {n}':<22}{cells}")


def _run_worker(tree: Path, scenario: str, n: int, count: int, *, api: bool, profile: bool) -> float:
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", scenario, str(n), str(count)]
    argv += ["--api"] * api + ["--profile"] * profile
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(argv, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {scenario} at {n} failed:\n{done.stderr}")
    if profile:
        print(f"-- profile: {tree}, {scenario} turn at {n}\n{done.stderr}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if Path(found["proxy"]).resolve().parent != tree / "proxy":
        raise SystemExit(f"{tree}: the worker imported proxy from {found['proxy']}")
    return found["ms"]


# -- the worker: one scenario in a fresh store, in this process --------------------------------------


def _worker(scenario: str, n: int, count: int, *, api: bool, profile: bool) -> dict[str, Any]:
    import asyncio

    import proxy
    from proxy.identity import ConversationKey
    from proxy.store import LIVE, PENDING
    from proxy.store.disk import DiskStore

    try:
        from proxy.store import TurnRecord
    except ImportError:  # a tree from before it
        TurnRecord = None
    # Where the tree's records keep runs (proxy/seqruns.py), through its store's own import: an
    # editable install would find `proxy.seqruns` in the installed tree for a tree without it.
    from proxy.store import base as store_base

    SeqRuns = getattr(store_base, "SeqRuns", None)

    with tempfile.TemporaryDirectory() as folder:
        store = DiskStore(Path(folder) / "store")
        loop = asyncio.new_event_loop()

        def call(name: str, *args: Any, **kwargs: Any) -> Any:
            if api:  # the public method, through the store's thread
                return loop.run_until_complete(getattr(store, name)(*args, **kwargs))
            return store._written(getattr(store, f"_{name}"), *args, *kwargs.values())

        # A turn's items as the engine writes them: staged for its end where the store can (trees
        # before `stage` appended them).
        first_write = "stage" if hasattr(store, "stage") else "append"

        def sent(last: int) -> Any:
            """The record's seqs sent, 1..last, as the engine hands them (made before the clock: the
            engine's work): runs where the tree keeps them (proxy/seqruns.py), a list before."""
            return SeqRuns.from_runs([1, last]) if SeqRuns is not None else list(range(1, last + 1))

        def turn(key: ConversationKey, items: list[tuple[dict, str]], reply: tuple[dict, str], calls: int, sent_seqs: Any) -> None:
            seqs = call(first_write, key, [i for i, _ in items], [h for _, h in items], PENDING)
            record: Any = {"created_at": time.time(), "model": "m", "sent_seqs": sent_seqs, "tokens_sent": 9000}
            assert len(sent_seqs) == seqs[-1]  # the prompt sends the whole conversation
            if api and TurnRecord is not None:  # the public method takes it typed (trees before: a dict)
                record = TurnRecord(**record)
            call("finish_turn", key, dict.fromkeys(seqs, LIVE), [reply], LIVE, record,
                 llm_calls=1, forwarded=dict.fromkeys(seqs, calls))

        def first_items(size: int) -> tuple[list[tuple[dict, str]], tuple[dict, str]]:
            items = [{"role": "tool", "tool_call_id": f"call_{i}", "content": f"{i} " + "x" * TOOL_OUTPUT} for i in range(size)]
            return _hashed(items), _hashed([{"role": "assistant", "content": "first reply"}])[0]

        def later_items(i: int) -> tuple[list[tuple[dict, str]], tuple[dict, str]]:
            item = {"role": "tool", "tool_call_id": f"call_l{i}", "content": f"{i} " + "y" * LATER_OUTPUT}
            return _hashed([item]), _hashed([{"role": "assistant", "content": f"step {i} done"}])[0]

        # Items and hashes are made before the clock starts: only the store's work is measured.
        if scenario == "first":
            firsts = [(*first_items(n), sent(n)) for _ in range(count)]

            def measured() -> None:
                for c, (items, reply, sent_seqs) in enumerate(firsts):
                    turn(ConversationKey("t" * 24, f"first-{c}"), items, reply, 1, sent_seqs)
        else:
            key = ConversationKey("t" * 24, "later")
            turn(key, *first_items(min(n, FIRST_TURN_MAX)), 1, sent(min(n, FIRST_TURN_MAX)))
            size, built = min(n, FIRST_TURN_MAX) + 1, 0
            while size < n:
                turn(key, *later_items(built), built + 2, sent(size + 1))
                size, built = size + 2, built + 1
            laters = [(*later_items(i), sent(size + 1 + 2 * j)) for j, i in enumerate(range(built, built + count))]

            def measured() -> None:
                for i, (items, reply, sent_seqs) in enumerate(laters, start=built):
                    turn(key, items, reply, i + 2, sent_seqs)

        _collect_as_serve_does()
        started = time.process_time()
        if profile:
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            profiler.runcall(measured)
            pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(25)
        else:
            measured()
        ms = (time.process_time() - started) / count * 1000
        loop.run_until_complete(store.close())
        loop.close()
    return {"ms": ms, "proxy": proxy.__file__}


def _collect_as_serve_does() -> None:
    """The garbage collector as `serve` sets it (proxy/cli.py): what was made so far frozen, the
    young generation collected every GC_YOUNG_THRESHOLD allocations."""
    import gc

    from proxy import cli

    gc.collect()
    gc.freeze()
    gc.set_threshold(getattr(cli, "GC_YOUNG_THRESHOLD", 700), 20, 20)


def _hashed(items: list[dict]) -> list[tuple[dict, str]]:
    from proxy.messages import message_hash

    return [(item, message_hash(item)) for item in items]


if __name__ == "__main__":
    main()
