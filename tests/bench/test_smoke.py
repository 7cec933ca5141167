"""The bench works end to end, in its tiny mode: it proves the machinery, it measures nothing.

`python -m bench.run --smoke` starts the mock upstream, the load generator, the bare forwarder (also
as the floor, with its minimal durable append) and the context-proxy configurations as real
processes on loopback (their agents naming no conversation, proxy-named's naming theirs), sends a
few requests through each phase (first turns, later turns, streaming, concurrency, scaling,
memory), and prints the side-by-side tables. LiteLLM is not installed in this mode; its row must
say so.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from bench.report import COLUMNS, WIRE_NAMES
from bench.run import SMOKE

REPO = Path(__file__).resolve().parents[2]
TARGETS = ["direct", "forwarder", "floor", "floor-count", "proxy-off", "proxy", "proxy-named", "proxy-models", "litellm"]
NUMBER = re.compile(r"^-?\d+(\.\d+)?$")
# What the direct row has no figure for: it has no process of its own between client and mock.
DIRECT_BLANK = {"CPU ms/req", "stream CPU ms/req", "CPU ms/1st req", "ctx sw/req", "paced CPU ms/req", "CPU µs/chunk", "peak RSS MB",
                f"CPU ms/req @{SMOKE.concurrency}"}


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _main_table(text: str) -> tuple[list[str], dict[str, list[str]]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| target ") and "+p50 ms" in line)
    header = _cells(lines[start])
    assert set(lines[start + 1]) <= set("|-"), "header separator row"
    rows: dict[str, list[str]] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = _cells(line)
        assert len(cells) == len(header), f"ragged row: {line}"
        rows[cells[0]] = cells
    return header, rows


def test_bench_smoke_runs_every_target_and_prints_the_table(tmp_path: Path) -> None:
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--smoke", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=90, check=False,
    )
    assert proc.returncode == 0, f"bench failed\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"

    header, rows = _main_table(proc.stdout)
    concurrency = json.loads((out / "latest.json").read_text())["settings"]["concurrency"]
    expected = [h.replace("@C", f"@{concurrency}") for _, h in COLUMNS]
    assert header == expected
    assert list(rows) == TARGETS

    for target in ("direct", "forwarder", "floor", "floor-count", "proxy-off", "proxy", "proxy-named"):
        for name, value in zip(header[1:], rows[target][1:]):
            if target == "direct" and name in DIRECT_BLANK:
                assert value == "—", (target, name, value)
            else:
                assert NUMBER.match(value), f"{target} / {name}: {value!r} is not a number"
        assert rows[target][header.index("errors")] == "0", f"{target} had failed requests"
    assert "skipped" in rows["litellm"][1]

    # The machine and the exact command are printed; results are written as JSON and markdown.
    assert "- command: `" in proc.stdout and "bench.run --smoke" in proc.stdout
    assert re.search(r"- machine: nproc \d+, .+, CPython 3\.\d+", proc.stdout)
    data = json.loads((out / "latest.json").read_text())
    assert set(data["summary"]["rows"]) == set(TARGETS)
    assert data["summary"]["rows"]["proxy"]["errors"] == 0
    assert (out / "latest.md").read_text().strip() in proc.stdout
    # Scaling and memory ran for the proxies, and the verdicts name both configurations.
    assert {"direct", "forwarder", "proxy-off", "proxy"} <= set(data["summary"]["scaling"])
    assert all("points" in data["summary"]["scaling"][t] for t in ("proxy-off", "proxy"))
    assert all("growth" in data["summary"]["memory"][t] for t in ("proxy-off", "proxy"))
    assert all({"proxy-off", "proxy"} <= set(v) for v in data["summary"]["verdicts"])
    # The floor is judged too, so a run says which targets lie below what the contract's writes cost.
    assert all("floor" in v for v in data["summary"]["verdicts"])
    assert "keeping a turn durably at all spends more than the target allows" in proc.stdout

    # Issue 31's table: every proxy's later turns say how their prompts were made, derived and named
    # alike, from the proxy's own counters (every measured turn counted, under some outcome).
    assert "## Later turns of the growing agents" in proc.stdout
    rows = data["summary"]["rows"]
    settings = data["settings"]
    for target in ("proxy", "proxy-named"):
        counted = {k: n for k, n in rows[target]["seq_fast_path"].items() if ":" not in k}
        assert sum(counted.values()) == settings["seq_requests"] + 2, (target, counted)  # + the 2 warm-up turns
        assert 0 <= rows[target]["seq_fast_share"] <= 1
        assert f"- {target}, later turns: " in proc.stdout
    assert "seq_fast_path" not in rows["forwarder"] and "seq_fast_path" not in rows["floor"]


@pytest.mark.parametrize("wire", ["responses", "messages", "gemini"])
def test_bench_smoke_speaks_every_wire_format(tmp_path: Path, wire: str) -> None:
    """`--wire` runs the same phases in the Responses API's or Anthropic Messages' shape: every
    phase gets its replies (no errors), and the results say which format they measured."""
    out = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.run", "--smoke", "--wire", wire, "--targets", "forwarder,floor,proxy", "--skip-memory",
         "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=90, check=False,
    )
    assert proc.returncode == 0, f"bench failed\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    header, rows = _main_table(proc.stdout)
    assert list(rows) == ["direct", "forwarder", "floor", "proxy"]
    for target in ("forwarder", "floor", "proxy"):
        assert rows[target][header.index("errors")] == "0", f"{target} had failed requests"
        assert NUMBER.match(rows[target][header.index("CPU ms/req")])
    data = json.loads((out / f"latest-{wire}.json").read_text())
    assert data["wire"] == wire
    assert f"- workload ({WIRE_NAMES[wire]})" in proc.stdout
    assert all(p["errors"] == 0 for p in data["blocks"] if isinstance(p, dict) and "errors" in p)


@pytest.mark.parametrize("named", [False, True], ids=["derived", "named"])
def test_memory_breakdown_smoke_and_the_caches_count_what_they_hold(tmp_path: Path, named: bool) -> None:
    """`python -m bench.memory_breakdown --smoke --repeats 2 [--named]`: every checkpoint written,
    each repeat's phases noted, and the caches that bound themselves by bytes believe within a third
    of what their objects really take (the budgets in proxy/prefix.py and proxy/engine/fastpath.py
    are only as good as that); with the proxy deriving the conversations, or the agents naming them."""
    out = tmp_path / "mb.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.memory_breakdown", "--smoke", "--repeats", "2", "--out", str(out),
         *(["--named"] if named else [])],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, f"breakdown failed\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    agents = "agents naming their conversation" if named else "derived ids"
    assert proc.stdout.startswith(f"# memory breakdown ({agents};"), proc.stdout[:200]
    result = json.loads(out.read_text())
    assert list(result["checkpoints"]) == ["idle after start", "after the side-by-side load", "after 40 more conversations"]
    phases = [p["phase"] for p in result["phases"]]
    assert len([p for p in phases if p.startswith("1: ")]) == len([p for p in phases if p.startswith("2: ")]) > 0
    end = result["checkpoints"]["after 40 more conversations"]
    assert end["status_mb"]["VmHWM"] >= end["status_mb"]["VmRSS"] > 0
    assert end["tiktoken_loaded"] == ["cl100k_base"] and end["threads"]["os"] >= 2
    for name in ("BodyCache (request bodies, parsed)", "FastPath memos (items, stage runs, upstream bodies)"):
        cache = end["caches"][name]
        assert cache["entries"] > 0 and cache["real_mb"] > 0, name
        assert 0.75 < cache["believed_mb"] / cache["real_mb"] < 1.33, f"{name}: {cache}"
    assert "| mapping | resident MB |" in proc.stdout and "fast path taken" in proc.stdout


def test_over_twice_as_many_repeats_as_targets_each_takes_each_place_after_each_neighbour() -> None:
    from bench.run import Target, measuring_order

    names = ["direct", "forwarder", "floor", "proxy", "proxy-named", "proxy-base", "litellm"]
    targets = [Target(name) for name in names]
    orders = [[t.name for t in measuring_order(targets, rep)] for rep in range(2 * (len(names) - 1))]
    assert all(order[0] == "direct" and sorted(order) == sorted(names) for order in orders)
    places = Counter((name, order.index(name)) for order in orders for name in order[1:])
    assert set(places.values()) == {2}  # each place twice
    after = Counter((order[i - 1], order[i]) for order in orders for i in range(2, len(order)))
    assert after[("floor", "proxy")] == after[("proxy-named", "proxy")] == after[("proxy", "proxy-named")]
    assert after[("floor", "proxy")] > 0 and after[("proxy-base", "proxy")] == 0  # neighbours only, both ways
