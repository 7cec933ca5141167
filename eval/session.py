"""The scripted agent session: fixed user turns, a real model choosing the tool calls, real tools.

The user's turns never depend on what the model said, so every run asks the same things; the
model's replies (temperature 0, a fixed seed) decide the rest. The client is the official
`openai` client, with retries off so every failure is seen, streaming on every other request.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import openai

from .relay import Relay
from .tools import TOOL_DEFINITIONS, Tools
from .workspace import LAST_ERROR_ORDER, MOST_COMMON_ERROR, TICKET

SYSTEM = (
    "You are a coding agent working in a small Python project. When the user asks you to list, read, "
    "write or run something, call the tool for it; never describe what you would do, and never guess "
    "a file's content. After the tool answers, reply to the user in one or two short sentences."
)


@dataclass(frozen=True)
class UserTurn:
    text: str
    expect: str | None = None  # a probe: the turn's last answer should contain this (case-insensitive)


TURNS = (
    UserTurn(f"I'm working on ticket {TICKET}: stock sometimes goes negative. List the files in the project root."),
    UserTurn("Read README.md and tell me in two sentences what the service does."),
    UserTurn("List the inventory folder, then read inventory/stock.py."),
    UserTurn("Run the tests with `python3 -m unittest discover -s tests` and tell me which test fails."),
    UserTurn("Read logs/app.log and tell me which ERROR message appears most often.", MOST_COMMON_ERROR),
    UserTurn("What is the order id in the very last ERROR line of logs/app.log? The end of the log matters, "
             "not its beginning.", LAST_ERROR_ORDER),
    UserTurn("Run `grep -c ERROR logs/app.log` and tell me the count."),
    UserTurn("Read tests/test_stock.py."),
    UserTurn("Explain in one sentence why test_reserve_more_than_available fails."),
    UserTurn("Fix reserve() in inventory/stock.py: it must raise ValueError when the quantity is more than the "
             "stock level, and change nothing then. Write the whole file with write_file."),
    UserTurn("Run the tests again and tell me if they pass."),
    UserTurn("Read data/orders.csv and tell me how many orders have the status cancelled."),
    UserTurn("Run `grep -n WARN logs/app.log` and tell me the slowest query's duration."),
    UserTurn("Read inventory/pricing.py."),
    UserTurn("Does with_vat round to the nearest cent, or does it cut? Answer in one sentence."),
    UserTurn("Run `python3 -m unittest discover -s tests -v`."),
    UserTurn("Which ticket am I working on? Answer with the ticket id only.", TICKET),
    UserTurn("Remind me: what was the order id in the last ERROR line of the log?", LAST_ERROR_ORDER),
    UserTurn(f"Write a CHANGELOG.md with one entry for {TICKET} that describes the fix."),
    UserTurn("Read CHANGELOG.md to check it."),
    UserTurn("Summarize this session in three bullet points."),
)


@dataclass
class Request:
    """One client request to the proxy and how it ended."""

    turn: int
    step: int
    stream: bool
    started_s: float
    seconds: float = 0.0
    status: int | None = None  # HTTP status the client got; None when no response came
    tokens_sent: int | None = None  # the proxy's X-Context-Tokens-Sent
    left_out: int | None = None  # X-Context-Messages-Left-Out
    prompt_tokens: int | None = None  # usage.prompt_tokens as the client got it (the last upstream call's)
    tool_calls: list[str] = field(default_factory=list)
    answer_chars: int = 0
    error: str | None = None
    failed_by: str | None = None  # "proxy", "upstream" or "client"
    upstream_calls: list[int] = field(default_factory=list)  # the relay's indices of this request's agent calls


@dataclass
class SessionResult:
    requests: list[Request]
    probes: list[dict[str, Any]]
    conversation_id: str | None
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {"requests": [asdict(r) for r in self.requests], "probes": self.probes,
                "conversation_id": self.conversation_id, "seconds": self.seconds}


class Agent:
    def __init__(self, client: openai.AsyncOpenAI, model: str, tools: Tools, relay: Relay, *,
                 max_steps: int = 4, max_tokens: int = 400, seed: int = 42) -> None:
        self.client, self.model, self.tools, self.relay = client, model, tools, relay
        self.max_steps, self.max_tokens, self.seed = max_steps, max_tokens, seed
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        self.requests: list[Request] = []
        self.conversation_id: str | None = None
        self.started = time.monotonic()

    async def run(self, turns: tuple[UserTurn, ...] = TURNS, minutes: float | None = None,
                  grace_minutes: float = 8) -> SessionResult:
        """Every turn in order. With `minutes`, no new turn starts once they have passed, and a
        request still under way `grace_minutes` later is given up (counted as failed by the client)."""
        self.probes: list[dict[str, Any]] = []
        if minutes is None:
            await self._turns(turns, None)
        else:
            try:
                await asyncio.wait_for(self._turns(turns, minutes), (minutes + grace_minutes) * 60)
            except TimeoutError:
                request = self.requests[-1]
                request.error, request.failed_by = "given up at the eval's time limit", "client"
        return SessionResult(self.requests, self.probes, self.conversation_id, round(time.monotonic() - self.started, 1))

    async def _turns(self, turns: tuple[UserTurn, ...], minutes: float | None) -> None:
        for number, turn in enumerate(turns, 1):
            if minutes is not None and time.monotonic() - self.started > minutes * 60:
                return
            self.relay.turn = number
            self.messages.append({"role": "user", "content": turn.text})
            answer = await self._turn(number)
            if turn.expect is not None:
                self.probes.append({"turn": number, "expect": turn.expect,
                                    "found": turn.expect.lower() in answer.lower(), "answer": answer[:300]})

    async def _turn(self, number: int) -> str:
        """Requests until the model answers without tool calls (or `max_steps`); returns its last text."""
        answer = ""
        for step in range(1, self.max_steps + 1):
            request = Request(turn=number, step=step, stream=len(self.requests) % 2 == 1,
                              started_s=round(time.monotonic() - self.started, 3))
            self.requests.append(request)
            first_call = len(self.relay.calls)
            message = await self._request(request)
            request.upstream_calls = [c.index for c in self.relay.calls[first_call:] if c.kind == "agent"]
            if message is None:
                request.failed_by = self._blame(request)
                return answer
            answer = message.get("content") or ""
            request.answer_chars = len(answer)
            self.messages.append(message)
            calls = message.get("tool_calls") or []
            if not calls:
                return answer
            for call in calls:
                result = await self.tools.call(call["function"]["name"], call["function"]["arguments"])
                self.messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        return answer

    def _blame(self, request: Request) -> str:
        """Who failed a request: the upstream if one of its calls did, else the proxy, else the client."""
        if any(not self.relay.calls[i].ok for i in request.upstream_calls):
            return "upstream"
        return "client" if request.status is None and "timed out" in (request.error or "") else "proxy"

    async def _request(self, request: Request) -> dict[str, Any] | None:
        params: dict[str, Any] = {
            "model": self.model, "messages": self.messages, "tools": TOOL_DEFINITIONS,
            "temperature": 0, "seed": self.seed, "max_tokens": self.max_tokens,
        }
        if request.stream:
            params |= {"stream": True, "stream_options": {"include_usage": True}}
        started = time.monotonic()
        try:
            raw = await self.client.chat.completions.with_raw_response.create(**params)
            request.status = raw.status_code
            self._take_headers(request, raw.headers)
            parsed = raw.parse()
            if inspect.isawaitable(parsed):  # openai's async responses parse with or without await
                parsed = await parsed
            message = await (_assemble(parsed, request) if request.stream else _message(parsed, request))
        except openai.APIStatusError as exc:
            request.status = exc.status_code
            self._take_headers(request, exc.response.headers)
            request.error = _error_text(exc)
            message = None
        except openai.APIError as exc:  # an error event inside a stream, a broken connection, a timeout
            request.error = _error_text(exc)
            message = None
        request.seconds = round(time.monotonic() - started, 2)
        return message

    def _take_headers(self, request: Request, headers: Any) -> None:
        self.conversation_id = headers.get("X-Conversation-ID") or self.conversation_id
        if (sent := headers.get("X-Context-Tokens-Sent")) is not None:
            request.tokens_sent = int(sent)
        if (left := headers.get("X-Context-Messages-Left-Out")) is not None:
            request.left_out = int(left)


async def _message(completion: Any, request: Request) -> dict[str, Any]:
    if completion.usage is not None:
        request.prompt_tokens = completion.usage.prompt_tokens
    message = completion.choices[0].message
    calls = [{"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
             for c in message.tool_calls or []]
    return _assistant(message.content, calls, request)


async def _assemble(stream: Any, request: Request) -> dict[str, Any]:
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    async for chunk in stream:
        if chunk.usage is not None:
            request.prompt_tokens = chunk.usage.prompt_tokens
        for choice in chunk.choices:
            content.append(choice.delta.content or "")
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": "", "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                call["id"] = delta.id or call["id"]
                if delta.function is not None:
                    call["function"]["name"] += delta.function.name or ""
                    call["function"]["arguments"] += delta.function.arguments or ""
    return _assistant("".join(content), [calls[i] for i in sorted(calls)], request)


def _assistant(content: str | None, calls: list[dict[str, Any]], request: Request) -> dict[str, Any]:
    request.tool_calls = [f"{c['function']['name']}({c['function']['arguments'][:120]})" for c in calls]
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = calls
    return message


def _error_text(exc: openai.APIError) -> str:
    body = exc.body if isinstance(exc.body, (dict, list)) else None
    text = json.dumps(body)[:400] if body is not None else str(exc)[:400]
    return f"{type(exc).__name__}: {text}"
