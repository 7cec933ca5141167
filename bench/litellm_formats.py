"""A `models:` entry, chat completions vs the Responses API: `python -m bench.litellm_formats`.

What a litellm-routed Responses turn costs the proxy next to the same turn as a chat completion:
both go through litellm (`custom_openai/` at the bench's mock upstream, so litellm runs its real
OpenAI-compatible client code), the Responses one translated to a chat completion and back
(proxy/upstream/litellm_responses.py). One proxy process, one request at a time, the same
transcript in both formats (a system prompt, a task and N tool-call rounds with their outputs),
each request a later turn of its own conversation. Reported: the proxy's CPU per request
(schedstat, see bench/procs.py) and the wall time per request, JSON and streamed; the cases are
interleaved and repeated, so a busy machine's drift hits them alike.
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

from .procs import CpuMeter, Proc, free_port

REPO = Path(__file__).resolve().parent.parent
KEY = "sk-bench-client-0123456789"
OUTPUT = "x" * 900  # a tool output well under the truncation threshold: no read-back rounds


def chat_transcript(rounds: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "fix it"},
    ]
    for i in range(rounds):
        arguments = json.dumps({"command": f"cat file_{i}.py"})
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": f"call_{i}", "type": "function", "function": {"name": "run_shell", "arguments": arguments}}
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": f"{i}: {OUTPUT}"})
    return messages


def responses_input(rounds: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": "You are a coding agent."},
        {"type": "message", "role": "user", "content": "fix it"},
    ]
    for i in range(rounds):
        arguments = json.dumps({"command": f"cat file_{i}.py"})
        items.append({"type": "function_call", "call_id": f"call_{i}", "name": "run_shell", "arguments": arguments})
        items.append({"type": "function_call_output", "call_id": f"call_{i}", "output": f"{i}: {OUTPUT}"})
    return items


SCHEMA = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}
CHAT_TOOLS = [{"type": "function", "function": {"name": "run_shell", "parameters": SCHEMA}}]
RESPONSES_TOOLS = [{"type": "function", "name": "run_shell", "parameters": SCHEMA, "strict": False}]


def request(fmt: str, rounds: int, stream: bool) -> tuple[str, dict[str, Any]]:
    if fmt == "chat":
        return "/v1/chat/completions", {
            "model": "house",
            "messages": chat_transcript(rounds),
            "tools": CHAT_TOOLS,
            "stream": stream,
        }
    return "/v1/responses", {
        "model": "house",
        "input": responses_input(rounds),
        "tools": RESPONSES_TOOLS,
        "stream": stream,
        "store": False,
    }


def warm(client: httpx.Client, fmt: str, stream: bool, rounds: int, conversations: int) -> None:
    """Each conversation's first turn stores the transcript: done before anything is measured."""
    path, body = request(fmt, rounds, stream)
    for i in range(conversations):
        client.post(
            path, json=body, headers={"Authorization": f"Bearer {KEY}", "X-Conversation-ID": f"{fmt}-{stream}-{i}"}
        ).raise_for_status()


def measure(client: httpx.Client, proxy: Proc, fmt: str, stream: bool, rounds: int, n: int) -> tuple[float, float]:
    """(proxy CPU seconds per request, median wall seconds) over n later turns."""
    path, body = request(fmt, rounds, stream)
    walls = []
    meter = CpuMeter(proxy.pid)
    meter.start()
    for i in range(n):
        started = time.perf_counter()
        response = client.post(
            path, json=body, headers={"Authorization": f"Bearer {KEY}", "X-Conversation-ID": f"{fmt}-{stream}-{i}"}
        )
        response.raise_for_status()
        walls.append(time.perf_counter() - started)
    return meter.stop().sched_s / n, statistics.median(walls)


def translation_cost(rounds: int, n: int = 200) -> dict[str, float]:
    """CPU of the translation alone, in this process (deterministic, unlike the end to end
    figures on a busy machine): the request, a JSON reply, and a 32-chunk stream."""
    from proxy.config import ModelSettings
    from proxy.upstream.litellm import LiteLLMUpstream
    from proxy.upstream.litellm_responses import EventWriter, Translation, response_from_completion

    from .mock_upstream import REPLY, stream_parts

    route = LiteLLMUpstream("house", ModelSettings(litellm_model="custom_openai/bench-model"), timeout_s=30)
    _, body = request("responses", rounds, True)
    completion = json.loads(REPLY % (b"call_1", 10, 52))
    content, (call_a, call_b), closing = stream_parts(32)
    chunks = [json.loads(c[6:]) for c in [*content, call_a + b"call_1" + call_b, *closing] if c != b"data: [DONE]\n\n"]
    out = {}
    started = time.process_time()
    for _ in range(n):
        translation = Translation.of(body, route)
        translation.chat_body(body)
    out["request_ms"] = 1000 * (time.process_time() - started) / n
    started = time.process_time()
    for _ in range(n):
        response_from_completion(completion, translation)
    out["json_reply_ms"] = 1000 * (time.process_time() - started) / n
    started = time.process_time()
    for _ in range(n):
        writer = EventWriter(translation)
        writer.start()
        for chunk in chunks:
            writer.feed(chunk)
        writer.finish()
    out["stream_chunk_us"] = 1e6 * (time.process_time() - started) / n / len(chunks)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=100, help="tool-call rounds in the transcript (2 items each)")
    parser.add_argument("-n", type=int, default=10, help="requests per case and run")
    parser.add_argument("--repeats", type=int, default=7, help="runs of every case, interleaved")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-litellm-formats-"))
    mock_port, proxy_port = free_port(), free_port()
    mock = Proc(
        "mock",
        [sys.executable, "-m", "bench.mock_upstream", "--port", str(mock_port)],
        mock_port,
        "/healthz",
        work / "mock.log",
        cwd=str(REPO),
    ).start()
    models = {
        "house": {
            "litellm_model": "custom_openai/bench-model",
            "api_base": f"http://127.0.0.1:{mock_port}/v1",
            "api_key_env": "BENCH_PROVIDER_KEY",
        }
    }
    env = {
        "CONTEXT_PROXY_MODELS": json.dumps(models),
        "BENCH_PROVIDER_KEY": "sk-bench-provider",
        "CONTEXT_PROXY_STORAGE__PATH": str(work / "data"),
        "CONTEXT_PROXY_LOGGING__LEVEL": "WARNING",
    }
    proxy = Proc(
        "proxy",
        [sys.executable, "-m", "proxy", "serve", "--config", str(REPO / "config.yaml"), "--port", str(proxy_port)],
        proxy_port,
        "/healthz",
        work / "proxy.log",
        env=env,
        cwd=str(REPO),
    )
    try:
        mock.wait_ready(30)
        proxy.start().wait_ready(60)
        cases = [(fmt, stream) for stream in (False, True) for fmt in ("chat", "responses")]
        cpu: dict[tuple[str, bool], list[float]] = {case: [] for case in cases}
        wall: dict[tuple[str, bool], list[float]] = {case: [] for case in cases}
        with httpx.Client(base_url=f"http://127.0.0.1:{proxy_port}", timeout=120) as client:
            for fmt, stream in cases:
                warm(client, fmt, stream, args.rounds, args.n)
            for _ in range(args.repeats):  # cases interleaved: a busy machine's drift hits all alike
                for case in cases:
                    per_request, median_wall = measure(client, proxy, *case, args.rounds, args.n)
                    cpu[case].append(per_request)
                    wall[case].append(median_wall)
        print(
            f"litellm route, {2 * args.rounds + 2}-item transcript: proxy CPU per request, median of {args.repeats} "
            f"runs of {args.n} requests (min in brackets)"
        )
        for fmt, stream in cases:
            runs = cpu[(fmt, stream)]
            print(
                f"  {fmt:9s} {'stream' if stream else 'json  '}  cpu {1000 * statistics.median(runs):6.2f} ms"
                f" [{1000 * min(runs):6.2f}]  wall p50 {1000 * statistics.median(wall[(fmt, stream)]):7.2f} ms"
            )
        cost = translation_cost(args.rounds)
        print(
            f"  translation alone: request {cost['request_ms']:.3f} ms, JSON reply {cost['json_reply_ms']:.3f} ms, "
            f"stream {cost['stream_chunk_us']:.1f} us per chunk"
        )
    finally:
        proxy.stop()
        mock.stop()


if __name__ == "__main__":
    main()
