"""context-proxy with a memory probe, to see what its resident memory is made of.

`python -m bench.memprobe [--untraced] OUT.json serve --config config.yaml --port P` runs
`proxy.cli.main` unchanged in this process; on SIGUSR1 it writes OUT.json.

- Traced (the default, `--profile` runs): tracemalloc on (12 frames); OUT.json holds the Python
  heap it traces, charged to the deepest proxy/ frame of each allocation (which proxy code made or
  keeps it) and to the allocating file, next to VmRSS/RssAnon. Before tracing starts it loads the
  two tiktoken encodings the proxy uses and notes what they cost (Python dicts and the Rust tables
  together). Tracing slows the proxy several times and inflates its RSS, so run.py compares the
  traced heap with the untraced proxy's RSS.
- `--untraced` (`python -m bench.memory_breakdown`): nothing slows the proxy down; OUT.json is
  `breakdown()`: the resident set by mapping (malloc's main arena, its thread arenas, pymalloc's
  arenas, files), glibc malloc's own figures (in use / free but kept, per arena), pymalloc's, the
  threads, the garbage collector's counts, and each of the proxy's caches: what it believes it
  holds next to what its objects really take (sys.getsizeof over everything it alone reaches).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import re
import signal
import sys
import tempfile
import threading
import tracemalloc
import types
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from types import FrameType
from typing import Any

FRAMES = 12  # enough to reach the proxy/ frame above json, pickle, tiktoken internals
MB = 1024 * 1024
THREAD_HEAP = 64 * MB  # glibc maps each thread arena's heap at a multiple of HEAP_MAX_SIZE (64 MB on 64-bit)


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
    return {
        "status_mb": _status_mb(),
        "traced_mb": total / MB,
        "tracemalloc_overhead_mb": tracemalloc.get_tracemalloc_memory() / MB,
        "by_proxy_line": [{"where": k, "mb": v / MB} for k, v in by_owner.most_common(top)],
        "by_allocating_file": [{"where": k, "mb": v / MB} for k, v in by_file.most_common(top)],
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


# -- the untraced breakdown ---------------------------------------------------------------------


def mappings() -> dict[str, float]:
    """Resident MB by kind of mapping (/proc/self/smaps). Anonymous mappings: malloc's main arena
    is [heap]; a thread arena's heap starts at a multiple of 64 MB; the rest (pymalloc's 1 MiB
    arenas, malloc's mmapped chunks, thread stacks) is told apart with pymalloc's own count."""
    kinds: Counter[str] = Counter()
    name = ""
    start = 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = re.match(r"^([0-9a-f]+)-[0-9a-f]+ \S+ \S+ \S+ \S+\s*(.*)$", line)
        if head:
            start, name = int(head.group(1), 16), head.group(2)
            continue
        if not line.startswith("Rss:"):
            continue
        kb = int(line.split()[1])
        if name == "[heap]":
            kinds["malloc main arena ([heap])"] += kb
        elif name.startswith("["):
            kinds[f"other {name}"] += kb
        elif name:
            kinds["shared libraries" if ".so" in name else "other files"] += kb
        elif start % THREAD_HEAP == 0:
            kinds["malloc thread arenas"] += kb
        else:
            kinds["other anonymous (pymalloc arenas, mmapped chunks, stacks)"] += kb
    return {k: v / 1024 for k, v in kinds.most_common()}


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(f, ctypes.c_size_t) for f in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost",
    )]


def glibc_malloc() -> dict[str, Any]:
    """glibc's figures: every arena's memory from the system, in use, free but kept; mmapped chunks;
    then malloc_info's per-arena view (what each arena holds from the system, free in its bins)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _Mallinfo2
        info = libc.mallinfo2()
    except (OSError, AttributeError) as exc:
        return {"error": str(exc)}
    out: dict[str, Any] = {
        "arenas_from_system_mb": info.arena / MB,
        "in_use_mb": info.uordblks / MB,
        "free_kept_mb": info.fordblks / MB,
        "mmapped_chunks": info.hblks,
        "mmapped_mb": info.hblkhd / MB,
        "top_releasable_mb": info.keepcost / MB,
    }
    with tempfile.NamedTemporaryFile("r", suffix=".xml") as tmp:
        libc.fopen.restype = ctypes.c_void_p
        libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.fclose.argtypes = [ctypes.c_void_p]
        fp = libc.fopen(tmp.name.encode(), b"w")
        if fp:
            libc.malloc_info(0, fp)
            libc.fclose(fp)
            xml = Path(tmp.name).read_text()
            heaps = []
            for nr, body in re.findall(r'<heap nr="(\d+)">(.*?)</heap>', xml, re.S):
                current = re.search(r'<system type="current" size="(\d+)"/>', body)
                free = sum(int(s) for s in re.findall(r'<total type="(?:fast|rest)" count="\d+" size="(\d+)"/>', body))
                heaps.append({"arena": int(nr), "from_system_mb": int(current.group(1)) / MB if current else None,
                              "free_mb": free / MB})
            out["per_arena"] = heaps
    return out


def pymalloc() -> dict[str, Any]:
    """pymalloc's own count (sys._debugmallocstats, which writes to fd 2): its arenas (1 MiB each),
    the bytes in allocated blocks, and what its free blocks and pools keep."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile("w+") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read()

    def figure(label: str) -> int | None:
        found = re.search(rf"^{re.escape(label)}\s*=\s*([\d,]+)", text, re.M)
        return int(found.group(1).replace(",", "")) if found else None

    arenas = figure("# arenas allocated current")
    arena_bytes = re.search(r"(\d+) arenas \* (\d+) bytes/arena", text)
    size = int(arena_bytes.group(2)) if arena_bytes else MB
    return {
        "arenas": arenas,
        "arenas_mb": (arenas or 0) * size / MB,
        "arenas_highwater": figure("# arenas highwater mark"),
        "allocated_blocks_mb": (figure("# bytes in allocated blocks") or 0) / MB,
        "free_blocks_mb": (figure("# bytes in available blocks") or 0) / MB,
        "free_pools_mb": sum(int(n) * int(b) for n, b in re.findall(r"^(\d+) unused pools \* (\d+) bytes", text, re.M)) / MB,
        "allocated_blocks": sys.getallocatedblocks(),
    }


def sqlite_mb() -> dict[str, float] | None:
    """SQLite's own allocations (every connection: page caches, schema, statements), now and at
    their peak: sqlite3_status64(SQLITE_STATUS_MEMORY_USED) of the library the sqlite3 module uses."""
    try:
        import sqlite3  # noqa: F401  # loads libsqlite3 if nothing did yet

        lib = ctypes.CDLL("libsqlite3.so.0")
    except OSError:
        return None
    now, peak = ctypes.c_int64(), ctypes.c_int64()
    if lib.sqlite3_status64(0, ctypes.byref(now), ctypes.byref(peak), 0) != 0:  # 0: SQLITE_STATUS_MEMORY_USED
        return None
    return {"now": now.value / MB, "peak": peak.value / MB}


STOP_TYPES = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
              types.CodeType, types.FrameType, threading.Thread)


def deep_mb(roots: Iterable[Any], seen: set[int]) -> float:
    """What `roots` take, everything they reach counted once (and not again for a later cache:
    `seen` is shared), stopping at classes, modules, functions and the app's own objects."""
    total = 0
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, STOP_TYPES):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        stack.extend(gc.get_referents(obj))
    return total / MB


def caches(app: Any) -> dict[str, Any]:
    """Each cache of the proxy: its entries, what it believes it holds, what it really takes.
    Measured in this order, objects shared with an earlier one charged to the earlier one."""
    if app is None:
        return {}
    from proxy import state

    def get(key: str) -> Any:
        k = getattr(state, key, None)
        return app.get(k) if k is not None else None

    engine, store = get("ENGINE"), get("STORE")
    seen = {id(x) for x in (app, engine, store, get("PIPELINE"), get("SETTINGS"), get("COUNTER"), get("METRICS"), get("PREFIXES"))}
    seen |= {id(x) for x in (getattr(engine, a, None) for a in ("bodies", "fastpath", "router", "compaction", "summarizer"))}
    out: dict[str, Any] = {}

    def add(name: str, entries: int, believed_mb: float | None, roots: Iterable[Any]) -> None:
        out[name] = {"entries": entries, "believed_mb": believed_mb, "real_mb": deep_mb(roots, seen)}

    bodies = getattr(engine, "bodies", None)
    if bodies is not None:
        entries = list(bodies._entries.values())
        parts = {"bytes": [e.head.obj for e in entries] + [e.tail for e in entries],
                 "hashes": [e.hashes for e in entries], "parsed": [e.body for e in entries] + [e.raws for e in entries]}
        out["BodyCache's parts (MB)"] = {name: deep_mb(roots, set()) for name, roots in parts.items()}
        add("BodyCache (request bodies, parsed)", len(bodies._entries), bodies.held / MB, [bodies._entries])
    prefixes = get("PREFIXES")
    if prefixes is not None:
        add("PrefixCache (parsed messages, hashes)", len(prefixes._entries), prefixes._held / MB, [prefixes._entries])
    fast = getattr(engine, "fastpath", None)
    if fast is not None:
        memos = list(fast._memos.values())
        parts = {"upstream bytes": [m.wire.encoded for m in memos if m.wire],
                 "upstream sendable": [m.wire.sendable for m in memos if m.wire], "items": [m.items for m in memos],
                 "runs": [m.runs for m in memos]}
        known = set(seen)  # what the BodyCache holds is not the memos'
        out["FastPath's parts (MB, beyond the BodyCache)"] = {name: deep_mb(roots, set(known)) for name, roots in parts.items()}
        add("FastPath memos (items, stage runs, upstream bodies)", len(fast._memos), fast._held / MB, [fast._memos, fast._keys])
    parts_held = getattr(engine, "request_parts", None)
    if parts_held is not None:
        add("RequestParts (system prompts and tools)", len(parts_held._last), parts_held.held / MB, [parts_held._last, parts_held._values])
    metrics = get("METRICS")
    if metrics is not None:
        add("Metrics' active conversations", len(metrics._last_seen), None, [metrics._last_seen])
    counter = get("COUNTER")
    if counter is not None:
        add("TokenCounter counts", len(counter._cache), None, [counter._cache])
    if store is not None:
        for attr in ("_snapshots", "_records"):  # diskcache: conversations, records; Redis: its Snapshots
            held = getattr(store, attr, None)
            if held is not None:
                add(f"store {attr}", len(held), None, [held])
    trajectories = get("TRAJECTORIES")
    if trajectories is not None and hasattr(trajectories, "_mirrors"):
        add("trajectory mirrors", len(trajectories._mirrors), trajectories._held / MB, [trajectories._mirrors])
    return out


def breakdown(app: Any) -> dict[str, Any]:
    gc_counts = {"objects_tracked": len(gc.get_objects()), "frozen": gc.get_freeze_count(), "counts": gc.get_count(),
                 "thresholds": gc.get_threshold()}
    return {
        "status_mb": _status_mb(),
        "mappings_mb": mappings(),
        "glibc_malloc": glibc_malloc(),
        "pymalloc": pymalloc(),
        "sqlite_mb": sqlite_mb(),
        "threads": {"os": len(os.listdir("/proc/self/task")), "python": sorted(t.name for t in threading.enumerate())},
        "gc": gc_counts,
        "caches": caches(app),
        "tiktoken_loaded": sorted(getattr(app.get(_counter_key()), "_loaded", ())) if app is not None else [],
    }


def _counter_key() -> Any:
    from proxy import state

    return state.COUNTER


def main() -> None:
    argv = sys.argv[1:]
    untraced = argv[:1] == ["--untraced"]
    if untraced:
        argv = argv[1:]
    out, argv = Path(argv[0]), argv[1:]
    import proxy.cli

    apps: list[Any] = []
    build_app = proxy.cli.build_app

    def keep_app(settings: Any) -> Any:  # the app, for its caches; cli.py is otherwise unchanged
        apps.append(build_app(settings))
        return apps[-1]

    proxy.cli.build_app = keep_app
    tiktoken = None if untraced else _tiktoken_mb()
    if not untraced:
        tracemalloc.start(FRAMES)

    def dump(signum: int, frame: FrameType | None) -> None:
        data = breakdown(apps[-1] if apps else None) if untraced else {**snapshot(), "tiktoken": tiktoken}
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        # Walking the caches takes memory of its own (sets of ids, sizes): handed back, then the
        # peak reset (Linux: 5 sets VmHWM to the current RSS), the next checkpoint's peak is the
        # load's, not this walk's.
        data = None
        gc.collect()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        with contextlib.suppress(OSError):
            Path("/proc/self/clear_refs").write_text("5")
        tmp.rename(out)  # whole file or nothing: the caller waits for it to appear

    signal.signal(signal.SIGUSR1, dump)
    sys.exit(proxy.cli.main(argv))


if __name__ == "__main__":
    main()
