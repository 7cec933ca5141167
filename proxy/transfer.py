"""Moving a conversation between stores (`context-proxy export` / `import`): its whole record read
from one store, as a JSON document, and written into another, diskcache or Redis, losslessly.

The document holds what the store holds: every message with its seq, status, hash and time, the
rewrites, the first-forwarded quota marks, the pipeline's marks (where the window and mask cut),
the boundary and current summary, every summary, every turn record, the response ids that name
its replies (`previous_response_id`), every inbox message and where it was delivered, every
system prompt and tools list its turns sent (`request_parts`, checked against their hashes on
import), the LLM-call count and the times; the tenant and id are kept. Refs are not in it: they are HMACs of (tenant, id, seq) under each store's own secret,
derived whenever they are shown, so after an import every ref the proxy shows or answers is the
target store's.

An import trusts the file no more than the API trusts a request (a file may come from anyone):
`dump_from_json` checks every part against the API's own rules (ids, the sizes of titles,
messages and counts, ranges, nesting depth, types) and rebuilds each inbox note, what the model
reads, from the message's content and time; `check_owners` refuses a response id another
conversation of the store answers to. The CLI writes nothing unless every check passes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import orjson

from .config import Settings
from .errors import InvalidRequest
from .identity import CONVERSATION_ID, ConversationKey
from .markers import inbox_note
from .messages import MAX_DEPTH, too_deep
from .refs import RefSigner
from .store import LIVE, SEQ_LISTS, Conversation, ConversationDump, InboxMessage, RequestPart, Store, StoredMessage, Summary
from .titles import MAX_TASK_CHARS, check_title

FORMAT = "context-proxy.conversation"
VERSION = 1
MAX_NAME_CHARS = 256  # a model's or client's name, a response id, a mark's name, a hash
MAX_RECORD_DEPTH = 16  # a turn record, a last error: flat records of the proxy's own


class InvalidExport(ValueError):
    """A file that is not a conversation export this version can read."""


async def read_dump(store: Store, key: ConversationKey) -> ConversationDump | None:
    """Everything `store` holds of the conversation (take its lock first for a consistent read)."""
    conversation = await store.get(key)
    if conversation is None:
        return None
    turns = await store.turn_records(key)
    responses = {}
    for response_id in (r["response_id"] for r in turns if r.get("response_id")):
        owner = await store.response_owner(key.tenant, response_id)
        if owner is not None and owner[0] == key.id:
            responses[response_id] = owner[1]
    return ConversationDump(
        conversation=conversation,
        messages=await store.messages(key, live_only=False),
        rewrites=await store.rewrites(key, sorted(conversation.rewritten)),
        summaries=await store.summaries(key),
        turns=turns,
        responses=responses,
        inbox=await store.inbox(key),
        parts=await store.request_parts(key),
    )


def dump_to_json(dump: ConversationDump) -> dict[str, Any]:
    c = dump.conversation
    return {
        "object": FORMAT,
        "version": VERSION,
        "tenant": c.key.tenant,
        "id": c.key.id,
        "created_at": c.created_at,
        "updated_at": c.updated_at,
        "llm_calls": c.llm_calls,
        "boundary": c.boundary,
        "summary_id": c.summary_id,
        "marks": dict(sorted(c.marks.items())),  # in one order whatever the backend keeps them in
        **c.description(),
        "messages": [
            {"seq": m.seq, "status": m.status, "hash": m.hash, "created_at": m.created_at, "message": m.message}
            for m in dump.messages
        ],
        "first_forwarded": {str(seq): calls for seq, calls in sorted(c.first_forwarded.items())},
        "rewrites": {str(seq): content for seq, content in sorted(dump.rewrites.items())},
        "summaries": [s.to_record() for s in dump.summaries],
        "turns": dump.turns,
        "responses": dump.responses,
        "inbox": [{k: v for k, v in m.to_api().items() if k != "object"} | {"note": m.note} for m in dump.inbox],
        "request_parts": [p.to_record() for p in dump.parts],
    }


def dump_from_json(doc: Any, settings: Settings) -> ConversationDump:
    """The dump an export document describes, checked as the API checks what it stores
    (`settings`: its bounds); InvalidExport, naming what is wrong, otherwise."""
    if not isinstance(doc, dict) or doc.get("object") != FORMAT:
        raise InvalidExport(f"not a conversation export (its 'object' must be {FORMAT!r})")
    if doc.get("version") != VERSION:
        raise InvalidExport(f"export version {doc.get('version')!r} is not one this proxy reads ({VERSION})")
    try:
        key = ConversationKey(_name(doc["tenant"], "tenant"), _name(doc["id"], "id"))
        messages = [_message(_object(m), settings) for m in _list(doc["messages"])]
        live = [(m.seq, m.hash) for m in messages if m.status == LIVE]
        if len(live) > settings.server.max_messages:
            raise InvalidExport(f"{len(live)} live messages: more than server.max_messages ({settings.server.max_messages})")
        rewrites = {_key(seq): _text(content, settings) for seq, content in _object(doc["rewrites"]).items()}
        summaries = []
        for raw in _list(doc["summaries"]):
            if set(_object(raw)) - set(SUMMARY_PARTS) != set(SUMMARY_FIELDS):
                raise InvalidExport(f"a summary must have exactly the fields {sorted(SUMMARY_FIELDS)} (and {sorted(SUMMARY_PARTS)})")
            fields = {name: check(raw[name]) for name, check in (SUMMARY_FIELDS | SUMMARY_PARTS).items() if name in raw}
            _bounded(fields["text"], settings, "a summary's text")
            summaries.append(Summary.from_record(fields))
        llm_calls = _count(doc["llm_calls"])
        turns = [_turn_record(t) for t in _list(doc["turns"])]
        conversation = Conversation(
            key,
            created_at=_time(doc["created_at"]),
            updated_at=_time(doc["updated_at"]),
            next_seq=len(messages) + 1,
            live=live,
            llm_calls=llm_calls,
            first_forwarded={_key(seq): _count(calls) for seq, calls in _object(doc["first_forwarded"]).items()},
            rewritten=frozenset(rewrites),
            boundary=_count(doc["boundary"]),
            summary_id=_optional_int(doc["summary_id"]),
            marks={_short(name): _count(seq) for name, seq in _object(doc["marks"]).items()},
            # What describes it to people: absent from the exports of a proxy before these fields.
            title=_title(doc.get("title")),
            task=_optional_str(doc.get("task")),
            model=_optional_short(doc.get("model")),
            client=_optional_short(doc.get("client")),
            turns=len(turns),
            failures=_count(doc.get("failures", 0)),
            last_error=None if doc.get("last_error") is None else _record(doc["last_error"], "last_error"),
        )
        if conversation.task is not None and len(conversation.task) > MAX_TASK_CHARS:
            raise InvalidExport(f"the task is longer than {MAX_TASK_CHARS} characters")
        if any(calls > llm_calls for calls in conversation.first_forwarded.values()):
            raise InvalidExport("a first-forwarded mark counts more LLM calls than the conversation made")
        responses = {_short(rid): _int(seq) for rid, seq in _object(doc["responses"]).items()}
        inbox = [_inbox_message(_object(m), settings) for m in _list(doc.get("inbox", []))]  # none in older exports
        parts = [_request_part(_object(p)) for p in _list(doc.get("request_parts", []))]  # none in older exports
        dump = ConversationDump(conversation, messages, rewrites, summaries, turns, responses, inbox, parts)
        dump.check()
        if any(q.ref is not None and not 1 <= q.seq <= len(messages) for s in summaries for q in s.user_messages):
            raise InvalidExport("a summary quotes a message the conversation does not have")
    except KeyError as exc:
        raise InvalidExport(f"the export has no {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise InvalidExport(str(exc)) from None
    except InvalidRequest as exc:  # the API's own check (of a title)
        raise InvalidExport(exc.message) from None
    return dump


def with_refs_of(dump: ConversationDump, refs: RefSigner) -> ConversationDump:
    """`dump` with the refs its summaries quote made anew under `refs` (the target store's): a ref
    is a conversation's own only under its store's secret, whatever the file said."""
    key = dump.conversation.key
    summaries = [
        dataclasses.replace(s, user_messages=[
            q if q.ref is None else dataclasses.replace(q, ref=refs.make(key, q.seq)) for q in s.user_messages
        ])
        for s in dump.summaries
    ]
    return dataclasses.replace(dump, summaries=summaries)


class OwnedElsewhere(Exception):
    """The export names something another conversation of the store owns."""


async def check_owners(store: Store, dump: ConversationDump) -> None:
    """Refuse a response id another conversation of the tenant answers to: the import would take
    that conversation's next `previous_response_id` request (and send it the file's history)."""
    key = dump.conversation.key
    for response_id in dump.responses:
        owner = await store.response_owner(key.tenant, response_id)
        if owner is not None and owner[0] != key.id:
            raise OwnedElsewhere(f"response id {response_id!r} belongs to conversation {owner[0]!r} of this tenant")


def _message(raw: dict[str, Any], settings: Settings) -> StoredMessage:
    message = _object(raw["message"])
    seq = _int(raw["seq"])
    if too_deep(message, MAX_DEPTH - 2):
        raise InvalidExport(f"message {seq} is nested too deeply")
    if len(orjson.dumps(message)) > settings.server.max_body_mb * 2**20:
        raise InvalidExport(f"message {seq} is larger than server.max_body_mb ({settings.server.max_body_mb} MB)")
    return StoredMessage(seq, message, _short(raw["hash"]), _str(raw["status"]), _time(raw["created_at"]))


def _inbox_message(raw: dict[str, Any], settings: Settings) -> InboxMessage:
    """An inbox message; its note (what the model reads) made from its content, as a POST makes it:
    a file's own note could say anything while /ui shows the content."""
    content, created_at = _str(raw["content"]), _time(raw["created_at"])
    if not content.strip() or len(content) > settings.inbox.max_message_chars:
        raise InvalidExport(f"an inbox message must be 1-{settings.inbox.max_message_chars} characters (inbox.max_message_chars)")
    _str(raw["note"])
    return InboxMessage(
        _int(raw["id"]), content, inbox_note(content, created_at), created_at, _str(raw["status"]),
        _optional_int(raw["seq"]), None if raw["placement"] is None else _str(raw["placement"]),
        _optional_int(raw["turn"]), None if raw["delivered_at"] is None else _time(raw["delivered_at"]),
    )


def _request_part(raw: dict[str, Any]) -> RequestPart:
    if set(raw) != {"kind", "hash", "value", "created_at"}:
        raise InvalidExport("a request part must have exactly the fields ['created_at', 'hash', 'kind', 'value']")
    return RequestPart(_str(raw["kind"]), _str(raw["hash"]), raw["value"], _number(raw["created_at"]))


def _count(value: Any) -> int:
    """A count or a seq: a non-negative integer."""
    if _int(value) < 0:
        raise InvalidExport(f"expected a count (0 or more), not {_show(value)}")
    return value


def _time(value: Any) -> float:
    number = _number(value)
    if not math.isfinite(number) or number < 0:
        raise InvalidExport(f"expected a time (seconds since 1970), not {_show(value)}")
    return number


def _short(value: Any) -> str:
    """A name or id: at most MAX_NAME_CHARS, no control characters."""
    text = _str(value)
    if len(text) > MAX_NAME_CHARS or not text.isprintable():
        raise InvalidExport(f"expected a name of at most {MAX_NAME_CHARS} printable characters, not {_show(value)}")
    return text


def _optional_short(value: Any) -> str | None:
    return None if value is None else _short(value)


def _title(value: Any) -> str | None:
    return check_title(value, "title")  # the API's rule: InvalidRequest, made InvalidExport above


def _text(value: Any, settings: Settings) -> str:
    return _bounded(_str(value), settings, "a stored rewrite")


def _bounded(text: str, settings: Settings, what: str) -> str:
    if len(text) > settings.server.max_body_mb * 2**20:
        raise InvalidExport(f"{what} is larger than server.max_body_mb ({settings.server.max_body_mb} MB)")
    return text


def _record(value: Any, what: str) -> dict[str, Any]:
    """A record of the proxy's own (a turn record, an error): an object, flat enough, its counts
    counts and its title and task as the API would have them."""
    record = _object(value)
    if too_deep(record, MAX_RECORD_DEPTH):
        raise InvalidExport(f"{what} is nested too deeply")
    for name in RECORD_COUNTS:
        if record.get(name) is not None:
            _count(record[name])
    if "title" in record:
        _title(record["title"])
    if record.get("task") is not None and len(_str(record["task"])) > MAX_TASK_CHARS:
        raise InvalidExport(f"{what}'s task is longer than {MAX_TASK_CHARS} characters")
    return record


def _turn_record(value: Any) -> dict[str, Any]:
    """A turn record: a `_record` whose seq lists are lists of seqs (never a store's own form of
    them: proxy/seqruns.py)."""
    record = _record(value, "a turn record")
    for name in SEQ_LISTS:
        if name in record and not (isinstance(record[name], list) and all(type(s) is int and s > 0 for s in record[name])):
            raise InvalidExport(f"a turn record's {name!r} must be a list of message seqs")
    return record


# A turn record's counts (engine/report.py): none is ever negative.
RECORD_COUNTS = (
    "turn", "tokens_sent", "tokens_sent_total", "messages_left_out", "truncated", "masked", "repairs", "llm_calls",
    "llm_call_limit", "read_rounds", "reply_seq",
)


def _optional_int(value: Any) -> int | None:
    return None if value is None else _int(value)


def _optional_str(value: Any) -> str | None:
    return None if value is None else _str(value)


def _name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not CONVERSATION_ID.fullmatch(value) or set(value) == {"."}:
        raise InvalidExport(f"{what} must be 1-128 characters of A-Z a-z 0-9 . _ : -")
    return value


def _int(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidExport(f"expected an integer, not {_show(value)}")
    return value


def _key(value: str) -> int:
    """A seq as a JSON object key."""
    if not value.isdigit():
        raise InvalidExport(f"expected a seq as the key, not {_show(value)}")
    return int(value)


def _number(value: Any) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise InvalidExport(f"expected a number, not {_show(value)}")
    return value


def _str(value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidExport(f"expected a string, not {_show(value)}")
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise InvalidExport("expected a JSON object")
    return value


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidExport("expected a JSON array")
    return value


SUMMARY_FIELDS = {
    "text": _str, "first_seq": _count, "last_seq": _count, "strategy": _short, "model": _short,
    "tokens_in": _count, "tokens_out": _count, "created_at": _time, "id": _int,
}  # Summary's fields, each with its check


def _records(fields: dict[str, Any]) -> Any:
    """A check of a list of objects with exactly `fields` (name -> check)."""

    def check(value: Any) -> list[dict[str, Any]]:
        out = []
        for item in _list(value):
            if set(_object(item)) != set(fields):
                raise InvalidExport(f"expected objects with exactly the fields {sorted(fields)}")
            out.append({name: part(item[name]) for name, part in fields.items()})
        return out

    return check


# A summary's parts kept as data; an export written before them has none.
SUMMARY_PARTS = {
    "facts": _records({"value": _str, "named": _count, "seen": _count, "last_seq": _count}),
    "user_messages": _records({"seq": _count, "text": _str, "chars": _count, "ref": _optional_str}),
    "user_messages_omitted": _count,
}
