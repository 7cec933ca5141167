"""`make eval`: a short real-model agent session through the proxy, once per compaction strategy.

For each strategy: llama-server on loopback with the model, the recording relay in front of it,
the proxy (`python -m proxy serve`) pointed at the relay, then the scripted session with the
official `openai` client. Prints the figures and writes them to `eval/results/`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import shutil
import time
from pathlib import Path
from typing import Any

import aiohttp
import openai
import yaml

from bench.procs import Proc, free_port

from . import install
from .relay import Relay
from .report import figures, print_report
from .session import TURNS, Agent
from .tools import Tools
from .workspace import make_workspace

RESULTS = Path(__file__).resolve().parent / "results"
WORKSPACE = RESULTS / "workspace"
API_KEY = "eval-key"  # llama-server checks none; the proxy needs one to name the tenant
SEED = 42

# Compaction settings per strategy, small enough that a 20-turn session compacts several times.
STRATEGIES: dict[str, dict[str, Any]] = {
    "turns": {"strategy": "turns", "turns": {"every_n_user_messages": 3}},
    "budget": {"strategy": "budget", "budget": {"max_history_summary_length": 8000}},
}


def llama_server(model: Path, port: int, ctx_size: int, log: Path) -> Proc:
    argv = [
        str(install.SERVER), "--model", str(model), "--host", "127.0.0.1", "--port", str(port),
        "--ctx-size", str(ctx_size),
        "--parallel", "1",  # one slot: the whole context is one request's, as the proxy's window assumes
        "--jinja",  # the model's own chat template, with OpenAI tool calls parsed out of its output
        # One generation thread: on a shared 2-core machine two threads wait on each other at every
        # step whenever one is descheduled (measured: 0.55 tokens/s with two, 6.6 with one). The
        # prompt is processed in batches, on all cores.
        "--threads", "1", "--threads-batch", str(os.cpu_count() or 1),
        "--seed", str(SEED), "--temp", "0",  # also for the summarizer's requests, which set neither
        # A cap for requests that set no max_tokens (as hosted APIs cap output): the summarizer's
        # carry none today, and a looping 0.5B summary at ~3 tokens/s otherwise holds the one slot
        # until the context is full. The report counts summaries the cap cut.
        "--n-predict", "1024",
        "--fit", "off", "--no-webui",
    ]
    return Proc("llama-server", argv, port, "/health", log)


def proxy_config(path: Path, port: int, upstream: str, data: Path, model: str, ctx_size: int, history_limit: int,
                 strategy: str) -> Path:
    config = {
        "server": {"host": "127.0.0.1", "port": port},
        "upstream": {"base_url": upstream, "timeout_s": 900},
        "storage": {"backend": "diskcache", "path": str(data)},
        "context": {"history_token_limit": history_limit},
        "truncation": {"enabled": True, "max_tool_response_length": 10000},
        "compaction": STRATEGIES[strategy],
        # The request's own model at the same upstream; a single-slot CPU server queues summaries
        # behind the agent's requests, so they get more time than the default 120 s.
        "summarizer": {"model": None, "timeout_s": 600},
        "models": {model: {"context_window": ctx_size}},
        "logging": {"level": "INFO"},
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


async def run_strategy(strategy: str, args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    model_file = install.model_path(args.model)
    server = llama_server(model_file, free_port(), args.ctx_size, run_dir / "llama-server.log").start()
    relay: Relay | None = None
    proxy: Proc | None = None
    try:
        load_started = time.monotonic()
        await asyncio.to_thread(server.wait_ready, 600)
        load_seconds = round(time.monotonic() - load_started, 1)
        relay = await Relay(f"http://127.0.0.1:{server.port}").start()
        proxy_port = free_port()
        config = proxy_config(run_dir / "proxy.yaml", proxy_port, relay.base_url, run_dir / "data", args.model,
                              args.ctx_size, args.history_token_limit, strategy)
        proxy = Proc("proxy", [sys.executable, "-m", "proxy", "serve", "--config", str(config)],
                     proxy_port, "/healthz", run_dir / "proxy.log", cwd=str(Path(__file__).resolve().parent.parent))
        proxy.start()
        await asyncio.to_thread(proxy.wait_ready, 60)
        proxy_url = f"http://127.0.0.1:{proxy_port}"
        # The same path on every run: it shows in tool outputs (tracebacks), so in the prompts.
        shutil.rmtree(WORKSPACE, ignore_errors=True)
        client = openai.AsyncOpenAI(base_url=proxy_url + "/v1", api_key=API_KEY, max_retries=0, timeout=900)
        agent = Agent(client, args.model, Tools(make_workspace(WORKSPACE)), relay, seed=SEED)
        chosen = tuple(TURNS[n - 1] for n in args.only) if args.only else TURNS[: args.turns]
        result = await agent.run(chosen, args.minutes)
        await client.close()
        # Background summaries may still be running: let them finish before reading the figures.
        await _settle(relay, timeout_s=120 if args.minutes is not None else 600)
        proxy_side = await _proxy_figures(proxy_url, result.conversation_id)
        return {
            "strategy": strategy, "model_load_seconds": load_seconds, "load_average": os.getloadavg(), "server_props": await _props(server.port),
            "session": result.as_dict(), "upstream_calls": [c.as_dict() for c in relay.calls], "proxy": proxy_side,
        }
    finally:
        if proxy is not None:
            proxy.stop()
        if relay is not None:
            await relay.stop()
        server.stop()


async def _settle(relay: Relay, quiet_s: float = 5, timeout_s: float = 600) -> None:
    """Wait until no upstream call has started or been under way for `quiet_s` (or `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        now = time.monotonic() - relay.started
        busy = [c for c in relay.calls if not c.done]
        last = max((c.started_s + c.seconds for c in relay.calls), default=0)
        if not busy and now - last >= quiet_s:
            return
        await asyncio.sleep(0.5)


async def _get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url, headers={"Authorization": f"Bearer {API_KEY}"}) as response:
        return await response.json() if response.status == 200 else {"status": response.status}


async def _proxy_figures(proxy_url: str, conversation_id: str | None) -> dict[str, Any]:
    """What the proxy itself says: its metrics, and the summaries stored with the conversation."""
    async with aiohttp.ClientSession() as session:
        async with session.get(proxy_url + "/metrics") as response:
            metrics = _prometheus(await response.text())
        summaries: list[Any] = []
        if conversation_id is not None:
            page = await _get_json(session, f"{proxy_url}/v1/conversations/{conversation_id}/trajectory?limit=1")
            summaries = page.get("summaries", [])
    return {"metrics": metrics, "summaries": summaries}


async def _props(port: int) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}/props") as response:
            props = await response.json()
    settings = props.get("default_generation_settings") or {}
    return {"n_ctx": settings.get("n_ctx"), "total_slots": props.get("total_slots"),
            "model_path": props.get("model_path"), "build_info": props.get("build_info")}


def _prometheus(text: str) -> dict[str, float]:
    """The context_proxy_* samples of a Prometheus text page, by name and labels."""
    out = {}
    for line in text.splitlines():
        match = re.match(r"^(context_proxy_[a-z_]+(?:\{[^}]*\})?) ([0-9.e+-]+)$", line)
        if match and not match.group(1).endswith("_created"):
            out[match.group(1)] = float(match.group(2))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m eval", description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", action="append", choices=sorted(STRATEGIES),
                        help="compaction strategy to run (repeatable; default: all)")
    parser.add_argument("--model", choices=sorted(install.MODELS), default=install.DEFAULT_MODEL)
    parser.add_argument("--ctx-size", type=int, default=8192, help="llama-server's --ctx-size = the proxy's context_window")
    parser.add_argument("--history-token-limit", type=int, default=3000)
    parser.add_argument("--turns", type=int, default=len(TURNS), help=f"user turns to run (at most {len(TURNS)})")
    parser.add_argument("--only", type=lambda text: [int(n) for n in text.split(",")], default=None,
                        help="run these user turns alone, in this order (1-based, e.g. 1,5,6,7,13,17,18: "
                             "an early log read and its late probe, sooner)")
    parser.add_argument("--minutes", type=float, default=None,
                        help="start no new user turn after this many minutes (and give up a request 8 minutes later)")
    args = parser.parse_args(argv)
    build = install.install_server()
    install.install_model(args.model)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    runs = []
    for strategy in args.strategy or list(STRATEGIES):
        run = asyncio.run(run_strategy(strategy, args, RESULTS / f"{stamp}-{strategy}"))
        run["figures"] = figures(run, args.ctx_size)
        runs.append(run)
        print_report(run)
    out = RESULTS / f"{stamp}.json"
    settings = {"model": args.model, "ctx_size": args.ctx_size, "history_token_limit": args.history_token_limit,
                "turns": args.turns, "only": args.only, "minutes": args.minutes, "seed": SEED, "strategies": {s: STRATEGIES[s] for s in args.strategy or STRATEGIES}}
    out.write_text(json.dumps({"settings": settings, "build": build, "runs": runs}, indent=2))
    print(f"\nfigures: {out}")


if __name__ == "__main__":
    main()
