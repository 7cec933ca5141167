"""A managed turn in each wire format: `python -m bench.formats` (part of `make bench`).

What the proxy spends on a later turn of the bench's 200-message agent transcript when it comes
as Anthropic Messages (Claude Code's shape: bench/messages_workload.py) next to the same turn as
a chat completion (bench/workload.py), both answered by the bench's mock upstream
(bench/mock_upstream.py serves /v1/chat/completions and /v1/messages alike). One proxy process
per wire format, the shipped config.yaml, both pinned to the same core; each request a later
turn of one of the format's conversations (the previous request + the reply + a new tool
result), JSON and streamed. Requests alternate between the formats one by one, so whatever else
the machine does hits both alike; the figures are medians over the repeats: each proxy's CPU per
request (schedstat, bench/procs.py) and its wall time. DESIGN.md's target: Messages within 10% of
chat completions.

Results: printed, and bench/results/formats-<stamp>.{json,md} (+ formats-latest.*).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from .procs import CpuMeter, Proc, cores, free_port, pin_self
from .wires import WIRES
from .workload import stream_model

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
KEY = "sk-bench-formats-0123456789abcdef"
TARGET = 1.10  # Messages' CPU per request at most this times chat completions'


class Case:
    """One wire format, streamed or not: its own conversations, taken in turn, at its own proxy."""

    def __init__(self, key: str, stream: bool, conversations: int, run_id: str, proxy: Proc) -> None:
        self.format = WIRES[key]
        self.key, self.stream, self.proxy = key, stream, proxy
        self.clients = [
            self.format.make(f"{run_id}-{key}-{'s' if stream else 'j'}-{i}", "agent200", i) for i in range(conversations)
        ]
        self.next = 0
        self.cpu_ms: list[float] = []  # per run: proxy CPU per request
        self.wall_ms: list[float] = []  # per run: median wall time of a request

    @property
    def label(self) -> str:
        return f"{self.format.name} {'stream' if self.stream else 'json'}"

    def turn(self, http: httpx.Client, model: str) -> float:
        """One request (the next conversation's next turn); its wall time in ms."""
        conversation = self.clients[self.next % len(self.clients)]
        self.next += 1
        started = time.perf_counter()
        response = http.post(
            self.format.url(f"http://127.0.0.1:{self.proxy.port}/v1", model, self.stream), content=conversation.body(model, self.stream),
            headers={"Content-Type": "application/json", **self.format.headers(KEY, conversation.id)},
        )
        wall = 1000 * (time.perf_counter() - started)
        if response.status_code != 200:
            raise RuntimeError(f"{self.label}: {response.status_code} {response.text[:300]}")
        self.format.advance(conversation, response.content, self.stream)
        return wall


def measure(cases: list[Case], http: httpx.Client, model: str, n: int) -> None:
    """n requests of each case, alternating one by one; each proxy's CPU per request."""
    meters = [CpuMeter(case.proxy.pid) for case in cases]
    walls: list[list[float]] = [[] for _ in cases]
    for meter in meters:
        meter.start()
    for _ in range(n):
        for case, wall in zip(cases, walls, strict=True):
            wall.append(case.turn(http, model))
    for case, meter, wall in zip(cases, meters, walls, strict=True):
        case.cpu_ms.append(1000 * meter.stop().sched_s / n)
        case.wall_ms.append(statistics.median(wall))


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    client_cpus, target_cpus = cores()
    pin_self(client_cpus)
    mock_port = free_port()
    mock = Proc("mock", [sys.executable, "-m", "bench.mock_upstream", "--port", str(mock_port)],
                mock_port, "/healthz", work / "mock.log", cwd=str(REPO), cpus=client_cpus).start()
    env = {
        "CONTEXT_PROXY_UPSTREAM__BASE_URL": f"http://127.0.0.1:{mock_port}/v1",
        "CONTEXT_PROXY_UPSTREAM__ANTHROPIC_BASE_URL": f"http://127.0.0.1:{mock_port}",
        "CONTEXT_PROXY_UPSTREAM__GEMINI_BASE_URL": f"http://127.0.0.1:{mock_port}",
        "CONTEXT_PROXY_LOGGING__LEVEL": "WARNING",
    }
    proxies: dict[str, Proc] = {}
    for key in WIRES:
        port = free_port()
        proxies[key] = Proc(
            f"proxy-{key}", [sys.executable, "-m", "proxy", "serve", "--config", str(REPO / "config.yaml"), "--port", str(port)],
            port, "/healthz", work / f"proxy-{key}.log", env={**env, "CONTEXT_PROXY_STORAGE__PATH": str(work / f"data-{key}")},
            cwd=str(REPO), cpus=target_cpus,
        )
    run_id = f"f{int(time.time())}"
    modes = {stream: [Case(key, stream, args.conversations, run_id, proxies[key]) for key in WIRES] for stream in (False, True)}
    cases = [case for group in modes.values() for case in group]
    model = stream_model(args.chunks)
    size = cases[0].clients[0].messages  # the transcript before the bench's own turns
    try:
        mock.wait_ready(30)
        for proxy in proxies.values():
            proxy.start().wait_ready(60)
        with httpx.Client(timeout=120) as http:
            for case in cases:  # the first turns store the transcripts; a few more warm every path
                for _ in range(2 * args.conversations):
                    case.turn(http, model)
            for _ in range(args.repeats):
                for group in modes.values():
                    measure(group, http, model, args.n)
    finally:
        for proxy in proxies.values():
            proxy.stop()
        mock.stop()
    rows = {
        case.label: {
            "cpu_ms": statistics.median(case.cpu_ms), "cpu_ms_min": min(case.cpu_ms),
            "wall_ms": statistics.median(case.wall_ms), "runs": case.cpu_ms,
        }
        for case in cases
    }
    ratios = {
        f"{WIRES[key].name} vs chat completions, {mode}": rows[f"{WIRES[key].name} {mode}"]["cpu_ms"] / rows[f"chat completions {mode}"]["cpu_ms"]
        for key in WIRES if key != "chat" for mode in ("json", "stream")
    }
    return {
        "command": " ".join([sys.executable, "-m", "bench.formats", *sys.argv[1:]]),
        "settings": vars(args), "messages_in_transcript": size,
        "rows": rows, "vs_chat": ratios, "target": TARGET,
    }


def render(data: dict[str, Any]) -> str:
    s = data["settings"]
    lines = [
        (f"Wire formats: a later turn of a {data['messages_in_transcript']}-message agent transcript, proxy CPU per "
         f"request (median of {s['repeats']} runs of {s['n']} requests, min in brackets); streams of {s['chunks']} events."),
        "",
        "| case | proxy CPU / request | wall p50 |",
        "| --- | --- | --- |",
    ]
    for label, row in data["rows"].items():
        lines.append(f"| {label} | {row['cpu_ms']:.2f} ms [{row['cpu_ms_min']:.2f}] | {row['wall_ms']:.2f} ms |")
    lines.append("")
    for label, ratio in data["vs_chat"].items():
        verdict = "within" if ratio <= data["target"] else "OVER"
        lines.append(f"- {label}: {ratio:.2f}x ({verdict} the {data['target']:.2f}x target)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=40, help="requests per case and run")
    parser.add_argument("--repeats", type=int, default=5, help="runs of every case, interleaved")
    parser.add_argument("--conversations", type=int, default=4, help="conversations per case, taken in turn")
    parser.add_argument("--chunks", type=int, default=16, help="events per streamed reply")
    parser.add_argument("--out", default=str(RESULTS), help="where the results go")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-formats-") as work:
        data = run(args, Path(work))
    text = render(data)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for name in (f"formats-{stamp}", "formats-latest"):
        (out / f"{name}.json").write_text(json.dumps(data, indent=1))
        (out / f"{name}.md").write_text(text + "\n")
    print(text)
    print(f"\nresults: {out / f'formats-{stamp}.md'} (also formats-latest.*)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
