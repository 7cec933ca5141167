"""History modes: from a request and the stored transcript, decide what is new and what goes upstream.

- full history: the request carries the whole transcript. The longest prefix whose canonical
  hashes match the live transcript is already stored; the rest is new. Live items after that
  prefix were diverged from (an edit, a regenerate) and become superseded once the upstream
  accepts the request.
- proxy history: the request carries only new items (with or without its system prompt); the
  stored live transcript is put before them, and the stored system prompt when the request has
  none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import itemgetter

from .store import Conversation, StoredMessage
from .transcript import Codec, Item, Raw, Role, leading_system_count


@dataclass(slots=True)
class TurnPlan:
    new: list[Raw]  # to persist (staged before forwarding, durable before the reply's first byte)
    new_hashes: list[str]
    upstream: list[Raw]  # the transcript to send (before the pipeline rewrites it)
    # Stored seqs of `upstream` minus its new tail (which gets seqs when written); None = not stored.
    known_seqs: list[int | None] = field(default_factory=list)
    supersede: list[int] = field(default_factory=list)  # live seqs the client diverged from
    upstream_hashes: list[str] = field(default_factory=list)
    # The request names the whole live branch it continues (full history, an anchor): live items
    # outside it are superseded when it ends well. Proxy history and unknown anchors only add.
    branch: bool = True
    # The conversation's live index it was planned against (full history), when `known_seqs` and
    # `supersede` are all of it: a turn that ends with the same index need not read it again.
    planned_on: list[tuple[int, str]] | None = None

    def items(self, codec: Codec, new_seqs: Sequence[int]) -> list[Item]:
        """`upstream` as items with their seqs and hashes, once the new ones have their seqs."""
        seqs = self.known_seqs + list(new_seqs)
        return codec.items(self.upstream, seqs, self.upstream_hashes)


def plan_full_history(raws: list[Raw], hashes: list[str], conversation: Conversation | None) -> TurnPlan:
    live = conversation.live if conversation else []
    stored = list(map(_second, live))  # in C: a turn of a long conversation walks it in Python nowhere
    if stored == hashes[: len(stored)]:  # the usual turn: the request extends the live transcript
        same = len(stored)
    else:
        same = 0
        for kept, sent in zip(stored, hashes, strict=False):
            if kept != sent:
                break
            same += 1
    return TurnPlan(
        new=raws[same:],
        new_hashes=hashes[same:],
        upstream=raws,
        known_seqs=list(map(_first, live[:same])),
        supersede=list(map(_first, live[same:])),
        upstream_hashes=hashes,
        planned_on=live,
    )


_first, _second = itemgetter(0), itemgetter(1)


def plan_proxy_history(
    codec: Codec, raws: list[Raw], hashes: list[str], live: list[StoredMessage], first: bool | None = None
) -> TurnPlan:
    """`first`: the conversation's first turn, whose system prompt joins the record (default: no
    live transcript yet; the engine says no when another first turn in flight wrote it already)."""
    request = codec.items(raws, [None] * len(raws), hashes)
    stored = codec.items([m.message for m in live], [m.seq for m in live], [m.hash for m in live])
    n_system = leading_system_count(request)
    n_stored_system = leading_system_count(stored)
    if first is None:
        first = not live
    if first:  # the first turn: everything joins the record, the system prompt included
        return TurnPlan(new=raws, new_hashes=hashes, upstream=raws, upstream_hashes=hashes, branch=False)
    history = live[n_stored_system:]
    if n_system:  # the client's current system prompt leads; the stored one stays in the record as it was
        head, head_seqs, head_hashes = raws[:n_system], [None] * n_system, hashes[:n_system]
    else:  # no system prompt in the request: the stored one goes upstream
        system = live[:n_stored_system]
        head, head_seqs, head_hashes = [m.message for m in system], [m.seq for m in system], [m.hash for m in system]
    return TurnPlan(
        new=raws[n_system:],
        new_hashes=hashes[n_system:],
        upstream=head + [m.message for m in history] + raws[n_system:],
        known_seqs=head_seqs + [m.seq for m in history],
        upstream_hashes=head_hashes + [m.hash for m in history] + hashes[n_system:],
        branch=False,
    )


def plan_anchored(raws: list[Raw], hashes: list[str], live: list[StoredMessage], anchor_seq: int) -> TurnPlan:
    """The request continues the reply ending at `anchor_seq` with new items only: the live
    transcript up to it goes first; live items after it were branched away from (superseded)."""
    history = [m for m in live if m.seq <= anchor_seq]
    return TurnPlan(
        new=raws,
        new_hashes=hashes,
        upstream=[m.message for m in history] + raws,
        known_seqs=[m.seq for m in history],
        supersede=[m.seq for m in live if m.seq > anchor_seq],
        upstream_hashes=[m.hash for m in history] + hashes,
    )


def plan_appended(raws: list[Raw], hashes: list[str]) -> TurnPlan:
    """Everything in the request is new and goes upstream as it is; nothing stored is touched."""
    return TurnPlan(new=raws, new_hashes=hashes, upstream=raws, upstream_hashes=hashes, branch=False)


def is_fresh_start(codec: Codec, raws: list[Raw]) -> bool:
    """Whether a request is an agent starting over: its system prompt and its task, nothing else.
    Asked of every request with a derived id, so it reads items only up to the first that is no
    system prompt (an item's role is its own: no neighbour changes it), not the whole transcript."""
    for i in range(len(raws)):
        role = codec.items(raws[i : i + 1], [None], [None])[0].role
        if role is not Role.SYSTEM:
            return role is Role.USER and i == len(raws) - 1
    return False
