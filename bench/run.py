"""The bench: `python -m bench.run` (full, ~10 min; `make bench`) or `python -m bench.run --smoke`.

Side by side in one run, against one mock upstream on loopback. The main scenario is the growing,
zero-code-change agent: it names no conversation (no header: the proxy derives the id), its
transcript starts at 200 messages (~200 KB) and each request is the previous one + the reply as
received + a new ~1.5 KB observation, compact JSON as httpx/openai-python and JavaScript clients
send it (bench/workload.py). Every target gets that agent but proxy-named, whose agents are the
same ones naming their conversation (X-Conversation-ID; Claude Code's session header in Messages).
  direct      the load generator straight to the mock (the baseline every "added" figure is over)
  forwarder   bare aiohttp forwarder (bench/forwarder.py): no logic at all
  floor       the same plus a minimal durable append of the same bytes, outside our code
              (`--store`: raw sqlite3, WAL, synchronous=NORMAL, one INSERT of the request's new
              bytes before forwarding and one of the reply before the response ends, on a thread)
  floor-count the floor plus tiktoken's exact count of the request's new text, newest first up
              to the shipped window's budget (`--count-tokens`): the least a token-budgeted
              window must do before it can place anything
  proxy-off   context-proxy, shipped config.yaml, pipeline stages turned off by env vars
  proxy       context-proxy, shipped config.yaml (derived ids)
  proxy-named the same, its agents naming their conversation
  proxy-base  the same as proxy from another source tree (`--base-src`, e.g. main's): before/after
  litellm     LiteLLM's proxy (its own venv), same mock

Phases, per target and per repeat (targets interleaved within a repeat so drift hits all alike,
their order reversed and rotated from one repeat to the next because the place and the target
before matter too: `measuring_order`; figures are medians over repeats):
  first   new conversations: the first request stores the whole 200-message transcript
  seq     one request at a time, later turns (stored prefix + the reply + a new tool result)
  paced   the same, each after a pause (an agent's turns come seconds apart, the model's and the
          tools' time between them): the process and the core come back from idle every turn
  stream  the same, streamed, short replies (time to first byte), then long replies (the CPU
          per forwarded chunk is the slope between the two: per-request costs cancel out); each
          conversation's first streamed turn, and first long one, goes unmeasured (a client keeps
          to one; the long replies' model name changes the body)
  conc    16 concurrent clients, one conversation each: throughput
Then, for direct, forwarder and both proxies: scaling (turns 10, 100, 1,000 of one conversation)
and, for the proxies, memory over 10,000 conversations. `--profile` adds py-spy runs of the proxy.

Every request goes to 127.0.0.1. Results: bench/results/bench-<stamp>.{json,md} (+ latest.*).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import litellm_target, profiling, report
from .loadgen import API_KEY
from .procs import CpuMeter, Proc, clean_env, cores, cpu_seconds, free_port, machine_busy_seconds, memory_mb, pin_self
from .wires import WIRES
from .workload import stream_model

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"

# "pipeline off": the shipped config with every prompt-rewriting stage turned off by env vars.
# Add a line here whenever a stage gets its own switch.
PIPELINE_OFF_ENV = {
    "CONTEXT_PROXY_TRUNCATION__ENABLED": "false",
}
# Both proxy targets: one JSON log line per request at INFO would be measured too (and fill the
# disk); the bench runs them at WARNING, stderr going to bench/results/logs/<target>.log.
PROXY_ENV = {"CONTEXT_PROXY_LOGGING__LEVEL": "WARNING"}

# "with a models: table": the shipped config plus a litellm-routed model the bench never calls.
# Passthrough requests must cost the same with it (litellm stays unimported).
MODELS_TABLE_ENV = {
    "CONTEXT_PROXY_MODELS": '{"claude": {"litellm_model": "anthropic/claude-3-5-sonnet-20241022", '
    '"api_base": "http://127.0.0.1:9", "api_key_env": "BENCH_UNUSED_PROVIDER_KEY"}}',
    "BENCH_UNUSED_PROVIDER_KEY": "unused",
}

TARGETS = ["direct", "forwarder", "floor", "floor-count", "proxy-off", "proxy", "proxy-named", "proxy-models", "proxy-base", "litellm"]
# floor-count's budget: the shipped window's (ContextSettings.history_token_limit's default).
FLOOR_COUNT_BUDGET = 10_000
# Whose agents name their conversation by a header; every other target's agents name none.
NAMED_TARGETS = frozenset({"proxy-named"})


@dataclass
class Settings:
    repeats: int = 3
    seq_conversations: int = 20  # the seq phase takes turns round-robin over these
    seq_requests: int = 200
    paced_requests: int = 10
    paced_gap_ms: float = 300  # idle before each paced turn: the malloc trimmer's quiet interval (1 s) passes
    stream_requests: int = 40
    stream_chunks: int = 16  # events per short streamed reply
    stream_long_requests: int = 10
    stream_long_chunks: int = 256  # events per long streamed reply
    stream_gap_ms: float = 0.5  # between events, as a model spaces its tokens (asyncio rounds up to ~1 ms)
    concurrency: int = 16
    conc_requests: int = 960
    scaling_turns: list[int] = field(default_factory=lambda: [10, 100, 1000])
    scaling_window: int = 8  # turns measured on each side of a checkpoint: 17 single turns (7 swung the ratio by 2x)
    memory_conversations: list[int] = field(default_factory=lambda: [1000, 10000])
    memory_batch: int = 1000
    memory_concurrency: int = 8
    profile_requests: int = 400
    prime_requests: int = 40  # per target, unmeasured, before the first repeat


SMOKE = Settings(
    repeats=1, seq_conversations=2, seq_requests=6, paced_requests=2, paced_gap_ms=50, stream_requests=3, stream_chunks=8, stream_long_requests=2,
    stream_long_chunks=24, stream_gap_ms=0.2,
    concurrency=4, conc_requests=8, scaling_turns=[2, 5], scaling_window=1, memory_conversations=[20, 40],
    memory_batch=20, memory_concurrency=4, profile_requests=10, prime_requests=4,
)


def fast_path_turns(t: Any) -> dict[str, float]:
    """The proxy's fast-path turn counters from its /metrics: by outcome (taken, declined, none),
    and the turns not taken by reason (`not_taken:<reason>`); empty for a target that is not this
    proxy (or predates the counters)."""
    if not t.name.startswith("proxy") or not t.url:
        return {}
    try:
        with urllib.request.urlopen(t.url.removesuffix("/v1") + "/metrics", timeout=10) as reply:
            text = reply.read().decode()
    except OSError:
        return {}
    found = re.findall(r'^context_proxy_fast_path_turns_total\{outcome="(\w+)"\} ([0-9.e+]+)$', text, re.MULTILINE)
    reasons = re.findall(r'^context_proxy_fast_path_not_taken_turns_total\{reason="([\w-]+)"\} ([0-9.e+]+)$', text, re.MULTILINE)
    return {**{outcome: float(n) for outcome, n in found}, **{f"not_taken:{why}": float(n) for why, n in reasons}}


def counted_since(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The counters' growth between two reads of fast_path_turns (zero rows left out)."""
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


class BenchError(RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class LoadGen:
    """The load-generator process (bench/loadgen.py), one JSON line per command and per answer."""

    def __init__(self, cpus: set[int] | None, log_path: Path, wire: str = "chat") -> None:
        self.wire = wire  # every pool it opens speaks this wire format (bench/wires.py)
        self._log = open(log_path, "wb")  # noqa: SIM115  # open for the process's lifetime; close() closes it
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "bench.loadgen"],
            cwd=REPO, env=clean_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
            # run.py starts no threads, so preexec_fn is safe here: it pins the child before exec.
            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,  # noqa: PLW1509
        )

    def __call__(self, **cmd: Any) -> dict[str, Any]:
        assert self.popen.stdin and self.popen.stdout
        if cmd["op"] == "open":
            cmd.setdefault("wire", self.wire)
        self.popen.stdin.write((json.dumps(cmd) + "\n").encode())
        self.popen.stdin.flush()
        line = self.popen.stdout.readline()
        if not line:
            raise BenchError(f"load generator died (exit {self.popen.poll()}); see its log")
        answer: dict[str, Any] = json.loads(line)
        if not answer.pop("ok"):
            raise BenchError(f"load generator: {answer['error']}")
        return answer

    def close(self) -> None:
        if self.popen.poll() is None:
            try:
                self(op="quit")
            except (BenchError, BrokenPipeError, ValueError):
                pass
            try:
                self.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
        self._log.close()


@dataclass
class Target:
    name: str
    url: str | None = None  # base URL, /v1 included
    proc: Proc | None = None
    status: str = "ok"  # or why it is not measured

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def named(self) -> bool:
        """Whether its agents name their conversation (else the proxy derives it)."""
        return self.name in NAMED_TARGETS


def measuring_order(targets: list[Target], rep: int) -> list[Target]:
    """`targets` in the order repeat `rep` measures them: `direct` (if first) first, the others
    in their order on even repeats and the other way round on odd ones, rotated by one every two
    repeats, so that over twice as many repeats as there are of them each takes each place, and
    follows each of its two neighbours, as often. The place matters: the same tree run as proxy
    and proxy-base took ~7% more CPU a later turn and ~20% a first turn as whichever came right
    after `direct` (three runs of three repeats, in a fixed order; four unmeasured first turns
    before each block did not change it). So does the target before: rotated only, proxy always
    followed floor and proxy-base proxy-named, and whichever tree ran as proxy measured 10-25%
    more CPU a later turn than the one run as proxy-base in four runs of five (the trees swapped
    in one of them)."""
    lead = [t for t in targets[:1] if t.name == "direct"]
    rest = targets[len(lead):]
    if rep % 2:
        rest = rest[::-1]
    shift = (rep // 2) % len(rest) if rest else 0
    return [*lead, *rest[shift:], *rest[:shift]]


class Bench:
    def __init__(self, args: argparse.Namespace, s: Settings) -> None:
        self.args, self.s = args, s
        self.client_cpus, self.target_cpus = cores()
        self.run_id = f"{os.getpid()}-{int(time.time())}"
        self.out_dir = Path(args.out)
        self.logs = self.out_dir / "logs"
        self.tmp = Path(tempfile.mkdtemp(prefix="context-proxy-bench-"))
        self.proxy_src = Path(args.proxy_src).resolve()
        self.base_src = Path(args.base_src).resolve() if args.base_src else self.proxy_src
        self.targets: dict[str, Target] = {}
        self.procs: list[Proc] = []
        self.mock: Proc | None = None
        self.mock_url = ""
        self.lg: LoadGen | None = None
        self.data: dict[str, Any] = {"blocks": [], "scaling": {}, "memory": {}, "profile": {}}

    # -- set-up ------------------------------------------------------------------------------------

    def start(self) -> None:
        pin_self(self.client_cpus)
        self.logs.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.mock = Proc(
            "mock", [sys.executable, "-m", "bench.mock_upstream", "--port", str(port), "--gap-ms", str(self.s.stream_gap_ms)],
            port, "/healthz", self.logs / "mock.log", cwd=str(REPO), cpus=self.client_cpus,
        ).start()
        self.procs.append(self.mock)
        mock_url = self.mock_url = f"http://127.0.0.1:{port}/v1"
        self.lg = LoadGen(self.client_cpus, self.logs / "loadgen.log", self.args.wire)

        wanted = [t for t in self.args.targets if t in TARGETS]
        for name in wanted:
            self.targets[name] = Target(name)
        if "direct" in self.targets:
            self.targets["direct"].url = mock_url
        starting: list[Target] = []
        for name in ("forwarder", "floor", "floor-count", "proxy-off", "proxy", "proxy-named", "proxy-models", "proxy-base"):
            if name in self.targets:
                t = self.targets[name]
                t.proc = self._make(name, mock_url)
                t.url = f"http://127.0.0.1:{t.proc.port}/v1"
                t.proc.start()
                self.procs.append(t.proc)
                starting.append(t)
        if "litellm" in self.targets:
            self._start_litellm(self.targets["litellm"], mock_url)
            if self.targets["litellm"].proc:
                starting.append(self.targets["litellm"])
        self.mock.wait_ready(30)
        for t in starting:
            assert t.proc is not None
            try:
                t.proc.wait_ready(180 if t.name == "litellm" else 30)
            except RuntimeError as exc:
                t.status = f"did not start: {str(exc).splitlines()[0]}"
                log(f"{t.name}: {t.status}")
                t.proc.stop()
                t.proc = None
        for t in self.targets.values():
            if t.pid and t.status == "ok":
                self.data.setdefault("idle_memory_mb", {})[t.name] = memory_mb(t.pid)  # before any request
        for t in self.targets.values():
            if t.status == "ok":
                self._prime(t)

    def _make(self, name: str, mock_url: str, runner: list[str] | None = None) -> Proc:
        """The forwarder, or context-proxy as `python -m proxy serve` (`runner` replaces `-m proxy`)."""
        port = free_port()
        if name in ("forwarder", "floor", "floor-count"):
            store = ["--store", str(self.tmp / f"store-{name}")] if name != "forwarder" else []
            store += ["--count-tokens", str(FLOOR_COUNT_BUDGET)] if name == "floor-count" else []
            return Proc(name, [sys.executable, "-m", "bench.forwarder", "--port", str(port), "--upstream", mock_url, *store],
                        port, "/v1/models", self.logs / f"{name}.log", cwd=str(REPO), cpus=self.target_cpus)
        env = {
            "CONTEXT_PROXY_UPSTREAM__BASE_URL": mock_url,
            # Only where it is needed: a tree from before the setting existed refuses it (proxy-base).
            **({"CONTEXT_PROXY_UPSTREAM__ANTHROPIC_BASE_URL": mock_url.removesuffix("/v1")} if self.args.wire == "messages" else {}),
            **({"CONTEXT_PROXY_UPSTREAM__GEMINI_BASE_URL": mock_url.removesuffix("/v1")} if self.args.wire == "gemini" else {}),
            "CONTEXT_PROXY_STORAGE__PATH": str(self.tmp / f"store-{name}"),
            **PROXY_ENV,
            **(PIPELINE_OFF_ENV if name == "proxy-off" else {}),
            **(MODELS_TABLE_ENV if name == "proxy-models" else {}),
        }
        if runner:
            env["PYTHONPATH"] = str(REPO)  # bench.* from here; `proxy` still from proxy_src (the cwd comes first)
        src = self.base_src if name == "proxy-base" else self.proxy_src
        return Proc(
            name,
            [sys.executable, *(runner or ["-m", "proxy"]), "serve", "--config", str(src / "config.yaml"), "--port", str(port)],
            port, "/healthz", self.logs / f"{name}.log", env=env, cwd=str(src), cpus=self.target_cpus,
        )

    def memprobe(self) -> dict[str, Any]:
        """A separate proxy (shipped config) under tracemalloc, the comparison's load, then a heap snapshot."""
        assert self.lg is not None
        out = self.out_dir / "memprobe-proxy.json"
        out.unlink(missing_ok=True)
        proc = self._make("proxy-memprobe", self.mock_url, runner=["-m", "bench.memprobe", str(out)])
        self.procs.append(proc)
        proc.start()
        try:
            proc.wait_ready(60)
            t = Target("proxy-memprobe", f"http://127.0.0.1:{proc.port}/v1", proc)
            s, lg = self.s, self.lg
            seq, mem = f"mp-{self.run_id}-seq", f"mp-{self.run_id}-mem"
            n_mem = min(300, max(s.memory_conversations))  # tracing is slow: a sample of the load is enough
            lg(op="open", pool=seq, kind="agent200", ids=[f"{seq}-{i}" for i in range(s.seq_conversations)], url=t.url, named=t.named)
            lg(op="open", pool=mem, kind="small", ids=[f"{mem}-{i}" for i in range(n_mem)], url=t.url, named=t.named)
            try:
                lg(op="run", pool=seq, requests=s.seq_conversations + min(100, s.seq_requests))
                lg(op="run", pool=mem, requests=2 * n_mem, concurrency=s.memory_concurrency if n_mem % s.memory_concurrency == 0 else 1)
            finally:
                lg(op="close", pool=seq)
                lg(op="close", pool=mem)
            os.kill(proc.pid, signal.SIGUSR1)
            deadline = time.monotonic() + 120
            while not out.exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            if not out.exists():
                return {"error": f"no snapshot written; see {proc.log}"}
            return {"file": str(out), "conversations": s.seq_conversations + n_mem, **json.loads(out.read_text())}
        except (BenchError, RuntimeError) as exc:
            return {"error": str(exc).splitlines()[0]}
        finally:
            proc.stop()

    def _start_litellm(self, t: Target, mock_url: str) -> None:
        if self.args.no_litellm:
            t.status = "skipped (--no-litellm)"
            return
        if self.args.wire != "chat":
            t.status = "skipped (measured over chat completions only)"
            return
        log("litellm: checking bench/.litellm-venv (first run installs litellm[proxy], a few minutes)")
        exe, how = litellm_target.ensure_installed(self.logs / "litellm-install.log")
        if exe is None:
            t.status = f"not measured: {how}"
            log(f"litellm: {t.status}")
            return
        self.data["litellm_version"] = litellm_target.version()
        config = self.tmp / "litellm.yaml"
        litellm_target.write_config(config, mock_url, self._models(), API_KEY)
        port = free_port()
        t.proc = litellm_target.make_proc(exe, config, port, self.logs / "litellm.log", self.target_cpus)
        t.url = f"http://127.0.0.1:{port}/v1"
        t.proc.start()
        self.procs.append(t.proc)

    def _models(self) -> list[str]:
        return sorted({stream_model(n) for n in (16, 256, self.s.stream_chunks, self.s.stream_long_chunks)})

    def _prime(self, t: Target) -> None:
        """Requests before anything is measured: lazy imports, first connections, caches, CPU clocks."""
        assert self.lg is not None
        pool = f"prime-{t.name}"
        try:
            self.lg(op="open", pool=pool, kind="agent200", ids=[f"prime-{self.run_id}-{t.name}-{i}" for i in range(2)], url=t.url, named=t.named)
            for stream, n in ((False, self.s.prime_requests), (True, 4)):
                r = self.lg(op="run", pool=pool, requests=n, concurrency=2, stream=stream, model=stream_model(16))
                if r["errors"]:
                    raise BenchError(f"{r['errors']} failed requests, e.g. {r['error_samples'][0]}")
        except BenchError as exc:
            t.status = f"failed its first requests: {exc}"
            log(f"{t.name}: {t.status}")
        finally:
            self.lg(op="close", pool=pool)

    # -- measuring ---------------------------------------------------------------------------------

    def measured(self, t: Target, **cmd: Any) -> dict[str, Any]:
        """One load-generator run, with the target's and the mock's CPU around it."""
        assert self.lg is not None and self.mock is not None
        meters = {"target": CpuMeter(t.pid) if t.pid else None, "mock": CpuMeter(self.mock.pid)}
        for m in meters.values():
            if m:
                m.start()
        r = self.lg(op="run", **cmd)
        for key, m in meters.items():
            if m:
                c = m.stop()
                r[f"{key}_cpu_s"], r[f"{key}_cpu_sched_s"] = c.stat_s, c.sched_s
                r[f"{key}_cpu_ms_per_req"] = 1000 * c.stat_s / r["sent"]
                r[f"{key}_cpu_sched_ms_per_req"] = 1000 * c.sched_s / r["sent"]
                r[f"{key}_switches_per_req"] = c.switches / r["sent"]
                r[f"{key}_sys_share"] = c.sys_s / c.stat_s if c.stat_s else None
        return r

    def measured_turns(self, t: Target, **cmd: Any) -> dict[str, Any]:
        """`measured`, with how the proxy made the turns' prompts (its fast-path counters' growth)."""
        before = fast_path_turns(t)
        r = self.measured(t, **cmd)
        r["fast_path"] = counted_since(before, fast_path_turns(t))
        return r

    def block(self, t: Target, rep: int) -> dict[str, Any]:
        """One repeat of every phase against one target."""
        assert self.lg is not None
        s, lg = self.s, self.lg
        tag = f"{self.run_id}-r{rep}-{t.name}"
        out: dict[str, Any] = {"target": t.name, "repeat": rep}
        seq, conc = f"seq-{tag}", f"conc-{tag}"
        lg(op="open", pool=seq, kind="agent200", ids=[f"{tag}-s{i}" for i in range(s.seq_conversations)], url=t.url, named=t.named)
        try:
            out["first"] = self.measured(t, pool=seq, requests=s.seq_conversations, concurrency=1)
            out["seq"] = self.measured_turns(t, pool=seq, requests=s.seq_requests, concurrency=1, warmup=2)
            out["paced"] = self.measured(t, pool=seq, requests=s.paced_requests, concurrency=1, gap_ms=s.paced_gap_ms)
            # Each conversation turns to streaming first, unmeasured: a client keeps to one (Codex and
            # Claude Code stream every turn), and the turn that changes the body's `stream` field is no
            # extension of the last (the whole pipeline): counted, half the 16-event turns were such.
            lg(op="run", pool=seq, requests=s.seq_conversations, concurrency=1, stream=True, model=stream_model(s.stream_chunks))
            out["stream"] = self.measured_turns(
                t, pool=seq, requests=s.stream_requests, concurrency=1, warmup=1, stream=True,
                model=stream_model(s.stream_chunks),
            )
            # Long replies: the mock reads their length from the model's name, which the body carries:
            # the same conversations once more first, unmeasured, so that the measured turns extend
            # their last body as the short ones do (else the slope gains a whole pipeline's cost).
            long_model = stream_model(s.stream_long_chunks)
            lg(op="run", pool=seq, requests=s.stream_long_requests, concurrency=1, stream=True, model=long_model)
            out["stream_long"] = self.measured(
                t, pool=seq, requests=s.stream_long_requests, concurrency=1, stream=True, model=long_model,
            )
        finally:
            lg(op="close", pool=seq)
        lg(op="open", pool=conc, kind="agent200", ids=[f"{tag}-c{i}" for i in range(s.concurrency)], url=t.url, named=t.named)
        try:
            lg(op="run", pool=conc, requests=s.concurrency, concurrency=s.concurrency)  # their first turns
            out["conc"] = self.measured(t, pool=conc, requests=s.conc_requests, concurrency=s.concurrency, warmup=1)
        finally:
            lg(op="close", pool=conc)
        if t.pid:
            out["memory_mb"] = memory_mb(t.pid)
        out["errors"] = sum(out[p]["errors"] for p in ("first", "seq", "paced", "stream", "stream_long", "conc"))
        return out

    def json_round_trip(self) -> dict[str, Any]:
        """json.loads + json.dumps of the 200-message body, best of 10, on the client core."""
        assert self.lg is not None
        pool = f"json-{self.run_id}"
        self.lg(op="open", pool=pool, kind="agent200", ids=[pool], url="http://127.0.0.1:1/v1")  # never sent
        try:
            return self.lg(op="json_rt", pool=pool, repeat=10)
        finally:
            self.lg(op="close", pool=pool)

    def in_turn(self, rep: int) -> list[Target]:
        """The targets in the order repeat `rep` measures them (see `measuring_order`)."""
        return measuring_order(list(self.targets.values()), rep)

    def comparison(self) -> None:
        for rep in range(self.s.repeats):
            for t in self.in_turn(rep):
                if t.status != "ok":
                    continue
                log(f"repeat {rep + 1}/{self.s.repeats}: {t.name}")
                try:
                    b = self.block(t, rep)
                except BenchError as exc:
                    b = {"target": t.name, "repeat": rep, "failed": str(exc), "errors": 1}
                    log(f"{t.name}: {exc}")
                self.data["blocks"].append(b)
                if b.get("errors"):
                    log(f"{t.name}: {b['errors']} failed requests")

    def scaling(self, t: Target) -> dict[str, Any]:
        """Turns 10, 100, 1,000 of one conversation: latency and CPU of single turns around each."""
        assert self.lg is not None and self.mock is not None
        s, lg = self.s, self.lg
        pool = f"scale-{self.run_id}-{t.name}"
        lg(op="open", pool=pool, kind="empty", ids=[pool], url=t.url, named=t.named)
        done = 0  # turns answered so far
        points: list[dict[str, Any]] = []
        try:
            for turn in s.scaling_turns:
                lo, hi = max(1, turn - s.scaling_window), turn + s.scaling_window
                if lo - 1 > done:
                    r = lg(op="run", pool=pool, requests=lo - 1 - done)
                    if r["errors"]:
                        raise BenchError(f"{r['errors']} failed requests, e.g. {r['error_samples'][0]}")
                    done = lo - 1
                samples: list[dict[str, Any]] = []
                before = fast_path_turns(t)
                for _ in range(lo, hi + 1):
                    r = self.measured(t, pool=pool, requests=1)
                    if r["errors"]:
                        raise BenchError(f"turn {done + 1}: {r['error_samples'][0]}")
                    done += 1
                    samples.append({
                        "ms": r["all"]["p50"],
                        "cpu_ms": 1000 * r["target_cpu_sched_s"] if t.pid else None,
                        "mock_cpu_ms": 1000 * r["mock_cpu_sched_s"],
                        "body_bytes": r["mean_body_bytes"],
                        "messages": r["messages"],
                    })
                rt = lg(op="json_rt", pool=pool, repeat=3)
                fast = {k: v for k, v in counted_since(before, fast_path_turns(t)).items() if ":" not in k}
                points.append({"turn": turn, "samples": samples, "json_rt_ms": rt["ms"], "fast_path": fast})
        finally:
            lg(op="close", pool=pool)
        return {"points": points}

    def memory(self, t: Target) -> dict[str, Any]:
        """RSS while conversations pile up (two turns each, small transcripts)."""
        assert self.lg is not None and t.pid is not None
        s, lg = self.s, self.lg
        curve: list[dict[str, Any]] = [{"conversations": 0, **memory_mb(t.pid)}]
        made = 0
        start = time.monotonic()
        meter = CpuMeter(t.pid)
        while made < max(s.memory_conversations):
            n = min(s.memory_batch, max(s.memory_conversations) - made)
            pool = f"mem-{self.run_id}-{t.name}-{made}"
            ids = [f"{pool}-{i}" for i in range(n)]
            lg(op="open", pool=pool, kind="small", ids=ids, url=t.url, named=t.named)
            try:
                # requests = 2 per conversation, shared evenly: every conversation gets exactly two turns.
                conc = s.memory_concurrency if n % s.memory_concurrency == 0 else 1
                meter.start()
                r = lg(op="run", pool=pool, requests=2 * n, concurrency=conc)
                cpu = meter.stop()
            finally:
                lg(op="close", pool=pool)
            if r["errors"]:
                raise BenchError(f"{r['errors']} failed requests, e.g. {r['error_samples'][0]}")
            made += n
            # CPU per request of this batch: does starting a conversation get dearer as they pile up?
            curve.append({
                "conversations": made, **memory_mb(t.pid),
                "cpu_ms_per_req": 1000 * cpu.stat_s / r["sent"], "first_p50_ms": r["first"]["p50"], "later_p50_ms": r["later"]["p50"],
            })
        return {"curve": curve, "seconds": time.monotonic() - start}

    def profile(self, t: Target) -> dict[str, Any]:
        """py-spy over the proxy in three scenarios: later turns of the 200-message transcript,
        first turns (the whole transcript stored), and turns around 1,000 of one conversation."""
        assert self.lg is not None and t.pid is not None
        lg, s = self.lg, self.s
        late = max(s.scaling_turns)
        scenarios = [
            # (name, file tag, transcript, conversations, unprofiled turns first, profiled turns)
            ("later turns, 200-message transcript", "later", "agent200", s.seq_conversations, s.seq_conversations, s.profile_requests),
            (
                "first turns, 200-message transcript" + ("" if self.args.skip_memory else ", store already holding the memory run's conversations"),
                "first", "agent200", s.profile_requests // 4, 0, s.profile_requests // 4,
            ),
            (f"turns {late}+ of one conversation", f"turn{late}", "empty", 1, late - 1, max(3, s.profile_requests // 12)),
            # Long streams over the 200-message transcript (with the shipped config, truncated outputs
            # in the prompt: the read_tool_output recognition path).
            ("streamed later turns, 256 events each", "stream", "agent200", 4, 4, max(4, s.profile_requests // 20)),
        ]
        out: dict[str, Any] = {}
        for scenario, tag, kind, n_conv, before, turns in scenarios:
            stream = tag == "stream"
            pool = f"prof-{self.run_id}-{t.name}-{tag}"
            lg(op="open", pool=pool, kind=kind, ids=[f"{pool}-{i}" for i in range(n_conv)], url=t.url, named=t.named)
            try:
                if before:
                    lg(op="run", pool=pool, requests=before)  # unprofiled
                folded = self.out_dir / f"profile-{t.name}-{tag}.txt"
                rec = profiling.record(t.pid, folded, self.client_cpus)
                if rec is None:
                    return {"error": "py-spy not found: pip install py-spy into the project venv"}
                time.sleep(0.5)  # let it attach
                r = lg(op="run", pool=pool, requests=turns, concurrency=1, stream=stream,
                       model=stream_model(256 if stream else 16))
                rec.stop()
            finally:
                lg(op="close", pool=pool)
            if not folded.exists():
                out[scenario] = {"error": f"py-spy wrote nothing; see {rec.log}"}
                continue
            out[scenario] = {"file": str(folded), "requests": r["completed"], **profiling.top(folded)}
        return out

    def run(self) -> int:
        started = time.monotonic()
        # Whatever else runs on the machine meanwhile disturbs latency: measure it, to say so.
        load0 = (machine_busy_seconds(), cpu_seconds(os.getpid()), os.getloadavg()[0])
        try:
            self.start()
            self.data["json_rt_200"] = self.json_round_trip()
            self.comparison()
            measurable = [t for t in self.targets.values() if t.status == "ok" and t.name != "litellm"]
            if not self.args.skip_scaling:
                for t in measurable:
                    log(f"scaling: {t.name}, turns {self.s.scaling_turns}")
                    try:
                        self.data["scaling"][t.name] = self.scaling(t)
                    except BenchError as exc:
                        self.data["scaling"][t.name] = {"error": str(exc)}
            if not self.args.skip_memory:
                for t in measurable:
                    if t.name.startswith("proxy"):
                        log(f"memory: {t.name}, {max(self.s.memory_conversations)} conversations")
                        try:
                            self.data["memory"][t.name] = self.memory(t)
                        except BenchError as exc:
                            self.data["memory"][t.name] = {"error": str(exc)}
            for t in self.targets.values():
                if t.pid and t.status == "ok":
                    self.data.setdefault("final_memory_mb", {})[t.name] = memory_mb(t.pid)
            if self.args.profile:
                for name in ("proxy", "proxy-named"):  # derived ids and named: where they differ
                    t = self.targets.get(name)
                    if t and t.status == "ok":
                        log(f"profile: {name}")
                        self.data["profile"][name] = self.profile(t)
                log("memory probe: proxy under tracemalloc")
                self.data["memprobe"] = self.memprobe()
        finally:
            if self.lg:
                self.lg.close()
            for p in reversed(self.procs):
                p.stop()
            shutil.rmtree(self.tmp, ignore_errors=True)
        self.data["seconds"] = time.monotonic() - started
        # Ours = this process and every descendant it waited for (children's times are folded into
        # ours once reaped) -- all bench processes are reaped by now.
        ours = cpu_seconds(os.getpid()) + sum(os.times()[2:4]) - load0[1]
        self.data["other_load"] = {
            "other_cores": max(0.0, (machine_busy_seconds() - load0[0] - ours) / self.data["seconds"]),
            "loadavg_start": round(load0[2], 2),
            "loadavg_end": round(os.getloadavg()[0], 2),
        }
        self.data["targets"] = {n: t.status for n, t in self.targets.items()}
        return self.finish()

    def finish(self) -> int:
        data = self.data
        data["command"] = f"cd {shlex.quote(os.getcwd())} && " + shlex.join([sys.executable, "-m", "bench.run", *sys.argv[1:]])
        data["machine"] = machine()
        data["settings"] = vars(self.s)
        data["smoke"] = self.args.smoke
        data["wire"] = self.args.wire
        data["pinning"] = {"client_cores": sorted(self.client_cpus or []), "target_cores": sorted(self.target_cpus or [])}
        data["proxy_src"] = str(self.proxy_src)
        data["proxy_version"] = source_version(self.proxy_src)
        data["base_src"], data["base_version"] = str(self.base_src), source_version(self.base_src)
        data["pipeline_off_env"] = PIPELINE_OFF_ENV
        summary = report.summarize(data)
        data["summary"] = summary
        text = report.render(data, summary)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        wire = "" if self.args.wire == "chat" else f"-{self.args.wire}"
        for name in (f"bench{wire}-{stamp}", f"latest{wire}"):
            (self.out_dir / f"{name}.json").write_text(json.dumps(data, indent=1, default=str))
            (self.out_dir / f"{name}.md").write_text(text)
        print(text)
        print(f"\nresults: {self.out_dir / f'bench{wire}-{stamp}.json'} and .md (also latest{wire}.json, .md)")
        failed = [n for n, t in self.targets.items() if n != "litellm" and (t.status != "ok" or summary["rows"].get(n, {}).get("errors"))]
        if failed:
            print(f"FAILED requests or start-up: {', '.join(failed)}", file=sys.stderr)
            return 1
        return 0


def source_version(src: Path) -> str:
    """The commit of the proxy under test (with -dirty for uncommitted changes), if it is a git tree."""
    try:
        out = subprocess.run(
            ["git", "-C", str(src), "describe", "--tags", "--always", "--dirty"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown (not a git tree)"


def machine() -> dict[str, Any]:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import aiohttp

    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "kernel": platform.release(),
        "aiohttp": aiohttp.__version__,
    }


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, Settings]:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny run that proves the bench works (no LiteLLM)")
    p.add_argument("--targets", help=f"comma-separated subset of {','.join(TARGETS)} (default: all; proxy-base with --base-src)")
    p.add_argument("--no-litellm", action="store_true", help="do not install or run LiteLLM (its row says skipped)")
    p.add_argument("--repeats", type=int)
    p.add_argument("--seq-requests", type=int)
    p.add_argument("--conc-requests", type=int)
    p.add_argument("--concurrency", type=int)
    p.add_argument("--stream-requests", type=int)
    p.add_argument("--stream-chunks", type=int)
    p.add_argument("--stream-gap-ms", type=float)
    p.add_argument("--stream-long-requests", type=int)
    p.add_argument("--stream-long-chunks", type=int)
    p.add_argument("--scaling-turns", help="comma-separated checkpoints, default 10,100,1000")
    p.add_argument("--memory-conversations", help="comma-separated checkpoints, default 1000,10000")
    p.add_argument("--skip-scaling", action="store_true")
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--profile", action="store_true", help="also sample the proxy with py-spy and list hot spots")
    p.add_argument("--proxy-src", default=str(REPO), help="source tree whose `proxy` package and config.yaml are run")
    p.add_argument("--base-src", help="source tree the proxy-base target runs (default: --proxy-src)")
    p.add_argument("--out", default=str(RESULTS), help="where results go (default bench/results)")
    p.add_argument("--wire", choices=sorted(WIRES), default="chat",
                   help="the wire format every phase speaks (bench/wires.py): the same figures for Responses, Messages and Gemini")
    args = p.parse_args(argv)
    s = Settings(**vars(SMOKE)) if args.smoke else Settings()
    if args.smoke:
        args.no_litellm = True
    for name in ("repeats", "seq_requests", "conc_requests", "concurrency", "stream_requests", "stream_chunks", "stream_gap_ms",
                 "stream_long_requests", "stream_long_chunks"):
        if getattr(args, name) is not None:
            setattr(s, name, getattr(args, name))
    if args.scaling_turns:
        s.scaling_turns = sorted(int(x) for x in args.scaling_turns.split(","))
    if args.memory_conversations:
        s.memory_conversations = sorted(int(x) for x in args.memory_conversations.split(","))
    if args.targets is None:
        args.targets = ",".join(t for t in TARGETS if t != "proxy-base" or args.base_src)
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    unknown = set(args.targets) - set(TARGETS)
    if unknown:
        p.error(f"unknown targets: {', '.join(sorted(unknown))}")
    if "direct" not in args.targets:
        args.targets.insert(0, "direct")  # every "added" figure is over direct
    return args, s


def main(argv: list[str] | None = None) -> int:
    args, settings = parse_args(argv)
    return Bench(args, settings).run()


if __name__ == "__main__":
    sys.exit(main())
