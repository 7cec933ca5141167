"""A streamed event's instructions in the proxy process (callgrind), beside the bare forwarder's.

    python -m bench.event_instructions [--proxy-src /path/to/before] [--proxy-src .] [--repeats 6]
        [--wire messages|responses|gemini] [--events 16 64 --gap-ms 10]

The CPU a streamed chunk costs is a small difference of two noisy times (bench/run.py: turns of
256 events minus turns of 16, over 240); instructions are stable. Each target runs under
`valgrind --tool=callgrind` (bench/turn_instructions.py explains how): the bare forwarder
(bench/forwarder.py) first, then each tree as `python -m proxy serve`. The bench's growing agents
(no conversation header; the proxy's recall tools go with every streamed turn, as the window has
left messages out, so the relay watches each event for the proxy's calls) send streamed turns of
16 and of 256 events, `--repeats` of each, twice over in turns, each counted alone (zeroed, then
dumped); the figure per event is (median at 256 - median at 16) / 240.

A model spaces its tokens, so each event of a real stream is a read of its own (bench/run.py's
mock sends them 0.5 ms apart): `--gap-ms` spaces them so (under callgrind the proxy is ~50x
slower, so the gap must outlast that: 10 ms, with `--events 16 64` to keep turns short), and the
figure then includes each read's own cost (the wake-up, the read, the write to the client).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .procs import Proc, cores, free_port, pin_self
from .run import PROXY_ENV, REPO, LoadGen
from .turn_instructions import instructions
from .workload import stream_model

CONVERSATIONS = 3


def count_turn(proc: Proc, lg: LoadGen, pool: str, out: Path, events: int) -> int:
    """One streamed turn of `events` events, its instructions alone."""
    subprocess.run(["callgrind_control", "--zero", str(proc.pid)], check=True, capture_output=True)
    result = lg(op="run", pool=pool, requests=1, stream=True, model=stream_model(events))
    if result["errors"]:
        raise RuntimeError(f"{proc.name}: {result['error_samples'][:1]}")
    before = set(out.parent.glob(f"{out.name}*"))
    subprocess.run(["callgrind_control", "--dump", str(proc.pid)], check=True, capture_output=True)
    return instructions(sorted(set(out.parent.glob(f"{out.name}*")) - before)[-1])


def measure(proc: Proc, lg: LoadGen, out: Path, repeats: int, events: tuple[int, int]) -> dict[int, float]:
    """Median instructions of a streamed turn at each of `events` events."""
    url = f"http://127.0.0.1:{proc.port}/v1"
    pool = proc.name
    lg(op="open", pool=pool, kind="agent200", ids=[f"{pool}-{i}" for i in range(CONVERSATIONS)], url=url, named=False)
    lg(op="run", pool=pool, requests=2 * CONVERSATIONS)  # first turns, then a later one each
    counts: dict[int, list[int]] = {n: [] for n in events}
    for length in (*events, *events):
        # A turn that changes the model (the mock reads the event count from it) is no extension
        # of the last: each conversation takes one, unmeasured, before the counted ones.
        lg(op="run", pool=pool, requests=CONVERSATIONS, stream=True, model=stream_model(length))
        counts[length] += [count_turn(proc, lg, pool, out, length) for _ in range(repeats)]
    lg(op="close", pool=pool)
    return {n: statistics.median(c) for n, c in counts.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--proxy-src", action="append", default=[], help="a source tree (repeat; default: this one)")
    p.add_argument("--repeats", type=int, default=6, help="counted turns of each length, twice over")
    p.add_argument("--events", type=int, nargs=2, default=[16, 256], metavar=("LOW", "HIGH"), help="the two turn lengths")
    p.add_argument("--gap-ms", type=float, default=0.0, help="the mock's pause between events (each then a read of its own)")
    p.add_argument("--wire", choices=["chat", "messages", "responses", "gemini"], default="chat")
    args = p.parse_args(argv)
    events = (args.events[0], args.events[1])
    client_cpus, target_cpus = cores()
    pin_self(client_cpus)
    tmp = Path(tempfile.mkdtemp(prefix="context-proxy-event-instructions-"))
    mock_port = free_port()
    mock_url = f"http://127.0.0.1:{mock_port}/v1"
    mock = Proc("mock", [sys.executable, "-m", "bench.mock_upstream", "--port", str(mock_port), "--gap-ms", str(args.gap_ms)],
                mock_port, "/healthz",
                tmp / "mock.log", cwd=str(REPO), cpus=client_cpus).start()
    lg = LoadGen(client_cpus, tmp / "loadgen.log", wire=args.wire)
    callgrind = ["valgrind", "--tool=callgrind", "--dump-instr=no"]
    rows: list[tuple[str, dict[int, float]]] = []
    try:
        mock.wait_ready(30)
        targets = [("forwarder", [sys.executable, "-m", "bench.forwarder", "--upstream", mock_url], None, REPO, "/v1/models")]
        for n, src in enumerate(args.proxy_src or ["."]):
            root = Path(src).resolve()
            env = {
                "CONTEXT_PROXY_UPSTREAM__BASE_URL": mock_url,
                **({"CONTEXT_PROXY_UPSTREAM__ANTHROPIC_BASE_URL": mock_url.removesuffix("/v1")} if args.wire == "messages" else {}),
                **({"CONTEXT_PROXY_UPSTREAM__GEMINI_BASE_URL": mock_url.removesuffix("/v1")} if args.wire == "gemini" else {}),
                "CONTEXT_PROXY_STORAGE__PATH": str(tmp / f"store-{n}"),
                **PROXY_ENV,
            }
            targets.append((f"{root.name or root}-{n}", [sys.executable, "-m", "proxy", "serve", "--config", str(root / "config.yaml")],
                            env, root, "/healthz"))
        for name, argv_, env, cwd, health in targets:
            port, out = free_port(), tmp / f"callgrind-{name}"
            proc = Proc(name, [*callgrind, f"--callgrind-out-file={out}", *argv_, "--port", str(port)], port, health,
                        tmp / f"{name}.log", env=env, cwd=str(cwd), cpus=target_cpus).start()
            try:
                proc.wait_ready(600)
                rows.append((name, measure(proc, lg, out, args.repeats, events)))
            finally:
                proc.stop()
            print(f"{name}: {rows[-1][1]}", file=sys.stderr)
    finally:
        lg.close()
        mock.stop()
    low, high = events
    forwarder = (rows[0][1][high] - rows[0][1][low]) / (high - low)
    print(f"| target ({args.wire}{f', {args.gap_ms:g} ms apart' if args.gap_ms else ''}) | instructions / streamed turn of {low} events "
          f"| of {high} | per event | beyond the forwarder's |")
    print("|---|---|---|---|---|")
    for name, medians in rows:
        per_event = (medians[high] - medians[low]) / (high - low)
        print(f"| {name} | {medians[low]:,.0f} | {medians[high]:,.0f} | {per_event:,.0f} | {per_event - forwarder:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
