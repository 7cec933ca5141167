"""The bench's coding-agent transcript (bench/workload.py) as Codex sends it over the Responses API,
and a full-history client over it.

The same messages, converted: the system prompt is the first `developer` message, each tool call
a `function_call` item after its assistant message, each tool result a `function_call_output`,
the tools flat (`{"type": "function", "name", ...}`), `store: false` with every item resent each
turn, as Codex does. Each body ends as Codex's do (tests/samples/codex-session.json): its tool
settings, then `client_metadata`, new every request (the turn's ids and time, its keys in another
order each time: Codex serializes a hash map). Codex's `prompt_cache_key` (its session id) is left
out: the proxy would take the run for a session's thread, and the bench's no-header agents name
nothing. As in `workload.Conversation`, the items are serialized once and kept as bytes; only the
new ones are serialized per request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache

from .workload import SYSTEM_PROMPT, TOOL_POOL, TOOLS, Message, base_parts, dumps, own_ids, task_message, tool_pool


def response_items(message: Message) -> list[Message]:
    """One chat message of the transcript as the Responses items Codex would have sent for it."""
    role = message["role"]
    if role == "tool":
        return [{"type": "function_call_output", "call_id": message["tool_call_id"], "output": message["content"]}]
    if role in ("system", "user"):
        kind = "developer" if role == "system" else "user"
        return [{"type": "message", "role": kind, "content": [{"type": "input_text", "text": message["content"]}]}]
    items: list[Message] = []
    if message.get("content"):
        items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": message["content"]}]})
    for call in message.get("tool_calls") or ():
        fn = call["function"]
        items.append({"type": "function_call", "call_id": call["id"], "name": fn["name"], "arguments": fn["arguments"]})
    return items


@cache
def base_items(kind: str) -> tuple[bytes, ...]:
    """The serialized opening items after the system prompt and the task (which is per conversation)."""
    return tuple(dumps(item) for part in base_parts(kind)[2:] for item in response_items(json.loads(part)))


@cache
def _tools() -> bytes:
    return dumps([{"type": "function", **t["function"]} for t in TOOLS])


@dataclass
class ResponsesConversation:
    """A full-history Codex-like client: each request = the previous one's items + the reply's
    output items + the outputs of its calls."""

    id: str
    kind: str
    index: int = 0  # its place in its pool: picks the tool outputs, the same ones on every run
    turn: int = 0
    _joined: bytearray = field(default_factory=bytearray)
    _count: int = 0
    _pool_offset: int = 0

    def __post_init__(self) -> None:
        system = response_items({"role": "system", "content": SYSTEM_PROMPT})
        task = response_items(json.loads(task_message(self.id)))
        parts = [*(dumps(i) for i in system + task), *base_items(self.kind)]
        self._joined = bytearray(own_ids(b",".join(parts), self.id))
        self._count = len(parts)
        self._pool_offset = (self.index * 17) % TOOL_POOL

    @property
    def messages(self) -> int:
        return self._count

    def body(self, model: str, stream: bool) -> bytes:
        head = b'{"model":' + dumps(model) + b',"stream":' + (b"true" if stream else b"false") + b',"input":['
        settings = b',"tool_choice":"auto","parallel_tool_calls":true,"store":false,"include":[]'
        return head + bytes(self._joined) + b'],"tools":' + _tools() + settings + b',"client_metadata":' + self._metadata() + b"}"

    def _metadata(self) -> bytes:
        """Codex's `client_metadata` for this request: ids of the turn, its time, keys in turn order."""
        turn_id = f"{self.id}-turn-{self.turn}"
        window = {"session_id": self.id, "turn_id": turn_id, "window_number": 0, "request_kind": "turn",
                  "history_initialization": "new", "sandbox": "seccomp", "turn_started_at_unix_ms": 1796128005999 + self.turn}
        fields = [("session_id", self.id), ("turn_id", turn_id), ("root_turn_id", turn_id),
                  ("x-codex-installation-id", "30917a47-8a7c-462f-b8b5-0fb1b1180b64"),
                  ("x-codex-turn-metadata", json.dumps(window, separators=(",", ":")))]
        shift = self.turn % len(fields)
        return dumps(dict(fields[shift:] + fields[:shift]))

    def advance(self, output: list[Message]) -> None:
        """Append the reply's output items as Codex echoes them (without their ids, which need the
        server's store), then the output of each of its calls."""
        echo = [{k: v for k, v in item.items() if k not in ("id", "status")} for item in output]
        pool = tool_pool()
        calls = [item for item in output if item.get("type") == "function_call"]
        results = [{"type": "function_call_output", "call_id": c["call_id"],
                    "output": pool[(self._pool_offset + self.turn * 7 + i) % TOOL_POOL]} for i, c in enumerate(calls)]
        if not results:
            results = response_items({"role": "user", "content": "Go on with the next step."})
        for item in [*echo, *results]:
            self._joined += b"," + dumps(item)
        self._count += len(echo) + len(results)
        self.turn += 1


def assemble_output(text: str) -> list[Message]:
    """The output items of a Responses SSE stream: those of its `response.completed` event."""
    for line in reversed(text.splitlines()):
        if line.startswith("data: "):
            event = json.loads(line[6:])
            if event.get("type") == "response.completed":
                return event["response"]["output"]
    raise ValueError("a Responses stream without response.completed")
