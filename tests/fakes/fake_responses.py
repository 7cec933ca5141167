"""The Responses API (``POST /v1/responses``) of the scripted fake upstream.

``FakeUpstream`` serves it beside Chat Completions, from the same queue and responder: a test
enqueues ``Reply`` objects whatever the format, and this module renders them as the real API
does — a ``response`` object, or SSE with ``event:`` lines, contiguous ``sequence_number``s and
no ``[DONE]``. A reply's ``reasoning`` becomes a ``reasoning`` item before its message and calls,
with ``encrypted_content`` when ``include`` asks for it.

Strict (``responses_checks``) and stateful like the real API: a response made with ``store`` not
false is kept, and ``previous_response_id`` / ``item_reference`` resolve against what was kept
(per fake, until ``FakeUpstream.reset()``). A reasoning item's ``encrypted_content`` seals (a MAC
under a fixed key) its id and the item that followed it, so one that comes back altered, or
without that item, is refused — by any fake, so recorded client sessions replay.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
import time
from typing import Any

from tests.fakes.fake_upstream import (
    SERVER_ERROR,
    InvalidRequest,
    Reply,
    SseScript,
    _estimate_tokens,
    _split,
    _text_of,
)
from tests.fakes.responses_checks import IssuedReasoning, check_chain, check_request, item_type

__all__ = ["ResponsesAPI", "response_events", "sse_event"]


class ResponsesAPI:
    """The ``WireFormat`` of ``POST /v1/responses``, with the state the real API keeps.

    ``check`` runs on the request before a reply is taken; ``reply_body`` / ``reply_stream``
    render the reply and keep what the real server would (the response, its reasoning)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._chains: dict[str, list[dict]] = {}  # stored response id -> its input + output
        self._items: dict[str, dict] = {}  # id -> an item of a stored response
        self._reasoning: dict[str, IssuedReasoning] = {}  # reasoning of the stored responses
        self._prompts: dict[str, list[tuple[str, int]]] = {}  # cache key -> last prompt's segments

    def reset(self) -> None:
        with self._lock:
            self._chains.clear()
            self._items.clear()
            self._reasoning.clear()
            self._prompts.clear()

    def stored(self, response_id: str) -> list[dict] | None:
        """The items a stored response stands for (its resolved input, then its output)."""
        with self._lock:
            chain = self._chains.get(response_id)
            return list(chain) if chain is not None else None

    # -- Ledger --

    def open_reasoning(self, item_id: str, encrypted_content: str) -> IssuedReasoning | None:
        return unseal_reasoning(item_id, encrypted_content)

    def stored_reasoning(self, item_id: str) -> IssuedReasoning | None:
        with self._lock:
            return self._reasoning.get(item_id)

    # -- WireFormat --

    def check(self, body: Any) -> InvalidRequest | None:
        refusal = check_request(body)
        if refusal:
            return refusal
        chain, refusal = self._resolve(body)
        return refusal or check_chain(chain, self)

    def reply_body(self, body: dict, reply: Reply) -> dict[str, Any]:
        return self._answer(body, reply)

    def reply_stream(self, body: dict, reply: Reply) -> SseScript:
        response = self._answer(body, reply)
        events = response_events(response, reply.chunk_size)

        def failure(sent: int) -> bytes:
            return sse_event(_failure_event(response, events[:sent], reply.failure, sent))

        return SseScript([sse_event(event) for event in events], 1, failure)

    # -- state --

    def _resolve(self, body: dict) -> tuple[list[dict], InvalidRequest | None]:
        """The whole input the model sees: the stored chain, then the new items."""
        chain: list[dict] = []
        previous = body.get("previous_response_id")
        with self._lock:
            if previous is not None:
                if previous not in self._chains:
                    return [], InvalidRequest(
                        f"Previous response with id '{previous}' not found.",
                        "previous_response_id",
                        "previous_response_not_found",
                    )
                chain = list(self._chains[previous])
            for index, item in enumerate(input_items(body)):
                if item_type(item) != "item_reference":
                    chain.append(item)
                elif item["id"] in self._items:
                    chain.append(self._items[item["id"]])
                else:
                    return [], InvalidRequest(f"Item with id '{item['id']}' not found.", f"input[{index}]")
        return chain, None

    def _answer(self, body: dict, reply: Reply) -> dict[str, Any]:
        """The completed response to ``body``, kept with its reasoning when ``store`` is not
        false and the reply is scripted to complete."""
        chain, _ = self._resolve(body)  # checked already: it resolves
        include_encrypted = "reasoning.encrypted_content" in (body.get("include") or [])
        output, issued = output_items(reply, include_encrypted)
        response = response_object(body, output, self._usage(body, chain, reply))
        completes = reply.error_after_chunks is None and not reply.never_ends
        if completes and body.get("store") is not False:
            with self._lock:
                self._reasoning.update(issued)
                self._chains[response["id"]] = chain + output
                self._items.update((item["id"], item) for item in chain + output if item.get("id"))
        return response

    def _usage(self, body: dict, chain: list[dict], reply: Reply) -> dict[str, Any]:
        """Input tokens estimated over the whole prompt (instructions and tools included);
        cached tokens: the items this prompt shares, from the start, with the previous prompt of
        its ``prompt_cache_key`` (a simple model of the real prompt cache)."""
        head = (body.get("instructions") or "") + (json.dumps(body["tools"]) if body.get("tools") else "")
        segments = [(head, _estimate_tokens(head) if head else 0)]
        segments += [(json.dumps(item), 4 + _estimate_tokens(_item_text(item))) for item in chain]
        bucket = body.get("prompt_cache_key") or body["model"]
        with self._lock:
            previous = self._prompts.get(bucket, [])
            self._prompts[bucket] = segments
        cached = 0
        for (text, tokens), (earlier, _) in zip(segments, previous):
            if text != earlier:
                break
            cached += tokens
        reasoning = _estimate_tokens(reply.reasoning) if reply.reasoning else 0
        output = reasoning + _estimate_tokens(
            (reply.content or "") + "".join(call.name + call.arguments for call in reply.calls)
        )
        prompt = sum(tokens for _, tokens in segments)
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": output,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": prompt + output,
        }


def input_items(body: dict) -> list[dict]:
    """``input`` as a list of items: a string is one user message."""
    given = body.get("input")
    if given is None:
        return []
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    return given


def _item_text(item: dict) -> str:
    kind = item_type(item)
    if kind == "message":
        return _text_of(item.get("content"))
    if kind == "function_call":
        return item["name"] + item["arguments"]
    if kind in ("function_call_output", "custom_tool_call_output"):
        return _text_of(item["output"])
    if kind == "reasoning":
        return "".join(part["text"] for part in item["summary"])
    return json.dumps(item)


# --------------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------------


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"


def output_items(reply: Reply, include_encrypted: bool) -> tuple[list[dict], dict[str, IssuedReasoning]]:
    """The output items of ``reply`` (reasoning, message, calls, in that order) and the
    reasoning issued with them."""
    items: list[dict] = []
    if reply.content is not None:
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": reply.content}
        items.append({"id": _new_id("msg"), "type": "message", "status": "completed",
                      "content": [part], "role": "assistant"})
    for call in reply.calls:
        items.append({"id": "fc_" + call.id.removeprefix("call_"), "type": "function_call",
                      "status": "completed", "arguments": call.arguments, "call_id": call.id,
                      "name": call.name})
    if reply.reasoning is None:
        return items, {}
    reasoning = {"id": _new_id("rs"), "type": "reasoning",
                 "summary": [{"type": "summary_text", "text": reply.reasoning}]}
    following = items[0] if items else {"id": "", "type": ""}
    issued = IssuedReasoning(following["id"], following["type"])
    if include_encrypted:
        reasoning["encrypted_content"] = seal_reasoning(reasoning["id"], issued)
    return [reasoning, *items], {reasoning["id"]: issued}


# Fixed, not per fake: content sealed in a recorded session opens in any later test.
SEAL_KEY = b"context-proxy tests: the fake upstream's reasoning seal"
SEAL_PREFIX = "gAAAAAB"  # what the real API's Fernet tokens start with


def seal_reasoning(item_id: str, issued: IssuedReasoning) -> str:
    """Opaque ``encrypted_content`` for a reasoning item: its id and following item, MAC'd."""
    payload = json.dumps(
        {"id": item_id, "following_id": issued.following_id, "following_type": issued.following_type,
         "nonce": secrets.token_hex(16)},
        separators=(",", ":"),
    ).encode()
    mac = hmac.new(SEAL_KEY, payload, hashlib.sha256).digest()
    return SEAL_PREFIX + base64.urlsafe_b64encode(mac + payload).decode()


def unseal_reasoning(item_id: str, sealed: str) -> IssuedReasoning | None:
    """What ``seal_reasoning`` sealed for ``item_id``; None if the content was changed at all."""
    try:
        raw = base64.urlsafe_b64decode(sealed.removeprefix(SEAL_PREFIX).encode())
    except ValueError:
        return None
    mac, payload = raw[:32], raw[32:]
    # Byte for byte: base64 decoding forgives some edits (padding, whitespace) that re-encoding shows.
    exact = sealed == SEAL_PREFIX + base64.urlsafe_b64encode(raw).decode()
    if not exact or not hmac.compare_digest(mac, hmac.new(SEAL_KEY, payload, hashlib.sha256).digest()):
        return None
    sealed_for = json.loads(payload)
    if sealed_for["id"] != item_id:
        return None
    return IssuedReasoning(sealed_for["following_id"], sealed_for["following_type"])


def response_object(body: dict, output: list[dict], usage: dict[str, Any]) -> dict[str, Any]:
    """A completed ``response`` object, echoing the request's settings as the real API does."""
    reasoning = body.get("reasoning") or {}
    return {
        "id": _new_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": body["model"],
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "reasoning": {"effort": reasoning.get("effort"), "summary": reasoning.get("summary")},
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": body.get("text") or {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "top_p": body.get("top_p", 1.0),
        "truncation": body.get("truncation") or "disabled",
        "usage": usage,
        "user": body.get("user"),
        "metadata": body.get("metadata") or {},
    }


def response_events(response: dict[str, Any], chunk_size: int) -> list[dict[str, Any]]:
    """The stream of a completed ``response``, event by event, numbered from 0."""
    started = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
    ]
    for index, item in enumerate(response["output"]):
        events += ITEM_EVENTS[item["type"]](index, item, chunk_size)
    events.append({"type": "response.completed", "response": response})
    return [
        {"type": event.pop("type"), "sequence_number": number, **event}
        for number, event in enumerate(events)
    ]


def _message_events(index: int, item: dict, chunk_size: int) -> list[dict[str, Any]]:
    part = item["content"][0]
    at = {"item_id": item["id"], "output_index": index, "content_index": 0}
    return [
        {"type": "response.output_item.added", "output_index": index,
         "item": {**item, "status": "in_progress", "content": []}},
        {"type": "response.content_part.added", **at, "part": {**part, "text": ""}},
        *({"type": "response.output_text.delta", **at, "delta": piece, "logprobs": []}
          for piece in _split(part["text"], chunk_size)),
        {"type": "response.output_text.done", **at, "text": part["text"], "logprobs": []},
        {"type": "response.content_part.done", **at, "part": part},
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]


def _function_call_events(index: int, item: dict, chunk_size: int) -> list[dict[str, Any]]:
    at = {"item_id": item["id"], "output_index": index}
    return [
        {"type": "response.output_item.added", "output_index": index,
         "item": {**item, "status": "in_progress", "arguments": ""}},
        *({"type": "response.function_call_arguments.delta", **at, "delta": piece}
          for piece in _split(item["arguments"], chunk_size)),
        {"type": "response.function_call_arguments.done", **at, "arguments": item["arguments"]},
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]


def _reasoning_events(index: int, item: dict, chunk_size: int) -> list[dict[str, Any]]:
    text = item["summary"][0]["text"]
    at = {"item_id": item["id"], "output_index": index, "summary_index": 0}
    return [
        {"type": "response.output_item.added", "output_index": index,
         "item": {"id": item["id"], "type": "reasoning", "summary": []}},
        {"type": "response.reasoning_summary_part.added", **at,
         "part": {"type": "summary_text", "text": ""}},
        *({"type": "response.reasoning_summary_text.delta", **at, "delta": piece}
          for piece in _split(text, chunk_size)),
        {"type": "response.reasoning_summary_text.done", **at, "text": text},
        {"type": "response.reasoning_summary_part.done", **at,
         "part": {"type": "summary_text", "text": text}},
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]


ITEM_EVENTS = {
    "message": _message_events,
    "function_call": _function_call_events,
    "reasoning": _reasoning_events,
}


def _failure_event(
    response: dict[str, Any], sent: list[dict[str, Any]], kind: str, number: int
) -> dict[str, Any]:
    """What the real API sends when it fails mid-stream: ``response.failed`` with the items
    finished so far, or a bare ``error`` event."""
    if kind == "error":
        return {"type": "error", "sequence_number": number, "code": "server_error",
                "message": SERVER_ERROR, "param": None}
    done = [event["item"] for event in sent if event["type"] == "response.output_item.done"]
    failed = {**response, "status": "failed", "output": done, "usage": None,
              "error": {"code": "server_error", "message": SERVER_ERROR}}
    return {"type": "response.failed", "sequence_number": number, "response": failed}


def sse_event(event: dict[str, Any]) -> bytes:
    """One SSE event as the real API frames it: its type on an ``event:`` line, then the data."""
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()
