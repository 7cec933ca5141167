"""What the proxy's resident memory is made of, under the bench's load.

`python -m bench.memory_breakdown [--conversations 10000] [--repeats N] [--env NAME=VALUE ...] [--src TREE] [--named]`
starts the mock upstream and one proxy (shipped config.yaml, `--src`'s tree) under
`bench.memprobe --untraced` (nothing slows it down), then runs what `python -m bench.run` runs
against a proxy: `--repeats` (1) repeats of the side-by-side phases (20 agent conversations of 200
messages one at a time, streamed turns, 16 concurrent clients; each repeat new ones), then the memory run's conversations
(two turns each, small transcripts). At each checkpoint (idle after start, after the
side-by-side load, after the memory run) the proxy writes `memprobe.breakdown()`: its resident
set by mapping, glibc malloc's and pymalloc's own figures, its threads, and each cache's entries,
believed and real size. `--env` sets the proxy's environment (MALLOC_ARENA_MAX=2, a
CONTEXT_PROXY_ setting...): an A/B of a lever without editing anything. `--named`: the agents name
their conversation (X-Conversation-ID), as bench.run's proxy-named's do; else the proxy derives it. Prints a table per
checkpoint and writes the whole as JSON (`--out`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from .procs import memory_mb
from .run import REPO, RESULTS, SMOKE, Bench, Settings, Target, fast_path_turns, log

TIKTOKEN_PROBE = (
    "import os, sys\n"
    "from proxy.tokens import tiktoken_encoder\n"
    "def anon():\n"
    "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('RssAnon')) / 1024\n"
    "before = anon(); tiktoken_encoder(sys.argv[1])('warm up'); print(anon() - before)\n"
)


def dump(proc_pid: int, out: Path, timeout: float = 60) -> dict[str, Any]:
    """Ask the probe for its breakdown (SIGUSR1) and wait for the file."""
    out.unlink(missing_ok=True)
    os.kill(proc_pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout
    while not out.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no breakdown written to {out}")
        time.sleep(0.1)
    return json.loads(out.read_text())


def tiktoken_mb(src: Path, encoding: str) -> float | None:
    """RssAnon one encoding adds to a fresh interpreter, loaded by the proxy's own loader."""
    import subprocess

    done = subprocess.run([sys.executable, "-c", TIKTOKEN_PROBE, encoding], cwd=src, capture_output=True, text=True, check=False)
    try:
        return float(done.stdout.strip())
    except ValueError:
        return None


def _mb(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def render(name: str, b: dict[str, Any]) -> str:
    s, g, p = b["status_mb"], b["glibc_malloc"], b["pymalloc"]
    lines = [
        f"## {name}",
        "",
        f"- resident {s['VmRSS']:.1f} MB (anon {s['RssAnon']:.1f}, file {s['RssFile']:.1f}); peak since the last checkpoint (VmHWM) {s['VmHWM']:.1f} MB",
        f"- threads: {b['threads']['os']} ({', '.join(b['threads']['python'])}); tokenizers loaded: {', '.join(b['tiktoken_loaded']) or 'none'}",
        f"- gc: {b['gc']['objects_tracked']:,} objects tracked, {b['gc']['frozen']:,} frozen",
        "",
        "| mapping | resident MB |",
        "|---|---|",
        *(f"| {k} | {v:.1f} |" for k, v in b["mappings_mb"].items()),
        "",
        f"- glibc malloc: {g.get('arenas_from_system_mb', 0):.1f} MB from the system in its arenas, "
        f"{g.get('in_use_mb', 0):.1f} in use, {g.get('free_kept_mb', 0):.1f} free but kept "
        f"(top of the heap releasable: {g.get('top_releasable_mb', 0):.1f}); "
        f"{g.get('mmapped_chunks', 0)} mmapped chunks, {g.get('mmapped_mb', 0):.1f} MB",
        "  - per arena (from system / free): " + ", ".join(
            f"#{a['arena']} {a['from_system_mb']:.1f}/{a['free_mb']:.1f}" for a in g.get("per_arena", [])
        ),
        f"- pymalloc: {p['arenas']} arenas ({p['arenas_mb']:.1f} MB, high-water {p['arenas_highwater']}), "
        f"{p['allocated_blocks_mb']:.1f} MB in allocated blocks, {p['free_blocks_mb']:.1f} MB free blocks, "
        f"{p['free_pools_mb']:.1f} MB free pools; {p['allocated_blocks']:,} blocks",
        f"- SQLite's own allocations (page caches, statements): {b['sqlite_mb']}",
        "",
        "| cache | entries | believed MB | real MB |",
        "|---|---|---|---|",
        *(
            f"| {k} | {v['entries']:,} | {_mb(v['believed_mb'])} | {v['real_mb']:.1f} |"
            for k, v in b["caches"].items()
            if "entries" in v
        ),
        "",
        *(
            f"- {k}: " + ", ".join(f"{part} {mb:.1f}" for part, mb in v.items())
            for k, v in b["caches"].items()
            if "entries" not in v
        ),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.memory_breakdown", description=__doc__.splitlines()[0])
    p.add_argument("--conversations", type=int, default=10_000, help="of the memory run (default 10,000)")
    p.add_argument("--repeats", type=int, default=1, help="side-by-side blocks before the memory run (bench.run's --repeats)")
    p.add_argument("--env", action="append", default=[], help="NAME=VALUE for the proxy's environment (repeatable)")
    p.add_argument("--src", default=str(REPO), help="source tree whose proxy and config.yaml run")
    p.add_argument("--named", action="store_true", help="the agents name their conversation (bench.run's proxy-named)")
    p.add_argument("--smoke", action="store_true", help="the bench's smoke load: seconds, proves the tool works")
    p.add_argument("--out", default=str(RESULTS / "memory-breakdown.json"))
    args = p.parse_args(argv)
    s = Settings(**vars(SMOKE)) if args.smoke else Settings()
    s.memory_conversations = [min(s.memory_conversations[-1], args.conversations) if args.smoke else args.conversations]
    out = Path(args.out)
    bench_args = argparse.Namespace(
        out=str(out.parent), proxy_src=args.src, base_src=None, targets=[], wire="chat", no_litellm=True, smoke=args.smoke,
        skip_memory=False,
    )
    bench = Bench(bench_args, s)
    extra = dict(item.split("=", 1) for item in args.env)
    probe_file = out.with_name(out.stem + "-probe.json")
    result: dict[str, Any] = {"env": extra, "src": str(Path(args.src).resolve()), "checkpoints": {}}
    try:
        bench.start()  # the mock and the load generator (no targets)
        proc = bench._make("proxy", bench.mock_url, runner=["-m", "bench.memprobe", "--untraced", str(probe_file)])
        proc.env.update(extra)
        bench.procs.append(proc)
        proc.start()
        proc.wait_ready(60)
        t = Target("proxy-named" if args.named else "proxy", f"http://127.0.0.1:{proc.port}/v1", proc)
        checkpoints = result["checkpoints"]
        checkpoints["idle after start"] = dump(proc.pid, probe_file)
        log(f"side-by-side load ({args.repeats} repeat{'s' if args.repeats != 1 else ''})")
        bench._prime(t)
        phases = result["phases"] = [{"phase": "the first requests (unmeasured: the tokenizer loads)", **memory_mb(proc.pid), "fast_path": {}}]
        measured = bench.measured

        def measured_and_noted(target: Target, **cmd: Any) -> dict[str, Any]:
            """Each phase of the block: its resident set after it, the peak since the idle checkpoint, the fast path's turns."""
            before = fast_path_turns(target)
            r = measured(target, **cmd)
            after = fast_path_turns(target)
            phase = f"{block_no + 1}: " * (args.repeats > 1) + f"{cmd['requests']} requests at {cmd.get('concurrency', 1)}{' streamed' if cmd.get('stream') else ''}"
            phases.append({"phase": phase, **memory_mb(proc.pid), "fast_path": {k: after[k] - before.get(k, 0) for k in after}})
            return r

        bench.measured = measured_and_noted  # type: ignore[method-assign]
        for block_no in range(args.repeats):
            block = bench.block(t, block_no)
        bench.measured = measured  # type: ignore[method-assign]
        checkpoints["after the side-by-side load"] = dump(proc.pid, probe_file)
        log(f"memory run: {s.memory_conversations[-1]} conversations")
        curve = bench.memory(t)
        checkpoints[f"after {s.memory_conversations[-1]:,} more conversations"] = dump(proc.pid, probe_file)
        result["cpu_ms_per_later_turn"] = block["seq"]["target_cpu_ms_per_req"]
        result["req_per_s_at_16"] = block["conc"].get("rps")
        result["memory_curve"] = curve["curve"]
        result["final_memory_mb"] = memory_mb(proc.pid)
        result["tiktoken_mb"] = {e: tiktoken_mb(Path(args.src), e) for e in ("cl100k_base", "o200k_base")}
    finally:
        if bench.lg:
            bench.lg.close()
        for proc_ in reversed(bench.procs):
            proc_.stop()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    agents = "agents naming their conversation" if args.named else "derived ids"
    text = [f"# memory breakdown ({agents}; {', '.join(f'{k}={v}' for k, v in extra.items()) or 'no extra env'})", ""]
    text += [render(name, b) for name, b in result["checkpoints"].items()]
    text += ["| side-by-side phase | resident MB | peak since idle MB | fast path taken / declined / none |", "|---|---|---|---|"]
    text += [
        f"| {p['phase']} | {p['rss']:.1f} | {p['hwm']:.1f} | "
        + " / ".join(str(int(p["fast_path"].get(k, 0))) for k in ("taken", "declined", "none")) + " |"
        for p in result.get("phases", [])
    ]
    text.append("")
    text.append(f"- tiktoken, RssAnon one encoding adds to a fresh interpreter: {result['tiktoken_mb']}")
    text.append(f"- CPU ms per later turn (one at a time): {result['cpu_ms_per_later_turn']:.2f}; req/s at 16: {result['req_per_s_at_16']}")
    print("\n".join(text))
    out.with_suffix(".md").write_text("\n".join(text) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
