"""What a wire format must tell the engine: a dialect.

A dialect turns a client's request into the engine's transcript (`Codec.items`) and the
transcript back into an upstream request (`upstream_body`), reads the upstream's reply (JSON or
a stream) into items to store, takes the proxy's own tool calls out of what the client sees,
and knows its error shapes. The engine and the stages know only this interface; the summarizer
asks a dialect for its one-shot request and its answer's text (`SummaryFormat`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from ..errors import ProxyError
from ..identity import session_conversation_id
from ..prefix import REPLY_MARKERS
from ..transcript import Call, Codec, Item, Raw
from ..upstream.base import EncodedBody


class JSONBody:
    """What every managed wire format reads the same way from its request body."""

    # What a dialect offers beyond what every one does, all False or None here (see Dialect).
    names_replies = False
    items_sent_alone = False
    transcript_parts: Callable[[list[Any]], list[Raw]] | None = None
    session_header: str | None = None  # the header a known client names its session in (session_hint)
    reply_markers = REPLY_MARKERS  # a reply's role: chat, Messages
    volatile_fields: frozenset[str] = frozenset()

    def by_elements(self) -> ByElements | None:
        return None

    def encoded_body(self, body: dict[str, Any], encoded: bytes) -> dict[str, Any]:
        return EncodedBody(body, encoded)

    def summary_format(self) -> SummaryFormat | None:
        return None

    def session_hint(self, headers: Mapping[str, str]) -> str | None:
        return session_conversation_id(headers.get(self.session_header)) if self.session_header else None

    def model(self, body: dict[str, Any]) -> str:
        return str(body.get("model") or "")

    def streaming(self, body: dict[str, Any]) -> bool:
        return body.get("stream") is True

    def thread_basis(self, body: dict[str, Any], raws: Sequence[Raw]) -> Any:
        """What tells one thread of a client session from another: its run's identity basis
        and the names of the tools it offers. A subagent has its own system prompt and task;
        Claude Code's side requests (hook evaluators, title checks) replay the main transcript
        under other tools or another system prompt."""
        return [self.identity_basis(body, raws), tool_names(body)]  # type: ignore[attr-defined]


def tool_names(body: dict[str, Any]) -> list[str]:
    """The names of the body's tools in every format (chat's under `function`; a built-in
    tool's type), sorted: their order and schemas may change without making another thread."""
    tools = body.get("tools")
    names = []
    for tool in tools if isinstance(tools, list) else ():
        if isinstance(tool, dict):
            function = tool.get("function")
            name = tool.get("name") or (function.get("name") if isinstance(function, dict) else None) or tool.get("type")
            names.append(str(name))
    return sorted(names)


def tools_text(body: dict[str, Any]) -> list[str]:
    """The body's tool schemas as one counted text (they go with every call), or none."""
    tools = body.get("tools")
    return [orjson.dumps(tools).decode()] if isinstance(tools, list) and tools else []


def has_named_tool(body: dict[str, Any], name: str) -> bool:
    """Whether the body's tools (flat ones: Responses, Messages) hold one called `name`."""
    tools = body.get("tools")
    return isinstance(tools, list) and any(isinstance(t, dict) and t.get("name") == name for t in tools)


def token_limit(value: Any) -> int:
    """A body's limit on the reply's tokens, if it is a positive integer; else 0 (none given)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool the proxy offers and answers itself, in no wire format yet."""

    name: str
    description: str
    parameters: dict[str, Any]  # a JSON schema


@dataclass(frozen=True, slots=True)
class Elements:
    """An upstream transcript as a dialect made it of prompt items, for the fast path to reuse
    (proxy/engine/fastpath.py): its elements as they go, the index of the item each starts at
    (several items may make one: Anthropic's tool_result parts of one user message), and the
    cache breakpoints they hold (Anthropic's cache_control; `room`: how many the transcript of
    that body may hold, None when it can't be told)."""

    sendable: list[Any]
    firsts: list[int]
    breakpoints: int = 0
    room: int | None = None


class ByElements(Protocol):
    """What a dialect whose transcript elements may each be made of several items tells the
    fast path, so that a turn's upstream body reuses the previous one's bytes (Messages)."""

    def upstream_body_elements(
        self, body: dict[str, Any], items: Sequence[Item], tools: Sequence[ToolSpec]
    ) -> tuple[dict[str, Any], Elements | None]:
        """`upstream_body`, and its transcript's elements (None: a later body can't reuse it)."""

    def upstream_elements(self, items: Sequence[Item]) -> Elements | None:
        """The elements made of `items`, a run of a prompt's items that starts an element, as
        they go in the whole prompt's body (its first ones aside); None when they can't go
        apart from the rest (say, a note of the proxy's among them: it goes to `system`)."""

    def breakpoints(self, sendable: Sequence[Any]) -> int:
        """The cache breakpoints these elements hold."""


@dataclass(frozen=True, slots=True)
class Completion:
    """The answer to a one-shot request (the summarizer's): its text, stripped (empty: it gave
    none), the tokens it took, and whether the model stopped at the request's max tokens."""

    text: str
    tokens_in: int
    tokens_out: int
    cut: bool = False


class SummaryFormat(Protocol):
    """A wire format as the summarizer asks in it: one request for a text, its answer read."""

    name: str

    def summary_request(self, model: str, system: str, user: str, max_tokens: int) -> dict[str, Any]:
        """A request (not streamed) to `model`: `system`'s instructions, `user`'s message, at most
        `max_tokens` of answer."""

    def summary_reply(self, parsed: Any) -> Completion:
        """The answer (its JSON, parsed) read; KeyError, IndexError or TypeError if malformed."""


@dataclass(slots=True)
class ReplyRead:
    """An upstream reply as the engine needs it."""

    items: list[Raw]  # what joins the transcript (the assistant message; Responses: its output items)
    calls: list[Call]  # the tool calls it makes, in order
    usage: dict[str, Any] | None = None
    response_id: str | None = None  # the upstream's id for this reply (chatcmpl-..., msg_..., resp_...)
    complete: bool = True  # the reply came to its end (finish/stop reason, completed event)


@dataclass(slots=True)
class RoundEnd:
    """One upstream stream, relayed: the whole reply of that round, the proxy's calls included."""

    reply: ReplyRead
    ours: list[Call] = field(default_factory=list)
    theirs: list[Call] = field(default_factory=list)


class StreamRelay(Protocol):
    """Relays an upstream event stream to the client, across read-back rounds.

    In a round that offers the proxy's tools, `filtering` is on: events of the proxy's own calls
    are kept from the client (and anything that must not reach it before we know: a finish
    event, a reasoning item that may belong to our call). The stream the client sees stays
    well-formed across rounds (one start, contiguous indexes and sequence numbers, one end).
    """

    def begin_round(self, ours: frozenset[str]) -> None:
        """A new upstream stream starts; `ours` names the proxy's tools in it (empty: none)."""

    def feed(self, chunk: bytes) -> bytes:
        """Upstream bytes in, the bytes to forward to the client now out (possibly empty)."""

    def end_round(self) -> RoundEnd:
        """After the round's stream ended: what it said (our calls and the client's apart)."""

    def release(self) -> bytes:
        """The last round is over: events held back while recognising our calls, made final."""

    def closing(self) -> bytes:
        """The stream's final event(s), sent only once the reply is stored (a client must not
        take a reply for done that the store never got). Empty if the upstream sent none."""

    def error_event(self, exc: ProxyError) -> bytes:
        """An error event ending the stream, in this format."""

    @property
    def finished(self) -> bool:
        """Whether the reply the client saw came to its end."""

    def seen(self) -> list[Raw]:
        """The reply the client saw, as items to store (empty if it saw nothing yet)."""

    @property
    def response_id(self) -> str | None:
        """The reply's id as the client saw it (the upstream's: chatcmpl-..., msg_..., resp_...)."""

    @property
    def upstream_error(self) -> str | None:
        """The upstream's own error event, relayed to the client, if the stream ended in one."""

    @property
    def usage(self) -> dict[str, Any] | None: ...


class NoAnchor:
    """A format whose requests name no earlier reply: nothing to echo."""

    def echo_anchor(self, data: bytes, anchor: str) -> bytes:
        return data


class OneMessageRelay:
    """What a relay whose reply is one assembled message (chat, Messages) says of it, from its
    assemblers: `_seen` of what the client saw, `_round` of the round under way; `_usage` sums
    the rounds before it. Neither format names a reply a later request can point back at: its id
    is the upstream's, for the turn's trace (see Dialect.names_replies)."""

    _seen: Any
    _round: Any
    _usage: dict[str, Any] | None
    _ours: frozenset[str]

    def _round_end(self, message: Raw, calls: list[Call]) -> RoundEnd:
        """The round's reply (`message`, making `calls`), our calls and the client's apart."""
        self._usage = self._round.usage or self._usage
        reply = ReplyRead([message], calls, self._round.usage, response_id=self._round.id, complete=self._round.complete)
        return RoundEnd(reply, [c for c in calls if c.name in self._ours], [c for c in calls if c.name not in self._ours])

    @property
    def finished(self) -> bool:
        return self._seen.complete or self._seen.done

    def seen(self) -> list[Raw]:
        return [] if self._seen.empty else [self._seen.message()]

    @property
    def usage(self) -> dict[str, Any] | None:
        return self._round.usage or self._usage

    @property
    def response_id(self) -> str | None:
        return self._seen.id


class Dialect(Protocol):
    name: str  # "chat", "responses", "messages", "gemini": also the conversation's stored format
    codec: Codec
    transcript_key: str  # the body field that holds the transcript ("messages", "input", "contents")
    # Whether a later request may name a reply by its id (Responses' previous_response_id): the
    # store then keeps which conversation owns it (`response_owner`).
    names_replies: bool
    # Whether `upstream_body` makes each item one element of the upstream transcript, as that item
    # alone says (chat, Responses): the fast path then splices a new body of the previous one's
    # elements and the new items' (proxy/engine/fastpath.py).
    items_sent_alone: bool
    # The transcript's items of the body's transcript array, where some element makes several
    # (Messages' and Gemini's split a message of several results); element by element, so that
    # parts(a + b) == parts(a) + parts(b) (the body cache, proxy/prefix.py). None: the array is the transcript.
    transcript_parts: Callable[[list[Any]], list[Raw]] | None
    # The JSON tokens a reply echoed in the transcript starts with, the likeliest first: what a
    # request holds before the first of them names an unnamed client's run (prefix.run_fingerprint).
    reply_markers: tuple[bytes, ...]
    # Body fields a known client sends new every request that decide nothing of the prompt and go
    # upstream as they came (Codex's `client_metadata`: turn ids, keys in a new order): a body that
    # extends the last one but for them is still read only where new (prefix.py, fastpath.py).
    volatile_fields: frozenset[str]

    def transcript(self, body: dict[str, Any]) -> list[Raw]:
        """The request's transcript items (raises InvalidRequest if absent or malformed at the top)."""

    def by_elements(self) -> ByElements | None:
        """This dialect as the fast path rebuilds a body whose elements may each be made of
        several items (Messages and Gemini: themselves); None when it makes no such body."""

    def encoded_body(self, body: dict[str, Any], encoded: bytes) -> dict[str, Any]:
        """An upstream body made of `body` and its JSON bytes, as `upstream_body` makes one (Gemini's
        carries the URL's model and stream flag): the fast path's, made of the previous turn's bytes."""

    def summary_format(self) -> SummaryFormat | None:
        """This dialect as the summarizer asks a conversation's own model in it (itself: chat,
        and Messages and Gemini, whose clients' keys open no other API); None: in chat."""

    def validate(self, raws: Sequence[Raw], start: int) -> None:
        """Check `raws[start:]` enough to store and forward them safely; InvalidRequest otherwise."""

    def anchor(self, body: dict[str, Any]) -> str | None:
        """The earlier reply this request continues, by the id the upstream gave it (Responses'
        `previous_response_id`): the request then carries only its new items. None: no anchor."""

    def detach_anchor(self, body: dict[str, Any]) -> dict[str, Any]:
        """`body` without its anchor: the proxy sends the history itself."""

    def session_hint(self, headers: Mapping[str, str]) -> str | None:
        """The session a known client names in its headers (Codex's `session-id`, Claude Code's
        `X-Claude-Code-Session-Id`), when it is a valid conversation id; else None. Needs no
        body: the handler keys the body cache by it before the body is parsed."""

    def session_id(self, body: dict[str, Any], headers: Mapping[str, str]) -> str | None:
        """The session id a known client sends, in its headers (`session_hint`) or its body
        (Codex's `prompt_cache_key`, Claude Code's `metadata.user_id`), when it is a valid
        conversation id; else None."""

    def identity_basis(self, body: dict[str, Any], raws: Sequence[Raw]) -> Any:
        """What names an unmodified agent's run: its system prompt and first user message (JSON)."""

    def thread_basis(self, body: dict[str, Any], raws: Sequence[Raw]) -> Any:
        """What names one thread of a client's session (see JSONBody.thread_basis)."""

    def model(self, body: dict[str, Any]) -> str: ...

    def streaming(self, body: dict[str, Any]) -> bool: ...

    def reply_reserve(self, body: dict[str, Any]) -> int:
        """Tokens the request reserves for the reply (its max tokens), 0 if it sets none."""

    def fixed_parts(self, body: dict[str, Any]) -> list[str]:
        """Texts sent with every call besides the transcript (tool schemas, instructions): they
        count against the token window."""

    def has_tool(self, body: dict[str, Any], name: str) -> bool:
        """Whether the client offers a tool of that name (then the proxy never adds its own)."""

    def upstream_body(self, body: dict[str, Any], items: Sequence[Item], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        """The request to send upstream: the client's parameters, `items` as the transcript, and
        the proxy's `tools` added to the client's."""

    def tool_definition(self, tool: ToolSpec) -> dict[str, Any]:
        """`tool` as this format declares tools (for counting it against the window)."""

    def read_reply(self, data: bytes) -> ReplyRead | None:
        """A JSON reply read; None when it has no reply to store (logged by the dialect)."""

    def without_calls(self, data: bytes, reply: ReplyRead, keep: Sequence[Call]) -> tuple[bytes, ReplyRead]:
        """The JSON reply with every call but `keep` taken out (a mixed reply: ours go)."""

    def relay(self, anchor: str | None = None) -> StreamRelay:
        """A relay for one streamed turn; `anchor` is the request's (see `echo_anchor`)."""

    def echo_anchor(self, data: bytes, anchor: str) -> bytes:
        """A JSON reply as the client sees it when its request named `anchor`, which the proxy
        took out (`detach_anchor`): the reply says the client's value, as the real API does."""

    def error_body(self, exc: ProxyError) -> dict[str, Any]:
        """`exc` in this format's error shape."""
