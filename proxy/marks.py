"""A conversation's marks: small named integers on its record (`Conversation.marks`), each moved
by one part of the proxy and read again on the conversation's next turn. Their names live here,
with what each means and who moves it.

What is stored stays a plain mapping of these names to ints (`dict[str, int]` in both stores and
in exports): a turn writes the marks it moved as such a mapping (`TurnReport.marks`), and reads
the conversation's through `Marks`, which names each one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

# -- seqs: where a cut stands, so that each prompt extends the previous one until the next cut --
WINDOW_MARK = "window_start"  # the seq the token window starts at since its last cut (pipeline/window.py)
MASK_MARK = "mask_through"  # tool outputs up to this seq go as placeholders (pipeline/compaction.py, mask)
KNOWLEDGE_MARK = "knowledge_from"  # the seq whose time names the knowledge version shown (pipeline/knowledge.py)
# The order of the turn whose request the live transcript is (turns.py): a turn that started
# before it and ends after it does not take the live transcript back.
LIVE_ORDER_MARK = "live_order"

# -- not seqs --------------------------------------------------------------------------------------
RECALL_MARK = "recall_tools"  # 1 once the recall tools were offered: from then on, on every turn (tools/)
THREAD_MARK = "thread"  # which thread of its client's session a conversation is (a token; engine)
RUNS_MARK = "runs"  # how many runs a derived conversation had (engine)


class Marks(Mapping[str, int]):
    """A conversation's marks as a turn reads them: the stored mapping, unchanged (a copy), with
    each mark read by its name."""

    __slots__ = ("_stored",)

    def __init__(self, stored: Mapping[str, int] | None = None) -> None:
        self._stored = dict(stored or {})

    def __getitem__(self, name: str) -> int:
        return self._stored[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._stored)

    def __len__(self) -> int:
        return len(self._stored)

    def __repr__(self) -> str:
        return f"Marks({self._stored!r})"

    def __eq__(self, other: object) -> bool:  # (Mapping's copies both sides: a turn compares them once)
        if type(other) is Marks:
            return self._stored == other._stored
        return self._stored == other if type(other) is dict else super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]  # (a mapping)

    def after(self, moved: Mapping[str, int]) -> dict[str, int]:
        """The marks as a turn that `moved` some leaves them (the mapping stored)."""
        return {**self._stored, **moved}

    @property
    def window_start(self) -> int | None:
        return self._stored.get(WINDOW_MARK)

    @property
    def mask_through(self) -> int:
        return self._stored.get(MASK_MARK, 0)

    @property
    def knowledge_from(self) -> int | None:
        return self._stored.get(KNOWLEDGE_MARK)

    @property
    def live_order(self) -> int:
        return self._stored.get(LIVE_ORDER_MARK, 0)

    @property
    def recall_tools(self) -> bool:
        return RECALL_MARK in self._stored

    @property
    def thread(self) -> int | None:
        return self._stored.get(THREAD_MARK)

    @property
    def runs(self) -> int:
        return self._stored.get(RUNS_MARK, 1)
