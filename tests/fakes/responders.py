"""Reusable responders for the strict fake upstream: how real models misbehave.

Each is a function of the request body, as `FakeUpstream.responder` takes, built from the
behaviours seen with small and local models (issue 11): a summarizer that keeps nothing, answers
at length or echoes its prompt, a server with a small context that refuses long requests, and an
agent that repeats a read, invents a ref or calls a tool that is no longer offered. They compose:
the agent behaviours take the responder to fall back to (`then`), and `by_kind` routes the
summarizer's requests apart from the agent's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from tests.fakes.fake_upstream import Reply, ToolCall, default_responder

Responder = Callable[[dict], Reply]

SUMMARIZER_MARK = "You maintain the working memory of an AI agent"
TOOL_SUMMARY_MARK = "You condense the output of one tool call"
READ_TOOL = "read_tool_output"
REF = re.compile(r"out_\d+_[0-9a-f]{24}")
KEEPS_NOTHING = "Goal: keep the service green.\nWork done: edited modules, ran tests, fixed failures."


def _first_system(body: dict) -> str:
    if isinstance(body.get("system"), str):  # Anthropic Messages: the instructions are top level
        return body["system"]
    first = body["messages"][0]
    content = first.get("content")
    return content if first.get("role") == "system" and isinstance(content, str) else ""


def is_summary_request(body: dict) -> bool:
    return SUMMARIZER_MARK in _first_system(body)


def is_tool_summary_request(body: dict) -> bool:
    return TOOL_SUMMARY_MARK in _first_system(body)


def by_kind(agent: Responder = default_responder, summarizer: Responder | None = None) -> Responder:
    """History and tool-output summaries to `summarizer` (default: `fixed_summary()`), the rest to `agent`."""
    summarize = summarizer or fixed_summary()

    def respond(body: dict) -> Reply:
        return summarize(body) if is_summary_request(body) or is_tool_summary_request(body) else agent(body)

    return respond


# -- summarizers --------------------------------------------------------------------------------


def fixed_summary(text: str = KEEPS_NOTHING) -> Responder:
    """The worst case small models approach: the same text whatever the messages, keeping nothing."""
    return lambda body: Reply.text(text)


def answers_at_length(words: int = 1000) -> Responder:
    """A summarizer that ignores `max_tokens` and writes `words` words."""
    text = " ".join(f"word{i % 97}" for i in range(words))
    return lambda body: Reply.text(text)


def echoes_prompt() -> Responder:
    """A summarizer that answers with the messages it was asked to summarize."""

    def respond(body: dict) -> Reply:
        prompt = body["messages"][-1]["content"]
        _, _, messages = prompt.partition("Messages to fold into the summary:\n")
        return Reply.text(messages.split("\n\n---\n\n")[0] or prompt)

    return respond


def estimated_tokens(body: dict) -> int:
    """What the fake counts a request as: about 4 characters a token, tools included."""
    return len(json.dumps(body["messages"])) // 4 + len(json.dumps(body.get("tools") or [])) // 4


def refuses_over(context_tokens: int, then: Responder) -> Responder:
    """A server with a `context_tokens` window (llama.cpp's `n_ctx`): a request whose prompt plus
    `max_tokens` is over it gets llama.cpp's 400, the rest `then`."""

    def respond(body: dict) -> Reply:
        needed = estimated_tokens(body) + int(body.get("max_tokens") or body.get("max_completion_tokens") or 0)
        if needed > context_tokens:
            return Reply.error(400, {"error": {
                "code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": needed, "n_ctx": context_tokens,
                "message": "the request exceeds the available context size, try increasing it"}})
        return then(body)

    return respond


# -- agents -------------------------------------------------------------------------------------


def _offers_read(body: dict) -> bool:
    return any((t.get("function") or {}).get("name") == READ_TOOL for t in body.get("tools") or ())


def _trailing_reads(messages: list[dict]) -> int:
    """How many read_tool_output rounds end the prompt (each: our call, then its result)."""
    rounds, i = 0, len(messages) - 1
    while i >= 1 and messages[i].get("role") == "tool":
        calls = messages[i - 1].get("tool_calls") or []
        if messages[i - 1].get("role") != "assistant" or not calls or any(
                (c.get("function") or {}).get("name") != READ_TOOL for c in calls):
            break
        rounds += 1
        i -= 2
    return rounds


def _read_call(ref: str, offset: int, length: int, n: int) -> Reply:
    arguments = json.dumps({"ref": ref, "offset": offset, "length": length})
    return Reply("message", calls=[ToolCall(f"call_read_{n}_{len(ref)}", READ_TOOL, arguments)])


def repeats_read(then: Responder, times: int = 3, offset: int = 2000, length: int = 8000) -> Responder:
    """While read_tool_output is offered and a ref is in the prompt, read the same range of the
    newest ref `times` times in a row (each answer is the same), then answer with `then`."""

    def respond(body: dict) -> Reply:
        messages = body["messages"]
        refs = REF.findall(json.dumps(messages))
        done = _trailing_reads(messages)
        if _offers_read(body) and refs and done < times:
            return _read_call(refs[-1], offset, length, done)
        return then(body)

    return respond


def invents_ref(then: Responder, ref: str = "10020") -> Responder:
    """Calls read_tool_output with a ref that names nothing (once per turn), then `then`."""

    def respond(body: dict) -> Reply:
        if _offers_read(body) and _trailing_reads(body["messages"]) == 0:
            return _read_call(ref, 0, 8000, 0)
        return then(body)

    return respond


def calls_withdrawn_tool(then: Responder) -> Responder:
    """Calls read_tool_output once per turn whether or not the request offers it (a model that
    remembers the tool from earlier turns), then `then`."""

    def respond(body: dict) -> Reply:
        refs = REF.findall(json.dumps(body["messages"]))
        if _trailing_reads(body["messages"]) == 0:
            return _read_call(refs[-1] if refs else "out_1_" + "0" * 24, 0, 8000, 0)
        return then(body)

    return respond


def strict_about_withdrawn_tools(then: Responder) -> Responder:
    """A server (llama.cpp) that fails with a 500 on a prompt holding a call of a function the
    request does not define; OpenAI accepts such prompts, llama.cpp's chat templates do not."""

    def respond(body: dict) -> Reply:
        defined = {(t.get("function") or {}).get("name") for t in body.get("tools") or ()}
        called = {(c.get("function") or {}).get("name") for m in body["messages"] for c in m.get("tool_calls") or ()}
        if called - defined:
            return Reply.error(500, {"error": {"code": 500, "type": "server_error",
                                               "message": f"tool not defined: {sorted(called - defined)[0]}"}})
        return then(body)

    return respond


def agent_requests(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in requests if not (is_summary_request(r) or is_tool_summary_request(r))]


def summary_requests(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in requests if is_summary_request(r)]
