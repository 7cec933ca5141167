"""The store-turn bench (bench/store_turn.py) works end to end in a tiny run, both ways of calling
the store, and measures the tree it is given."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_store_turn_bench_prints_a_figure_for_every_scenario() -> None:
    for mode in ([], ["--api"]):
        done = subprocess.run(
            [sys.executable, "-m", "bench.store_turn", "--src", str(REPO), "--messages", "210",
             "--turns", "3", "--firsts", "2", "--rounds", "1", *mode],
            cwd=REPO, capture_output=True, text=True, timeout=120,
        )
        assert done.returncode == 0, done.stderr
        for scenario in ("first turn at 210", "later turn at 210"):  # the later one built turn by turn past 200
            line = next(line for line in done.stdout.splitlines() if line.startswith(scenario))
            assert float(re.split(r"\s+", line[len(scenario):].strip())[0]) > 0, line
