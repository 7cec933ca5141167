"""One later turn's instructions in the proxy process (callgrind), A/B between source trees.

    python -m bench.turn_instructions --proxy-src /path/to/before --proxy-src . [--named]
        [--wire messages] [--requests 40] [--conversations 4] [--first]

CPU time on a shared or virtual machine moves by 20-50% from one minute to the next (the same
tree, the same turns: bench/turn_cpu.py's rounds show it), which hides a 5% change. The
instructions a turn executes do not: each tree runs as `python -m proxy serve` (its shipped
config.yaml) under `valgrind --tool=callgrind`, every thread counted (the store's, the
checkpoints'); the bench's growing agents (bench/workload.py, as bench/run.py's seq phase: no
conversation header unless --named) send their first and a few later turns, the counters are
zeroed (`callgrind_control --zero`), `--requests` later turns are sent one at a time, and the
counters dumped: instructions per turn, the same within ~1% from run to run. `--first` counts
new conversations' first turns instead (each storing the whole 200-message transcript). Instructions are
not time (a cache miss costs no instruction, a syscall's kernel side is not counted): read them
beside the CPU figures of bench/run.py, not instead. Slow (~50x): a few minutes per tree.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from .procs import Proc, cores, free_port, pin_self
from .run import PROXY_ENV, REPO, LoadGen

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
    p.add_argument("--wire", choices=["chat", "messages", "responses"], default="chat")
    p.add_argument("--first", action="store_true", help="count new conversations' first turns")
    args = p.parse_args(argv)

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
        for n, src in enumerate(args.proxy_src):
            root = Path(src).resolve()
            port = free_port()
            out = tmp / f"callgrind-{n}"
            env = {
                "CONTEXT_PROXY_UPSTREAM__BASE_URL": f"http://127.0.0.1:{mock_port}/v1",
                **({"CONTEXT_PROXY_UPSTREAM__ANTHROPIC_BASE_URL": f"http://127.0.0.1:{mock_port}"} if args.wire == "messages" else {}),
                "CONTEXT_PROXY_STORAGE__PATH": str(tmp / f"store-{n}"),
                **PROXY_ENV,
            }
            argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", "--dump-instr=no",
                    sys.executable, "-m", "proxy", "serve", "--config", str(root / "config.yaml"), "--port", str(port)]
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
    base = results[0][1]
    turn = "first turn" if args.first else "later turn"
    print(f"| tree | instructions / {turn} ({args.wire}, {'named' if args.named else 'derived id'}) | ratio |")
    print("|------|------|------|")
    for name, count in results:
        print(f"| {name} | {count:,} | {count / base:.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
