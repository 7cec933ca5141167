"""Last stage, the pairing guard: what goes upstream never has a tool result without its call, nor
a call without its result. A client bug, an interrupted run or one of our own cuts must not
become an upstream 400. Each repair is logged and counted in `turn.notes["repairs"]`.
"""

from __future__ import annotations

import logging

from ..config import Settings
from .base import Item, Turn

log = logging.getLogger("proxy.pairing")
NO_RESULT = "[context-proxy: no result was recorded for this tool call]"


class PairingGuard:
    name = "pairing"

    async def __call__(self, turn: Turn, items: list[Item]) -> list[Item]:
        out: list[Item] = []
        open_calls: list[str] = []  # ids of the last assistant message's calls still unanswered
        repairs = 0
        for item in items:
            msg = item.message
            role = msg.get("role")
            if role == "tool":
                call_id = msg.get("tool_call_id")
                if call_id in open_calls:
                    open_calls.remove(call_id)
                    out.append(item)
                else:  # answers no call of the assistant message just before it
                    repairs += 1
                    log.warning("dropped a tool result that answers no preceding call", extra={"conversation": str(turn.key)})
                continue
            repairs += self._close(open_calls, out)
            open_calls = [c.get("id") for c in msg.get("tool_calls") or ()] if role == "assistant" else []
            out.append(item)
        repairs += self._close(open_calls, out)
        if repairs:
            turn.notes["repairs"] = turn.notes.get("repairs", 0) + repairs
            log.warning("repaired %d tool-call pairing problems", repairs, extra={"conversation": str(turn.key)})
        return out if repairs else items

    @staticmethod
    def _close(open_calls: list[str], out: list[Item]) -> int:
        """Give every still-unanswered call a short 'no result' message."""
        for call_id in open_calls:
            out.append(Item({"role": "tool", "tool_call_id": call_id, "content": NO_RESULT}, None))
        return len(open_calls)


def build(settings: Settings) -> PairingGuard:
    return PairingGuard()
