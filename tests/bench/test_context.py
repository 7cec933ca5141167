"""bench/context.py works end to end in a tiny run (it proves the machinery, it measures nothing),
and its generator plants what it says."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
from pathlib import Path

from bench.agent_run import PLANTS_PER_KIND, generate_run, occurs

REPO = Path(__file__).resolve().parents[2]


def test_the_generator_plants_each_fact_once_where_a_run_names_it():
    run = generate_run(120, seed=3)
    assert len(run.steps) == 120
    assert collections.Counter(p.kind for p in run.plants) == PLANTS_PER_KIND
    for plant in run.plants:
        step = run.steps[plant.step]
        where = {"decision": step.user, "finding": step.content}.get(plant.kind)
        if where is None:  # notes, warnings and JSON fields are inside the step's tool output
            (output,) = step.outputs.values()
            where = output
            if plant.kind == "note":
                assert len(output) > 25_000
            if plant.kind == "warn":
                assert output.count("\n") > 1000
        assert occurs(plant.value, where), plant
        assert plant.value not in plant.query and len(plant.query) > 20  # what one would search for
    assert not occurs("12", "v12.3") and occurs("INV-1234", "as INV-1234;")


def test_the_context_bench_prints_its_table_for_each_wire_format():
    proc = subprocess.run(
        [sys.executable, "-m", "bench.context", "--steps", "60", "--only", "turns", "--wire", "chat,responses,messages,gemini"],
        cwd=REPO, capture_output=True, text=True, timeout=240, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    tables = proc.stdout.split("### ")[1:]
    assert [t.splitlines()[0] for t in tables] == ["chat completions", "responses", "messages", "gemini"]
    figures = []
    for text in tables:
        rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
        assert rows[0].startswith("| configuration | tokens | cost") and len(rows) == 3  # header, naive, turns
        header = [cell.strip() for cell in rows[0].strip("|").split("|")]
        turns = dict(zip(header, (cell.strip() for cell in rows[2].strip("|").split("|")), strict=True))
        assert turns["configuration"] == "turns" and turns["facts kept"].endswith("%")
        assert all(turns[column].isdigit() for column in ("summaries", "over limit", "refused", "failed"))
        assert turns["failed"] == turns["refused"] == "0"
        assert "turns: prompts not extending the one before:" in text
        figures.append(turns)
    # The same run over any wire format: the same summaries and the same facts reach the upstream.
    chat, *others = figures
    for other in others:
        assert (chat["summaries"], chat["facts kept"]) == (other["summaries"], other["facts kept"])
    for counted_like_chat in others[1:]:  # Messages and Gemini: counted like chat (ids included), their windows hold as much
        assert abs(int(counted_like_chat["tokens"].replace(",", "")) / int(chat["tokens"].replace(",", "")) - 1) < 0.02
