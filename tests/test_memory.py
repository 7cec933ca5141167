"""The C allocator set up at start-up (proxy/memory.py): large blocks go back to the system once
freed, a variable glibc reads itself wins over the setting, and the trimmer hands back what a
burst left in the middle of the heap. Against real `python -m proxy serve` processes (and, for
mallopt's own effect, a plain interpreter calling the same function)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.activity import Activity
from proxy.engine.fastpath import wire_of
from proxy.memory import Trimmer
from tests.conftest import ALICE
from tests.fakes.fake_upstream import Reply
from tests.support.harness import ProxyProcess, peak_rss_kb, wait_until

JSON_AUTH = {"Authorization": f"Bearer {ALICE}", "Content-Type": "application/json"}
MB = 1024 * 1024

# Frees a 4 MB block, then holds another: is the second one mapped on its own (mallinfo2's hblks)?
# glibc's dynamic threshold rises to 4 MB on the first free, so by default the second is not.
MMAPPED_AFTER_A_FREE = """
import ctypes, sys
from proxy.memory import tune_malloc
print(tune_malloc(2, int(sys.argv[1])))
class Info(ctypes.Structure):
    _fields_ = [(f, ctypes.c_size_t) for f in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
block = bytearray(4 << 20)
del block
before = libc.mallinfo2().hblks
block = bytearray(4 << 20)
print(libc.mallinfo2().hblks - before)
"""


def mmapped_after_a_free(threshold_kb: int, env: dict[str, str] | None = None) -> tuple[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", MMAPPED_AFTER_A_FREE, str(threshold_kb)],
        capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin", **(env or {})},
        cwd=Path(__file__).resolve().parent.parent,
    )
    applied, mapped = done.stdout.split("\n")[:2]
    return applied, int(mapped)


def test_a_fixed_threshold_keeps_large_blocks_mapped_and_the_environment_wins():
    applied, mapped = mmapped_after_a_free(128)
    assert "'mmap_threshold': 131072" in applied and "'arena_max': 2" in applied
    assert mapped == 1  # mapped on its own: freed, it goes straight back to the system
    assert mmapped_after_a_free(0)[1] == 0  # glibc's default: from the heap, where it leaves a hole when freed
    applied, mapped = mmapped_after_a_free(128, {"MALLOC_MMAP_THRESHOLD_": str(64 * MB)})
    assert "mmap_threshold" not in applied and "arena_max" in applied and mapped == 0  # the admin's variable stands


# Memory freed in the heap's middle (what a cache lets go of) shrinks nothing by itself: is it
# handed back though the resident set did not grow since the last trim, once the process is quiet
# (not under load, where the next turns would fault the pages back in)?
FREED_IN_THE_MIDDLE = """
from proxy.memory import Trimmer, resident_bytes
trimmer = Trimmer(1.0)
trimmer._resident_after, trimmer._free_after = resident_bytes(), trimmer._free_bytes()
blocks = [bytes(2000) + bytes([i % 256]) for i in range(15_000)]  # ~30 MB from the heap (not pymalloc's, not mapped)
top = blocks[-1]  # holds the heap's top: nothing goes back from there
grown = trimmer.trim_if_worth_it(quiet=False)
before = resident_bytes()
del blocks
busy = trimmer.trim_if_worth_it(quiet=False)
print(grown, busy, trimmer.trim_if_worth_it(quiet=True), (before - resident_bytes()) >> 20, trimmer.trim_if_worth_it(quiet=True))
"""


def test_the_trimmer_hands_back_what_was_freed_once_quiet():
    done = subprocess.run([sys.executable, "-c", FREED_IN_THE_MIDDLE], capture_output=True, text=True, check=True,
                          env={"PATH": "/usr/bin:/bin"}, cwd=Path(__file__).resolve().parent.parent)
    grown, busy, quiet, handed_back_mb, again = done.stdout.split()
    assert (grown, busy, quiet, again) == ("True", "False", "True", "False")  # growth always, freed memory once quiet
    assert int(handed_back_mb) > 20


def rss_anon_mb(proc: ProxyProcess) -> float:
    assert proc.proc is not None
    status = Path(f"/proc/{proc.proc.pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("RssAnon:")).split()[1]) / 1024


def turns(http: httpx.Client, conversation: str, messages: list[dict[str, Any]], n: int) -> None:
    """`n` full-history turns of `conversation`, starting from `messages`."""
    for i in range(n):
        response = http.post("/v1/chat/completions", json={"model": "gpt-4o-mini", "messages": messages},
                             headers={**JSON_AUTH, "X-Conversation-ID": conversation})
        assert response.status_code == 200, response.text[:300]
        messages = [*messages, response.json()["choices"][0]["message"], {"role": "user", "content": f"step {i}"}]


@pytest.mark.parametrize("server", [
    {},  # the defaults: two arenas, glibc's dynamic mmap threshold, the trimmer
    {"malloc_mmap_threshold_kb": 128, "malloc_trim_interval_s": 0},  # a fixed threshold alone
], ids=["defaults", "mmap-threshold"])
def test_what_the_caches_let_go_goes_back_to_the_system(processes, upstream, server):
    """Eight conversations of 1 MB bodies fill the caches that make their next turns cheap; then
    300 small conversations push them out. What they held (bodies, parsed, forwarded: ~20 MB)
    must leave the resident set: with glibc's defaults (malloc_arena_max 0, no threshold, no
    trimmer) all of it stays, as holes in the heap under the small conversations' objects."""
    (proc,) = processes(server=server)
    upstream.responder = lambda body: Reply.text("done")
    with httpx.Client(base_url=f"http://127.0.0.1:{proc.port}", auth=proc.admin_auth, timeout=60) as http:
        for c in range(8):
            turns(http, f"big-{c}", [{"role": "user", "content": f"{c} " + "word " * 200_000}], 3)
        full = rss_anon_mb(proc)
        for c in range(300):
            turns(http, f"small-{c}", [{"role": "user", "content": f"small task {c}"}], 1)
    # Polled: the trimmer runs in its own time (a deadline, not a sleep).
    wait_until(lambda: rss_anon_mb(proc) < full - 10, timeout=20, what="the caches' memory back with the system")


def test_two_first_requests_at_once_build_the_tokenizer_once(processes, upstream):
    """Each request's first need of a tokenizer loads it in a thread; two at once used to build
    cl100k_base twice side by side: the process's peak grew by ~70 MB instead of ~35 (one
    build: 40 MB at its height, 25 MB once built)."""
    (proc,) = processes()
    upstream.responder = lambda body: Reply.text("ok")
    before = peak_rss_kb(proc) / 1024

    def first_turn(i: int) -> int:
        with httpx.Client(base_url=f"http://127.0.0.1:{proc.port}", auth=proc.admin_auth, timeout=60) as http:
            body = {"model": "gpt-4", "messages": [{"role": "user", "content": f"task {i}"}]}
            return http.post("/v1/chat/completions", json=body, headers={**JSON_AUTH, "X-Conversation-ID": f"c{i}"}).status_code

    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(first_turn, range(2))) == [200, 200]
    grown = peak_rss_kb(proc) / 1024 - before
    assert 20 < grown < 55, f"peak grew by {grown:.0f} MB"  # the tokenizer was built, and once


def test_a_memos_upstream_body_holds_its_length_not_the_encoders_buffer():
    """orjson's bytes keep the capacity its buffer grew to (~3x a 5 KB body's length); a Wire is
    kept in a memo for the next turn, so it holds an exact copy (the FastPath's budget counts its
    length). The block its bytes live in is found by where it was allocated."""
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 1000 + str(i)} for i in range(5)]}
    tracemalloc.start()
    try:
        wire = wire_of(body, "messages", ())
        assert wire is not None
        where = tracemalloc.get_object_traceback(wire.encoded)
        blocks = [trace.size for trace in tracemalloc.take_snapshot().traces if trace.traceback == where]
    finally:
        tracemalloc.stop()
    assert len(wire.encoded) > 5000 and blocks
    assert max(blocks) < len(wire.encoded) + 100, (blocks, len(wire.encoded))  # a bytes object's header: 33


async def paced_clients(trimmer: Trimmer, activity: Activity, turns: int, gap_s: float) -> None:
    """The trimmer running while a client comes every `gap_s` seconds (an agent's paced turns)."""
    running = asyncio.create_task(trimmer.run(activity))
    for _ in range(turns):
        await asyncio.sleep(gap_s)  # the pace of the clients, not a wait for the trimmer
        activity.poke()
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running


def test_a_lightly_loaded_process_is_looked_at_when_a_client_comes_not_on_a_timer():
    """Four looks an interval, on a timer, woke the process between an agent's turns (on this
    project's VM each wake-up of an idle core costs ~2.5 ms: a paced turn was 20-30% dearer).
    Lightly loaded, the trimmer looks when a client sends, and once quiet waits for one."""
    trimmer, activity = Trimmer(0.2), Activity()
    asyncio.run(paced_clients(trimmer, activity, turns=6, gap_s=0.25))
    # On the timer: 4 looks every 0.2 s, ~30 over these 1.5 s.
    assert 6 <= trimmer.looks <= 6 + 3, trimmer.looks
