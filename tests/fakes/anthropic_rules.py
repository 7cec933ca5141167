"""What the real Anthropic Messages API refuses, as a pure checker for the strict fake.

`check_messages_request` returns the refusal (HTTP 400, Anthropic's error shape) the real API
would give for a `POST /v1/messages` or `/v1/messages/count_tokens` body, or None. The rules are
/work/shared/ANTHROPIC-RULES.md's refusal list; field and block shapes follow anthropic-sdk-python's
`types/` (generally available) and `types/beta/` (only with their `anthropic-beta` header).

Thinking signatures are the fake's own: the checker asks a `ThinkingLedger` whether a signature is
valid and which thinking block preceded a `tool_use` the fake issued.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

__all__ = [
    "AnthropicRefusal",
    "ThinkingLedger",
    "betas_of",
    "check_messages_request",
    "content_blocks",
    "thinking_enabled",
]

MAX_CACHE_BREAKPOINTS = 4
TOOL_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
# Typed (server / Anthropic-defined) tools: `web_search_20250305`, `bash_20250124`, `mcp_toolset`, ...
SERVER_TOOL_TYPE_RE = re.compile(r"^([a-z_]+_\d{8}|mcp_toolset)$")
EFFORTS = ("low", "medium", "high", "xhigh", "max")

# Top-level fields of each endpoint, generally available.
MESSAGES_FIELDS = frozenset({
    "model", "messages", "max_tokens", "system", "metadata", "stop_sequences", "stream",
    "temperature", "top_k", "top_p", "tools", "tool_choice", "thinking", "service_tier",
    "container", "inference_geo", "output_config", "cache_control",
})
COUNT_TOKENS_FIELDS = frozenset({
    "model", "messages", "system", "tools", "tool_choice", "thinking", "output_config",
    "cache_control",
})
# Beta-only fields, with the betas that allow them (any one of them).
MESSAGES_BETA_FIELDS: dict[str, tuple[str, ...]] = {
    "context_management": ("context-management-2025-06-27",),
    "mcp_servers": ("mcp-client-2025-04-04", "mcp-client-2025-11-20", "mcp-client-2026-09-15"),
    "speed": ("fast-mode-2026-02-01",),
    "fallbacks": ("server-side-fallback-2026-06-01", "server-side-fallback-2026-07-01"),
    "fallback_credit_token": ("fallback-credit-2026-06-01", "fallback-credit-2026-07-01"),
    "diagnostics": ("cache-diagnosis-2026-04-07",),
    "output_format": ("structured-outputs-2025-11-13",),
    "compaction": ("compact-2026-01-12", "compact-2026-09-04"),
}
COUNT_TOKENS_BETA_FIELDS = {
    key: MESSAGES_BETA_FIELDS[key]
    for key in ("context_management", "mcp_servers", "speed", "output_format")
}
OUTPUT_CONFIG_KEYS = frozenset({"effort", "format"})
OUTPUT_CONFIG_BETA_KEYS = {"task_budget": ("task-budgets-2026-03-13",)}
# A `role: "system"` message (generally available) may carry these only under their beta;
# Claude Code sends `output_config` with `per-turn-control-2026-07-01`.
SYSTEM_MESSAGE_BETA_KEYS = {
    "output_config": ("mid-conversation-output-config-2026-07-01", "per-turn-control-2026-07-01"),
    "clear_at": ("mid-conversation-system-clear-at-2026-08-21",),
}
TOOL_CHANGE_BETAS = ("mid-conversation-tool-changes-2026-07-01", "inline-tools-2026-09-15")

# Request block types: the keys each may carry, and the keys it must carry.
BLOCK_KEYS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "text": (frozenset({"type", "text", "cache_control", "citations"}), frozenset({"text"})),
    "image": (frozenset({"type", "source", "cache_control"}), frozenset({"source"})),
    "document": (
        frozenset({"type", "source", "cache_control", "citations", "context", "title"}),
        frozenset({"source"}),
    ),
    "search_result": (
        frozenset({"type", "source", "title", "content", "cache_control", "citations"}),
        frozenset({"source", "title", "content"}),
    ),
    "thinking": (frozenset({"type", "thinking", "signature"}), frozenset({"thinking", "signature"})),
    "redacted_thinking": (frozenset({"type", "data"}), frozenset({"data"})),
    "tool_use": (
        frozenset({"type", "id", "name", "input", "cache_control", "caller", "toolset_name"}),
        frozenset({"id", "name", "input"}),
    ),
    "tool_result": (
        frozenset({"type", "tool_use_id", "content", "is_error", "cache_control", "toolset_name"}),
        frozenset({"tool_use_id"}),
    ),
    "tool_reference": (frozenset({"type", "tool_name", "cache_control"}), frozenset({"tool_name"})),
    "tool_addition": (frozenset({"type", "tool", "cache_control"}), frozenset({"tool"})),
    "tool_removal": (frozenset({"type", "tool", "cache_control"}), frozenset({"tool"})),
}
# Blocks of server tools: passed back as the API produced them, so only their type is checked.
SERVER_RESULT_BLOCKS = frozenset({
    "server_tool_use", "web_search_tool_result", "web_fetch_tool_result",
    "code_execution_tool_result", "bash_code_execution_tool_result",
    "text_editor_code_execution_tool_result", "tool_search_tool_result",
})
ROLE_BLOCKS: dict[str, frozenset[str]] = {
    "user": frozenset({"text", "image", "document", "search_result", "tool_result", "container_upload"}),
    "assistant": frozenset({"text", "thinking", "redacted_thinking", "tool_use"}) | SERVER_RESULT_BLOCKS,
    "system": frozenset({"text", "tool_addition", "tool_removal"}),
}
TOOL_RESULT_BLOCKS = frozenset({"text", "image", "document", "search_result", "tool_reference"})
CUSTOM_TOOL_KEYS = frozenset({
    "type", "name", "description", "input_schema", "cache_control", "strict", "defer_loading",
    "input_examples", "eager_input_streaming", "allowed_callers",
})
THINKING_KEYS = {
    "enabled": frozenset({"type", "budget_tokens", "display"}),
    "adaptive": frozenset({"type", "display"}),
    "disabled": frozenset({"type"}),
}
TOOL_CHOICE_KEYS = {
    "auto": frozenset({"type", "disable_parallel_tool_use"}),
    "any": frozenset({"type", "disable_parallel_tool_use"}),
    "tool": frozenset({"type", "name", "disable_parallel_tool_use"}),
    "none": frozenset({"type"}),
}

THINKING_FIRST = (
    "messages.{index}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
    "`{found}`. When `thinking` is enabled, a final `assistant` message must start with a thinking "
    "block (preceeding the lastmost set of `tool_use` and `tool_result` blocks). We recommend you "
    "include thinking blocks from previous turns. To avoid this requirement, disable `thinking`."
)


class AnthropicRefusal(Exception):
    """A refusal in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`."""

    def __init__(self, message: str, status: int = 400, error_type: str = "invalid_request_error"):
        super().__init__(message)
        self.message = message
        self.status = status
        self.error_type = error_type

    def error_body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.error_type, "message": self.message}}


class ThinkingLedger(Protocol):
    """The fake's memory of the thinking it issued."""

    def signature_valid(self, thinking: str, signature: str) -> bool: ...

    def redacted_valid(self, data: str) -> bool: ...

    def issued_before(self, tool_use_id: str) -> dict[str, Any] | None:
        """The thinking (or redacted_thinking) block the fake sent ahead of this tool_use, if any."""


def betas_of(header_values: Iterable[str]) -> frozenset[str]:
    """The betas named by `anthropic-beta` header values (comma lists, possibly repeated)."""
    return frozenset(b.strip() for value in header_values for b in value.split(",") if b.strip())


def thinking_enabled(body: dict[str, Any]) -> bool:
    thinking = body.get("thinking")
    return isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive")


def content_blocks(content: Any) -> list[dict[str, Any]]:
    """A message's content as blocks: a string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content if isinstance(content, list) else []


def check_messages_request(
    body: Any, betas: frozenset[str], ledger: ThinkingLedger, *, count_tokens: bool = False
) -> AnthropicRefusal | None:
    """The refusal the real API would give for this body, or None when it is valid."""
    try:
        _Checker(betas, ledger).check(body, count_tokens)
    except AnthropicRefusal as refusal:
        return refusal
    return None


def _refuse(message: str) -> AnthropicRefusal:
    return AnthropicRefusal(message)


def _extra(path: str, betas_needed: tuple[str, ...] = ()) -> AnthropicRefusal:
    hint = f" (it needs the anthropic-beta header '{betas_needed[0]}')" if betas_needed else ""
    return _refuse(f"{path}: Extra inputs are not permitted{hint}")


class _Checker:
    def __init__(self, betas: frozenset[str], ledger: ThinkingLedger) -> None:
        self.betas = betas
        self.ledger = ledger
        self.breakpoints = 0

    def allows(self, needed: tuple[str, ...]) -> bool:
        return any(beta in self.betas for beta in needed)

    def check(self, body: Any, count_tokens: bool) -> None:
        if not isinstance(body, dict):
            raise _refuse("body: Input should be an object")
        fields, beta_fields = (
            (COUNT_TOKENS_FIELDS, COUNT_TOKENS_BETA_FIELDS) if count_tokens
            else (MESSAGES_FIELDS, MESSAGES_BETA_FIELDS)
        )
        for key in body:
            if key in fields:
                continue
            needed = beta_fields.get(key, ())
            if not (needed and self.allows(needed)):
                raise _extra(key, needed)
        self.check_required(body, count_tokens)
        self.check_sampling(body)
        self.check_thinking(body, count_tokens)
        self.check_output_config(body.get("output_config"))
        self.check_system(body.get("system"))
        tool_names = self.check_tools(body.get("tools"))
        self.check_tool_choice(body.get("tool_choice"), tool_names)
        messages = body["messages"]
        for index, message in enumerate(messages):
            self.check_message(index, message)
        _check_pairing(messages)
        self.check_thinking_blocks(body, messages)
        if body.get("cache_control") is not None:
            self.cache_control("cache_control", body["cache_control"])
        if self.breakpoints > MAX_CACHE_BREAKPOINTS:
            raise _refuse(
                f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. "
                f"Found {self.breakpoints}."
            )

    # -- top level --

    def check_required(self, body: dict[str, Any], count_tokens: bool) -> None:
        if "model" not in body:
            raise _refuse("model: Field required")
        if not isinstance(body["model"], str) or not body["model"]:
            raise _refuse("model: Input should be a valid string")
        if not count_tokens:
            if "max_tokens" not in body:
                raise _refuse("max_tokens: Field required")
            max_tokens = body["max_tokens"]
            if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 0:
                raise _refuse("max_tokens: Input should be a valid integer, greater than or equal to 0")
            if "stream" in body and not isinstance(body["stream"], bool):
                raise _refuse("stream: Input should be a valid boolean")
        if "messages" not in body:
            raise _refuse("messages: Field required")
        if not isinstance(body["messages"], list):
            raise _refuse("messages: Input should be a valid list")
        if not body["messages"]:
            raise _refuse("messages: at least one message is required")
        metadata = body.get("metadata")
        if metadata is not None:
            if not isinstance(metadata, dict):
                raise _refuse("metadata: Input should be an object")
            for key in metadata:
                if key != "user_id":
                    raise _extra(f"metadata.{key}")

    def check_sampling(self, body: dict[str, Any]) -> None:
        temperature = body.get("temperature")
        if temperature is not None and not (_is_number(temperature) and 0 <= temperature <= 1):
            raise _refuse("temperature: Input should be a number between 0 and 1")
        stops = body.get("stop_sequences")
        if stops is not None and not (isinstance(stops, list) and all(isinstance(s, str) for s in stops)):
            raise _refuse("stop_sequences: Input should be a list of strings")
        if body.get("service_tier") not in (None, "auto", "standard_only"):
            raise _refuse("service_tier: Input should be 'auto' or 'standard_only'")

    def check_thinking(self, body: dict[str, Any], count_tokens: bool) -> None:
        thinking = body.get("thinking")
        if thinking is None:
            return
        kind = _check_tagged("thinking", thinking, THINKING_KEYS)
        if thinking.get("display") not in (None, "summarized", "omitted"):
            raise _refuse(f"thinking.{kind}.display: Input should be 'summarized' or 'omitted'")
        if kind == "enabled":
            budget = thinking.get("budget_tokens")
            if isinstance(budget, bool) or not isinstance(budget, int):
                raise _refuse("thinking.enabled.budget_tokens: Field required")
            if budget < 1024:
                raise _refuse("thinking.enabled.budget_tokens: Input should be greater than or equal to 1024")
            if not count_tokens and budget >= body["max_tokens"]:
                raise _refuse(
                    "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our "
                    "documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
                )
        if kind != "disabled":
            if body.get("temperature") not in (None, 1, 1.0):
                raise _refuse("`temperature` may only be set to 1 when thinking is enabled or in adaptive mode.")
            if body.get("top_k") is not None:
                raise _refuse("`top_k` is not supported when thinking is enabled or in adaptive mode.")

    def check_output_config(self, config: Any, path: str = "output_config") -> None:
        if config is None:
            return
        if not isinstance(config, dict):
            raise _refuse(f"{path}: Input should be an object")
        for key in config:
            needed = OUTPUT_CONFIG_BETA_KEYS.get(key, ())
            if key not in OUTPUT_CONFIG_KEYS and not (needed and self.allows(needed)):
                raise _extra(f"{path}.{key}", needed)
        if config.get("effort") not in (None, *EFFORTS):
            raise _refuse(f"{path}.effort: Input should be one of {', '.join(map(repr, EFFORTS))}")

    def check_system(self, system: Any) -> None:
        if system is None or isinstance(system, str):
            return
        if not isinstance(system, list):
            raise _refuse("system: Input should be a valid string or a list of text blocks")
        for position, block in enumerate(system):
            path = f"system.{position}"
            if not isinstance(block, dict) or block.get("type") != "text":
                raise _refuse(f"{path}.type: Input should be 'text'")
            self.check_block(path, block, frozenset({"text"}))

    # -- tools --

    def check_tools(self, tools: Any) -> set[str]:
        if tools is None:
            return set()
        if not isinstance(tools, list):
            raise _refuse("tools: Input should be a valid list")
        names: set[str] = set()
        for position, tool in enumerate(tools):
            path = f"tools.{position}"
            if not isinstance(tool, dict):
                raise _refuse(f"{path}: Input should be an object")
            if tool.get("type") in (None, "custom"):
                self.check_custom_tool(path, tool)
            elif not (isinstance(tool["type"], str) and SERVER_TOOL_TYPE_RE.match(tool["type"])):
                raise _refuse(f"{path}.type: Input should be 'custom' or a known tool type, got {tool['type']!r}")
            name = tool.get("name")
            if not isinstance(name, str) or not name:
                raise _refuse(f"{path}.name: Field required")
            if name in names:
                raise _refuse("tools: Tool names must be unique.")
            names.add(name)
            if tool.get("cache_control") is not None:
                self.cache_control(f"{path}.cache_control", tool["cache_control"])
        return names

    def check_custom_tool(self, path: str, tool: dict[str, Any]) -> None:
        for key in tool:
            if key not in CUSTOM_TOOL_KEYS:
                raise _extra(f"{path}.custom.{key}")
        name = tool.get("name")
        if not isinstance(name, str) or not TOOL_NAME_RE.match(name):
            raise _refuse(f"{path}.custom.name: String should match pattern '{TOOL_NAME_RE.pattern}'")
        if "input_schema" not in tool:
            raise _refuse(f"{path}.custom.input_schema: Field required")
        schema = tool["input_schema"]
        if not isinstance(schema, dict) or schema.get("type") != "object":
            raise _refuse(f"{path}.custom.input_schema.type: Input should be 'object'")

    def check_tool_choice(self, choice: Any, tool_names: set[str]) -> None:
        if choice is None:
            return
        kind = _check_tagged("tool_choice", choice, TOOL_CHOICE_KEYS)
        if kind == "tool" and choice.get("name") not in tool_names:
            raise _refuse(f"tool_choice: tool {choice.get('name')!r} not found in 'tools'")

    # -- messages and blocks --

    def check_message(self, index: int, message: Any) -> None:
        path = f"messages.{index}"
        if not isinstance(message, dict):
            raise _refuse(f"{path}: Input should be an object")
        role = message.get("role")
        if role not in ROLE_BLOCKS:
            raise _refuse(f"{path}.role: Input should be 'user', 'assistant' or 'system'")
        for key in message:
            if key in ("role", "content"):
                continue
            needed = SYSTEM_MESSAGE_BETA_KEYS.get(key, ()) if role == "system" else ()
            if not (needed and self.allows(needed)):
                raise _extra(f"{path}.{key}", needed)
        if role == "system":
            self.check_output_config(message.get("output_config"), f"{path}.output_config")
        if "content" not in message:
            raise _refuse(f"{path}.content: Field required")
        content = message["content"]
        if isinstance(content, str):
            if not content and role != "assistant":
                raise _refuse(f"{path}.content: text content blocks must be non-empty")
            return
        if not isinstance(content, list):
            raise _refuse(f"{path}.content: Input should be a valid string or list of content blocks")
        if not content and role != "assistant":
            raise _refuse(f"{path}.content: List should have at least 1 item")
        for position, block in enumerate(content):
            self.check_message_block(f"{path}.content.{position}", role, block)

    def check_message_block(self, path: str, role: str, block: Any) -> None:
        kind = block.get("type") if isinstance(block, dict) else None
        if not isinstance(kind, str):
            raise _refuse(f"{path}.type: Field required")
        if kind not in BLOCK_KEYS and kind not in SERVER_RESULT_BLOCKS and kind != "container_upload":
            raise _refuse(f"{path}.type: Input tag '{kind}' found using 'type' does not match any of the expected tags")
        if kind not in ROLE_BLOCKS[role]:
            raise _refuse(f"{path}: `{kind}` blocks are not allowed in `{role}` messages")
        if kind in ("tool_addition", "tool_removal") and not self.allows(TOOL_CHANGE_BETAS):
            raise _extra(path, TOOL_CHANGE_BETAS)
        if kind in BLOCK_KEYS:
            self.check_block(path, block, BLOCK_KEYS[kind][1])
        if kind == "tool_result":
            self.check_tool_result_content(path, block.get("content"))
        if kind == "tool_use" and not isinstance(block.get("input"), dict):
            raise _refuse(f"{path}.input: Input should be a valid dictionary")

    def check_block(self, path: str, block: dict[str, Any], required: frozenset[str]) -> None:
        allowed = BLOCK_KEYS[block["type"]][0]
        for key in block:
            if key not in allowed:
                raise _extra(f"{path}.{block['type']}.{key}")
        for key in sorted(required):
            if key not in block:
                raise _refuse(f"{path}.{block['type']}.{key}: Field required")
        if block["type"] == "text":
            if not isinstance(block["text"], str):
                raise _refuse(f"{path}.text.text: Input should be a valid string")
            if not block["text"]:
                raise _refuse(f"{path}.text: text content blocks must be non-empty")
        if block.get("cache_control") is not None:
            self.cache_control(f"{path}.cache_control", block["cache_control"])

    def check_tool_result_content(self, path: str, content: Any) -> None:
        if content is None or isinstance(content, str):
            return
        if not isinstance(content, list):
            raise _refuse(f"{path}.tool_result.content: Input should be a valid string or list")
        for position, inner in enumerate(content):
            inner_path = f"{path}.tool_result.content.{position}"
            kind = inner.get("type") if isinstance(inner, dict) else None
            if kind not in TOOL_RESULT_BLOCKS:
                raise _refuse(f"{inner_path}.type: Input tag '{kind}' found using 'type' does not match any of the expected tags")
            self.check_block(inner_path, inner, BLOCK_KEYS[kind][1])

    def cache_control(self, path: str, value: Any) -> None:
        if not isinstance(value, dict) or value.get("type") != "ephemeral":
            raise _refuse(f"{path}.type: Input should be 'ephemeral'")
        for key in value:
            if key not in ("type", "ttl"):
                raise _extra(f"{path}.{key}")
        if value.get("ttl") not in (None, "5m", "1h"):
            raise _refuse(f"{path}.ttl: Input should be '5m' or '1h'")
        self.breakpoints += 1

    # -- thinking --

    def check_thinking_blocks(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        """Every thinking block passed back must be unchanged; with thinking on, the assistant
        message a tool-use continuation answers must start with its thinking block."""
        for index, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            for position, block in enumerate(content_blocks(message["content"])):
                if block["type"] == "thinking" and not self.ledger.signature_valid(
                    block["thinking"], block["signature"]
                ):
                    raise _refuse(f"messages.{index}.content.{position}: Invalid `signature` in `thinking` block")
                if block["type"] == "redacted_thinking" and not self.ledger.redacted_valid(block["data"]):
                    raise _refuse(f"messages.{index}.content.{position}: Invalid `data` in `redacted_thinking` block")
        if thinking_enabled(body):
            self.check_thinking_first(body, messages)

    def check_thinking_first(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        turns = [(i, m) for i, m in enumerate(messages) if m["role"] != "system"]
        if len(turns) < 2 or turns[-1][1]["role"] != "user":
            return
        if not any(b["type"] == "tool_result" for b in content_blocks(turns[-1][1]["content"])):
            return
        index, assistant = turns[-2]
        blocks = content_blocks(assistant["content"])
        issued = [self.ledger.issued_before(b["id"]) for b in blocks if b["type"] == "tool_use"]
        expected = next((block for block in issued if block is not None), None)
        # Budgeted thinking always thinks first; adaptive thinking only when the fake did.
        if expected is None and body["thinking"]["type"] != "enabled":
            return
        first = blocks[0]["type"] if blocks else "nothing"
        if first not in ("thinking", "redacted_thinking"):
            raise _refuse(THINKING_FIRST.format(index=index, found=first))
        if expected is not None and blocks[0] != expected:
            raise _refuse(
                f"messages.{index}.content.0: the thinking block does not belong to the `tool_use` "
                "blocks that follow it; pass back the assistant message's own thinking block unchanged"
            )


def _check_tagged(path: str, value: Any, keys_by_type: dict[str, frozenset[str]]) -> str:
    """The `type` of a tagged object (thinking, tool_choice) whose keys must be its type's."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in keys_by_type:
        tags = [f"'{tag}'" for tag in keys_by_type]
        raise _refuse(f"{path}.type: Input should be {', '.join(tags[:-1])} or {tags[-1]}")
    for key in value:
        if key not in keys_by_type[kind]:
            raise _extra(f"{path}.{kind}.{key}")
    return kind


def _tool_use_ids(message: dict[str, Any]) -> list[str]:
    return [b["id"] for b in content_blocks(message["content"]) if b["type"] == "tool_use"]


def _tool_results(message: dict[str, Any]) -> Iterator[tuple[int, dict[str, Any]]]:
    for position, block in enumerate(content_blocks(message["content"])):
        if block["type"] == "tool_result":
            yield position, block


def _check_pairing(messages: list[dict[str, Any]]) -> None:
    """Each tool_use is answered by a tool_result in the next message, each tool_result answers a
    tool_use of the message right before it, and tool_results come first in their message.
    `role: "system"` messages stand beside the conversation and are skipped."""
    turns = [(i, m) for i, m in enumerate(messages) if m["role"] != "system"]
    for k, (index, message) in enumerate(turns):
        if message["role"] == "assistant":
            ids = _tool_use_ids(message)
            if len(set(ids)) != len(ids):
                raise _refuse(f"messages.{index}: `tool_use` ids must be unique")
            following = turns[k + 1][1] if k + 1 < len(turns) else None
            answered = (
                {b["tool_use_id"] for _, b in _tool_results(following)}
                if following is not None and following["role"] == "user" else set()
            )
            missing = [i for i in ids if i not in answered]
            if missing:
                raise _refuse(
                    f"messages.{index}: `tool_use` ids were found without `tool_result` blocks "
                    f"immediately after: {', '.join(missing)}. Each `tool_use` block must have a "
                    "corresponding `tool_result` block in the next message."
                )
            continue
        previous = turns[k - 1][1] if k > 0 else None
        offered = set(_tool_use_ids(previous)) if previous is not None and previous["role"] == "assistant" else set()
        seen_other = False
        for position, block in enumerate(content_blocks(message["content"])):
            if block["type"] != "tool_result":
                seen_other = True
                continue
            if seen_other:
                raise _refuse(
                    f"messages.{index}.content.{position}: `tool_result` blocks must come first in "
                    "their message, before any text or other content"
                )
            if block["tool_use_id"] not in offered:
                raise _refuse(
                    f"messages.{index}.content.{position}: unexpected `tool_use_id` found in "
                    f"`tool_result` blocks: {block['tool_use_id']}. Each `tool_result` block must "
                    "have a corresponding `tool_use` block in the previous message."
                )


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
