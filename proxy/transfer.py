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
"""

from __future__ import annotations

from typing import Any

from .identity import CONVERSATION_ID, ConversationKey
from .store import LIVE, Conversation, ConversationDump, InboxMessage, RequestPart, Store, StoredMessage, Summary

FORMAT = "context-proxy.conversation"
VERSION = 1


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
        "marks": c.marks,
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


def dump_from_json(doc: Any) -> ConversationDump:
    """The dump an export document describes; InvalidExport, naming what is wrong, otherwise."""
    if not isinstance(doc, dict) or doc.get("object") != FORMAT:
        raise InvalidExport(f"not a conversation export (its 'object' must be {FORMAT!r})")
    if doc.get("version") != VERSION:
        raise InvalidExport(f"export version {doc.get('version')!r} is not one this proxy reads ({VERSION})")
    try:
        key = ConversationKey(_name(doc["tenant"], "tenant"), _name(doc["id"], "id"))
        messages = [
            StoredMessage(
                _int(m["seq"]), _object(m["message"]), _str(m["hash"]), _str(m["status"]), _number(m["created_at"])
            )
            for m in _list(doc["messages"])
        ]
        rewrites = {_key(seq): _str(content) for seq, content in _object(doc["rewrites"]).items()}
        summaries = []
        for raw in _list(doc["summaries"]):
            if set(_object(raw)) - set(SUMMARY_PARTS) != set(SUMMARY_FIELDS):
                raise InvalidExport(f"a summary must have exactly the fields {sorted(SUMMARY_FIELDS)} (and {sorted(SUMMARY_PARTS)})")
            fields = {name: check(raw[name]) for name, check in (SUMMARY_FIELDS | SUMMARY_PARTS).items() if name in raw}
            summaries.append(Summary.from_record(fields))
        conversation = Conversation(
            key,
            created_at=_number(doc["created_at"]),
            updated_at=_number(doc["updated_at"]),
            next_seq=len(messages) + 1,
            live=[(m.seq, m.hash) for m in messages if m.status == LIVE],
            llm_calls=_int(doc["llm_calls"]),
            first_forwarded={_key(seq): _int(calls) for seq, calls in _object(doc["first_forwarded"]).items()},
            rewritten=frozenset(rewrites),
            boundary=_int(doc["boundary"]),
            summary_id=_optional_int(doc["summary_id"]),
            marks={_str(name): _int(seq) for name, seq in _object(doc["marks"]).items()},
            # What describes it to people: absent from the exports of a proxy before these fields.
            title=_optional_str(doc.get("title")),
            task=_optional_str(doc.get("task")),
            model=_optional_str(doc.get("model")),
            client=_optional_str(doc.get("client")),
            turns=len(_list(doc["turns"])),
            failures=_int(doc.get("failures", 0)),
            last_error=None if doc.get("last_error") is None else _object(doc["last_error"]),
        )
        turns = [_object(t) for t in _list(doc["turns"])]
        responses = {_str(rid): _int(seq) for rid, seq in _object(doc["responses"]).items()}
        inbox = [_inbox_message(_object(m)) for m in _list(doc.get("inbox", []))]  # none in older exports
        parts = [_request_part(_object(p)) for p in _list(doc.get("request_parts", []))]  # none in older exports
        dump = ConversationDump(conversation, messages, rewrites, summaries, turns, responses, inbox, parts)
        dump.check()
    except KeyError as exc:
        raise InvalidExport(f"the export has no {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise InvalidExport(str(exc)) from None
    return dump


def _inbox_message(raw: dict[str, Any]) -> InboxMessage:
    return InboxMessage(
        _int(raw["id"]), _str(raw["content"]), _str(raw["note"]), _number(raw["created_at"]), _str(raw["status"]),
        _optional_int(raw["seq"]), None if raw["placement"] is None else _str(raw["placement"]),
        _optional_int(raw["turn"]), None if raw["delivered_at"] is None else _number(raw["delivered_at"]),
    )


def _request_part(raw: dict[str, Any]) -> RequestPart:
    if set(raw) != {"kind", "hash", "value", "created_at"}:
        raise InvalidExport("a request part must have exactly the fields ['created_at', 'hash', 'kind', 'value']")
    return RequestPart(_str(raw["kind"]), _str(raw["hash"]), raw["value"], _number(raw["created_at"]))


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
    "text": _str, "first_seq": _int, "last_seq": _int, "strategy": _str, "model": _str,
    "tokens_in": _int, "tokens_out": _int, "created_at": _number, "id": _int,
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


def _optional_str(value: Any) -> str | None:
    return None if value is None else _str(value)


# A summary's parts kept as data; an export written before them has none.
SUMMARY_PARTS = {
    "facts": _records({"value": _str, "named": _int, "seen": _int, "last_seq": _int}),
    "user_messages": _records({"seq": _int, "text": _str, "chars": _int, "ref": _optional_str}),
    "user_messages_omitted": _int,
}
