"""The instruction-count A/B (bench/turn_instructions.py) reads what callgrind writes: a dump's
totals, the figure it divides by the turns counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.turn_instructions import instructions

# The head of a dump as callgrind 3.19 writes it on `callgrind_control --dump`, abridged.
DUMP = """# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 25406
cmd:  python -m proxy serve --config config.yaml --port 36275
part: 1

desc: Timerange: Basic block 0 - 1132955806
desc: Trigger: dump

positions: line
events: Ir
summary: 199795306

ob=(1) /usr/lib/x86_64-linux-gnu/libc.so.6
fl=(1) ./string/../sysdeps/x86_64/multiarch/memmove-vec-unaligned-erms.S
fn=(1) __memcpy_avx_unaligned_erms
0 9831248

totals: 199795306
"""


def test_a_dumps_totals_are_its_instructions(tmp_path: Path) -> None:
    dump = tmp_path / "callgrind-1.1"
    dump.write_text(DUMP)
    assert instructions(dump) == 199_795_306
    dump.write_text(DUMP.replace("summary: 199795306\n", "").replace("totals: 199795306\n", ""))
    with pytest.raises(RuntimeError, match="no totals"):
        instructions(dump)
