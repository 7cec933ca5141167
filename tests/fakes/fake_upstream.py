"""A scripted, strict server used as the test upstream: Chat Completions here, the Responses API
(``POST /v1/responses``) in ``fake_responses``, Anthropic Messages (``/v1/messages``) in
``fake_anthropic``, the Gemini API (``/v1beta/models/...``) in ``fake_gemini``, all from the same
script.

Strict: it refuses (HTTP 400, OpenAI error shape) every request the real API refuses per
/work/shared/OPENAI-RULES.md (and RESPONSES-RULES.md), so a proxy that leaks its own fields or
breaks the tool-call protocol fails its tests here rather than in production.

Scripted: tests ``enqueue`` replies (text, tool calls, reasoning, errors, hangs, paused streams,
streams that never end or fail midway) or set a ``responder``; one queue serves every format. The
scripting API is thread-safe, so tests may drive a server whose event loop runs in another thread
(see ``running_in_thread``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn, Protocol

from aiohttp import web

__all__ = [
    "FakeUpstream",
    "Gate",
    "InvalidRequest",
    "Recorded",
    "Reply",
    "SseScript",
    "ToolCall",
    "WireFormat",
    "check_chat_request",
    "last_user_text",
    "running_in_thread",
    "server_error_body",
    "validate_chat_request",
]

# --------------------------------------------------------------------------------------------
# Request validation
# --------------------------------------------------------------------------------------------

KNOWN_PARAMS = frozenset(
    {
        "model", "messages", "stream", "stream_options", "tools", "tool_choice",
        "parallel_tool_calls", "temperature", "top_p", "n", "stop", "max_tokens",
        "max_completion_tokens", "presence_penalty", "frequency_penalty", "logit_bias",
        "logprobs", "top_logprobs", "user", "seed", "response_format", "metadata", "store",
        "service_tier", "reasoning_effort", "modalities", "audio", "prediction",
        "web_search_options", "verbosity", "safety_identifier", "prompt_cache_key",
    }
)

# Keys each message role may carry; anything else is "Additional properties are not allowed".
MESSAGE_KEYS: dict[str, frozenset[str]] = {
    "system": frozenset({"role", "content", "name"}),
    "developer": frozenset({"role", "content", "name"}),
    "user": frozenset({"role", "content", "name"}),
    "assistant": frozenset(
        {"role", "content", "name", "tool_calls", "refusal", "audio", "function_call"}
    ),
    "tool": frozenset({"role", "content", "tool_call_id"}),
    "function": frozenset({"role", "content", "name"}),
}
# Order used by the real API's error message.
ROLE_ORDER = ("system", "assistant", "user", "function", "tool", "developer")

# Content part types each role accepts in array content.
PART_TYPES: dict[str, tuple[str, ...]] = {
    "system": ("text",),
    "developer": ("text",),
    "user": ("text", "image_url", "input_audio", "file"),
    "assistant": ("text", "refusal"),
    "tool": ("text",),
}

TOOL_KEYS = frozenset({"type", "function"})
FUNCTION_KEYS = frozenset({"name", "description", "parameters", "strict"})
TOOL_CALL_KEYS = frozenset({"id", "type", "function"})
TOOL_CALL_FUNCTION_KEYS = frozenset({"name", "arguments"})
STREAM_OPTIONS_KEYS = frozenset({"include_usage", "include_obfuscation"})

NAME_PATTERN = "^[a-zA-Z0-9_-]+$"
NAME_RE = re.compile(NAME_PATTERN)
NAME_MAX_LEN = 64

JSON_PARSE_ERROR = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't "
    "using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was "
    "sent was not valid JSON.)"
)
MISSING_KEY_ERROR = (
    "You didn't provide an API key. You need to provide your API key in an Authorization "
    "header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
)


class InvalidRequest(Exception):
    """A refusal: the message, param and code of an OpenAI ``invalid_request_error``."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    def error_body(self) -> dict[str, Any]:
        return error_body(self.message, self.param, self.code)


def error_body(message: str, param: str | None = None, code: str | None = None) -> dict:
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": param,
            "code": code,
        }
    }


def validate_chat_request(body: Any) -> str | None:
    """Return the error message the real API would give for this body, or None if valid."""
    refusal = check_chat_request(body)
    return refusal.message if refusal else None


def check_chat_request(body: Any) -> InvalidRequest | None:
    """Like ``validate_chat_request`` but keeps the error's param and code."""
    try:
        _check_body(body)
    except InvalidRequest as refusal:
        return refusal
    return None


# -- error builders (wording modelled on the real API) --


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):  # before int: bool is an int subclass
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _invalid_type(param: str, expected: str, value: Any) -> InvalidRequest:
    return InvalidRequest(
        f"Invalid type for '{param}': expected {expected}, but got {_describe(value)} instead.",
        param,
        "invalid_type",
    )


def _missing(param: str) -> InvalidRequest:
    return InvalidRequest(
        f"Missing required parameter: '{param}'.", param, "missing_required_parameter"
    )


def _empty_array(param: str) -> InvalidRequest:
    return InvalidRequest(
        f"Invalid '{param}': empty array. Expected an array with minimum length 1, "
        "but got an empty array instead.",
        param,
        "empty_array",
    )


def _invalid_value(param: str, value: Any, supported: tuple[str, ...]) -> InvalidRequest:
    quoted = [f"'{s}'" for s in supported]
    if len(quoted) == 1:
        listed = quoted[0]
    elif len(quoted) == 2:
        listed = f"{quoted[0]} and {quoted[1]}"
    else:
        listed = ", ".join(quoted[:-1]) + f", and {quoted[-1]}"
    return InvalidRequest(
        f"Invalid value: '{value}'. Supported values are: {listed}.", param, "invalid_value"
    )


def _additional_properties(keys: list[str], where: str) -> InvalidRequest:
    quoted = ", ".join(f"'{k}'" for k in keys)
    verb = "was" if len(keys) == 1 else "were"
    return InvalidRequest(
        f"Additional properties are not allowed ({quoted} {verb} unexpected) - '{where}'"
    )


def _unknown_parameter(param: str) -> InvalidRequest:
    return InvalidRequest(f"Unknown parameter: '{param}'.", param, "unknown_parameter")


def _check_name(param: str, value: Any) -> None:
    if not isinstance(value, str):
        raise _invalid_type(param, "a string", value)
    if len(value) > NAME_MAX_LEN:
        raise InvalidRequest(
            f"Invalid '{param}': string too long. Expected a string with maximum length "
            f"{NAME_MAX_LEN}, but got a string with length {len(value)} instead.",
            param,
            "string_above_max_length",
        )
    if not NAME_RE.match(value):
        raise InvalidRequest(
            f"Invalid '{param}': string does not match pattern. Expected a string that "
            f"matches the pattern '{NAME_PATTERN}'.",
            param,
            "invalid_value",
        )


def _given(body: dict, key: str) -> bool:
    """Whether an optional, nullable parameter was actually supplied (null means absent)."""
    return body.get(key) is not None


# -- top level --


def _check_body(body: Any) -> None:
    if not isinstance(body, dict):
        raise InvalidRequest(
            f"Invalid type for request body: expected an object, but got {_describe(body)} "
            "instead."
        )
    _check_known_params(body)
    _check_model(body)
    _check_messages_param(body)
    _check_stream(body)
    function_names = _check_tools(body)
    _check_tool_options(body, function_names)
    for index, message in enumerate(body["messages"]):
        _check_message(index, message)
    _check_tool_sequence(body["messages"])


def _check_known_params(body: dict) -> None:
    unknown = [key for key in body if key not in KNOWN_PARAMS]
    if len(unknown) == 1:
        raise InvalidRequest(f"Unrecognized request argument supplied: {unknown[0]}")
    if unknown:
        raise InvalidRequest(f"Unrecognized request arguments supplied: {', '.join(unknown)}")


def _check_model(body: dict) -> None:
    model = body.get("model")
    if model is None or model == "":
        raise InvalidRequest("you must provide a model parameter")
    if not isinstance(model, str):
        raise _invalid_type("model", "a string", model)


def _check_messages_param(body: dict) -> None:
    if "messages" not in body:
        raise _missing("messages")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise _invalid_type("messages", "an array of objects", messages)
    if not messages:
        raise _empty_array("messages")


def _check_stream(body: dict) -> None:
    if _given(body, "stream") and not isinstance(body["stream"], bool):
        raise _invalid_type("stream", "a boolean", body["stream"])
    if not _given(body, "stream_options"):
        return
    if body.get("stream") is not True:
        raise InvalidRequest(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
            "stream_options",
        )
    options = body["stream_options"]
    if not isinstance(options, dict):
        raise _invalid_type("stream_options", "an object", options)
    for key in options:
        if key not in STREAM_OPTIONS_KEYS:
            raise _unknown_parameter(f"stream_options.{key}")


# -- tools --


def _check_tools(body: dict) -> set[str]:
    """Validate ``tools``; return the declared function names."""
    if "tools" not in body:
        return set()
    tools = body["tools"]
    if not isinstance(tools, list):
        raise _invalid_type("tools", "an array of objects", tools)
    if not tools:
        raise _empty_array("tools")
    names: set[str] = set()
    for index, tool in enumerate(tools):
        name = _check_tool(index, tool)
        if name in names:
            raise InvalidRequest(
                f"Invalid 'tools': duplicate function name '{name}'. "
                "Function names must be unique.",
                f"tools[{index}].function.name",
                "invalid_value",
            )
        names.add(name)
    return names


def _check_tool(index: int, tool: Any) -> str:
    path = f"tools[{index}]"
    if not isinstance(tool, dict):
        raise _invalid_type(path, "an object", tool)
    for key in tool:
        if key not in TOOL_KEYS:
            raise _unknown_parameter(f"{path}.{key}")
    if "type" not in tool:
        raise _missing(f"{path}.type")
    if tool["type"] != "function":
        raise _invalid_value(f"{path}.type", tool["type"], ("function",))
    if "function" not in tool:
        raise _missing(f"{path}.function")
    function = tool["function"]
    if not isinstance(function, dict):
        raise _invalid_type(f"{path}.function", "an object", function)
    for key in function:
        if key not in FUNCTION_KEYS:
            raise _unknown_parameter(f"{path}.function.{key}")
    if "name" not in function:
        raise _missing(f"{path}.function.name")
    _check_name(f"{path}.function.name", function["name"])
    if "parameters" in function:
        _check_parameters(
            function["name"], function["parameters"], function.get("strict") is True,
            f"{path}.function.parameters",
        )
    return function["name"]


def _check_parameters(function_name: str, schema: Any, strict: bool, param: str) -> None:
    def refuse(problem: str) -> InvalidRequest:
        return InvalidRequest(
            f"Invalid schema for function '{function_name}': {problem}",
            param,
            "invalid_function_parameters",
        )

    if schema == {} and not strict:  # an empty schema means "no parameters"
        return
    if not isinstance(schema, dict) or schema.get("type") != "object":
        got = schema.get("type") if isinstance(schema, dict) else _describe(schema)
        raise refuse(f"schema must be a JSON Schema of 'type: \"object\"', got 'type: \"{got}\"'.")
    if strict:
        problem = _strict_schema_problem(schema, ())
        if problem:
            raise refuse(problem)


def _strict_schema_problem(schema: Any, context: tuple[str, ...]) -> str | None:
    """First violation of Structured Outputs' rules for object schemas, searched recursively."""
    if not isinstance(schema, dict):
        return None
    schema_type = schema.get("type")
    is_object = schema_type == "object" or (
        isinstance(schema_type, list) and "object" in schema_type
    )
    if is_object:
        if schema.get("additionalProperties") is not False:
            return (
                f"In context={context!r}, 'additionalProperties' is required to be supplied "
                "and to be false."
            )
        required = schema.get("required")
        required = required if isinstance(required, list) else []
        properties = schema.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        missing = [key for key in properties if key not in required]
        if missing:
            return (
                f"In context={context!r}, 'required' is required to be supplied and to be an "
                f"array including every key in properties. Missing '{missing[0]}'."
            )
    for sub_context, sub_schema in _subschemas(schema):
        problem = _strict_schema_problem(sub_schema, context + sub_context)
        if problem:
            return problem
    return None


def _subschemas(schema: dict) -> Iterator[tuple[tuple[str, ...], Any]]:
    for keyword in ("properties", "$defs", "definitions"):
        named = schema.get(keyword)
        if isinstance(named, dict):
            for name, sub in named.items():
                yield (keyword, name), sub
    if isinstance(schema.get("items"), dict):
        yield ("items",), schema["items"]
    for keyword in ("anyOf", "allOf", "oneOf"):
        alternatives = schema.get(keyword)
        if isinstance(alternatives, list):
            for position, sub in enumerate(alternatives):
                yield (keyword, str(position)), sub


def _check_tool_options(body: dict, function_names: set[str]) -> None:
    for key in ("parallel_tool_calls", "tool_choice"):
        if _given(body, key) and "tools" not in body:
            raise InvalidRequest(
                f"Invalid value for '{key}': '{key}' is only allowed when 'tools' are "
                "specified.",
                key,
            )
    if _given(body, "parallel_tool_calls") and not isinstance(body["parallel_tool_calls"], bool):
        raise _invalid_type("parallel_tool_calls", "a boolean", body["parallel_tool_calls"])
    if _given(body, "tool_choice"):
        _check_tool_choice(body["tool_choice"], function_names)


def _check_tool_choice(choice: Any, function_names: set[str]) -> None:
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise _invalid_value("tool_choice", choice, ("none", "auto", "required"))
        return
    if not isinstance(choice, dict):
        raise _invalid_type("tool_choice", "a string or an object", choice)
    if choice.get("type") != "function":
        raise _invalid_value("tool_choice.type", choice.get("type"), ("function",))
    function = choice.get("function")
    if not isinstance(function, dict) or "name" not in function:
        raise _missing("tool_choice.function.name")
    if not isinstance(function["name"], str) or function["name"] not in function_names:
        raise InvalidRequest(
            f"Invalid value for 'tool_choice': function '{function['name']}' not found in "
            "'tools'.",
            "tool_choice",
        )


# -- messages --


def _check_message(index: int, message: Any) -> None:
    path = f"messages[{index}]"
    if not isinstance(message, dict):
        raise _invalid_type(path, "an object", message)
    if "role" not in message:
        raise _missing(f"{path}.role")
    role = message["role"]
    if not isinstance(role, str) or role not in MESSAGE_KEYS:
        raise _invalid_value(f"{path}.role", role, ROLE_ORDER)
    unexpected = [key for key in message if key not in MESSAGE_KEYS[role]]
    if unexpected:
        raise _additional_properties(unexpected, f"messages.{index}")
    if "name" in message:
        _check_name(f"{path}.name", message["name"])
    if role == "assistant":
        _check_assistant_calls(index, message)
    elif role == "tool":
        _check_tool_call_id(index, message)
    elif role == "function":
        _check_function_message(index, message)
        return
    _check_content(index, role, message)


def _check_content(index: int, role: str, message: dict) -> None:
    param = f"messages[{index}].content"
    content = message.get("content")
    if content is None:
        if role == "assistant":
            if message.get("tool_calls") or message.get("function_call"):
                return  # content is optional next to tool calls
            raise InvalidRequest(
                "Invalid value for 'content': expected a string, got null.",
                f"messages.[{index}].content",
            )
        if "content" not in message:
            raise _missing(param)
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _invalid_type(param, "one of a string or array of objects", content)
    if not content:
        raise _empty_array(param)
    for position, part in enumerate(content):
        _check_part(index, position, PART_TYPES[role], part)


def _check_part(index: int, position: int, allowed: tuple[str, ...], part: Any) -> None:
    param = f"messages[{index}].content[{position}]"
    if not isinstance(part, dict):
        raise _invalid_type(param, "an object", part)
    if "type" not in part:
        raise _missing(f"{param}.type")
    part_type = part["type"]
    if part_type not in allowed:
        raise _invalid_value(f"{param}.type", part_type, allowed)
    unexpected = [key for key in part if key not in ("type", part_type)]
    if unexpected:
        raise _additional_properties(unexpected, f"messages.{index}.content.{position}")
    if part_type not in part:
        raise _missing(f"{param}.{part_type}")
    if part_type in ("text", "refusal") and not isinstance(part[part_type], str):
        raise _invalid_type(f"{param}.{part_type}", "a string", part[part_type])


def _check_assistant_calls(index: int, message: dict) -> None:
    calls = message.get("tool_calls")
    if calls is None:
        return
    param = f"messages[{index}].tool_calls"
    if not isinstance(calls, list):
        raise _invalid_type(param, "an array of objects", calls)
    if not calls:
        raise _empty_array(param)
    seen: set[str] = set()
    for position, call in enumerate(calls):
        call_id = _check_tool_call(index, position, call)
        if call_id in seen:
            raise InvalidRequest(
                f"Invalid '{param}': duplicate tool call id '{call_id}'.",
                f"{param}[{position}].id",
                "invalid_value",
            )
        seen.add(call_id)


def _check_tool_call(index: int, position: int, call: Any) -> str:
    """Validate one assistant ``tool_calls`` entry; return its id."""
    param = f"messages[{index}].tool_calls[{position}]"
    where = f"messages.{index}.tool_calls.{position}"
    if not isinstance(call, dict):
        raise _invalid_type(param, "an object", call)
    unexpected = [key for key in call if key not in TOOL_CALL_KEYS]
    if unexpected:
        raise _additional_properties(unexpected, where)
    for key in ("id", "type", "function"):
        if key not in call:
            raise _missing(f"{param}.{key}")
    if not isinstance(call["id"], str):
        raise _invalid_type(f"{param}.id", "a string", call["id"])
    if call["type"] != "function":
        raise _invalid_value(f"{param}.type", call["type"], ("function",))
    function = call["function"]
    if not isinstance(function, dict):
        raise _invalid_type(f"{param}.function", "an object", function)
    unexpected = [key for key in function if key not in TOOL_CALL_FUNCTION_KEYS]
    if unexpected:
        raise _additional_properties(unexpected, f"{where}.function")
    for key in ("name", "arguments"):
        if key not in function:
            raise _missing(f"{param}.function.{key}")
        if not isinstance(function[key], str):
            raise _invalid_type(f"{param}.function.{key}", "a string", function[key])
    return call["id"]


def _check_tool_call_id(index: int, message: dict) -> None:
    param = f"messages[{index}].tool_call_id"
    if "tool_call_id" not in message:
        raise _missing(param)
    if not isinstance(message["tool_call_id"], str):
        raise _invalid_type(param, "a string", message["tool_call_id"])


def _check_function_message(index: int, message: dict) -> None:
    if "name" not in message:
        raise _missing(f"messages[{index}].name")
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise _invalid_type(f"messages[{index}].content", "a string", content)


def _check_tool_sequence(messages: list[dict]) -> None:
    """Tool messages must directly answer the assistant ``tool_calls`` message before them,
    and every call id of such a message must be answered before the next non-tool message."""
    open_calls: list[str] | None = None  # call ids of the assistant message being answered
    unanswered: list[str] = []
    opened_at = -1
    for index, message in enumerate(messages):
        if message["role"] == "tool":
            if open_calls is None:
                raise InvalidRequest(
                    "Invalid parameter: messages with role 'tool' must be a response to a "
                    "preceding message with 'tool_calls'.",
                    f"messages.[{index}].role",
                )
            call_id = message["tool_call_id"]
            if call_id not in open_calls:
                raise InvalidRequest(
                    f"Invalid parameter: 'tool_call_id' of '{call_id}' not found in "
                    "'tool_calls' of previous message.",
                    f"messages.[{index}].tool_call_id",
                )
            if call_id in unanswered:
                unanswered.remove(call_id)
            continue
        _refuse_unanswered(opened_at, unanswered)
        calls = message.get("tool_calls") if message["role"] == "assistant" else None
        open_calls = [call["id"] for call in calls] if calls else None
        unanswered = list(open_calls or [])
        opened_at = index
    _refuse_unanswered(opened_at, unanswered)


def _refuse_unanswered(assistant_index: int, unanswered: list[str]) -> None:
    if unanswered:
        raise InvalidRequest(
            "An assistant message with 'tool_calls' must be followed by tool messages "
            "responding to each 'tool_call_id'. The following tool_call_ids did not have "
            f"response messages: {', '.join(unanswered)}",
            f"messages.[{assistant_index}].role",
        )


# --------------------------------------------------------------------------------------------
# Scripted replies
# --------------------------------------------------------------------------------------------


class Gate:
    """A one-shot latch opened from any thread and awaited on any asyncio loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open = False
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def open(self) -> None:
        with self._lock:
            self._open = True
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is already closed
                loop.call_soon_threadsafe(_resolve, future)

    async def wait(self) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._open:
                return
            self._waiters.append((loop, future))
        await future


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str


def _new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


@dataclass(eq=False)
class Reply:
    """What the fake answers to one request, in whichever format it came. Build with the
    constructors; ``never_ending()`` and ``failing_after()`` make a reply misbehave."""

    kind: Literal["message", "error", "hang", "endless"]
    content: str | None = None
    calls: list[ToolCall] = field(default_factory=list)
    # The model's reasoning before its answer: ignored by Chat Completions, a `reasoning` item
    # (with encrypted_content) in Responses, a `thinking` block (with a signature) in Messages.
    reasoning: str | None = None
    status: int = 200
    body: dict | None = None  # the JSON body of an error reply
    chunk_size: int = 4  # characters per streamed content / arguments fragment
    # Streaming: stop after this many SSE events (0 = right after the headers) until release().
    # Non-streaming: any value holds the whole body back until release().
    pause_after_chunks: int | None = None
    # Streaming: after this many events an error event ends the stream (Messages: an `error` event
    # carrying `body`; chat: a server_error data event; Responses: `failure`). Non-streaming (chat,
    # Responses): a 500. Set with failing_after() or fake_anthropic.error_mid_stream().
    error_after_chunks: int | None = None
    # Which error event a Responses stream carries: `response.failed`, or a bare `error` event.
    failure: Literal["response.failed", "error"] = "response.failed"
    # Streaming, Messages fake: while paused, a `ping` every `keepalive_every_s`.
    keepalive_every_s: float | None = None
    # Streaming, chat and Responses: send every event but the closing ones, then hold the stream
    # open, parked like a hang. Non-streaming: a hang. Set with never_ending().
    never_ends: bool = False
    # Streaming: every event, the stream's end included, then the connection held open (the
    # body's last chunk never sent), parked like a hang until the client leaves. Set with held_open().
    holds_open: bool = False
    # Set when the pause point (or the hang) is reached, for tests to synchronise on.
    reached: threading.Event = field(default_factory=threading.Event, repr=False)
    # Set when the client went away while this reply was being served. Certain while parked
    # (paused or hanging); best effort mid-stream, as the OS may buffer what was written.
    client_gone: threading.Event = field(default_factory=threading.Event, repr=False)
    gate: Gate = field(default_factory=Gate, repr=False)
    # endless: seconds between two writes, and whether the stream ever ends a line.
    pace_s: float = 0.0
    line_breaks: bool = True

    @classmethod
    def text(
        cls,
        content: str,
        *,
        chunk_size: int = 4,
        pause_after_chunks: int | None = None,
        reasoning: str | None = None,
    ) -> Reply:
        return cls("message", content=content, chunk_size=chunk_size,
                   pause_after_chunks=pause_after_chunks, reasoning=reasoning)

    @classmethod
    def tool_calls(
        cls,
        calls: list[tuple[str, str]],
        content: str | None = None,
        *,
        chunk_size: int = 4,
        pause_after_chunks: int | None = None,
        reasoning: str | None = None,
    ) -> Reply:
        """An assistant message calling ``(name, arguments_json)`` functions, in order."""
        return cls(
            "message",
            content=content,
            calls=[ToolCall(_new_call_id(), name, arguments) for name, arguments in calls],
            chunk_size=chunk_size,
            pause_after_chunks=pause_after_chunks,
            reasoning=reasoning,
        )

    @classmethod
    def error(cls, status: int, body: dict) -> Reply:
        return cls("error", status=status, body=body)

    @classmethod
    def hang(cls) -> Reply:
        """Never answers: waits until the client goes away, the server closes, or release(),
        which drops the connection without an answer."""
        return cls("hang")

    @classmethod
    def endless(cls, *, chunk_size: int = 65536, pace_s: float = 0.0, line_breaks: bool = True) -> Reply:
        """A 200 that never ends (until the client goes away): content chunks of ``chunk_size``
        characters every ``pace_s`` seconds, streamed as SSE events, or, with ``line_breaks`` off,
        as one ``data:`` line that never ends; a non-streaming request gets a JSON body whose
        content string never closes."""
        return cls("endless", chunk_size=chunk_size, pace_s=pace_s, line_breaks=line_breaks)

    def never_ending(self) -> Reply:
        """This reply, streamed without its end: no finish, no [DONE] / response.completed."""
        self.never_ends = True
        return self

    def held_open(self) -> Reply:
        """This reply, streamed whole ([DONE] / response.completed sent), its connection then
        held open: the proxy is still waiting for the body's end when its client hangs up."""
        self.holds_open = True
        return self

    def failing_after(
        self, events: int, failure: Literal["response.failed", "error"] = "response.failed"
    ) -> Reply:
        """This reply, broken off by an error event after ``events`` events."""
        self.error_after_chunks, self.failure = events, failure
        return self

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.calls else "stop"

    def release(self) -> None:
        """Let a paused reply continue; callable from any thread, before or after the pause."""
        self.gate.open()


def default_responder(body: dict) -> Reply:
    return Reply.text(f"reply to: {last_user_text(body)}")


def last_user_text(body: dict) -> str:
    """The text of the last user message that has text, in a Chat Completions (``messages``),
    Responses (``input``: a string or items) or Anthropic Messages body; "" when there is none.
    A message of tool results only (Messages' ``tool_result`` blocks) has no text."""
    if isinstance(body.get("input"), str):
        return body["input"]
    if "contents" in body:  # Gemini: user contents' text parts
        return _gemini_user_text(body["contents"])
    messages = body.get("messages") if "messages" in body else body.get("input")
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("role") == "user":
            text = _text_of(message.get("content"))
            if text:
                return text
    return ""


def _gemini_user_text(contents: Any) -> str:
    for content in reversed(contents if isinstance(contents, list) else []):
        if isinstance(content, dict) and content.get("role", "user") == "user":
            parts = content.get("parts") if isinstance(content.get("parts"), list) else []
            text = "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
            if text:
                return text
    return ""


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


# --------------------------------------------------------------------------------------------
# Response bodies
# --------------------------------------------------------------------------------------------


def _estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)  # roughly 4 characters per token


def _usage(body: dict, reply: Reply) -> dict[str, int]:
    prompt = sum(4 + _estimate_tokens(_text_of(m.get("content"))) for m in body["messages"])
    if body.get("tools"):
        prompt += _estimate_tokens(json.dumps(body["tools"]))
    completion = _estimate_tokens(
        (reply.content or "") + "".join(c.name + c.arguments for c in reply.calls)
    )
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _envelope(obj: str, model: str) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{secrets.token_hex(12)}",
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": "fp_fake",
    }


def completion_body(body: dict, reply: Reply) -> dict[str, Any]:
    """A ``chat.completion`` object for a non-streaming request."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content, "refusal": None}
    if reply.calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.calls
        ]
    return {
        **_envelope("chat.completion", body["model"]),
        "choices": [
            {"index": 0, "message": message, "finish_reason": reply.finish_reason,
             "logprobs": None}
        ],
        "usage": _usage(body, reply),
    }


def completion_chunks(body: dict, reply: Reply) -> list[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a streamed reply, in order."""
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    envelope = _envelope("chat.completion.chunk", body["model"])
    if include_usage:
        envelope["usage"] = None  # as the real API: null on every chunk but the last

    def chunk(delta: dict, finish_reason: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return {**envelope, "choices": [choice]}

    first_content = "" if reply.content is not None else None
    chunks = [chunk({"role": "assistant", "content": first_content, "refusal": None})]
    chunks += [chunk({"content": piece}) for piece in _split(reply.content or "", reply.chunk_size)]
    for index, call in enumerate(reply.calls):
        head = {"index": index, "id": call.id, "type": "function",
                "function": {"name": call.name, "arguments": ""}}
        chunks.append(chunk({"tool_calls": [head]}))
        chunks += [
            chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            for piece in _split(call.arguments, reply.chunk_size)
        ]
    chunks.append(chunk({}, reply.finish_reason))
    if include_usage:
        chunks.append({**envelope, "choices": [], "usage": _usage(body, reply)})
    return chunks


def _split(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), max(1, size))]


SERVER_ERROR = "The server had an error while processing your request. Sorry about that!"


def server_error_body() -> dict[str, Any]:
    """The real API's error for a failure on its side (a 500, or an error event mid-stream)."""
    return {"error": {"message": SERVER_ERROR, "type": "server_error", "param": None,
                      "code": "server_error"}}


def _sse_event(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()


@dataclass(frozen=True)
class SseScript:
    """A reply's stream: its events, how many of the last ones are its end (withheld by
    ``never_ends``), and the error event that ``error_after_chunks`` sends after n events."""

    events: list[bytes]
    closing: int
    failure: Callable[[int], bytes]


class WireFormat(Protocol):
    """One API the fake serves: what it refuses, and how a Reply looks in it."""

    def check(self, body: Any) -> InvalidRequest | None: ...

    def reply_body(self, body: dict, reply: Reply) -> dict[str, Any]: ...

    def reply_stream(self, body: dict, reply: Reply) -> SseScript: ...


class ChatCompletions:
    """``POST /v1/chat/completions``."""

    def check(self, body: Any) -> InvalidRequest | None:
        return check_chat_request(body)

    def reply_body(self, body: dict, reply: Reply) -> dict[str, Any]:
        return completion_body(body, reply)

    def reply_stream(self, body: dict, reply: Reply) -> SseScript:
        events = [_sse_event(chunk) for chunk in completion_chunks(body, reply)]
        events.append(_sse_event("[DONE]"))
        # Its end: the finish_reason chunk, the usage chunk when asked for, and [DONE].
        closing = 3 if (body.get("stream_options") or {}).get("include_usage") else 2
        return SseScript(events, closing, lambda sent: _sse_event(server_error_body()))


# --------------------------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------------------------


@dataclass
class Recorded:
    """One request as received. Header names are lower-cased. ``body`` is the parsed JSON
    object, the raw bytes when it is not a JSON object, or None when empty. ``status_sent``
    stays 0 until a status line goes out (e.g. forever for a hang)."""

    method: str
    path: str
    headers: dict[str, str]
    body: dict | bytes | None
    status_sent: int = 0
    query: dict[str, str] = field(default_factory=dict)
    raw: bytes = b""  # the body's bytes as received


def _decode_body(raw: bytes) -> dict | bytes | None:
    if not raw:
        return None
    try:
        parsed = json.loads(raw)
    except ValueError:
        return raw
    return parsed if isinstance(parsed, dict) else raw


def _has_bearer(request: web.Request) -> bool:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return scheme.lower() == "bearer" and bool(token.strip())


MODELS = ("gpt-4o-mini", "gpt-4o", "gpt-4.1-mini")
CHAT_COMPLETIONS = ChatCompletions()


class FakeUpstream:
    """The scripted upstream. ``start``/``close`` run on the server's loop; everything else
    (enqueue, responder, requests, reset, Reply.release) is safe from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: collections.deque[Reply] = collections.deque()
        self._requests: list[Recorded] = []
        self._chat_bodies: list[dict] = []
        self._responses_bodies: list[dict] = []
        self._responder: Callable[[dict], Reply] = default_responder
        self._runner: web.AppRunner | None = None
        self._parked: set[asyncio.Task[Any]] = set()  # handlers in a pause or hang
        self._closing = False
        self.port: int = 0
        # Imported here: those modules build on this one's replies and refusals.
        from tests.fakes.fake_anthropic import AnthropicMessages
        from tests.fakes.fake_gemini import GeminiAPI
        from tests.fakes.fake_responses import ResponsesAPI

        self.anthropic = AnthropicMessages(self)  # POST /v1/messages, and what it issued
        self.responses = ResponsesAPI()  # POST /v1/responses, and what it stored
        self.gemini = GeminiAPI(self)  # POST /v1beta/models/{model}:generateContent, ...

    # -- lifecycle --

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)  # large prompts are the point
        app.router.add_post("/v1/chat/completions", self._handle_chat)
        app.router.add_post("/v1/responses", self._handle_responses)
        app.router.add_get("/v1/models", self._handle_models)
        app.router.add_routes(self.anthropic.routes())
        app.router.add_routes(self.gemini.routes())
        app.router.add_route("*", "/{tail:.*}", self._handle_other)
        # handler_cancellation: a client leaving cancels its handler, which is how a parked
        # reply learns about it. A short shutdown_timeout keeps close() quick.
        self._runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=2.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def close(self) -> None:
        self._closing = True
        for task in list(self._parked):  # don't let hangs and pauses hold the shutdown up
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- scripting --

    @property
    def requests(self) -> list[Recorded]:
        """Every request received so far, in order (a snapshot)."""
        with self._lock:
            return list(self._requests)

    def chat_requests(self) -> list[dict]:
        """Bodies of the chat completion requests that passed validation, in order."""
        with self._lock:
            return list(self._chat_bodies)

    def messages_requests(self) -> list[dict]:
        """Bodies of the Anthropic `/v1/messages` requests that passed validation, in order."""
        return self.anthropic.requests()

    def responses_requests(self) -> list[dict]:
        """Bodies of the Responses requests that passed validation, in order."""
        with self._lock:
            return list(self._responses_bodies)

    def enqueue(self, *replies: Reply) -> None:
        with self._lock:
            self._queue.extend(replies)

    @property
    def responder(self) -> Callable[[dict], Reply]:
        with self._lock:
            return self._responder

    @responder.setter
    def responder(self, responder: Callable[[dict], Reply]) -> None:
        with self._lock:
            self._responder = responder

    def reset(self) -> None:
        with self._lock:
            self._queue.clear()
            self._requests.clear()
            self._chat_bodies.clear()
            self._responses_bodies.clear()
            self._responder = default_responder
        self.anthropic.reset()
        self.gemini.reset()
        self.responses.reset()  # the responses it stored and the reasoning it issued

    # -- handlers --

    async def _record(self, request: web.Request) -> Recorded:
        raw = await request.read()
        record = Recorded(
            method=request.method,
            path=request.path,
            headers={name.lower(): value for name, value in request.headers.items()},
            body=_decode_body(raw),
            query=dict(request.query),
            raw=raw,
        )
        with self._lock:
            self._requests.append(record)
        return record

    async def _handle_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, CHAT_COMPLETIONS, self._chat_bodies)

    async def _handle_responses(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, self.responses, self._responses_bodies)

    async def _serve(
        self, request: web.Request, wire: WireFormat, accepted: list[dict]
    ) -> web.StreamResponse:
        """Answer one request of ``wire``: refuse it, or take the next reply and serve it."""
        record = await self._record(request)
        if not _has_bearer(request):
            return _json(record, error_body(MISSING_KEY_ERROR, code="invalid_api_key"), 401)
        try:
            body = json.loads(await request.read())
        except ValueError:
            return _json(record, error_body(JSON_PARSE_ERROR), 400)
        refusal = wire.check(body)
        if refusal:
            return _json(record, refusal.error_body(), 400)
        reply = self._take_reply(body, accepted)
        if reply.kind == "error":
            return _json(record, reply.body or {}, reply.status)
        if reply.kind == "hang" or (reply.never_ends and not body.get("stream")):
            await self._park(reply, reply.gate.wait())
            _drop_connection()
        if reply.kind == "endless":
            return await self._endless(request, record, body, reply)
        if body.get("stream"):
            return await self._stream(request, record, reply, wire.reply_stream(body, reply))
        if reply.pause_after_chunks is not None:
            await self._park(reply, reply.gate.wait())
        if reply.error_after_chunks is not None:
            return _json(record, server_error_body(), 500)
        return _json(record, wire.reply_body(body, reply), 200)

    def _take_reply(self, body: dict, accepted: list[dict] | None = None) -> Reply:
        """The next scripted Reply; `body` is logged in `accepted` (default: the chat bodies)."""
        with self._lock:
            (self._chat_bodies if accepted is None else accepted).append(body)
            if self._queue:
                return self._queue.popleft()
            responder = self._responder
        return responder(body)  # outside the lock: it may call back into the fake

    async def _park(self, reply: Reply, until: Any) -> None:
        """Await ``until`` with ``reply.reached`` set; note a client that leaves meanwhile."""
        task = asyncio.current_task()
        assert task is not None
        self._parked.add(task)
        reply.reached.set()
        try:
            await until
        except asyncio.CancelledError:
            self._note_client_gone(reply)
            raise
        finally:
            self._parked.discard(task)

    def _note_client_gone(self, reply: Reply) -> None:
        # With handler_cancellation, a cancelled handler means the client left -- unless we
        # are the ones closing.
        if not self._closing:
            reply.client_gone.set()

    async def _stream(
        self, request: web.Request, record: Recorded, reply: Reply, script: SseScript
    ) -> web.StreamResponse:
        """Send the events one by one, misbehaving as ``reply`` is scripted to: a pause at
        ``pause_after_chunks``; an error event in place of the rest (``error_after_chunks``); or
        (``never_ends``) the end held back and the stream held open."""
        events = script.events
        if reply.error_after_chunks is not None:
            kept = min(reply.error_after_chunks, len(events))
            events = events[:kept] + [script.failure(kept)]
        elif reply.never_ends:
            events = events[: len(events) - script.closing]
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream; charset=utf-8",
                     "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        record.status_sent = 200
        try:
            for sent in range(len(events) + 1):
                if reply.pause_after_chunks == sent:
                    await self._park(reply, reply.gate.wait())
                if sent < len(events):
                    await response.write(events[sent])  # written (flushed) one by one
            if not ((reply.never_ends or reply.holds_open) and reply.error_after_chunks is None):
                await response.write_eof()
                return response
            await self._park(reply, reply.gate.wait())
        except asyncio.CancelledError:
            self._note_client_gone(reply)
            raise
        except ConnectionError:
            self._note_client_gone(reply)
            return response
        _drop_connection()  # released: the stream ends without its end

    async def _endless(self, request: web.Request, record: Recorded, body: dict, reply: Reply) -> web.StreamResponse:
        stream = bool(body.get("stream"))
        content_type = "text/event-stream" if stream else "application/json"
        response = web.StreamResponse(headers={"Content-Type": content_type})
        await response.prepare(request)
        record.status_sent = 200
        piece = "x" * reply.chunk_size
        envelope = _envelope("chat.completion.chunk" if stream else "chat.completion", body["model"])
        if stream and reply.line_breaks:
            head = b""
            event = _sse_event({**envelope, "choices": [{"index": 0, "delta": {"content": piece}}]})
        elif stream:
            head = _sse_event({**envelope, "choices": [{"index": 0, "delta": {"content": ""}}]}).rstrip()
            head = head[: head.rindex(b'""') + 1]  # the content string opened, never closed
            event = piece.encode()
        else:
            head = json.dumps({**envelope, "choices": [{"index": 0, "message": {"content": ""}}]}).encode()
            head = head[: head.rindex(b'""') + 1]
            event = piece.encode()
        reply.reached.set()
        try:
            await response.write(head)
            while True:
                await response.write(event)
                await asyncio.sleep(reply.pace_s)  # 0 still yields: the client's reads interleave
        except asyncio.CancelledError:
            self._note_client_gone(reply)
            raise
        except ConnectionError:
            self._note_client_gone(reply)
        return response

    async def _handle_models(self, request: web.Request) -> web.StreamResponse:
        record = await self._record(request)
        if not _has_bearer(request):
            return _json(record, error_body(MISSING_KEY_ERROR, code="invalid_api_key"), 401)
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "fake"} for m in MODELS]
        return _json(record, {"object": "list", "data": data}, 200)

    async def _handle_other(self, request: web.Request) -> web.StreamResponse:
        """Echo any other request so a passthrough proxy can be checked end to end."""
        record = await self._record(request)
        if not _has_bearer(request):
            return _json(record, error_body(MISSING_KEY_ERROR, code="invalid_api_key"), 401)
        headers_seen: dict[str, Any] = dict(record.headers)
        headers_seen["authorization"] = True  # present, but never echo the secret
        echo = {
            "path": request.path,
            "method": request.method,
            "query": dict(request.query),
            "body": (await request.read()).decode("utf-8", errors="replace"),
            "headers_seen": headers_seen,
        }
        return _json(record, echo, 200)


def _drop_connection() -> NoReturn:
    # A cancelled handler is aiohttp's own way to abandon a request: it closes the connection
    # without a response and without logging an error.
    raise asyncio.CancelledError()


def _json(record: Recorded, payload: dict, status: int) -> web.Response:
    record.status_sent = status
    return web.json_response(payload, status=status)


@contextlib.contextmanager
def running_in_thread(fake: FakeUpstream | None = None) -> Iterator[FakeUpstream]:
    """Run a FakeUpstream on its own event loop in a daemon thread for the ``with`` block."""
    fake = fake or FakeUpstream()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="fake-upstream", daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(fake.start(), loop).result(timeout=10)
        yield fake
    finally:
        asyncio.run_coroutine_threadsafe(fake.close(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
