"""What the pipeline does to the prompt: tokens sent upstream per turn, naive vs. each configuration,
and the summarizer's input per compaction, over a generated tool-heavy agent run.

    .venv/bin/python -m bench.context [--turns 300] [--seed 7]

The proxy runs in-process on loopback in front of the strict fake upstream of the test suite
(which also answers the summarizer), so every prompt it sends over the whole run is validated
as the real API would. Token figures are the proxy's own `X-Context-Tokens-Sent` header; "naive"
is the whole transcript counted with the same tokenizer.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
from pathlib import Path
from typing import Any

import httpx

from proxy.tokens import TokenCounter
from tests.fake_upstream import FakeUpstream, Reply
from tests.harness import LoopThread, ProxyServer, proxy_settings

SUMMARIZER_MARK = "You maintain the working memory of an AI agent"
TOOL_MARK = "You condense the output of one tool call"
MODEL = "gpt-4o-mini"
KEY = "sk-bench-context"

CONFIGS: dict[str, dict[str, Any]] = {
    "window only": {"truncation": {"enabled": False}},
    "truncation + window": {},
    "+ compaction turns": {"compaction": {"strategy": "turns", "background": False}},
    "+ compaction budget": {"compaction": {"strategy": "budget", "background": False}},
    "+ compaction mask": {"compaction": {"strategy": "mask"}},
}


def tool_output(rng: random.Random, turn: int) -> str:
    """Realistic agent tool output: mostly small, sometimes a long log or file."""
    size = rng.choice([200, 400, 800, 1500, 3000, 6000, 20000, 45000])
    lines = [f"[{turn}:{i}] src/module_{i % 17}.py:{10 + i} result={rng.randint(0, 10**6)} ok" for i in range(size // 48 + 1)]
    return "\n".join(lines)[:size]


def responder(body: dict[str, Any]) -> Reply:
    first = body["messages"][0]
    if first["role"] == "system" and SUMMARIZER_MARK in first["content"]:
        return Reply.text("Goal: keep the service green.\n" + "Work done: edited modules, ran tests, fixed failures. " * 12)
    if first["role"] == "system" and TOOL_MARK in first["content"]:
        return Reply.text("Tool output summary: tests mostly pass; see failures listed. " * 4)
    return Reply.text("Noted; continuing with the next step of the plan. " * 3)


def run_config(loop: LoopThread, upstream: FakeUpstream, name: str, overrides: dict[str, Any], turns: int, seed: int) -> dict[str, Any]:
    upstream.reset()
    upstream.responder = responder
    with tempfile.TemporaryDirectory() as data:
        proxy = ProxyServer(loop, proxy_settings(upstream.base_url, Path(data), **overrides)).start()
        counter = TokenCounter()
        rng = random.Random(seed)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are a careful coding agent. Work step by step."},
            {"role": "user", "content": "Task: make the test suite of the service pass; the failing ids are in CI run 88213."},
        ]
        sent, naive, kept = [], [], []
        try:
            with httpx.Client(base_url=proxy.url, timeout=60) as http:
                for turn in range(turns):
                    call = f"call_{turn}"
                    messages.append({"role": "assistant", "content": None, "tool_calls": [
                        {"id": call, "type": "function", "function": {"name": "run", "arguments": json.dumps({"step": turn})}}]})
                    messages.append({"role": "tool", "tool_call_id": call, "content": tool_output(rng, turn)})
                    response = http.post(
                        "/v1/chat/completions",
                        json={"model": MODEL, "messages": messages},
                        headers={"Authorization": f"Bearer {KEY}", "X-Conversation-ID": "bench"},
                    )
                    response.raise_for_status()
                    sent.append(int(response.headers["X-Context-Tokens-Sent"]))
                    naive.append(sum(counter.count_many(messages, MODEL)))
                    kept.append(len(messages) - int(response.headers["X-Context-Messages-Left-Out"]))
                    messages.append({"role": "assistant", "content": response.json()["choices"][0]["message"]["content"]})
                    if turn % 3 == 2:
                        messages.append({"role": "user", "content": f"Good. Next: check module {turn % 17}."})
                record = http.get("/v1/conversations/bench/trajectory", params={"limit": 1000}).json()
        finally:
            proxy.stop()
    summaries = record["summaries"]
    return {"name": name, "sent": sent, "naive": naive, "kept": kept, "summarizer_inputs": [s["tokens_in"] for s in summaries]}


def table(results: list[dict[str, Any]], turns: int) -> str:
    marks = [t for t in (10, 50, 100, 200, 300, 1000) if t <= turns]
    naive = results[0]["naive"]
    head = "| configuration | " + " | ".join(f"turn {t}" for t in marks) + " | total | vs naive | messages sent, last turn |"
    rows = [head, "|" + " --- |" * (len(marks) + 4)]
    rows.append(
        "| naive (whole transcript) | " + " | ".join(f"{naive[t - 1]:,}" for t in marks)
        + f" | {sum(naive):,} | 100% | all |"
    )
    for r in results:
        rows.append(
            f"| {r['name']} | " + " | ".join(f"{r['sent'][t - 1]:,}" for t in marks)
            + f" | {sum(r['sent']):,} | {100 * sum(r['sent']) / sum(naive):.1f}% | {r['kept'][-1]} |"
        )
    lines = ["Tokens sent upstream per turn (agent requests):", "", *rows, ""]
    for r in results:
        inputs = r["summarizer_inputs"]
        if inputs:
            lines.append(
                f"- {r['name']}: {len(inputs)} summaries; summarizer input tokens first {inputs[0]:,}, "
                f"median {statistics.median(inputs):,.0f}, last {inputs[-1]:,}, max {max(inputs):,}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    loop = LoopThread()
    upstream = FakeUpstream()
    loop.run(upstream.start())
    try:
        results = [run_config(loop, upstream, name, cfg, args.turns, args.seed) for name, cfg in CONFIGS.items()]
    finally:
        loop.run(upstream.close())
        loop.stop()
    print(table(results, args.turns))


if __name__ == "__main__":
    main()
