"""A prompt's seqs kept as runs (proxy/seqruns.py): any list comes back as it was, and the fast
path's changes (a turn's items added, items taken back out) agree with the same on a list."""

from __future__ import annotations

import pickle
import random

from proxy.seqruns import SeqRuns
from proxy.store import TurnRecord
from proxy.store.base import imported_turn_row, turn_row_read

rng = random.Random(7)
LISTS = [[], [5], [3, 4, 5, 9, 2], [1, 1, 2, 2], [0, -1, -2], list(range(1, 3001)), [1, 2, 4, 3, 5, 6, 7, 8]]
LISTS += [sorted(rng.sample(range(1, 400), rng.randint(1, 120))) for _ in range(50)]
LISTS += [[rng.randint(-3, 40) for _ in range(rng.randint(0, 30))] for _ in range(50)]


def test_any_list_of_seqs_comes_back_as_it_was():
    for seqs in LISTS:
        runs = SeqRuns(seqs)
        assert list(runs) == seqs and len(runs) == len(seqs) and runs == seqs
        assert SeqRuns.from_runs(runs.runs()) == runs and list(SeqRuns.from_runs(runs.runs())) == seqs
    assert SeqRuns([3, 4, 5, 9, 2]).runs() == [3, 3, 9, 1, 2, 1]
    assert SeqRuns([1, *range(57, 2041)]).runs() == [1, 1, 57, 1984]  # a windowed prompt: two runs


def test_adding_and_taking_back_agree_with_a_list():
    for seqs in LISTS:
        runs, cut = SeqRuns(seqs), rng.randint(0, len(seqs) + 2)
        more = [rng.randint(-3, 3200) for _ in range(rng.randint(0, 5))] + list(range(len(seqs), len(seqs) + 4))
        assert runs.plus(more) == [*seqs, *more] and runs.plus(more).runs() == SeqRuns([*seqs, *more]).runs()
        assert runs.without_last(cut) == seqs[: max(len(seqs) - cut, 0)]
        assert runs.without_last(cut).runs() == SeqRuns(seqs[: max(len(seqs) - cut, 0)]).runs()
        assert runs.last(cut) == seqs[max(len(seqs) - cut, 0):]
        assert list(runs) == seqs  # unchanged: each makes a new one


def test_from_runs_joins_what_goes_on_and_drops_empty_runs():
    assert SeqRuns.from_runs([1, 2, 3, 2, 9, 0, 7, 1]).runs() == [1, 4, 7, 1]


def test_a_record_keeps_runs_and_gives_lists():
    record = TurnRecord(sent_seqs=[1, *range(40, 2041)], new_seqs=[2040], model="m")
    stored = record.stored_row()
    assert (stored["sent_seqs"], stored["new_seqs"]) == ({"runs": [1, 1, 40, 2001]}, {"runs": [2040, 1]})
    assert len(pickle.dumps(stored)) < 800
    row = record.row()
    assert row["sent_seqs"] == [1, *range(40, 2041)] and row["new_seqs"] == [2040]
    assert list(row) == [name for name in TurnRecord.__dataclass_fields__ if name not in ("title", "task")]
    assert turn_row_read(stored) == row and imported_turn_row(row) == stored


def test_a_row_kept_before_runs_reads_as_it_was():
    old = {"status": "live", "sent_seqs": [1, 2, 5], "new_seqs": [5], "turn": 1}
    assert turn_row_read(old) == old
