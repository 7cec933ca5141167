"""Last stage, the pairing guard: what goes upstream never has a tool result without its call, nor
a call without its result. A client bug, an interrupted run or one of our own cuts must not
become an upstream 400. Each repair is logged and counted in the turn report.

The rule, in every wire format: a result belongs to the unit of the call it answers (see
proxy/transcript.py); a result outside it is dropped, and a call left unanswered when its unit
ends gets a short "no result" result at the end of the unit.
"""

from __future__ import annotations

import logging

from ..config import Settings
from ..markers import NO_RESULT
from ..transcript import Call, Item, Role, unit_start
from .base import Notes, StageRun, Turn, passed_through

log = logging.getLogger("proxy.pairing")


class PairingGuard:
    name = "pairing"

    async def __call__(self, turn: Turn, items: list[Item]) -> list[Item]:
        out, repairs = self._paired(turn, items)
        if repairs:
            turn.report.repairs += repairs
            turn.notes = Notes(repairs=repairs)
            log.warning("repaired %d tool-call pairing problems", repairs, extra={"conversation": str(turn.key)})
        return out if repairs else items

    async def extend(self, turn: Turn, run: StageRun, new: list[Item]) -> list[Item] | None:
        """Units are checked one by one: the new items, with the unit they may continue, need no repair."""
        if run.note.repairs or not run.after:
            return None
        start = unit_start(run.after, len(run.after) - 1)
        _, repairs = self._paired(turn, [*run.after[start:], *new], quiet=True)
        return None if repairs else new

    async def retract(self, turn: Turn, run: StageRun, keep: int) -> StageRun | None:
        """A run without repairs, cut between units: the units before the cut needed none either."""
        if run.note.repairs or (keep < len(run.before) and run.before[keep].joins):
            return None
        return passed_through(run, keep)

    def _paired(self, turn: Turn, items: list[Item], quiet: bool = False) -> tuple[list[Item], int]:
        """`items` repaired, and how many repairs that took (`quiet`: none logged)."""
        out: list[Item] = []
        open_calls: list[Call] = []  # calls of the current unit still unanswered
        repairs = 0
        tool = Role.TOOL  # looked up once (see transcript.Role)
        for item in items:
            if not item.joins:
                repairs += self._close(turn, open_calls, out)
                open_calls = []
            if item.role is tool:
                answered = next((c for c in open_calls if c.id == item.answers), None) if item.joins else None
                if answered is None:  # answers no call of its unit
                    repairs += 1
                    if not quiet:
                        log.warning("dropped a tool result that answers no preceding call", extra={"conversation": str(turn.key)})
                    continue
                open_calls.remove(answered)
            open_calls.extend(item.calls)
            out.append(item)
        repairs += self._close(turn, open_calls, out)
        return out, repairs

    @staticmethod
    def _close(turn: Turn, open_calls: list[Call], out: list[Item]) -> int:
        """Give every still-unanswered call a short 'no result' result."""
        for call in open_calls:
            out.append(turn.codec.tool_result(call, NO_RESULT))
        return len(open_calls)


def build(settings: Settings) -> PairingGuard:
    return PairingGuard()
