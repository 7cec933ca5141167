"""One turn's CPU in the proxy process, A/B between source trees, and with traces on.

    python -m bench.turn_cpu --proxy-src /path/to/before --proxy-src . [--traces] [--rounds 5]
        [--wire messages] [--at-turn 1000 --conversations 1 --requests 28] [--first]
        [--concurrency 16 --conversations 16] [--variant CONTEXT_PROXY_SERVER__FAST_PATH=false]
        [--gap-ms 300] [--derived] [--stream 16 [--event-gap-ms 0.5]]

Each tree runs as `python -m proxy serve` with its own shipped config.yaml on the target core;
one load generator (bench/loadgen.py) sends full-history later turns of the bench's 200-message
agent transcript, one at a time (the seq phase of bench/run.py; each naming its conversation,
or none with `--derived`), in any wire format the bench
speaks (bench/wires.py); `--at-turn N` measures turns N+1... of a conversation that started
empty instead (the scaling phase's, without its other targets in between); `--first` measures
first turns instead: `--requests` new conversations, each storing the whole transcript;
`--concurrency C` sends from C clients at once (bench/run.py's 16, one conversation each);
`--gap-ms G` leaves each client idle G ms before each request (paced turns, as an agent's come:
the figure then includes what the process does while idle, the malloc trimmer's work). The
trees take turns, round by round, so drift on a busy machine hits them alike. The figure is the
proxy process's CPU (schedstat: on-CPU nanoseconds of every thread; utime+stime counts 10 ms
ticks) per request: the median over rounds, and each round's ratio to the first tree; with
`--concurrency`, requests a second too (wall time: what the target's core got through).
`--stream N` streams every measured reply as N events (and the warm turns before them: a client
keeps to one), `--event-gap-ms` apart (bench/run.py's stream phase: 16 events, 0.5 ms), and adds
the client's time to the first byte (p50 a round; the trees take turns, so it is an A/B too).
`--variant NAME=VALUE` adds the last tree again with that variable in its environment (a
setting's A/B). `--traces` adds the last tree again with telemetry on, exporting to an OTLP/HTTP
sink run here (it accepts and drops the spans), so the cost of tracing on shows beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
from pathlib import Path

from aiohttp import web

from .procs import Proc, cores, cpu_ns, free_port, pin_self
from .run import PROXY_ENV, REPO, LoadGen
from .workload import stream_model


class OtlpSink:
    """An OTLP/HTTP endpoint that takes every export and keeps only the byte count."""

    def __init__(self) -> None:
        self.port = free_port()
        self.received = 0
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    async def _start(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/traces", self._traces)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()

    async def _traces(self, request: web.Request) -> web.Response:
        self.received += len(await request.read())
        return web.Response(body=b"", content_type="application/x-protobuf")  # an empty ExportTraceServiceResponse


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--proxy-src", action="append", required=True, help="a source tree (repeat: the first is the baseline)")
    p.add_argument("--traces", action="store_true", help="also run the last tree with traces on")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=VALUE",
                   help="also run the last tree with this variable in its environment (repeatable)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--requests", type=int, default=200, help="measured requests per tree and round")
    p.add_argument("--conversations", type=int, default=20)
    p.add_argument("--concurrency", type=int, default=1,
                   help="clients sending at once (the conc phase of bench/run.py: 16, one conversation each)")
    p.add_argument("--gap-ms", type=float, default=0, help="idle before each request (paced turns)")
    p.add_argument("--stream", type=int, default=0, metavar="EVENTS", help="stream each reply as this many events")
    p.add_argument("--event-gap-ms", type=float, default=0.5, help="with --stream: the mock's pause between events")
    p.add_argument("--wire", choices=["chat", "messages", "responses"], default="chat")
    p.add_argument("--at-turn", type=int, default=0, help="measure from this turn of an empty conversation on")
    p.add_argument("--first", action="store_true", help="measure new conversations' first turns")
    p.add_argument("--derived", action="store_true",
                   help="the agents name no conversation (its id derived, as bench/run.py's main scenario); "
                        "by default they name it (X-Conversation-ID)")
    args = p.parse_args(argv)

    client_cpus, target_cpus = cores()
    pin_self(client_cpus)
    tmp = Path(tempfile.mkdtemp(prefix="context-proxy-turn-cpu-"))
    mock_port = free_port()
    procs: list[Proc] = []
    gap = ["--gap-ms", str(args.event_gap_ms)] if args.stream else []
    mock = Proc("mock", [sys.executable, "-m", "bench.mock_upstream", "--port", str(mock_port), *gap], mock_port, "/healthz",
                tmp / "mock.log", cwd=str(REPO), cpus=client_cpus).start()
    procs.append(mock)
    sink = OtlpSink() if args.traces else None
    targets: list[tuple[str, Proc]] = []
    # (tree, traced, its environment's extra variable): the trees, then the last one again per --variant
    runs: list[tuple[str, bool, str | None]] = [(src, False, None) for src in args.proxy_src]
    runs += [(args.proxy_src[-1], False, variant) for variant in args.variant]
    runs += [(args.proxy_src[-1], True, None)] if args.traces else []
    for n, (src, traced, variant) in enumerate(runs):
        port = free_port()
        env = {
            "CONTEXT_PROXY_UPSTREAM__BASE_URL": f"http://127.0.0.1:{mock_port}/v1",
            **({"CONTEXT_PROXY_UPSTREAM__ANTHROPIC_BASE_URL": f"http://127.0.0.1:{mock_port}"} if args.wire == "messages" else {}),
            "CONTEXT_PROXY_STORAGE__PATH": str(tmp / f"store-{n}"),
            **PROXY_ENV,
        }
        if traced and sink is not None:
            env["CONTEXT_PROXY_TELEMETRY__OTLP_ENDPOINT"] = f"http://127.0.0.1:{sink.port}"
        if variant is not None:
            variable, _, value = variant.partition("=")
            env[variable] = value
        root = Path(src).resolve()
        name = f"{root.name or root}{' +traces' if traced else ''}{f' {variant}' if variant else ''}"
        proc = Proc(name, [sys.executable, "-m", "proxy", "serve", "--config", str(root / "config.yaml"), "--port", str(port)],
                    port, "/healthz", tmp / f"proxy-{n}.log", env=env, cwd=str(root), cpus=target_cpus).start()
        procs.append(proc)
        targets.append((name, proc))
    lg = LoadGen(client_cpus, tmp / "loadgen.log", wire=args.wire)
    kind, warm = ("empty", args.at_turn) if args.at_turn else ("agent200", 1)
    streamed = {"stream": True, "model": stream_model(args.stream)} if args.stream else {}
    per_request: dict[str, list[float]] = {name: [] for name, _ in targets}
    rates: dict[str, list[float]] = {name: [] for name, _ in targets}  # req/s (wall), with --concurrency
    first_bytes: dict[str, list[float]] = {name: [] for name, _ in targets}  # the client's, with --stream (p50 a round)
    try:
        mock.wait_ready(30)
        for _, proc in targets:
            proc.wait_ready(60)
        for r in range(args.rounds):
            for name, proc in targets:
                pool = f"r{r}-{proc.port}"
                ids = [f"{pool}-{i}" for i in range(args.requests if args.first else args.conversations)]
                lg(op="open", pool=pool, kind=kind, ids=ids, url=f"http://127.0.0.1:{proc.port}/v1", named=not args.derived)
                if not args.first:  # first turns: the stored prefix exists
                    lg(op="run", pool=pool, requests=args.conversations * warm, **streamed)
                before = cpu_ns(proc.pid)
                result = lg(op="run", pool=pool, requests=args.requests, concurrency=args.concurrency, gap_ms=args.gap_ms,
                            **streamed)
                per_request[name].append((cpu_ns(proc.pid) - before) / result["sent"] / 1e6)
                rates[name].append(result["rps"] or 0.0)
                if args.stream:
                    first_bytes[name].append(result["ttfb"]["p50"])
                lg(op="close", pool=pool)
                if result["errors"]:
                    raise RuntimeError(f"{name}: {result['errors']} errors, e.g. {result['error_samples'][:1]}")
            print(f"round {r + 1}: " + ", ".join(f"{n} {v[-1]:.3f} ms" for n, v in per_request.items()), file=sys.stderr)
    finally:
        lg.close()
        for proc in reversed(procs):
            proc.stop()
    base = args.proxy_src and per_request[targets[0][0]]
    concurrent = args.concurrency > 1  # then the wall time says something too: requests a second
    print("| tree | CPU ms/turn (median) | per round | ratio to the first, per round |"
          + (" req/s (median), per round |" if concurrent else "")
          + (" first byte p50 ms (median), per round |" if args.stream else ""))
    print("|------|----------------------|-----------|-------------------------------|" + ("---|" if concurrent else "")
          + ("---|" if args.stream else ""))
    for name, values in per_request.items():
        ratios = [v / b for v, b in zip(values, base, strict=True)]
        print(f"| {name} | {statistics.median(values):.3f} | {' '.join(f'{v:.3f}' for v in values)} | "
              f"{' '.join(f'{x:.3f}' for x in ratios)} (median {statistics.median(ratios):.3f}) |"
              + (f" {statistics.median(rates[name]):.0f}: {' '.join(f'{v:.0f}' for v in rates[name])} |" if concurrent else "")
              + (f" {statistics.median(first_bytes[name]):.2f}: {' '.join(f'{v:.2f}' for v in first_bytes[name])} |"
                 if args.stream else ""))
    if sink is not None:
        print(f"\nspans received by the OTLP sink: {sink.received} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
