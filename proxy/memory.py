"""The C allocator, set up for a proxy whose requests are large bodies parsed into many objects.

Measured under the bench's load (`python -m bench.memory_breakdown`), glibc's malloc with its
defaults kept ~35 MB of freed memory resident out of ~180 MB:

- Each thread gets an arena of its own (up to 8 per core): the store's thread, the executor's
  threads that load the tokenizer, count tokens and check large bodies. What one of them freed
  is kept for that arena alone (one held 14 MB free, all of it from an earlier burst). Two arenas
  (the event loop's, and one the other threads share) cost nothing measurable in CPU.
- A heap gives memory back to the system from its top only: what a burst freed in its middle (a
  turn's request and upstream bodies, copies of them, a first turn's parsed messages) stays
  resident under the objects allocated after it. `Trimmer` hands those pages back (malloc_trim)
  once resident memory grew, or, once idle, what the caches let go: 9 MB off the bench's peak,
  24 MB off what stays after it.
- glibc's mmap threshold is dynamic: freeing a large block raises it to that block's size, so
  later bodies come from the heap, where they leave those holes. A fixed threshold keeps every
  large block mapped on its own, back with the system once freed: 7 MB more off the peak, but
  every socket read's 256 KB buffer is then mapped and its pages faulted in (7% more CPU a turn
  here, 20% a streamed chunk), so it is off unless `server.malloc_mmap_threshold_kb` sets one.

Elsewhere (musl, macOS) nothing is changed. A variable glibc reads itself (MALLOC_ARENA_MAX,
MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, GLIBC_TUNABLES) wins over the setting.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import time

from .activity import Activity

# mallopt parameters (glibc's malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
ENV = {  # what glibc reads from the environment for each, besides GLIBC_TUNABLES
    M_ARENA_MAX: ("MALLOC_ARENA_MAX", "glibc.malloc.arena_max"),
    M_MMAP_THRESHOLD: ("MALLOC_MMAP_THRESHOLD_", "glibc.malloc.mmap_threshold"),
    M_TRIM_THRESHOLD: ("MALLOC_TRIM_THRESHOLD_", "glibc.malloc.trim_threshold"),
}
TRIM_FACTOR = 8  # the trim threshold, in mmap thresholds: free memory at the heap's top kept for reuse


def glibc() -> ctypes.CDLL | None:
    """The process's glibc, or None when the C library is another (musl, macOS)."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  # glibc's own: absent from musl
        libc.mallopt  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


def tune_malloc(arena_max: int, mmap_threshold_kb: int) -> dict[str, int]:
    """Set glibc's arena count and a fixed mmap threshold (0: leave glibc's default); returns what
    was set, by mallopt's name, for the start-up log. Call it before threads start: arenas made
    before it stay."""
    libc = glibc()
    if libc is None:
        return {}
    wanted = {M_ARENA_MAX: arena_max}
    if mmap_threshold_kb:
        wanted[M_MMAP_THRESHOLD] = mmap_threshold_kb * 1024
        wanted[M_TRIM_THRESHOLD] = mmap_threshold_kb * 1024 * TRIM_FACTOR
    names = {M_ARENA_MAX: "arena_max", M_MMAP_THRESHOLD: "mmap_threshold", M_TRIM_THRESHOLD: "trim_threshold"}
    done: dict[str, int] = {}
    for param, value in wanted.items():
        if value and not _set_by_environment(param) and libc.mallopt(param, value) == 1:
            done[names[param]] = value
    return done


def _set_by_environment(param: int) -> bool:
    variable, tunable = ENV[param]
    return variable in os.environ or f"{tunable}=" in os.environ.get("GLIBC_TUNABLES", "")


# -- giving freed memory back -------------------------------------------------------------------

TRIM_GROWTH = 2 * 2**20  # resident bytes grown since the last trim that make the next one worth it
# Resident memory is looked at this many times an interval (a read of /proc/self/statm, ~5 µs).
# Under the bench's 16 clients it grows back ~5 MB a second after a trim (freed chunks reused),
# and a new workload's first second (small conversations pushing big ones out of the caches)
# grew it 3.5 MB: looked at once a second, the peak overshot by that much (python -m bench.run
# --skip-scaling, peak 121.2 / 119.9 -> 118.0 / 119.1 MB; CPU a turn, bench/turn_cpu.py, median
# ratios 0.989 at 16 clients, 0.996 and 1.028 one at a time: within the noise).
GROWTH_LOOKS = 4
QUIET_SHARE = 0.05  # of a core: a process using less is not under load
# Work (process CPU seconds) since the free bytes were last looked at that makes another look
# worth it: an agent's paced turns (20 ms of CPU each on this VM) have one every ~5 turns, not
# each (the walk of the free lists, cold, cost more than the turn's own allocations freed).
RECHECK_CPU_S = 0.1
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int:
    """This process's resident set (/proc/self/statm: two integers read, no parsing of status).
    os.open, not open(): three system calls, not nine (open() also stats, probes for a tty, seeks);
    it runs on the loop at a lightly loaded process's requests."""
    fd = os.open("/proc/self/statm", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return int(os.read(fd, 128).split()[1]) * PAGE
    finally:
        os.close(fd)


class MallInfo2(ctypes.Structure):
    """glibc's struct mallinfo2 (2.33 and later): every field a size_t."""

    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


class Trimmer:
    """malloc_trim(0) in a thread once memory was taken (looked at GROWTH_LOOKS times every
    `interval_s` s) or, the process quiet over an interval, given back.

    glibc returns free memory to the system from the top of a heap only: what a burst freed in
    its middle (a turn's request and upstream bodies, a first turn's 200 parsed messages) stays
    resident until reused. malloc_trim hands back every free page, in any arena. It costs ~1.5 ms
    on an 80 MB heap that has nothing to give back and ~0.2 ms per MB it does, off the event loop
    (ctypes lets go of the GIL); so it runs only when there is something to give: the resident set
    grew by TRIM_GROWTH since the last one (a burst), or the heap's free bytes did while the
    process was quiet (caches letting go of what they held: that shrinks nothing by itself, so
    resident memory alone never tells). Not under load: there the free bytes come and go with
    every turn's bodies, and trimming on them each second made the next turns fault the pages
    back in (8% more CPU a turn in one A/B, bench/turn_cpu.py, 4 x 1,000 turns); what is freed
    then is reused anyway. A steady process is not trimmed again and again, and an idle one is not
    woken: once quiet, it waits for the next client (proxy/activity.py).
    """

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._libc = glibc() if interval_s > 0 else None
        self._mallinfo2 = getattr(self._libc, "mallinfo2", None)  # glibc 2.33+; without it, growth alone
        if self._mallinfo2 is not None:
            self._mallinfo2.restype = MallInfo2
        self._resident_after = self._free_after = 0  # after the last trim
        self.looks = 0  # at resident memory, by `run` (tests: how often an idle-ish process is woken)

    @property
    def enabled(self) -> bool:
        return self._libc is not None

    async def run(self, activity: Activity | None = None) -> None:
        """Until cancelled. Busy, it looks GROWTH_LOOKS times an interval (the loop is awake anyway).
        Lightly loaded (an agent's turns, seconds apart), it looks when the next client sends
        rather than on a timer between turns: on this project's VM each wake-up of an idle core
        costs ~2.5 ms, and four a second made a paced turn 20-30% dearer. The free bytes (a walk
        of every free chunk, in a thread) are looked at once quiet over a whole interval, and
        again only after RECHECK_CPU_S of work since: what there is to give back was freed by
        work. Quiet with nothing due, it waits for the next client. Without `activity`, it keeps
        to the timer."""
        if self._libc is None:
            return
        self._resident_after, self._free_after = resident_bytes(), self._free_bytes()
        cpu, wall = time.process_time(), time.monotonic()
        checked_cpu = -RECHECK_CPU_S  # process time at the last look at the free bytes
        busy = True  # used QUIET_SHARE of a core or more since the last look
        while True:
            look_cpu, look_wall = time.process_time(), time.monotonic()
            due = look_cpu - checked_cpu >= RECHECK_CPU_S
            poked = False
            if busy or activity is None:
                await asyncio.sleep(self.interval_s / GROWTH_LOOKS)
            elif due:  # the next client, or the interval's end (quiet is told then), whichever first
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(wall + self.interval_s - look_wall, 0)):
                        await activity.wait()
                        poked = True
            else:
                await activity.wait()
                poked = True
            self.looks += 1
            now = time.monotonic()
            busy = time.process_time() - look_cpu >= QUIET_SHARE * (now - look_wall)
            whole = now - wall >= self.interval_s  # quiet or not is told over a whole interval
            # Quiet: the process (every thread) used under QUIET_SHARE of a core over the interval.
            quiet = whole and time.process_time() - cpu < QUIET_SHARE * (now - wall)
            # Not at a client's first byte: the walk would hold up its request.
            check_free = quiet and due and not poked
            if check_free or resident_bytes() >= self._resident_after + TRIM_GROWTH:  # under load: nothing more
                await asyncio.to_thread(self.trim_if_worth_it, check_free)
                if check_free:
                    checked_cpu = time.process_time()
            if quiet and not poked and activity is not None:
                await activity.wait()
            if whole:
                cpu, wall = time.process_time(), time.monotonic()

    def trim_if_worth_it(self, quiet: bool) -> bool:
        """Trim if memory grew by TRIM_GROWTH since the last trim, or, `quiet`, as much was freed;
        True if it did. In a thread: mallinfo2 walks the free lists under each arena's lock (~0.3 ms
        for 15,000 free chunks), so the free bytes are looked at only once quiet."""
        assert self._libc is not None
        if resident_bytes() < self._resident_after + TRIM_GROWTH:
            if not quiet:
                return False
            free = self._free_bytes()
            if free < self._free_after + TRIM_GROWTH:
                self._free_after = min(self._free_after, free)  # reused since: what is freed next counts from here
                return False
        self._libc.malloc_trim(0)
        self._resident_after, self._free_after = resident_bytes(), self._free_bytes()
        return True

    def _free_bytes(self) -> int:
        """Free bytes in the heaps (pages already handed back included: trimming keeps the chunks)."""
        return self._mallinfo2().fordblks if self._mallinfo2 is not None else 0
