"""One later turn's instructions in the proxy process (callgrind), A/B between source trees.

    python -m bench.turn_instructions --proxy-src /path/to/before --proxy-src . [--named]
        [--wire messages|responses|gemini] [--requests 40] [--conversations 4] [--first] [--reference forwarder]
        [--env CONTEXT_PROXY_CONTEXT__WINDOW_REFILL=1]

CPU time on a shared or virtual machine moves by 20-50% from one minute to the next (the same
tree, the same turns: bench/turn_cpu.py's rounds show it), which hides a 5% change. The
instructions a turn executes do not: each tree runs as `python -m proxy serve` (its shipped
config.yaml) under `valgrind --tool=callgrind`, every thread counted (the store's, the
checkpoints'); the bench's growing agents (bench/workload.py, as bench/run.py's seq phase: no
conversation header unless --named) send their first and a few later turns, the counters are
zeroed (`callgrind_control --zero`), `--requests` later turns are sent one at a time, and the
counters dumped: instructions per turn, the same within ~1% from run to run. `--first` counts
new conversations' first turns instead (each storing the whole 200-message transcript). Instructions are
not time (a cache miss costs no instruction, a syscall's kernel side is not counted; tiktoken's
regex runs ~6x the instructions it runs natively, valgrind's CPU lacking what its SIMD paths
need): read them beside the CPU figures of bench/run.py, not instead. `--reference forwarder`
(or `floor`, `floor-count`, repeatable) counts bench/forwarder.py's too, first: what a turn costs without our
code. `--env NAME=VALUE` sets a variable in every tree's environment (a setting that changes which path
a turn takes: a window refilled whole cuts every turn). Slow (~50x): a few minutes per tree.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from .procs import Proc, cores, free_port, pin_self
from .run import FLOOR_COUNT_BUDGET, PROXY_ENV, REPO, LoadGen

WARM_TURNS = 3  # later turns of each conversation before the count starts (caches, tokenizer, fast path)


def instructions(dump: Path) -> int:
    """The `totals:` (or `summary:`) line of a callgrind dump: instructions executed."""
    for line in dump.read_text().splitlines():
        if line.startswith(("totals:", "summary:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {dump}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--proxy-src", action="append", required=True, help="a source tree (repeat: the first is the baseline)")
    p.add_argument("--requests", type=int, default=40, help="later turns counted per tree")
    p.add_argument("--conversations", type=int, default=4)
    p.add_argument("--named", action="store_true", help="the agents name their conversation (X-Conversation-ID)")
    p.add_argument("--wire", choices=["chat", "messages", "responses", "gemini"], default="chat")
    p.add_argument("--first", action="store_true", help="count new conversations' first turns")
    p.add_argument("--reference", action="append", choices=["forwarder", "floor", "floor-count"], default=[],
                   help="also count bench/forwarder.py (floor: with its durable append), before the trees")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="set in every tree's environment (repeatable)")
    args = p.parse_args(argv)
    extra_env = dict(kv.split("=", 1) for kv in args.env)

    client_cpus, target_cpus = cores()
    pin_self(client_cpus)
    tmp = Path(tempfile.mkdtemp(prefix="context-proxy-turn-instructions-"))
    mock_port = free_port()
    mock = Proc("mock", [sys.executable, "-m", "bench.mock_upstream", "--port", str(mock_port)], mock_port, "/healthz",
                tmp / "mock.log", cwd=str(REPO), cpus=client_cpus).start()
    lg = LoadGen(client_cpus, tmp / "loadgen.log", wire=args.wire)
    results: list[tuple[str, int]] = []
    try:
        mock.wait_ready(30)
        runs = [(name, None) for name in args.reference] + [(None, Path(src).resolve()) for src in args.proxy_src]
        for n, (reference, root) in enumerate(runs):
            port = free_port()
            out = tmp / f"callgrind-{n}"
            env = {
                "CONTEXT_PROXY_UPSTREAM__BASE_URL": f"http://127.0.0.1:{mock_port}/v1",
                **({"CONTEXT_PROXY_UPSTREAM__ANTHROPIC_BASE_URL": f"http://127.0.0.1:{mock_port}"} if args.wire == "messages" else {}),
                **({"CONTEXT_PROXY_UPSTREAM__GEMINI_BASE_URL": f"http://127.0.0.1:{mock_port}"} if args.wire == "gemini" else {}),
                "CONTEXT_PROXY_STORAGE__PATH": str(tmp / f"store-{n}"),
                **PROXY_ENV,
                **extra_env,
            }
            valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no", sys.executable]
            if root is None:
                store = ["--store", str(tmp / f"store-{n}")] if reference != "forwarder" else []
                store += ["--count-tokens", str(FLOOR_COUNT_BUDGET)] if reference == "floor-count" else []
                proc = Proc(str(reference), [*valgrind, "-m", "bench.forwarder", "--port", str(port), "--upstream",
                            f"http://127.0.0.1:{mock_port}/v1", *store], port, "/v1/models", tmp / f"{reference}-{n}.log",
                            cwd=str(REPO), cpus=target_cpus).start()
            else:
                argv = [*valgrind, "-m", "proxy", "serve", "--config", str(root / "config.yaml"), "--port", str(port)]
                proc = Proc(root.name or str(root), argv, port, "/healthz", tmp / f"proxy-{n}.log", env=env, cwd=str(root),
                            cpus=target_cpus).start()
            try:
                proc.wait_ready(600)
                url = f"http://127.0.0.1:{port}/v1"
                warm, pool = f"w{n}", f"t{n}"
                ids = [f"{warm}-{i}" for i in range(args.conversations)]
                lg(op="open", pool=warm, kind="agent200", ids=ids, url=url, named=args.named)
                lg(op="run", pool=warm, requests=args.conversations * (1 + WARM_TURNS))  # first turns, then warm ones
                if args.first:  # a conversation each: every turn counted is its first
                    lg(op="open", pool=pool, kind="agent200", ids=[f"{pool}-{i}" for i in range(args.requests)], url=url,
                       named=args.named)
                else:
                    pool = warm
                subprocess.run(["callgrind_control", "--zero", str(proc.pid)], check=True, capture_output=True)
                result = lg(op="run", pool=pool, requests=args.requests)
                if result["errors"]:
                    raise RuntimeError(f"{proc.name}: {result['errors']} errors, e.g. {result['error_samples'][:1]}")
                before = set(tmp.glob(f"callgrind-{n}*"))
                subprocess.run(["callgrind_control", "--dump", str(proc.pid)], check=True, capture_output=True)
                dumps = sorted(set(tmp.glob(f"callgrind-{n}*")) - before)
                lg(op="close", pool=pool)
                if pool != warm:
                    lg(op="close", pool=warm)
            finally:
                proc.stop()
            results.append((proc.name, instructions(dumps[-1]) // result["sent"]))
            print(f"{proc.name}: {results[-1][1]:,} instructions a turn", file=sys.stderr)
    finally:
        lg.close()
        mock.stop()
    references = len(args.reference)
    base = results[references][1]  # the first tree's
    floor = results[0][1] if references else None
    turn = "first turn" if args.first else "later turn"
    print(f"| tree | instructions / {turn} ({args.wire}, {'named' if args.named else 'derived id'}) | ratio |"
          + (f" beyond the {args.reference[0]} |" if floor else ""))
    print("|------|------|------|" + ("------|" if floor else ""))
    for n, (name, count) in enumerate(results):
        ratio = f"{count / base:.3f}" if n >= references else ""
        print(f"| {name} | {count:,} | {ratio} |" + (f" {count - floor:,} |" if floor else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
