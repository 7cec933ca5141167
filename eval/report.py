"""The eval's figures, computed from one strategy's run record, and the tables printed from them.

Ground truth is the relay's record of what llama-server received and answered; the proxy's own
figures (its `X-Context-Tokens-Sent` header, its metrics) are shown beside it, not trusted.
The issue's targets: no request refused for length, no summarizer call retried on consecutive
turns, no request failed by or because of the proxy.
"""

from __future__ import annotations

import statistics
from typing import Any


def _spread(values: list[int]) -> dict[str, int | None]:
    if not values:
        return {"min": None, "median": None, "max": None}
    return {"min": min(values), "median": int(statistics.median(values)), "max": max(values)}


def summarizer_retries(calls: list[dict[str, Any]]) -> int:
    """Summarizer calls that follow a failed one, with no success between, on the same or the next turn."""
    retried = 0
    previous: dict[str, Any] | None = None
    for call in calls:
        if previous is not None and not previous["ok"] and call["turn"] - previous["turn"] <= 1:
            retried += 1
        previous = call
    return retried


def figures(run: dict[str, Any], ctx_size: int) -> dict[str, Any]:
    session, calls = run["session"], run["upstream_calls"]
    requests = session["requests"]
    agent = [c for c in calls if c["kind"] == "agent"]
    summarizer = [c for c in calls if c["kind"] == "summarizer"]
    failed = [r for r in requests if r["failed_by"] is not None]
    # "because of the proxy": the upstream refused what the proxy made of the prompt.
    because_of_proxy = [r for r in failed if r["failed_by"] == "upstream"
                        and any(calls[i]["refused_for_length"] for i in r["upstream_calls"])]
    metrics = run["proxy"]["metrics"]
    return {
        "turns": len({r["turn"] for r in requests}),
        "requests": len(requests),
        "upstream_calls": {"agent": len(agent), "summarizer": len(summarizer)},
        "tokens_sent_header": _spread([r["tokens_sent"] for r in requests if r["tokens_sent"] is not None]),
        "server_prompt_tokens": _spread([c["prompt_tokens"] for c in agent if c["prompt_tokens"] is not None]),
        "summarizer_prompt_tokens": _spread([c["prompt_tokens"] for c in summarizer if c["prompt_tokens"] is not None]),
        "ctx_size": ctx_size,
        "refused_for_length": {"agent": sum(c["refused_for_length"] for c in agent),
                               "summarizer": sum(c["refused_for_length"] for c in summarizer)},
        "summarizer": {
            "calls": len(summarizer), "ok": sum(c["ok"] for c in summarizer),
            "failed": sum(not c["ok"] for c in summarizer),
            "retried_on_consecutive_turns": summarizer_retries(summarizer),
            "summaries_stored": len(run["proxy"]["summaries"]),
            "cut_at_server_cap": sum(c["finish_reason"] == "length" for c in summarizer),
            "most_completion_tokens": max((c["completion_tokens"] or 0 for c in summarizer), default=0),
            "proxy_compactions": {k.split('"')[1]: v for k, v in metrics.items() if k.startswith("context_proxy_compactions_total")},
        },
        "read_back": {
            "rounds": sum(c["read_round"] for c in agent),
            "proxy_metric": metrics.get("context_proxy_read_rounds_total"),
            "offered": sum(c["offered_read_tool"] for c in agent),
            "offered_without_shortened_output": sum(c["offered_read_tool"] and not c["shortened_outputs"] for c in agent),
            "most_rounds_in_one_request": max((sum(calls[i]["read_round"] for i in r["upstream_calls"]) for r in requests),
                                              default=0),
        },
        # History search: offered once something left the prompt; did the model call it, and what
        # did the turns it called it in answer (a late probe of an evicted tool output, mostly).
        "history_search": {
            "offered": sum(c["offered_search_tool"] for c in agent),
            "calls": [f"turn {c['turn']}: {t}" for c in agent for t in c["tool_calls"] if t.startswith("search_history(")],
            "rounds": sum(c["search_round"] for c in agent),
            "probes": [{"turn": p["turn"], "found": p["found"], "answer": p["answer"][:200],
                        "searched": any(c["turn"] == p["turn"] and any(t.startswith("search_history(") for t in c["tool_calls"])
                                        for c in agent),
                        "offered": any(c["turn"] == p["turn"] and c["offered_search_tool"] for c in agent)}
                       for p in session["probes"]],
        },
        "failed_requests": {
            "total": len(failed),
            "by": {who: sum(r["failed_by"] == who for r in failed) for who in ("proxy", "upstream", "client")},
            "because_of_proxy": len(because_of_proxy),
            "errors": [f"turn {r['turn']}.{r['step']}: {r['failed_by']}: {r['error']}" for r in failed],
        },
        "upstream_errors": [f"call {c['index']} ({c['kind']}, turn {c['turn']}): {c['status']} {c['error']}"
                            for c in calls if not c["ok"]],
        "probes": {"found": sum(p["found"] for p in session["probes"]), "asked": len(session["probes"])},
        "seconds": {"session": session["seconds"], "model_load": run["model_load_seconds"],
                    "request_median": round(statistics.median([r["seconds"] for r in requests]), 1) if requests else None},
        "targets": {
            "no_request_refused_for_length": not any(c["refused_for_length"] for c in calls),
            "no_summarizer_call_retried_on_consecutive_turns": summarizer_retries(summarizer) == 0,
            "no_request_failed_by_or_because_of_the_proxy": not [r for r in failed if r["failed_by"] == "proxy"]
            and not because_of_proxy,
        },
    }


def _table(header: list[str], rows: list[list[Any]]) -> str:
    cells = [header, *[["" if v is None else str(v) for v in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _spread_text(spread: dict[str, int | None]) -> str:
    return "-" if spread["max"] is None else f"{spread['min']} / {spread['median']} / {spread['max']}"


def print_report(run: dict[str, Any]) -> None:
    f, calls = run["figures"], run["upstream_calls"]
    print(f"\n== compaction: {run['strategy']} ==")
    rows = []
    for r in run["session"]["requests"]:
        own = [calls[i] for i in r["upstream_calls"]]
        rows.append([
            f"{r['turn']}.{r['step']}", "sse" if r["stream"] else "json", r["status"], r["tokens_sent"],
            "/".join(str(c["prompt_tokens"]) for c in own) or None, sum(c["read_round"] for c in own),
            r["left_out"], "; ".join(r["tool_calls"])[:60] or None, r["seconds"], r["failed_by"],
        ])
    print(_table(["req", "mode", "status", "tokens hdr", "server prompt tokens", "reads", "left out",
                  "tool calls", "s", "failed by"], rows))
    s, rb, fr = f["summarizer"], f["read_back"], f["failed_requests"]
    summary = [
        ["user turns", f["turns"]],
        ["client requests", f["requests"]],
        ["upstream calls (agent / summarizer)", f"{f['upstream_calls']['agent']} / {f['upstream_calls']['summarizer']}"],
        ["X-Context-Tokens-Sent min / median / max", _spread_text(f["tokens_sent_header"])],
        ["server prompt_tokens, agent, min / median / max", _spread_text(f["server_prompt_tokens"])],
        ["server prompt_tokens, summarizer, min / median / max", _spread_text(f["summarizer_prompt_tokens"])],
        ["server context (--ctx-size)", f["ctx_size"]],
        ["refused for length (agent / summarizer)", f"{f['refused_for_length']['agent']} / {f['refused_for_length']['summarizer']}"],
        ["summarizer calls (ok / failed)", f"{s['calls']} ({s['ok']} / {s['failed']})"],
        ["summarizer calls retried on consecutive turns", s["retried_on_consecutive_turns"]],
        ["summaries stored", s["summaries_stored"]],
        ["summaries cut at the server's 1,024-token cap (longest)", f"{s['cut_at_server_cap']} ({s['most_completion_tokens']})"],
        ["agent replies rewritten from untagged calls", sum(c["rewrote_untagged_call"] for c in calls)],
        ["read-back rounds (relay / proxy metric)", f"{rb['rounds']} / {rb['proxy_metric']}"],
        ["read_tool_output offered (without a shortened output)", f"{rb['offered']} ({rb['offered_without_shortened_output']})"],
        ["search_history offered / called / rounds answered",
         f"{f['history_search']['offered']} / {len(f['history_search']['calls'])} / {f['history_search']['rounds']}"],
        ["failed requests (proxy / upstream / client)", f"{fr['total']} ({fr['by']['proxy']} / {fr['by']['upstream']} / {fr['by']['client']})"],
        ["failed because of the proxy (upstream refused its prompt)", fr["because_of_proxy"]],
        ["probes answered", f"{f['probes']['found']} of {f['probes']['asked']}"],
        ["time: session / model load / median request (s)",
         f"{f['seconds']['session']} / {f['seconds']['model_load']} / {f['seconds']['request_median']}"],
    ]
    print()
    print(_table(["figure", "value"], summary))
    for call in f["history_search"]["calls"]:
        print("  search_history call:", call[:200])
    for probe in f["history_search"]["probes"]:
        print(f"  probe, turn {probe['turn']}: found={probe['found']} search offered={probe['offered']} "
              f"called={probe['searched']}: {probe['answer'][:160]!r}")
    for line in f["upstream_errors"]:
        print("  upstream error:", line[:300])
    for line in fr["errors"]:
        print("  failed:", line[:300])
    print("targets:", ", ".join(f"{k}={'yes' if v else 'NO'}" for k, v in f["targets"].items()))
