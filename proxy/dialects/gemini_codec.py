"""The Gemini transcript's items (proxy/dialects/gemini.py says what they are): a user content's
function responses split into items of their own, contents hashed by meaning, their texts read
and rewritten for the stages."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from ..messages import canonical_digest
from ..tokens import IMAGE_TOKENS, PER_MESSAGE, PER_TOOL_CALL
from ..transcript import Call, Item, Raw, Role
from .gemini_stream import SIGNATURE, call_id, calls_of

SIGNATURE_TOKENS = 20  # an opaque blob the model reads back: a flat estimate


def role_of(content: Raw) -> str:
    """A content's role: a content without one is the user's, as the API reads it."""
    return content.get("role") or "user"


def _is_response(part: Any) -> bool:
    return type(part) is dict and "functionResponse" in part


def _response_id(part: dict[str, Any]) -> str | None:
    response = part.get("functionResponse")
    given = response.get("id") if type(response) is dict else None
    return given if isinstance(given, str) and given else None


def split_content(content: Any) -> list[Any]:
    """The stored parts of one client content: the content itself, or for a user content holding
    functionResponse parts, one part per response (see the module docstring)."""
    if type(content) is not dict or role_of(content) != "user":
        return [content]
    parts = content.get("parts")
    if type(parts) is not list or len(parts) < 2 or not any(_is_response(p) for p in parts):
        return [content]
    pieces: list[list[Any]] = []
    waiting: list[Any] = []  # parts before the next response
    for part in parts:
        if not _is_response(part):
            waiting.append(part)
            continue
        last = pieces[-1] if pieces else None
        if last is not None and not waiting and (rid := _response_id(part)) is not None and any(
            _response_id(p) == rid for p in last if _is_response(p)
        ):
            last.append(part)  # the same response again: it goes with its first
            continue
        pieces.append([*waiting, part])
        waiting = []
    if waiting:
        pieces[-1].extend(waiting)
    return [{**content, "parts": piece} for piece in pieces]


def response_part(raw: Raw) -> dict[str, Any] | None:
    """The functionResponse of a TOOL part, else None."""
    parts = raw.get("parts")
    if role_of(raw) != "user" or type(parts) is not list:
        return None
    return next((p["functionResponse"] for p in parts if _is_response(p) and type(p["functionResponse"]) is dict), None)


def is_note(raw: Raw) -> bool:
    """A system note of the proxy's own: a text part it adds to `systemInstruction`."""
    return "parts" not in raw and "text" in raw


# -- meaning, not bytes -------------------------------------------------------------------------


def canonical_parts(parts: Any) -> Any:
    """Parts by meaning: no thought parts (Gemini CLI drops them), no signatures (replayed as
    dummies on `--resume`), no call ids (Gemini CLI adds its own), adjacent texts as one, a
    response sent twice once."""
    if not isinstance(parts, list):
        return parts
    out: list[Any] = []
    for part in parts:
        if not isinstance(part, dict):
            out.append(part)
            continue
        if part.get("thought") is True:
            continue
        part = {k: v for k, v in part.items() if k != SIGNATURE}
        for key in ("functionCall", "functionResponse"):
            if isinstance(part.get(key), dict) and "id" in part[key]:
                part[key] = {k: v for k, v in part[key].items() if k != "id"}
        if set(part) == {"text"}:
            if not part["text"]:
                continue
            if out and isinstance(out[-1], dict) and set(out[-1]) == {"text"}:
                out[-1] = {"text": str(out[-1]["text"]) + str(part["text"])}
                continue
        if out and part == out[-1] and "functionResponse" in part:
            continue
        out.append(part)
    return out


def canonical(raw: Raw) -> Raw:
    return {"role": role_of(raw), "parts": canonical_parts(raw.get("parts"))}


# -- text ---------------------------------------------------------------------------------------


def response_text(response: dict[str, Any]) -> str:
    """A functionResponse's text: its `output` (or `error`) string, else its JSON."""
    body = response.get("response")
    if isinstance(body, dict):
        for key in ("output", "error"):
            if isinstance(body.get(key), str) and len(body) == 1:
                return body[key]
    return orjson.dumps(body).decode()


def _with_response_text(response: dict[str, Any], text: str, append: bool) -> dict[str, Any]:
    """`response` with its text replaced (or `text` appended): in its `output` (or `error`)
    string; a structured response replaced by the JSON object `text` is (the quota's figures
    added to it), else its text goes as `output`."""
    body = response.get("response")
    if isinstance(body, dict) and len(body) == 1:
        key = next(iter(body))
        if key in ("output", "error") and isinstance(body[key], str):
            return {**response, "response": {key: body[key] + text if append else text}}
    if not append and text.startswith("{"):
        try:
            parsed = orjson.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            return {**response, "response": parsed}
    return {**response, "response": {"output": response_text(response) + text if append else text}}


def _text_parts(parts: Any) -> str | None:
    texts = [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str) and not p.get("thought")] if isinstance(parts, list) else []
    return "".join(texts) if texts else None


class GeminiCodec:
    def items(self, raws: Sequence[Raw], seqs: Sequence[int | None], hashes: Sequence[str | None]) -> list[Item]:
        # A response without an id answers the call in its place: the k-th response after a model
        # content, its k-th call (the API's own rule; `raws` start where a unit does).
        out: list[Item] = []
        append = out.append
        open_calls: tuple[Call, ...] = ()
        answered = 0
        system, user, assistant, tool = Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.TOOL  # looked up once (see transcript.Role)
        for raw, seq, digest in zip(raws, seqs, hashes, strict=True):
            if "parts" not in raw and "text" in raw:  # a note of the proxy's (is_note): it stands alone
                append(Item(raw, system, seq, digest))
                continue
            if role_of(raw) == "model":
                open_calls, answered = calls_of(raw.get("parts")), 0
                append(Item(raw, assistant, seq, digest, calls=open_calls))
                continue
            response = response_part(raw)
            if response is None:
                open_calls = ()
                append(Item(raw, user, seq, digest))
                continue
            given = response.get("id")
            if isinstance(given, str) and given:
                answers = given
            else:
                answers = open_calls[answered].id if answered < len(open_calls) else call_id(response)
            answered += 1
            append(Item(raw, tool, seq, digest, answers=answers, joins=True))
        return out

    def hash(self, raw: Raw) -> str:
        return canonical_digest(canonical(raw) if "parts" in raw else raw)

    def text(self, item: Item) -> str | None:
        raw = item.raw
        if is_note(raw):
            return str(raw.get("text") or "")
        if item.role is Role.TOOL:
            response = response_part(raw)
            return response_text(response) if response is not None else None
        return _text_parts(raw.get("parts"))

    def with_text(self, item: Item, text: str) -> Item:
        return item.but(raw=self._changed(item, text, append=False), hash=None)

    def with_appended_text(self, item: Item, text: str) -> Item:
        return item.but(raw=self._changed(item, text, append=True), hash=None)

    @staticmethod
    def _changed(item: Item, text: str, append: bool) -> Raw:
        raw = item.raw
        if is_note(raw):
            return {**raw, "text": (str(raw.get("text") or "") + text) if append else text}
        parts = list(raw.get("parts") or ())
        if item.role is Role.TOOL:  # every copy of its response (a response sent twice stays twice)
            first = response_part(raw)
            rid = call_id(first) if first is not None else None
            parts = [
                {**p, "functionResponse": _with_response_text(p["functionResponse"], text, append)}
                if _is_response(p) and call_id(p["functionResponse"]) == rid else p
                for p in parts
            ]
            return {**raw, "parts": parts}
        if append:
            return {**raw, "parts": [*parts, {"text": text}]}
        # Text replaced: the first text part takes it, the other text parts go; the rest stays in place.
        out, placed = [], False
        for part in parts:
            if isinstance(part, dict) and "text" in part and not part.get("thought"):
                if not placed:
                    out.append({**part, "text": text})
                    placed = True
                continue
            out.append(part)
        return {**raw, "parts": out if placed else [*out, {"text": text}]}

    def counted_parts(self, raw: Raw) -> tuple[tuple[str, ...], int]:
        if is_note(raw):
            return (str(raw.get("text") or ""),), 0
        texts = [role_of(raw)]
        extra = PER_MESSAGE
        for part in raw.get("parts") or ():
            if not isinstance(part, dict):
                continue
            if isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part.get("functionCall"), dict):  # as chat counts a tool call: its id too
                call = part["functionCall"]
                texts.append(str(call.get("id") or ""))
                texts.append(str(call.get("name") or ""))
                texts.append(orjson.dumps(call.get("args")).decode())
                extra += PER_TOOL_CALL
            elif isinstance(part.get("functionResponse"), dict):  # and a tool message: the id it answers
                response = part["functionResponse"]
                texts.append(str(response.get("id") or ""))
                texts.append(str(response.get("name") or ""))
                texts.append(response_text(response))
            elif "inlineData" in part or "fileData" in part:
                extra += IMAGE_TOKENS
            else:  # executable code, its result...: their JSON, as an estimate
                texts.append(orjson.dumps(part).decode())
            if SIGNATURE in part:
                extra += SIGNATURE_TOKENS
        return tuple(texts), extra

    def system_note(self, text: str) -> Item:
        return Item({"text": text}, Role.SYSTEM)

    def user_note(self, text: str) -> Item:
        return Item({"role": "user", "parts": [{"text": text}]}, Role.USER)

    def tool_result(self, call: Call, text: str) -> Item:
        response: dict[str, Any] = {"name": call.name, "response": {"output": text}}
        if not call.id.startswith("#"):  # an id the model or the client gave the call
            response = {"id": call.id, **response}
        return Item({"role": "user", "parts": [{"functionResponse": response}]}, Role.TOOL, answers=call.id, joins=True)
