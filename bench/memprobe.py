"""context-proxy under tracemalloc, to see what its resident memory is made of.

`python -m bench.memprobe OUT.json serve --config config.yaml --port P` runs `proxy.cli.main`
unchanged in this process with tracemalloc on (12 frames). On SIGUSR1 it writes OUT.json: the
Python heap it traces, charged to the deepest proxy/ frame of each allocation (which proxy code
made or keeps it) and to the allocating file, next to VmRSS/RssAnon. Before tracing starts it
loads the two tiktoken encodings the proxy uses and notes what they cost (Python dicts and the
Rust tables together). Only `--profile` runs use it: tracing slows the proxy several times and
inflates its RSS, so run.py compares the traced heap with the untraced proxy's RSS.
"""

from __future__ import annotations

import json
import signal
import sys
import tracemalloc
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

FRAMES = 12  # enough to reach the proxy/ frame above json, pickle, tiktoken internals


def _status_mb() -> dict[str, float]:
    out: dict[str, float] = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key = line.split(":", 1)[0]
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            out[key] = int(line.split()[1]) / 1024
    return out


def _short(filename: str) -> str:
    for marker in ("site-packages/", "lib/python3.11/", "lib/python3."):
        if marker in filename:
            return filename.split(marker, 1)[1]
    i = filename.rfind("/proxy/")
    return filename[i + 1 :] if i >= 0 else filename


def snapshot(top: int = 20) -> dict[str, Any]:
    snap = tracemalloc.take_snapshot()
    by_owner: Counter[str] = Counter()
    by_file: Counter[str] = Counter()
    total = 0
    for stat in snap.statistics("traceback"):
        frames = list(stat.traceback)  # oldest first
        owner = next((f for f in reversed(frames) if "/proxy/" in f.filename), None)
        label = f"{_short(owner.filename)}:{owner.lineno}" if owner else "(no proxy/ frame: start-up, imports, aiohttp)"
        by_owner[label] += stat.size
        by_file[_short(frames[-1].filename)] += stat.size
        total += stat.size
    mb = 1024 * 1024
    return {
        "status_mb": _status_mb(),
        "traced_mb": total / mb,
        "tracemalloc_overhead_mb": tracemalloc.get_tracemalloc_memory() / mb,
        "by_proxy_line": [{"where": k, "mb": v / mb} for k, v in by_owner.most_common(top)],
        "by_allocating_file": [{"where": k, "mb": v / mb} for k, v in by_file.most_common(top)],
    }


def _tiktoken_mb() -> dict[str, Any]:
    """Resident cost of the tokenizers the proxy loads, measured before tracing starts (tracing
    would inflate it): both encodings through the proxy's own loader, which caches them, so the
    proxy reuses these very objects."""
    try:
        from proxy.tokens import tiktoken_encoder  # the proxy's loader: bundled files, offline

        before = _status_mb()["RssAnon"]
        for name in ("o200k_base", "cl100k_base"):
            tiktoken_encoder(name)("warm up")
        return {"mb": _status_mb()["RssAnon"] - before}
    except Exception as exc:  # noqa: BLE001  # the proxy's internals may move: report, don't fail
        return {"error": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    out, argv = Path(sys.argv[1]), sys.argv[2:]
    tiktoken = _tiktoken_mb()
    tracemalloc.start(FRAMES)

    def dump(signum: int, frame: FrameType | None) -> None:
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps({**snapshot(), "tiktoken": tiktoken}, indent=1))
        tmp.rename(out)  # whole file or nothing: run.py waits for it to appear

    signal.signal(signal.SIGUSR1, dump)
    from proxy.cli import main as proxy_main

    sys.exit(proxy_main(argv))


if __name__ == "__main__":
    main()
