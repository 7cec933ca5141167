"""The workload: a deterministic coding-agent transcript and a full-history client over it.

The transcript is what an agent loop sends after ~100 tool steps: a system prompt, the task, then
assistant messages with `tool_calls` each answered by a `tool` result. Tool results follow the
size mix of real agent runs (file reads of a few KB, short edits, test/grep output, and the odd
10-16 KB log or file, i.e. over the proxy's default truncation limit of 10,000 characters).

A `Conversation` is a full-history client: every request resends the whole transcript, byte for
byte, plus what is new since the last request (the assistant reply it got back and one new ~1.5 KB
tool result), serialized compactly as httpx/openai-python and JavaScript clients do. Messages
are serialized once and kept as bytes, so building a 2 MB body at turn 1,000 costs a join, not a
`json.dumps` of the whole history: the load generator must stay cheap.
"""

from __future__ import annotations

import json
import random
import zlib
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import Any

Message = dict[str, Any]

SEED = 20240611
BASE_MESSAGES = 200  # system + task + 99 x (assistant tool call, tool result)
TOOL_POOL = 64  # distinct tool outputs the continuation turns cycle through
OBSERVATION_CHARS = (1_200, 1_800)  # a continuation turn's new tool output: ~1.5 KB


def dumps(obj: Any) -> bytes:
    """How the official SDKs (httpx) serialize a body: compact, UTF-8, no ASCII escaping."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


# -- text that looks like what tools return --------------------------------------------------------

_WORDS = [
    "request", "response", "handler", "session", "store", "message", "conversation", "tenant", "upstream",
    "config", "token", "window", "summary", "boundary", "compaction", "truncate", "preview", "stream", "chunk",
    "reply", "client", "server", "cache", "index", "lock", "writer", "reader", "parser", "payload", "status",
    "header", "timeout", "retry", "error", "value", "result", "record", "sequence",
]
_FILES = [
    "proxy/app.py", "proxy/api/chat.py", "proxy/store/disk.py", "proxy/history.py", "proxy/turns.py",
    "proxy/upstream/http.py", "proxy/upstream/sse.py", "tests/test_chat.py", "tests/test_history.py",
    "src/server/routes.ts", "src/server/db.ts", "lib/utils/strings.py", "docs/architecture.md",
]


def _ident(rng: random.Random) -> str:
    return "_".join(rng.sample(_WORDS, rng.randint(1, 3)))


def _code_line(rng: random.Random) -> str:
    indent = "    " * rng.randint(0, 3)
    kind = rng.random()
    if kind < 0.15:
        return f"{indent}def {_ident(rng)}(self, {_ident(rng)}: {rng.choice(['str', 'int', 'dict[str, Any]', 'bytes'])}) -> None:"
    if kind < 0.35:
        return f'{indent}{_ident(rng)} = {_ident(rng)}.get("{rng.choice(_WORDS)}", {rng.randint(0, 999)})'
    if kind < 0.5:
        return f"{indent}if {_ident(rng)} is not None and len({_ident(rng)}) > {rng.randint(1, 64)}:"
    if kind < 0.6:
        return f"{indent}# {' '.join(rng.choices(_WORDS, k=rng.randint(4, 10)))}"
    if kind < 0.75:
        return f"{indent}return await self.{_ident(rng)}({_ident(rng)}, {_ident(rng)}=True)"
    return f"{indent}{_ident(rng)}.append({{\"{rng.choice(_WORDS)}\": {_ident(rng)}, 'n': {rng.randint(0, 99)}}})"


def _test_line(rng: random.Random) -> str:
    outcome = rng.choices(["PASSED", "FAILED", "SKIPPED"], weights=[90, 7, 3])[0]
    line = f"tests/test_{rng.choice(_WORDS)}.py::test_{_ident(rng)} {outcome} [{rng.randint(1, 100):3d}%]"
    if outcome == "FAILED":
        line += f"\nE   AssertionError: assert {rng.randint(0, 500)} == {rng.randint(0, 500)}  # \u2717 {rng.choice(_WORDS)}"
    return line


def _grep_line(rng: random.Random) -> str:
    return f"{rng.choice(_FILES)}:{rng.randint(1, 900)}:{_code_line(rng)}"


def _text(rng: random.Random, line: Any, size: int) -> str:
    lines: list[str] = []
    total = 0
    while total < size:
        lines.append(line(rng))
        total += len(lines[-1]) + 1
    return "\n".join(lines)[:size]


def _tool_step(rng: random.Random, call_id: str, big: bool | None = None) -> tuple[Message, Message]:
    """One agent step: the assistant's tool call and the tool's result, with a realistic size."""
    path = rng.choice(_FILES)
    kind = rng.random() * (0.55 if big else 1.0)  # a big output is a file read or a test log
    if big is None:
        big = rng.random() < 0.07  # ~7% of outputs exceed the 10,000-character truncation limit
    if kind < 0.3:
        name, args = "read_file", {"path": path}
        content = _text(rng, _code_line, rng.randint(11_000, 16_000) if big else rng.randint(900, 4_400))
    elif kind < 0.55:
        name, args = "run_shell", {"command": f"python -m pytest -q {path} -x", "timeout": 120}
        content = _text(rng, _test_line, rng.randint(11_000, 15_000) if big else rng.randint(300, 3_000))
    elif kind < 0.75:
        name, args = "search", {"pattern": rng.choice(_WORDS), "path": "."}
        content = _text(rng, _grep_line, rng.randint(300, 2_200))
    else:
        name = "edit_file"
        old, new = _code_line(rng).strip(), _code_line(rng).strip()
        args = {"path": path, "old": old, "new": new}
        content = f"Edited {path}: replaced 1 occurrence ({len(old)} -> {len(new)} chars)."
    say = rng.random() < 0.4  # agents often think aloud before a call
    assistant: Message = {
        "role": "assistant",
        # The thought names its call, as the call's id is the conversation's own (own_ids): no two
        # agents think the same thing, and in the Responses API a thought is an item of its own.
        "content": " ".join(rng.choices(_WORDS, k=rng.randint(12, 40))).capitalize() + f". Next: {call_id}."
        if say else None,
        "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        ],
    }
    return assistant, {"role": "tool", "tool_call_id": call_id, "content": content}


SYSTEM_PROMPT = (
    "You are a careful software engineering agent working in a git repository. "
    "Use the tools to read, search, edit and test the code; never guess file contents. "
    "Keep changes minimal, run the tests after each change, and report what you changed and why. "
    + " ".join(random.Random(SEED).choices(_WORDS, k=500))
)

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {
                "type": "object",
                "properties": {p: {"type": t, "description": f"The {p} argument."} for p, t in params.items()},
                "required": list(params)[:1],
            },
        },
    }
    for name, desc, params in [
        ("read_file", "Read a file of the repository.", {"path": "string", "offset": "integer", "limit": "integer"}),
        ("edit_file", "Replace text in a file.", {"path": "string", "old": "string", "new": "string"}),
        ("run_shell", "Run a shell command in the repository.", {"command": "string", "timeout": "integer"}),
        ("search", "Search the repository with a regular expression.", {"pattern": "string", "path": "string"}),
        ("list_dir", "List a directory.", {"path": "string"}),
    ]
]


@cache
def base_parts(kind: str) -> tuple[bytes, ...]:
    """The serialized opening messages of a conversation (index 1, the task, is per conversation).

    agent200: the 200-message (~200 KB) transcript; small: 8 messages (~10 KB), for the memory run;
    empty: system + task only, for the scaling run that grows one conversation to 1,000 turns.
    """
    rng = random.Random(SEED)
    messages: list[Message] = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": ""}]
    steps = {"agent200": (BASE_MESSAGES - 2) // 2, "small": 3, "empty": 0}[kind]
    for i in range(steps):
        messages.extend(_tool_step(rng, f"call_base{i:04d}"))
    return tuple(dumps(m) for m in messages)


@cache
def tool_pool() -> tuple[str, ...]:
    """Tool outputs the continuation turns answer with: ~1.5 KB each (a file read, a test run or
    a search), the observation a growing agent's transcript gains a turn besides the reply."""
    rng = random.Random(SEED + 1)
    kinds = (_code_line, _test_line, _grep_line)
    return tuple(_text(rng, kinds[i % len(kinds)], rng.randint(*OBSERVATION_CHARS)) for i in range(TOOL_POOL))


def own_ids(transcript: bytes, conversation_id: str) -> bytes:
    """The opening transcript with tool-call ids of this conversation's own. Its messages are the
    same in every conversation (one generated transcript); with the same ids too, a proxy that
    keys a cache by message (token counts by canonical hash) would find a new conversation's 200
    messages already counted by another's, and its first turn would look cheaper than a real new
    conversation's. A real agent's call ids are unique; only the system prompt is shared."""
    tag = b"%08x" % zlib.crc32(conversation_id.encode())
    return transcript.replace(b"call_base", b"call_" + tag).replace(b"toolu_base", b"toolu_" + tag)


def task_message(conversation_id: str) -> bytes:
    # Distinct per conversation, as the tool-call ids after it are (own_ids).
    return dumps({"role": "user", "content": f"[{conversation_id}] The export job fails on big tenants: "
                  "find out why `store.append` gets slower with every turn, fix it, and add a regression test."})


def stream_model(chunks: int) -> str:
    """The model name tells the mock how many chunks to stream (it is the one field every proxy,
    LiteLLM included, passes through untouched)."""
    return f"bench-s{chunks}"


@dataclass
class Conversation:
    """A full-history client: each request = the previous request's messages + reply + new tool result."""

    id: str
    kind: str
    index: int = 0  # its place in its pool: picks the tool outputs, the same ones on every run
    turn: int = 0  # requests answered so far
    _joined: bytearray = field(default_factory=bytearray)
    _count: int = 0
    _pool_offset: int = 0

    def __post_init__(self) -> None:
        parts = list(base_parts(self.kind))
        parts[1] = task_message(self.id)
        self._joined = bytearray(own_ids(b",".join(parts), self.id))
        self._count = len(parts)
        self._pool_offset = (self.index * 17) % TOOL_POOL

    @property
    def messages(self) -> int:
        return self._count

    def body(self, model: str, stream: bool) -> bytes:
        # "stream" leads so a proxy that keeps key order (json round trip) keeps it in the first bytes.
        head = b'{"stream":' + (b"true" if stream else b"false") + b',"model":' + dumps(model) + b',"messages":['
        tail = b'],"tools":' + _tools_json() + b',"tool_choice":"auto","temperature":0}'
        return head + bytes(self._joined) + tail

    def advance(self, reply: Message) -> None:
        """Append the assistant reply as a client echoes it, then the result of its (first) tool call."""
        echo: Message = {"role": "assistant", "content": reply.get("content")}
        calls = reply.get("tool_calls") or []
        if calls:
            echo["tool_calls"] = [
                {
                    "id": c.get("id"),
                    "type": "function",
                    "function": {
                        "name": (c.get("function") or {}).get("name"),
                        "arguments": (c.get("function") or {}).get("arguments") or "",
                    },
                }
                for c in calls
            ]
        new = [echo]
        pool = tool_pool()
        for i, c in enumerate(calls):
            content = pool[(self._pool_offset + self.turn * 7 + i) % TOOL_POOL]
            new.append({"role": "tool", "tool_call_id": c.get("id") or "", "content": content})
        if not calls:  # a reply without a call: the user answers instead
            new.append({"role": "user", "content": "Go on with the next step."})
        for m in new:
            self._joined += b"," + dumps(m)
        self._count += len(new)
        self.turn += 1


@lru_cache(maxsize=1)
def _tools_json() -> bytes:
    return dumps(TOOLS)


def assemble_stream(payloads: list[bytes]) -> Message:
    """Rebuild the assistant message from chat.completion.chunk payloads (as a streaming SDK does)."""
    content: list[str] = []
    calls: dict[int, Message] = {}
    for payload in payloads:
        if payload == b"[DONE]":
            continue
        try:
            chunk = json.loads(payload)
        except ValueError:
            continue
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                content.append(delta["content"])
            for c in delta.get("tool_calls") or ():
                slot = calls.setdefault(c.get("index", 0), {"id": None, "function": {"name": "", "arguments": ""}})
                if c.get("id"):
                    slot["id"] = c["id"]
                fn = c.get("function") or {}
                slot["function"]["name"] += fn.get("name") or ""
                slot["function"]["arguments"] += fn.get("arguments") or ""
    msg: Message = {"role": "assistant", "content": "".join(content) or None}
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg
