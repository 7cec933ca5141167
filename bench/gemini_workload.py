"""The bench's coding-agent transcript (bench/workload.py) as Gemini CLI sends it over the Gemini
API, and a full-history client over it.

The same messages, converted: the system prompt goes in `systemInstruction`, each tool call is a
`functionCall` part of its model content (with its id, as Gemini CLI gives one), each tool result
a `functionResponse` part of the user content after it (`{"output": ...}`), and the tools are
`functionDeclarations` with a `parametersJsonSchema`. The model and whether the reply streams
are in the URL (`Wire.url`), not the body. As in `workload.Conversation`, the contents are
serialized once and kept as bytes; only the newest is serialized per request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache

from .workload import SYSTEM_PROMPT, TOOL_POOL, TOOLS, Message, base_parts, dumps, own_ids, task_message, tool_pool

GENERATION = {"temperature": 1, "topP": 0.95, "topK": 64}


def gemini_content(message: Message, names: dict[str, str]) -> Message:
    """One chat message of the transcript as Gemini CLI would have sent it (not the system prompt);
    `names` (call id -> tool name) is filled from the calls, for the responses after them."""
    role = message["role"]
    if role == "tool":
        call_id = message["tool_call_id"]
        response = {"id": call_id, "name": names.get(call_id, "tool"), "response": {"output": message["content"]}}
        return {"role": "user", "parts": [{"functionResponse": response}]}
    if role == "user":
        return {"role": "user", "parts": [{"text": message["content"]}]}
    parts: list[Message] = [{"text": message["content"]}] if message.get("content") else []
    for call in message.get("tool_calls") or ():
        fn = call["function"]
        names[call["id"]] = fn["name"]
        parts.append({"functionCall": {"id": call["id"], "name": fn["name"], "args": json.loads(fn["arguments"])}})
    return {"role": "model", "parts": parts}


@cache
def base_contents(kind: str) -> tuple[bytes, ...]:
    """The serialized opening contents after the system prompt and the task (which is per conversation)."""
    names: dict[str, str] = {}
    return tuple(dumps(gemini_content(json.loads(part), names)) for part in base_parts(kind)[2:])


@cache
def _head_parts() -> tuple[bytes, bytes, bytes]:
    system = {"parts": [{"text": SYSTEM_PROMPT}], "role": "user"}
    declarations = [
        {"name": t["function"]["name"], "description": t["function"]["description"], "parametersJsonSchema": t["function"]["parameters"]}
        for t in TOOLS
    ]
    return dumps(system), dumps([{"functionDeclarations": declarations}]), dumps(GENERATION)


@dataclass
class GeminiConversation:
    """A full-history Gemini CLI-like client: each request = the previous one's contents + the
    reply + a user content answering its function calls."""

    id: str
    kind: str
    index: int = 0  # its place in its pool: picks the tool outputs, the same ones on every run
    turn: int = 0
    _joined: bytearray = field(default_factory=bytearray)
    _count: int = 0
    _pool_offset: int = 0

    def __post_init__(self) -> None:
        task = {"role": "user", "parts": [{"text": json.loads(task_message(self.id))["content"]}]}
        self._joined = bytearray(own_ids(b",".join([dumps(task), *base_contents(self.kind)]), self.id))
        self._count = 1 + len(base_contents(self.kind))
        self._pool_offset = (self.index * 17) % TOOL_POOL

    @property
    def messages(self) -> int:
        return self._count

    def body(self, model: str, stream: bool) -> bytes:
        system, tools, generation = _head_parts()
        return (b'{"contents":[' + bytes(self._joined) + b'],"systemInstruction":' + system + b',"tools":' + tools
                + b',"generationConfig":' + generation + b"}")

    def advance(self, parts: list[Message]) -> None:
        """Append the reply's content as Gemini CLI echoes it (its thoughts dropped, its own ids on
        the calls), then a user content answering its function calls."""
        kept: list[Message] = []
        responses: list[Message] = []
        pool = tool_pool()
        for i, part in enumerate(p for p in parts if not p.get("thought")):
            call = part.get("functionCall")
            if call is not None:
                call = {"id": call.get("id") or f"{call['name']}_{self.turn}_{i}", **call}
                part = {**part, "functionCall": call}
                output = pool[(self._pool_offset + self.turn * 7 + len(responses)) % TOOL_POOL]
                responses.append({"functionResponse": {"id": call["id"], "name": call["name"], "response": {"output": output}}})
            kept.append(part)
        answer: Message = {"role": "user", "parts": responses or [{"text": "Go on with the next step."}]}
        self._joined += b"," + dumps({"role": "model", "parts": kept}) + b"," + dumps(answer)
        self._count += 2
        self.turn += 1


def assemble_chunks(text: str) -> list[Message]:
    """The parts of a Gemini SSE stream, as a streaming client joins them (texts joined)."""
    parts: list[Message] = []
    for line in text.splitlines():
        if not line.startswith("data: "):
            continue
        for candidate in json.loads(line[6:]).get("candidates") or ():
            for part in (candidate.get("content") or {}).get("parts") or ():
                if "text" in part and parts and "text" in parts[-1] and set(part) == set(parts[-1]):
                    parts[-1] = {**parts[-1], "text": parts[-1]["text"] + part["text"]}
                else:
                    parts.append(part)
    return parts
