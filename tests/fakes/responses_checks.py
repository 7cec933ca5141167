"""What the real Responses API refuses (/work/shared/RESPONSES-RULES.md), as checks on a body.

Two stages, as on the real server: ``check_request`` looks at the body alone (parameters, tools,
the shape of every input item and part); ``check_chain`` looks at the input the server resolved
(the stored chain behind ``previous_response_id``, item references expanded, then the new
items): unique ids, reasoning that comes back intact and followed by its item, and calls paired
with their outputs. Both return the refusal, or None. Wording follows the real API where
RESPONSES-RULES.md gives it, and its usual forms ("Unknown parameter: 'x'.") elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from tests.fakes.fake_upstream import (
    InvalidRequest,
    _check_name,
    _invalid_type,
    _invalid_value,
    _missing,
    _strict_schema_problem,
    _unknown_parameter,
)

__all__ = ["IssuedReasoning", "Ledger", "check_chain", "check_request", "item_type"]

# ResponseCreateParams of the openai SDK, plus `stream` and what Codex sends (`client_metadata`).
KNOWN_PARAMS = frozenset(
    {
        "access_programs", "background", "background_options", "client_metadata",
        "context_management", "conversation", "image", "include", "input", "instructions",
        "max_output_tokens", "max_tool_calls", "metadata", "model", "moderation",
        "parallel_tool_calls", "previous_response_id", "prompt", "prompt_cache_key",
        "prompt_cache_options", "prompt_cache_retention", "reasoning", "safety_identifier",
        "service_tier", "store", "stream", "stream_options", "temperature", "text", "tool_choice",
        "tools", "top_logprobs", "top_p", "truncation", "user",
    }
)
INCLUDABLE = (
    "file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
    "message.input_image.image_url", "computer_call_output.output.image_url",
    "code_interpreter_call.outputs", "reasoning.encrypted_content",
    "message.output_text.logprobs",
)
STREAM_OPTIONS_KEYS = frozenset({"include_obfuscation"})


def _key_sets(table: dict[str, str]) -> dict[str, frozenset[str]]:
    """``{"kind": "key key ..."}`` as the sets of keys each kind may carry, ``type`` included."""
    return {kind: frozenset(keys.split()) | {"type"} for kind, keys in table.items()}


# The keys each input item type may carry (the openai SDK's input item params; `id` on every
# message, as Codex sends it). Checked in more depth below for the types agents use.
ITEM_KEYS = _key_sets(
    {
        "message": "id role content status phase",
        "function_call": "id call_id name arguments status namespace caller async",
        "function_call_output": "id call_id output status name namespace caller",
        "reasoning": "id summary content encrypted_content status",
        "item_reference": "id",
        "custom_tool_call": "id call_id name input namespace caller async",
        "custom_tool_call_output": "id call_id output caller",
        "compaction": "id encrypted_content",
        "compaction_trigger": "id",
        "web_search_call": "id action status",
        "file_search_call": "id queries results status",
        "computer_call": "id call_id action actions pending_safety_checks status",
        "computer_call_output": "id call_id output acknowledged_safety_checks status",
        "image_generation_call": (
            "id result status action background error output_format quality revised_prompt size "
            "svg_usage"
        ),
        "code_interpreter_call": "id code container_id outputs status",
        "local_shell_call": "id call_id action status",
        "local_shell_call_output": "id output status",
        "shell_call": "id call_id action status caller environment",
        "shell_call_output": "id call_id output status caller max_output_length",
        "apply_patch_call": "id call_id operation status caller",
        "apply_patch_call_output": "id call_id output status caller",
        "mcp_list_tools": "id server_label tools error",
        "mcp_approval_request": "id arguments name server_label",
        "mcp_approval_response": "id approval_request_id approve reason",
        "mcp_call": "id arguments name server_label approval_request_id error output status",
        "tool_search_call": "id call_id arguments execution status",
        "tool_search_output": "id call_id execution status tools",
        "additional_tools": "id role tools",
        "configuration_update": "id reasoning text",
        "program": "id call_id code fingerprint",
        "program_output": "id call_id result status",
    }
)
# The prefix the real API demands of an item id it issues, when the item carries one.
ID_PREFIXES = {"message": "msg", "function_call": "fc", "function_call_output": "fc", "reasoning": "rs"}

MESSAGE_ROLES = ("user", "assistant", "system", "developer")
PART_KEYS = _key_sets(
    {
        "input_text": "text",
        "input_image": "image_url file_id detail",
        "input_file": "file_id file_data file_url filename detail",
        "input_audio": "input_audio",
        "output_text": "text annotations logprobs",
        "refusal": "refusal",
    }
)
INPUT_PARTS = ("input_text", "input_image", "input_file", "input_audio")
OUTPUT_PARTS = ("output_text", "refusal")
TOOL_OUTPUT_PARTS = ("input_text", "input_image", "input_file")
STATUSES = ("in_progress", "completed", "incomplete")

TOOL_KEYS = _key_sets(
    {
        "function": "name description parameters strict defer_loading output_schema allowed_callers async",
        "custom": "name description format defer_loading allowed_callers async",
        "namespace": "name description tools",
    }
)
BUILT_IN_TOOLS = frozenset(
    {
        "file_search", "computer", "computer_use_preview", "web_search", "web_search_2025_08_26",
        "web_search_preview", "web_search_preview_2025_03_11", "mcp", "code_interpreter",
        "programmatic_tool_calling", "image_generation", "local_shell", "shell", "tool_search",
        "apply_patch",
    }
)
TOOL_TYPES = ("function", "custom", "namespace", *sorted(BUILT_IN_TOOLS))


def item_type(item: dict) -> str:
    """An input item's type: a bare ``{"role", "content"}`` is a message."""
    return item.get("type") or "message"


# --------------------------------------------------------------------------------------------
# The body alone
# --------------------------------------------------------------------------------------------


def check_request(body: Any) -> InvalidRequest | None:
    """The refusal the real API gives this body on its own, or None."""
    try:
        _check_body(body)
    except InvalidRequest as refusal:
        return refusal
    return None


def _check_body(body: Any) -> None:
    if not isinstance(body, dict):
        raise _invalid_type("body", "an object", body)
    for key in body:
        if key not in KNOWN_PARAMS:
            raise _unknown_parameter(key)
    if "model" not in body:
        raise _missing("model")
    if not isinstance(body["model"], str):
        raise _invalid_type("model", "a string", body["model"])
    for key in ("stream", "store", "parallel_tool_calls", "background"):
        if body.get(key) is not None and not isinstance(body[key], bool):
            raise _invalid_type(key, "a boolean", body[key])
    for key in ("instructions", "previous_response_id", "prompt_cache_key"):
        if body.get(key) is not None and not isinstance(body[key], str):
            raise _invalid_type(key, "a string", body[key])
    _check_stream_options(body)
    _check_include(body.get("include"))
    names = _check_tools(body.get("tools"))
    _check_tool_choice(body.get("tool_choice"), names)
    _check_input(body.get("input"))


def _check_stream_options(body: dict) -> None:
    options = body.get("stream_options")
    if options is None:
        return
    if body.get("stream") is not True:
        raise InvalidRequest(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options"
        )
    if not isinstance(options, dict):
        raise _invalid_type("stream_options", "an object", options)
    for key in options:
        if key not in STREAM_OPTIONS_KEYS:
            raise _unknown_parameter(f"stream_options.{key}")


def _check_include(include: Any) -> None:
    if include is None:
        return
    if not isinstance(include, list):
        raise _invalid_type("include", "an array of strings", include)
    for index, value in enumerate(include):
        if value not in INCLUDABLE:
            raise _invalid_value(f"include[{index}]", value, INCLUDABLE)


# -- tools --


def _check_tools(tools: Any) -> set[str]:
    """Validate ``tools``; return the callable names (functions and custom tools, top level)."""
    if tools is None:
        return set()
    if not isinstance(tools, list):
        raise _invalid_type("tools", "an array of objects", tools)
    return _check_tool_list(tools, "tools")


def _check_tool_list(tools: list, path: str) -> set[str]:
    names: set[str] = set()
    for index, tool in enumerate(tools):
        name = _check_tool(tool, f"{path}[{index}]", nested=path != "tools")
        if name is None:
            continue
        if name in names:
            raise InvalidRequest(
                f"Invalid '{path}': duplicate function name '{name}'. Function names must be unique.",
                f"{path}[{index}].name",
                "invalid_value",
            )
        names.add(name)
    return names


def _check_tool(tool: Any, path: str, nested: bool) -> str | None:
    if not isinstance(tool, dict):
        raise _invalid_type(path, "an object", tool)
    if "type" not in tool:
        raise _missing(f"{path}.type")
    kind = tool["type"]
    if kind == "function":
        if "name" not in tool:  # e.g. a Chat Completions tool: {"type", "function": {...}}
            raise _missing(f"{path}.name")
        _check_keys(tool, TOOL_KEYS["function"], path)
        _check_name(f"{path}.name", tool["name"])
        _check_function_parameters(tool, path)
        return tool["name"]
    if kind == "custom":
        if "name" not in tool:
            raise _missing(f"{path}.name")
        _check_keys(tool, TOOL_KEYS["custom"], path)
        _check_name(f"{path}.name", tool["name"])
        return tool["name"]
    if kind == "namespace" and not nested:
        _check_keys(tool, TOOL_KEYS["namespace"], path)
        if "name" not in tool:
            raise _missing(f"{path}.name")
        _check_name(f"{path}.name", tool["name"])
        if not isinstance(tool.get("tools"), list):
            raise _invalid_type(f"{path}.tools", "an array of objects", tool.get("tools"))
        _check_tool_list(tool["tools"], f"{path}.tools")
        return None  # its own name is no function's name
    if kind in BUILT_IN_TOOLS and not nested:
        return None
    raise _invalid_value(f"{path}.type", kind, ("function", "custom") if nested else TOOL_TYPES)


def _check_function_parameters(tool: dict, path: str) -> None:
    schema = tool.get("parameters")
    if schema is None:
        return
    if not isinstance(schema, dict) or (schema and schema.get("type") != "object"):
        got = schema.get("type") if isinstance(schema, dict) else type(schema).__name__
        raise InvalidRequest(
            f"Invalid schema for function '{tool['name']}': schema must be a JSON Schema of "
            f"'type: \"object\"', got 'type: \"{got}\"'.",
            f"{path}.parameters",
            "invalid_function_parameters",
        )
    if tool.get("strict") is True:
        problem = _strict_schema_problem(schema, ())
        if problem:
            raise InvalidRequest(
                f"Invalid schema for function '{tool['name']}': {problem}",
                f"{path}.parameters",
                "invalid_function_parameters",
            )


def _check_tool_choice(choice: Any, names: set[str]) -> None:
    if choice is None:
        return
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise _invalid_value("tool_choice", choice, ("none", "auto", "required"))
        return
    if not isinstance(choice, dict) or "type" not in choice:
        raise _invalid_type("tool_choice", "a string or an object", choice)
    if choice["type"] in ("function", "custom") and choice.get("name") not in names:
        raise InvalidRequest(
            f"Tool choice '{choice.get('name')}' not found in 'tools' parameter.", "tool_choice"
        )


# -- input items --


def _check_input(items: Any) -> None:
    if items is None or isinstance(items, str):
        return
    if not isinstance(items, list):
        raise _invalid_type("input", "a string or an array of objects", items)
    for index, item in enumerate(items):
        _check_item(item, f"input[{index}]")


def _check_item(item: Any, path: str) -> None:
    if not isinstance(item, dict):
        raise _invalid_type(path, "an object", item)
    kind = item_type(item)
    if kind not in ITEM_KEYS:
        raise _invalid_value(f"{path}.type", kind, tuple(ITEM_KEYS))
    _check_keys(item, ITEM_KEYS[kind], path)
    if "id" in item and item["id"] is not None:
        _check_id(item["id"], ID_PREFIXES.get(kind), f"{path}.id")
    if item.get("status") is not None and item["status"] not in STATUSES:
        raise _invalid_value(f"{path}.status", item["status"], STATUSES)
    check = ITEM_CHECKS.get(kind)
    if check:
        check(item, path)


def _check_keys(obj: dict, allowed: frozenset[str], path: str) -> None:
    for key in obj:
        if key not in allowed:
            raise _unknown_parameter(f"{path}.{key}")


def _check_id(value: Any, prefix: str | None, param: str) -> None:
    if not isinstance(value, str):
        raise _invalid_type(param, "a string", value)
    if prefix and not value.startswith(prefix):
        raise InvalidRequest(
            f"Invalid '{param}': '{value}'. Expected an ID that begins with '{prefix}'.",
            param,
            "invalid_value",
        )


def _required_string(item: dict, key: str, path: str) -> None:
    if key not in item:
        raise _missing(f"{path}.{key}")
    if not isinstance(item[key], str):
        raise _invalid_type(f"{path}.{key}", "a string", item[key])


def _check_message(item: dict, path: str) -> None:
    if "role" not in item:
        raise _missing(f"{path}.role")
    role = item["role"]
    if role not in MESSAGE_ROLES:
        raise _invalid_value(f"{path}.role", role, MESSAGE_ROLES)
    if "content" not in item:
        raise _missing(f"{path}.content")
    content = item["content"]
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _invalid_type(f"{path}.content", "a string or an array of objects", content)
    _check_parts(content, OUTPUT_PARTS if role == "assistant" else INPUT_PARTS, f"{path}.content")


def _check_parts(parts: list, allowed: tuple[str, ...], path: str) -> None:
    for position, part in enumerate(parts):
        param = f"{path}[{position}]"
        if not isinstance(part, dict):
            raise _invalid_type(param, "an object", part)
        if "type" not in part:
            raise _missing(f"{param}.type")
        if part["type"] not in allowed:
            raise _invalid_value(f"{param}.type", part["type"], allowed)
        _check_keys(part, PART_KEYS[part["type"]], param)
        if part["type"] in ("input_text", "output_text", "refusal"):
            _required_string(part, "refusal" if part["type"] == "refusal" else "text", param)


def _check_function_call(item: dict, path: str) -> None:
    for key in ("call_id", "name", "arguments"):
        _required_string(item, key, path)


def _check_call_output(item: dict, path: str) -> None:
    _required_string(item, "call_id", path)
    if "output" not in item:
        raise _missing(f"{path}.output")
    output = item["output"]
    if isinstance(output, list):
        _check_parts(output, TOOL_OUTPUT_PARTS, f"{path}.output")
    elif not isinstance(output, str):
        raise _invalid_type(f"{path}.output", "a string or an array of objects", output)


def _check_reasoning(item: dict, path: str) -> None:
    if "id" not in item:
        raise _missing(f"{path}.id")
    if "summary" not in item:
        raise _missing(f"{path}.summary")
    if not isinstance(item["summary"], list):
        raise _invalid_type(f"{path}.summary", "an array of objects", item["summary"])
    for position, part in enumerate(item["summary"]):
        param = f"{path}.summary[{position}]"
        if not isinstance(part, dict):
            raise _invalid_type(param, "an object", part)
        if part.get("type") != "summary_text":
            raise _invalid_value(f"{param}.type", part.get("type"), ("summary_text",))
        _check_keys(part, frozenset({"type", "text"}), param)
        _required_string(part, "text", param)
    if item.get("encrypted_content") is not None and not isinstance(item["encrypted_content"], str):
        raise _invalid_type(f"{path}.encrypted_content", "a string", item["encrypted_content"])


def _check_item_reference(item: dict, path: str) -> None:
    _required_string(item, "id", path)


def _check_custom_call(item: dict, path: str) -> None:
    for key in ("call_id", "name", "input"):
        _required_string(item, key, path)


ITEM_CHECKS = {
    "message": _check_message,
    "function_call": _check_function_call,
    "function_call_output": _check_call_output,
    "custom_tool_call": _check_custom_call,
    "custom_tool_call_output": _check_call_output,
    "reasoning": _check_reasoning,
    "item_reference": _check_item_reference,
}


# --------------------------------------------------------------------------------------------
# The resolved input
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IssuedReasoning:
    """What a reasoning item the server produced must come back with: the output item that
    followed it (its message or call)."""

    following_id: str
    following_type: str


class Ledger(Protocol):
    """What the server knows of the reasoning it issued."""

    def open_reasoning(self, item_id: str, encrypted_content: str) -> IssuedReasoning | None:
        """The reasoning sealed in ``encrypted_content``, if it is intact and ``item_id``'s."""

    def stored_reasoning(self, item_id: str) -> IssuedReasoning | None:
        """A reasoning item of a stored response (one that may come back by id alone)."""


# A call item type and the output type that answers it.
CALL_OUTPUTS = {"function_call": "function_call_output", "custom_tool_call": "custom_tool_call_output"}


def check_chain(items: list[dict], ledger: Ledger) -> InvalidRequest | None:
    """The refusal the real API gives this resolved input, or None."""
    try:
        _check_unique_ids(items)
        for index, item in enumerate(items):
            if item_type(item) == "reasoning":
                _check_reasoning_replay(items, index, ledger)
        _check_pairing(items)
    except InvalidRequest as refusal:
        return refusal
    return None


def _check_unique_ids(items: list[dict]) -> None:
    seen: set[str] = set()
    for item in items:
        item_id = item.get("id")
        if item_id is None:
            continue
        if item_id in seen:
            raise InvalidRequest(
                f"Duplicate item found with id {item_id}. Remove duplicate items from your input and "
                "try again.",
                "input",
            )
        seen.add(item_id)


def _check_reasoning_replay(items: list[dict], index: int, ledger: Ledger) -> None:
    item = items[index]
    encrypted = item.get("encrypted_content")
    if encrypted is not None:
        issued = ledger.open_reasoning(item["id"], encrypted)
        if issued is None:
            raise InvalidRequest(
                f"The encrypted content for item {item['id']} could not be verified.",
                None,
                "invalid_encrypted_content",
            )
    elif (issued := ledger.stored_reasoning(item["id"])) is None:
        raise InvalidRequest(
            f"Item with id '{item['id']}' not found. Items are not persisted when `store` is set to "
            "false. Try again with `store` set to true, or remove this item from your input.",
            "input",
        )
    following = items[index + 1] if index + 1 < len(items) else None
    if following is None or not _is_following(following, issued):
        raise InvalidRequest(
            f"Item '{item['id']}' of type 'reasoning' was provided without its required following item.",
            "input",
        )


def _is_following(item: dict, issued: IssuedReasoning) -> bool:
    if item.get("id") is not None:
        return item["id"] == issued.following_id
    return item_type(item) == issued.following_type  # a replay that dropped the id


def _check_pairing(items: list[dict]) -> None:
    calls: dict[str, str] = {}  # call_id -> the type of output that answers it
    answered: set[str] = set()
    for item in items:
        kind = item_type(item)
        if kind in CALL_OUTPUTS:
            calls[item["call_id"]] = CALL_OUTPUTS[kind]
        elif kind in CALL_OUTPUTS.values():
            if calls.get(item["call_id"]) != kind:
                raise InvalidRequest(
                    f"No tool call found for function call output with call_id {item['call_id']}.",
                    "input",
                )
            answered.add(item["call_id"])
    for call_id in calls:
        if call_id not in answered:
            raise InvalidRequest(f"No tool output found for function call {call_id}.", "input")
