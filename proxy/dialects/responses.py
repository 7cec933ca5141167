"""The Responses API (`POST /v1/responses`): the Agents SDK's default, and Codex CLI's only format.

Items and their units: responses_codec.py. A reply is a `response` object whose output items
join the transcript; a stream is `event:`/`data:` SSE with contiguous `sequence_number`s
(responses_stream.py).

History: a client either resends everything (Codex: `store: false`, reasoning included), or
sends `previous_response_id` with only the new items; the proxy then builds the input from its
own store and never forwards the id, so the upstream needs no server-side state. The reply the
client sees says the id it sent, as the real API's does (`echo_anchor`, the relay's `echo`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from ..errors import InvalidRequest, ProxyError, error_body
from ..identity import session_conversation_id
from ..messages import MAX_DEPTH, too_deep
from ..transcript import Call, Item, Raw
from .base import JSONBody, ReplyRead, ToolSpec, has_named_tool, token_limit, tools_text
from .responses_codec import CALLS, CODEC, MESSAGE_ROLES, RESULTS, item_type, reply_read, without_calls
from .responses_stream import ResponsesRelay

log = logging.getLogger("proxy.responses")


class ResponsesDialect(JSONBody):
    name = "responses"
    transcript_key = "input"
    items_sent_alone = True  # upstream_body sends each item as it alone says: bodies can be spliced (fastpath.py)
    names_replies = True  # previous_response_id
    session_header = "session-id"  # Codex's
    # An agent's first reply is often calls alone (its reasoning item before them): an assistant
    # message may come many turns later. The calls first: most runs make one early.
    reply_markers = (b'"function_call"', b'"custom_tool_call"', b'"assistant"')
    # Codex's analytics: each request's turn ids and time, its keys in a new order every time.
    volatile_fields = frozenset({"client_metadata"})

    def __init__(self) -> None:
        self.codec = CODEC

    def transcript(self, body: dict[str, Any]) -> list[Raw]:
        given = body.get("input")
        if isinstance(given, str):
            return [{"role": "user", "content": given}]
        if given is None:
            raise InvalidRequest("Missing required parameter: 'input'.", param="input", code="missing_required_parameter")
        if not isinstance(given, list):
            raise InvalidRequest("'input' must be a string or an array of input items", param="input")
        return given

    def validate(self, raws: Sequence[Raw], start: int) -> None:
        for i in range(start, len(raws)):
            _validate_item(raws[i], f"input[{i}]")

    def anchor(self, body: dict[str, Any]) -> str | None:
        """The response this request continues (`previous_response_id`), if any."""
        value = body.get("previous_response_id")
        return value if isinstance(value, str) and value else None

    def detach_anchor(self, body: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in body.items() if k != "previous_response_id"}

    def session_id(self, body: dict[str, Any], headers: Mapping[str, str]) -> str | None:
        # Codex names its session in a header and as the prompt cache key; both stay the same across resume.
        return self.session_hint(headers) or session_conversation_id(body.get("prompt_cache_key"))

    def identity_basis(self, body: dict[str, Any], raws: Sequence[Raw]) -> Any:
        system: list[Any] = []
        leading, first_user = True, None
        for raw in raws:  # the leading system prompt only, and up to the first user message
            if not isinstance(raw, dict):
                continue
            message = item_type(raw) == "message"
            if leading and message and raw.get("role") in ("system", "developer"):
                system.append(raw.get("content"))
                continue
            leading = False
            if message and raw.get("role") == "user":
                first_user = raw.get("content")
                break
        return ["responses", body.get("instructions"), system, first_user]

    def reply_reserve(self, body: dict[str, Any]) -> int:
        return token_limit(body.get("max_output_tokens"))

    def fixed_parts(self, body: dict[str, Any]) -> list[str]:
        parts = []
        if isinstance(body.get("instructions"), str) and body["instructions"]:
            parts.append(body["instructions"])
        return parts + tools_text(body)

    def has_tool(self, body: dict[str, Any], name: str) -> bool:
        return has_named_tool(body, name)

    def tool_definition(self, tool: ToolSpec) -> dict[str, Any]:
        return {"type": "function", "name": tool.name, "description": tool.description,
                "parameters": tool.parameters, "strict": False}

    def upstream_body(self, body: dict[str, Any], items: Sequence[Item], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        out = {**body, "input": [item.raw for item in items]}
        if tools:
            out["tools"] = [*(body.get("tools") or ()), *(self.tool_definition(t) for t in tools)]
        return out

    def read_reply(self, data: bytes) -> ReplyRead | None:
        try:
            response = orjson.loads(data)
            output = response["output"]
            if not isinstance(output, list):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            log.warning("upstream 2xx reply without an output list; nothing to persist")
            return None
        return reply_read(response)

    def without_calls(self, data: bytes, reply: ReplyRead, keep: Sequence[Call]) -> tuple[bytes, ReplyRead]:
        response = orjson.loads(data)
        response["output"] = without_calls(response["output"], {c.id for c in keep})
        return orjson.dumps(response), reply_read(response)

    def relay(self, anchor: str | None = None) -> ResponsesRelay:
        return ResponsesRelay({"previous_response_id": anchor} if anchor is not None else None)

    def echo_anchor(self, data: bytes, anchor: str) -> bytes:
        response = orjson.loads(data)
        if not isinstance(response, dict) or response.get("previous_response_id") == anchor:
            return data
        return orjson.dumps({**response, "previous_response_id": anchor})

    def error_body(self, exc: ProxyError) -> dict[str, Any]:
        return error_body(exc.message, exc.type, exc.code, exc.param)


def _validate_item(raw: Any, where: str) -> None:
    if not isinstance(raw, dict):
        raise InvalidRequest(f"Invalid type for '{where}': expected an object.", param=where)
    kind = item_type(raw)
    if not kind:
        raise InvalidRequest(f"Missing required parameter: '{where}.type'.", param=f"{where}.type")
    if kind == "message":
        if raw.get("role") not in MESSAGE_ROLES:
            raise InvalidRequest(f"Invalid value for '{where}.role': expected one of {sorted(MESSAGE_ROLES)}.", param=f"{where}.role")
        content = raw.get("content")
        if not isinstance(content, (str, list)) or (
            isinstance(content, list) and not all(isinstance(p, dict) and isinstance(p.get("type"), str) for p in content)
        ):
            raise InvalidRequest(f"Invalid '{where}.content': a string or an array of typed parts.", param=f"{where}.content")
    elif kind in CALLS:
        if not isinstance(raw.get("call_id"), str) or not isinstance(raw.get("name"), str):
            raise InvalidRequest(f"'{where}' needs a string 'call_id' and 'name'.", param=where)
        if kind == "function_call" and not isinstance(raw.get("arguments"), str):
            raise InvalidRequest(f"Invalid type for '{where}.arguments': expected a string.", param=f"{where}.arguments")
    elif kind in RESULTS and (not isinstance(raw.get("call_id"), str) or not isinstance(raw.get("output"), (str, list))):
        raise InvalidRequest(f"'{where}' needs a string 'call_id' and an 'output'.", param=where)
    if too_deep(raw, MAX_DEPTH - 2):
        raise InvalidRequest(f"{where} is nested too deeply", param=where, code="invalid_json")


RESPONSES = ResponsesDialect()
