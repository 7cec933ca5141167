"""Anthropic Messages (`POST /v1/messages`): Claude Code's wire format.

Items. One item per message, except that a user message's `tool_result` blocks each become a
TOOL item of their own: a user message holding just that block, joining the item before it, so
truncation, quota, the window and the pairing guard work per result as they do on chat `tool`
messages. The message's other blocks (Claude Code's `<system-reminder>` text after its results)
form a USER item that joins the results before it. What is stored is these parts; what goes
upstream is the messages rebuilt (`upstream_body`): a run of parts that joins becomes one user
message again, its blocks in order and byte for byte, `tool_result`s first (where a stage added
one, or dropped some, the message stays one the API accepts). Thinking, redacted_thinking and
tool_use blocks stay inside their assistant message, untouched: signatures stay valid, and the
window drops a thinking + tool_use message with its results as one unit. A `role: "system"`
message inside `messages` (a beta) joins the item before it.

The top-level `system` stays the client's; the proxy's own notes (the knowledge document, the
compaction summary) are appended to it as text blocks after the client's. An inbox message goes
into the newest `tool_result` when the prompt ends in tool results, else as a user message of
its own right before the client's newest. Claude Code re-sends a message as blocks that
was a string, and moves its `cache_control` breakpoint to the newest message each turn: the
canonical hash compares messages by meaning, so neither looks new (and the fast path parses and
rewrites only the messages that came back changed: proxy/prefix.py, proxy/engine/fastpath.py;
its upstream body makes again only the messages they, and the new ones, are in:
`upstream_elements`). Breakpoints stay valid: never more than four in the body (the oldest
messages' go first, e.g. stored messages replayed in proxy-history mode), and a dropped block
takes its own with it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from ..errors import InvalidRequest, ProxyError
from ..identity import session_conversation_id
from ..messages import MAX_DEPTH, canonical_digest, text_of, too_deep
from ..tokens import IMAGE_TOKENS, PER_MESSAGE, PER_TOOL_CALL
from ..transcript import Call, Item, Raw, Role
from .base import Elements, JSONBody, NoAnchor, ReplyRead, ToolSpec, has_named_tool, token_limit, tools_text
from .messages_stream import CallCache, MessagesRelay, calls_of, error_body

log = logging.getLogger("proxy.messages")

ROLES = {"user": Role.USER, "assistant": Role.ASSISTANT, "system": Role.SYSTEM}
SESSION_HEADER = "X-Claude-Code-Session-Id"
MAX_CACHE_BREAKPOINTS = 4  # the API refuses a fifth
# Sent first when the window leaves a prompt starting on an assistant message.
OMITTED_NOTE = "(Earlier messages of this conversation are not shown.)"
REDACTED_THINKING_TOKENS = 100  # an opaque blob: a flat estimate

def is_result(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "tool_result"


def split_message(message: Any) -> list[Any]:
    """The stored parts of one client message: the message itself, or for a user message holding
    tool_result blocks, one part per result and one per run of other blocks, in order."""
    if not isinstance(message, dict) or message.get("role") != "user":
        return [message]
    content = message.get("content")
    if not isinstance(content, list) or len(content) < 2 or not any(is_result(b) for b in content):
        return [message]
    parts: list[Raw] = []
    run: list[Any] = []
    for block in content:
        if is_result(block):
            if run:
                parts.append({"role": "user", "content": run})
                run = []
            parts.append({"role": "user", "content": [block]})
        else:
            run.append(block)
    if run:
        parts.append({"role": "user", "content": run})
    # Keys besides role and content (the API has none for user messages) stay on the first part.
    extra = {k: v for k, v in message.items() if k not in ("role", "content")}
    if extra:
        parts[0] = {**extra, **parts[0]}
    return parts


def result_block(raw: Raw) -> dict[str, Any] | None:
    """The tool_result block of a TOOL part, else None."""
    if raw.get("role") != "user":
        return None
    content = raw.get("content")
    if isinstance(content, list) and len(content) == 1 and is_result(content[0]):
        return content[0]
    return None


def is_note(raw: Raw) -> bool:
    """A system note of the proxy's own: the text block it adds to `system`."""
    return "role" not in raw and raw.get("type") == "text"


# -- meaning, not bytes -------------------------------------------------------------------------


def canonical_content(content: Any) -> Any:
    """Content by meaning: a string is one text block; `cache_control` markers, null fields and
    `is_error: false` say nothing."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if isinstance(content, list):
        return [canonical_block(block) for block in content]
    return content


def canonical_block(block: Any) -> Any:
    if not isinstance(block, dict):
        return block
    out = {}
    for key, value in block.items():
        if key == "cache_control" or value is None or (key == "is_error" and value is False):
            continue
        if key == "content":
            value = canonical_content(value)
        out[key] = value
    return out


def canonical(raw: Raw) -> Raw:
    return {key: canonical_content(value) if key == "content" else value for key, value in raw.items() if value is not None}


def system_blocks(system: Any) -> list[Any]:
    """The top-level `system` as a list of blocks."""
    if isinstance(system, str):
        return [{"type": "text", "text": system}] if system else []
    return list(system) if isinstance(system, list) else []


# -- text ---------------------------------------------------------------------------------------


def _with_text(content: Any, text: str) -> Any:
    """`content` with its text replaced by `text`; other blocks (images, thinking) stay in place,
    and so does a cache breakpoint on the text (the client's, on the block it marked)."""
    if not isinstance(content, list):
        return text
    texts = [b for b in content if isinstance(b, dict) and b.get("type") == "text"]
    marker = next((b["cache_control"] for b in reversed(texts) if b.get("cache_control") is not None), None)
    new = {"type": "text", "text": text} if marker is None else {"type": "text", "text": text, "cache_control": marker}
    if len(texts) == len(content):
        return text if marker is None else [new]
    out: list[Any] = []
    placed = False
    for block in content:
        if isinstance(block, dict) and block.get("type") == "text":
            if not placed:
                out.append(new)
                placed = True
            continue
        out.append(block)
    if not placed:
        out.append(new)
    return out


def _with_appended_text(content: Any, text: str) -> Any:
    if isinstance(content, str):
        return content + text
    if isinstance(content, list):
        return [*content, {"type": "text", "text": text}]
    return text


def _add_counted(content: Any, texts: list[str]) -> int:
    """Append what `content` holds as text to `texts`; return the flat tokens of the rest."""
    if isinstance(content, str):
        texts.append(content)
        return 0
    extra = 0
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text") or ""))
        elif kind == "thinking":
            texts.append(str(block.get("thinking") or ""))
        elif kind == "tool_use" or kind == "server_tool_use":  # as chat counts a tool call: its id too
            texts.append(str(block.get("id") or ""))
            texts.append(str(block.get("name") or ""))
            texts.append(orjson.dumps(block.get("input")).decode())
            extra += PER_TOOL_CALL
        elif kind == "tool_result":  # and a tool message: the id of the call it answers
            texts.append(str(block.get("tool_use_id") or ""))
            extra += _add_counted(block.get("content"), texts)
        elif kind == "redacted_thinking":
            extra += REDACTED_THINKING_TOKENS
        elif kind in ("image", "document"):
            extra += IMAGE_TOKENS
        else:  # server tool results, search results...: their JSON, as an estimate
            texts.append(orjson.dumps(block).decode())
    return extra


class MessagesCodec:
    def __init__(self) -> None:
        self.calls = CallCache()  # the transcript's tool_use blocks, read again every turn

    def items(self, raws: Sequence[Raw], seqs: Sequence[int | None], hashes: Sequence[str | None]) -> list[Item]:
        # Called on the whole transcript every turn: the checks of result_block and is_note, inline.
        out: list[Item] = []
        append = out.append
        after_result = False  # the previous item is a TOOL part: a user part after it continues its message
        for raw, seq, digest in zip(raws, seqs, hashes, strict=True):
            role = raw.get("role")
            content = raw.get("content")
            if role == "user":
                if type(content) is list and len(content) == 1:
                    block = content[0]
                    if type(block) is dict and block.get("type") == "tool_result":
                        append(Item(raw, Role.TOOL, seq, digest, answers=str(block.get("tool_use_id")), joins=True))
                        after_result = True
                        continue
                append(Item(raw, Role.USER, seq, digest, joins=after_result and type(content) is list))
            elif role == "assistant":
                append(Item(raw, Role.ASSISTANT, seq, digest, calls=calls_of(content, self.calls)))
            elif role is None and raw.get("type") == "text":  # a note of the proxy's: it stands alone
                append(Item(raw, Role.SYSTEM, seq, digest))
            else:  # a system message joins what it stands beside
                append(Item(raw, Role.SYSTEM if role == "system" else Role.OTHER, seq, digest, joins=bool(out)))
            after_result = False
        return out

    def hash(self, raw: Raw) -> str:
        return canonical_digest(canonical(raw))

    def text(self, item: Item) -> str | None:
        raw = item.raw
        if item.role is Role.TOOL:  # a user message holding just its tool_result (see items)
            return text_of(raw["content"][0].get("content"))
        if is_note(raw):
            return str(raw.get("text") or "")
        return text_of(raw.get("content"))

    def with_text(self, item: Item, text: str) -> Item:
        raw = item.raw
        if is_note(raw):
            return item.but(raw={**raw, "text": text}, hash=None)
        block = result_block(raw)
        if block is not None:
            block = {**block, "content": _with_text(block.get("content"), text)}
            return item.but(raw={**raw, "content": [block]}, hash=None)
        return item.but(raw={**raw, "content": _with_text(raw.get("content"), text)}, hash=None)

    def with_appended_text(self, item: Item, text: str) -> Item:
        raw = item.raw
        if is_note(raw):
            return item.but(raw={**raw, "text": str(raw.get("text") or "") + text}, hash=None)
        block = result_block(raw)
        if block is not None:
            block = {**block, "content": _with_appended_text(block.get("content"), text)}
            return item.but(raw={**raw, "content": [block]}, hash=None)
        return item.but(raw={**raw, "content": _with_appended_text(raw.get("content"), text)}, hash=None)

    def counted_parts(self, raw: Raw) -> tuple[tuple[str, ...], int]:
        if is_note(raw):
            return (str(raw.get("text") or ""),), 0
        texts = [str(raw.get("role") or "")]
        extra = PER_MESSAGE + _add_counted(raw.get("content"), texts)
        return tuple(texts), extra

    def system_note(self, text: str) -> Item:
        return Item({"type": "text", "text": text}, Role.SYSTEM)

    def user_note(self, text: str) -> Item:
        # A user message of its own: it goes before the client's newest, which the API takes as one
        # user turn with it (the client's own message keeps its bytes and its breakpoint).
        return Item({"role": "user", "content": text}, Role.USER)

    def tool_result(self, call: Call, text: str) -> Item:
        block = {"type": "tool_result", "tool_use_id": call.id, "content": text}
        return Item({"role": "user", "content": [block]}, Role.TOOL, answers=call.id, joins=True)


# -- the request body ---------------------------------------------------------------------------


def rebuild_messages(items: Sequence[Item], firsts: list[int] | None = None) -> tuple[list[Raw], list[Raw]]:
    """(the messages to send, the proxy's notes for `system`) from the transcript's items; the
    index of the item each message starts at appended to `firsts`, when given.

    A run of joined user parts becomes one user message, its tool_result blocks first (a valid
    client message has them first already: nothing moves then). An assistant message left empty
    (a reply that held only the proxy's calls, past the read-back limit) is not sent: the API
    refuses empty messages. The prompt starts on a user message, as the API wants."""
    messages, notes = _messages_of(items, [] if firsts is None else firsts)
    first = next((i for i, m in enumerate(messages) if m.get("role") != "system"), None)
    if first is not None and messages[first].get("role") == "assistant":
        messages.insert(first, {"role": "user", "content": OMITTED_NOTE})
        if firsts is not None:
            firsts.insert(first, firsts[first])
    return messages, notes


def _messages_of(items: Sequence[Item], firsts: list[int]) -> tuple[list[Raw], list[Raw]]:
    """`rebuild_messages` but for where the prompt starts: of a run of a prompt's items that
    starts a message, the messages as they go in the whole prompt's (a message starts where
    the item before it ends one, whatever came earlier)."""
    messages: list[Raw] = []
    notes: list[Raw] = []
    merged: list[int] = []  # the messages rebuilt from several parts (our copies): only they can need reordering
    open_user = False  # the last message is a user message being rebuilt from parts
    for at, item in enumerate(items):
        raw = item.raw
        role = item.role
        if role is Role.SYSTEM and "role" not in raw:  # a note of the proxy's (is_note)
            notes.append(raw)
            continue
        if role is Role.TOOL or (role is Role.USER and item.joins):
            if not open_user:  # a lone part goes as it is
                messages.append(raw)
                firsts.append(at)
                open_user = True
                continue
            if not merged or merged[-1] != len(messages) - 1:
                messages[-1] = {**messages[-1], "content": list(messages[-1].get("content") or ())}
                merged.append(len(messages) - 1)
            messages[-1]["content"].extend(raw.get("content") or ())
            continue
        open_user = False
        if role is not Role.ASSISTANT or raw.get("content"):  # a reply that was only our calls: the API refuses it empty
            messages.append(raw)
            firsts.append(at)
    for k in merged:
        content = messages[k]["content"]
        if _results_not_first(content):
            messages[k]["content"] = [b for b in content if is_result(b)] + [b for b in content if not is_result(b)]
    return messages, notes


def _results_not_first(content: list[Any]) -> bool:
    seen_other = False
    for block in content:
        if not is_result(block):
            seen_other = True
        elif seen_other:
            return True
    return False


def limit_breakpoints(body: dict[str, Any]) -> None:
    """At most four `cache_control` breakpoints: past that, the oldest messages' are taken off
    (in copies of their blocks; the client's own breakpoints, at most four, are all kept)."""
    excess = _breakpoints(body) - MAX_CACHE_BREAKPOINTS
    if excess <= 0:  # the usual case: counted, nothing to take off
        return
    spots: list[tuple[int, int, int | None]] = []  # (message, block, inner block) of each marked block
    for m, message in enumerate(body["messages"]):
        for b, block in enumerate(_blocks(message)):
            if block.get("cache_control") is not None:
                spots.append((m, b, None))
            if block.get("type") == "tool_result":
                spots.extend((m, b, i) for i, x in enumerate(_blocks(block)) if x.get("cache_control") is not None)
    for m, b, i in spots[:excess]:
        message = body["messages"][m] = {**body["messages"][m]}
        content = message["content"] = list(message["content"])
        if i is None:
            content[b] = {k: v for k, v in content[b].items() if k != "cache_control"}
        else:
            inner = list(content[b]["content"])
            inner[i] = {k: v for k, v in inner[i].items() if k != "cache_control"}
            content[b] = {**content[b], "content": inner}


def _blocks(holder: Any) -> list[dict[str, Any]]:
    """The blocks of a message (or of a tool_result) that are objects."""
    content = holder.get("content") if type(holder) is dict else None
    return [b for b in content if type(b) is dict] if type(content) is list else []


def _breakpoints(body: dict[str, Any]) -> int:
    """The `cache_control` markers of a request: system blocks, tools, the top level (automatic
    caching) and message blocks, tool_result contents included."""
    return _outside_breakpoints(body) + message_breakpoints(body["messages"])


def _outside_breakpoints(body: dict[str, Any]) -> int:
    """The `cache_control` markers of a request but its messages'."""
    n = 0
    for holder in (*system_blocks(body.get("system")), *(body.get("tools") or ()), body):
        if type(holder) is dict and holder.get("cache_control") is not None:
            n += 1
    return n


def message_breakpoints(messages: Sequence[Any]) -> int:
    """The `cache_control` markers of `messages`' blocks, tool_result contents included. Every
    message's blocks are looked at on every turn the body is made whole: a plain loop."""
    n = 0
    for message in messages:
        content = message.get("content") if type(message) is dict else None
        if type(content) is not list:
            continue
        for block in content:
            if type(block) is dict:
                if block.get("cache_control") is not None:
                    n += 1
                inner = block.get("content")
                if type(inner) is list and block.get("type") == "tool_result":
                    n += sum(1 for x in inner if type(x) is dict and x.get("cache_control") is not None)
    return n


# -- the dialect --------------------------------------------------------------------------------


class MessagesDialect(NoAnchor, JSONBody):
    name = "messages"
    transcript_key = "messages"

    def __init__(self) -> None:
        self.codec = MessagesCodec()
        # The split of the last body asked for: a turn asks for its transcript more than once
        # (handler, identity, engine), and splitting costs per message. Held by identity, so a
        # concurrent request's body can only miss it, never get another body's parts.
        self._last: tuple[dict[str, Any], list[Raw]] | None = None

    def transcript(self, body: dict[str, Any]) -> list[Raw]:
        last = self._last
        if last is not None and last[0] is body:
            return last[1]
        if "messages" not in body:
            raise InvalidRequest("messages: Field required", param="messages")
        messages = body["messages"]
        if not isinstance(messages, list):
            raise InvalidRequest("messages: Input should be a valid list", param="messages")
        out = self.transcript_parts(messages)
        self._last = (body, out)
        return out

    @staticmethod
    def transcript_parts(messages: list[Any]) -> list[Raw]:
        """The transcript's items of a `messages` array, message by message: so the parts of an
        array that extends another are the other's and then its new messages' (the body cache,
        proxy/prefix.py, splits only what a request adds)."""
        out: list[Raw] = []
        for message in messages:
            content = message.get("content") if type(message) is dict else None
            if type(content) is list and len(content) > 1 and message.get("role") == "user":
                out.extend(split_message(message))  # it may hold tool_results to part
            else:
                out.append(message)  # the usual message: as it is (split_message's own answer)
        return out

    def validate(self, raws: Sequence[Raw], start: int) -> None:
        for i in range(start, len(raws)):
            _validate_part(raws[i], i)

    def anchor(self, body: dict[str, Any]) -> str | None:
        return None  # a Messages request carries its history

    def detach_anchor(self, body: dict[str, Any]) -> dict[str, Any]:
        return body

    def session_id(self, body: dict[str, Any], headers: Mapping[str, str]) -> str | None:
        named = session_conversation_id(headers.get(SESSION_HEADER))
        if named is not None:
            return named
        metadata = body.get("metadata")
        user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
        if not isinstance(user_id, str) or "session_id" not in user_id:
            return None
        try:
            parsed = orjson.loads(user_id)  # Claude Code: a JSON string holding device, account and session
        except ValueError:
            return None
        return session_conversation_id(parsed.get("session_id")) if isinstance(parsed, dict) else None

    def identity_basis(self, body: dict[str, Any], raws: Sequence[Raw]) -> Any:
        # By meaning: a run keeps its name when a breakpoint moves or a string becomes blocks.
        system = canonical_content(body.get("system"))
        first_user = next(
            (canonical_content(m.get("content")) for m in raws if isinstance(m, dict) and m.get("role") == "user"),
            None,
        )
        return [system, first_user]

    def reply_reserve(self, body: dict[str, Any]) -> int:
        return token_limit(body.get("max_tokens"))

    def fixed_parts(self, body: dict[str, Any]) -> list[str]:
        parts = [str(b.get("text") or "") for b in system_blocks(body.get("system")) if isinstance(b, dict)]
        return parts + tools_text(body)

    def has_tool(self, body: dict[str, Any], name: str) -> bool:
        return has_named_tool(body, name)

    def tool_definition(self, tool: ToolSpec) -> dict[str, Any]:
        return {"name": tool.name, "description": tool.description, "input_schema": tool.parameters}

    def upstream_body(self, body: dict[str, Any], items: Sequence[Item], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        return self.upstream_body_elements(body, items, tools)[0]

    def upstream_body_elements(
        self, body: dict[str, Any], items: Sequence[Item], tools: Sequence[ToolSpec]
    ) -> tuple[dict[str, Any], Elements | None]:
        """`upstream_body`, and its messages as the fast path reuses them (proxy/engine/fastpath.py):
        None when breakpoints had to be taken off (a later body may have to take off others)."""
        firsts: list[int] = []
        messages, notes = rebuild_messages(items, firsts)
        out = {**body, "messages": messages}
        if notes:
            out["system"] = [*system_blocks(body.get("system")), *notes]
        if tools:
            out["tools"] = [*(body.get("tools") or ()), *(self.tool_definition(t) for t in tools)]
        outside, inside = _outside_breakpoints(out), message_breakpoints(messages)
        if outside + inside > MAX_CACHE_BREAKPOINTS:
            limit_breakpoints(out)
            return out, None
        return out, Elements(messages, firsts, inside, MAX_CACHE_BREAKPOINTS - outside)

    def upstream_elements(self, items: Sequence[Item]) -> Elements | None:
        firsts: list[int] = []
        messages, notes = _messages_of(items, firsts)
        return None if notes else Elements(messages, firsts, message_breakpoints(messages))

    def breakpoints(self, sendable: Sequence[Any]) -> int:
        return message_breakpoints(sendable)

    def read_reply(self, data: bytes) -> ReplyRead | None:
        try:
            parsed = orjson.loads(data)
            content = parsed["content"]
            if parsed.get("type") != "message" or not isinstance(content, list):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            log.warning("upstream 2xx reply that is not a message; nothing to persist")
            return None
        usage = parsed.get("usage") if isinstance(parsed.get("usage"), dict) else None
        message = {"role": "assistant", "content": content}
        return ReplyRead(
            [message], list(calls_of(content)), usage, response_id=parsed.get("id"),
            complete=parsed.get("stop_reason") is not None,
        )

    def without_calls(self, data: bytes, reply: ReplyRead, keep: Sequence[Call]) -> tuple[bytes, ReplyRead]:
        parsed = orjson.loads(data)
        kept_ids = {call.id for call in keep}
        parsed["content"] = [
            b for b in parsed["content"] if not (isinstance(b, dict) and b.get("type") == "tool_use") or b.get("id") in kept_ids
        ]
        if not kept_ids and parsed.get("stop_reason") == "tool_use":  # only ours were left: the turn ends
            parsed["stop_reason"] = "end_turn"
        content = parsed["content"]
        message = {"role": "assistant", "content": content}
        return orjson.dumps(parsed), ReplyRead([message], list(calls_of(content)), reply.usage, reply.response_id)

    def relay(self, anchor: str | None = None) -> MessagesRelay:
        return MessagesRelay()

    def error_body(self, exc: ProxyError) -> dict[str, Any]:
        return error_body(exc)


def _validate_part(raw: Any, i: int) -> None:
    """What storing and forwarding need: objects, known roles, blocks with a type, the ids and
    inputs the engine reads. The upstream checks the rest (and its refusal reaches the client)."""
    where = f"messages (part {i})"
    if not isinstance(raw, dict):
        raise InvalidRequest(f"{where}: Input should be an object", param="messages")
    role = raw.get("role")
    if role not in ROLES:
        raise InvalidRequest(f"{where}.role: Input should be 'user', 'assistant' or 'system'", param="messages")
    content = raw.get("content")
    if not isinstance(content, (str, list)):
        raise InvalidRequest(f"{where}.content: Input should be a valid string or list of content blocks", param="messages")
    for block in content if isinstance(content, list) else ():
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise InvalidRequest(f"{where}.content: every block must be an object with a 'type'", param="messages")
        kind = block["type"]
        if kind == "tool_use" and not (
            isinstance(block.get("id"), str) and isinstance(block.get("name"), str) and isinstance(block.get("input"), dict)
        ):
            raise InvalidRequest(f"{where}: a tool_use block needs a string id and name and an object input", param="messages")
        if kind == "tool_result" and not isinstance(block.get("tool_use_id"), str):
            raise InvalidRequest(f"{where}: a tool_result block needs a string tool_use_id", param="messages")
    if too_deep(raw, MAX_DEPTH - 2):
        raise InvalidRequest(f"{where} is nested too deeply", param="messages", code="invalid_json")


MESSAGES = MessagesDialect()
