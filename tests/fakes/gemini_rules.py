"""What the real Gemini API (v1beta `generateContent`) refuses, as the fake Gemini upstream checks
it: /work/shared/GEMINI-RULES.md, each rule a function of the request body.

A refusal is a `GeminiRefusal` whose `error_body()` is Google's shape,
`{"error": {"code", "message", "status"}}`. Thought signatures are the fake's own
(`SignatureIssuer`): base64 of a nonce and its MAC, so a changed one is told from a valid one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DUMMY_SIGNATURES",
    "GeminiRefusal",
    "SignatureIssuer",
    "check_generate_request",
    "camel",
    "is_gemini_3",
]

STATUS_NAMES = {
    400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
    429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED",
}
# The values the docs say pass the Gemini 3 signature check in place of a real signature.
DUMMY_SIGNATURES = frozenset({"skip_thought_signature_validator", "context_engineering_is_the_way_to_go"})
SIGNING_KEY = b"context-proxy tests: fake Gemini thought signatures"
NONCE_BYTES = 12

TOP_LEVEL = frozenset({
    "contents", "systemInstruction", "tools", "toolConfig", "generationConfig", "safetySettings",
    "cachedContent", "labels",
})
CONTENT_KEYS = frozenset({"role", "parts"})
DATA_FIELDS = frozenset({
    "text", "inlineData", "fileData", "functionCall", "functionResponse", "executableCode", "codeExecutionResult",
})
PART_EXTRAS = frozenset({"thought", "thoughtSignature", "videoMetadata", "partMetadata", "mediaResolution"})
FUNCTION_CALL_KEYS = frozenset({"id", "name", "args", "partialArgs", "willContinue"})
FUNCTION_RESPONSE_KEYS = frozenset({"id", "name", "response", "parts", "willContinue", "scheduling"})
TOOL_KEYS = frozenset({
    "functionDeclarations", "googleSearch", "googleSearchRetrieval", "codeExecution", "urlContext",
    "computerUse", "fileSearch", "googleMaps",
})
DECLARATION_KEYS = frozenset({
    "name", "description", "parameters", "parametersJsonSchema", "response", "responseJsonSchema", "behavior",
})
GENERATION_CONFIG_KEYS = frozenset({
    "temperature", "topP", "topK", "candidateCount", "maxOutputTokens", "stopSequences", "responseMimeType",
    "responseSchema", "responseJsonSchema", "_responseJsonSchema", "thinkingConfig", "presencePenalty",
    "frequencyPenalty", "seed", "responseLogprobs", "logprobs", "responseModalities", "speechConfig",
    "mediaResolution", "enableEnhancedCivicAnswers", "imageConfig",
})
THINKING_CONFIG_KEYS = frozenset({"includeThoughts", "thinkingBudget", "thinkingLevel"})
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")


@dataclass
class GeminiRefusal(Exception):
    message: str
    status: int = 400

    def error_body(self) -> dict[str, Any]:
        return google_error(self.status, self.message)


def google_error(status: int, message: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "status": STATUS_NAMES.get(status, "UNKNOWN")}}


def is_gemini_3(model: str) -> bool:
    return model.startswith("gemini-3")


def _unknown(name: str, where: str) -> GeminiRefusal:
    return GeminiRefusal(f'Invalid JSON payload received. Unknown name "{name}" at \'{where}\': Cannot find field.')


def camel(name: str) -> str:
    """A proto field's JSON name: the API takes `include_thoughts` for `includeThoughts` (the
    Python SDK sends some fields so)."""
    head, *rest = name.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def _known_keys(value: dict[str, Any], known: frozenset[str], where: str) -> None:
    for key in value:
        if key not in known and camel(key) not in known:
            raise _unknown(key, where)


class SignatureIssuer:
    """Issues thought signatures and tells the fake's own from changed or foreign ones."""

    @staticmethod
    def _mac(nonce: bytes) -> bytes:
        return hmac.new(SIGNING_KEY, nonce, hashlib.sha256).digest()[:16]

    def issue(self) -> str:
        nonce = secrets.token_bytes(NONCE_BYTES)
        return base64.b64encode(nonce + self._mac(nonce)).decode()

    def check(self, signature: Any, where: str) -> None:
        """Refuse a signature that is not base64, or is base64 but not one this fake issued."""
        if not isinstance(signature, str):
            raise GeminiRefusal(f"Invalid value at '{where}' (TYPE_BYTES), {signature!r}")
        if signature in DUMMY_SIGNATURES:
            return
        try:
            # Bytes in proto JSON: standard or URL-safe base64 (the Python SDK sends the latter).
            raw = base64.b64decode(signature.replace("-", "+").replace("_", "/"), validate=True)
        except (binascii.Error, ValueError):
            raise GeminiRefusal(f"Invalid value at '{where}' (TYPE_BYTES), Base64 decoding failed for \"{signature}\"") from None
        nonce, mac = raw[:NONCE_BYTES], raw[NONCE_BYTES:]
        if len(raw) <= NONCE_BYTES or not hmac.compare_digest(mac, self._mac(nonce)):
            raise GeminiRefusal("Invalid thought signature.")


def check_generate_request(body: Any, model: str, signer: SignatureIssuer) -> None:
    """Raise the GeminiRefusal the real API answers `body` (for `model`) with, if any."""
    if not isinstance(body, dict):
        raise GeminiRefusal("Invalid JSON payload received. Expected an object.")
    _known_keys(body, TOP_LEVEL, "")
    if not NAME.fullmatch(model.removeprefix("models/")):
        raise GeminiRefusal(f"models/{model} is not found for API version v1beta", 404)
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise GeminiRefusal("* GenerateContentRequest.contents: contents is not specified\n")
    for i, content in enumerate(contents):
        _check_content(content, f"contents[{i}]", signer)
    _check_turn_order(contents)
    if is_gemini_3(model):
        _check_step_signatures(contents)
    _check_system_instruction(body.get("systemInstruction"))
    _check_tools(body.get("tools"))
    _check_generation_config(body.get("generationConfig"), model)


def _check_content(content: Any, where: str, signer: SignatureIssuer) -> None:
    if not isinstance(content, dict):
        raise GeminiRefusal(f"Invalid value at '{where}' (type.googleapis.com/google.ai.generativelanguage.v1beta.Content)")
    _known_keys(content, CONTENT_KEYS, where)
    if "role" in content and content["role"] not in ("user", "model"):
        raise GeminiRefusal("Please use a valid role: user, model.")
    parts = content.get("parts")
    if not isinstance(parts, list) or not parts:
        raise GeminiRefusal(f"* GenerateContentRequest.{where}.parts: contents.parts must not be empty.\n")
    for j, part in enumerate(parts):
        _check_part(part, f"{where}.parts[{j}]", signer)


def _check_part(part: Any, where: str, signer: SignatureIssuer) -> None:
    if not isinstance(part, dict):
        raise GeminiRefusal(f"Invalid value at '{where}' (type.googleapis.com/google.ai.generativelanguage.v1beta.Part)")
    _known_keys(part, DATA_FIELDS | PART_EXTRAS, where)
    data = [key for key in part if key in DATA_FIELDS]
    if not data:
        raise GeminiRefusal(f"* GenerateContentRequest.{where}.data: required oneof field 'data' must have one initialized field\n")
    if len(data) > 1:
        raise GeminiRefusal(f"Invalid JSON payload received. Oneof field 'data' is already set. Cannot set '{data[1]}'")
    if "text" in part and not isinstance(part["text"], str):
        raise GeminiRefusal(f"Invalid value at '{where}.text' (TYPE_STRING), {part['text']!r}")
    if "thoughtSignature" in part:
        signer.check(part["thoughtSignature"], f"{where}.thought_signature")
    call = part.get("functionCall")
    if call is not None:
        if not isinstance(call, dict):
            raise GeminiRefusal(f"Invalid value at '{where}.function_call'")
        _known_keys(call, FUNCTION_CALL_KEYS, f"{where}.function_call")
        _check_name(call.get("name"), f"{where}.function_call.name")
        if "args" in call and not isinstance(call["args"], dict):
            raise GeminiRefusal(f"Invalid value at '{where}.function_call.args' (type.googleapis.com/google.protobuf.Struct)")
    response = part.get("functionResponse")
    if response is not None:
        if not isinstance(response, dict):
            raise GeminiRefusal(f"Invalid value at '{where}.function_response'")
        _known_keys(response, FUNCTION_RESPONSE_KEYS, f"{where}.function_response")
        _check_name(response.get("name"), f"{where}.function_response.name")
        if not isinstance(response.get("response"), dict):
            raise GeminiRefusal(f"* GenerateContentRequest.{where}.function_response.response: required field is not set\n")


def _check_name(name: Any, where: str) -> None:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise GeminiRefusal(
            f"* GenerateContentRequest.{where}: Invalid function name. Must start with a letter or an underscore. "
            "Must be a-z, A-Z, 0-9, or contain underscores, dots and dashes, with a maximum length of 64.\n"
        )


def _calls(content: dict[str, Any]) -> list[dict[str, Any]]:
    return [p["functionCall"] for p in content["parts"] if "functionCall" in p]


def _responses(content: dict[str, Any]) -> list[dict[str, Any]]:
    return [p["functionResponse"] for p in content["parts"] if "functionResponse" in p]


def _role(content: dict[str, Any]) -> str:
    return content.get("role") or "user"


def _check_turn_order(contents: list[dict[str, Any]]) -> None:
    """A function call turn comes right after a user turn or a function response turn (so never
    first); a function response turn right after a function call turn, answering as many calls
    (the CLI's `--resume` sends one call's response twice, under its id: counted once)."""
    for i, content in enumerate(contents):
        calls, responses = _calls(content), _responses(content)
        previous = contents[i - 1] if i else None
        if calls:
            if _role(content) != "model" or previous is None or _role(previous) != "user":
                raise GeminiRefusal(
                    "Please ensure that function call turn comes immediately after a user turn or after a "
                    "function response turn."
                )
        if responses:
            asked = _calls(previous) if previous is not None and _role(previous) == "model" else []
            if _role(content) != "user" or not asked:
                raise GeminiRefusal("Please ensure that function response turn comes immediately after a function call turn.")
            ids = [r.get("id") for r in responses]
            distinct = len({i for i in ids if i}) + sum(1 for i in ids if not i)
            if distinct != len(asked):
                raise GeminiRefusal(
                    "Please ensure that the number of function response parts is equal to the number of function "
                    "call parts of the function call turn."
                )


def _check_step_signatures(contents: list[dict[str, Any]]) -> None:
    """Gemini 3: in the current turn (since the last user content with text), each model step's
    first function call carries its thought signature."""
    start = 0
    for i, content in enumerate(contents):
        if _role(content) == "user" and any("text" in p for p in content["parts"]):
            start = i + 1
    for i in range(start, len(contents)):
        content = contents[i]
        first = next((p for p in content["parts"] if "functionCall" in p), None)
        if _role(content) == "model" and first is not None and "thoughtSignature" not in first:
            name = first["functionCall"].get("name")
            raise GeminiRefusal(
                "Function call is missing a thought_signature in functionCall parts. This is required for tools to "
                "work correctly, and missing thought_signature may lead to degraded model performance. Additional "
                f"data, function call `default_api:{name}` , position {i + 1}. Please refer to "
                "https://ai.google.dev/gemini-api/docs/thought-signatures for more details."
            )


def _check_system_instruction(system: Any) -> None:
    if system is None:
        return
    if not isinstance(system, dict):
        raise GeminiRefusal("Invalid value at 'system_instruction' (type.googleapis.com/google.ai.generativelanguage.v1beta.Content)")
    _known_keys(system, CONTENT_KEYS, "system_instruction")
    parts = system.get("parts")
    if not isinstance(parts, list) or not parts:
        raise GeminiRefusal("* GenerateContentRequest.system_instruction.parts: contents.parts must not be empty.\n")
    for j, part in enumerate(parts):
        if not isinstance(part, dict) or not isinstance(part.get("text"), str):
            raise GeminiRefusal(f"* GenerateContentRequest.system_instruction.parts[{j}]: only text parts are allowed\n")
        _known_keys(part, frozenset({"text"}), f"system_instruction.parts[{j}]")


def _check_tools(tools: Any) -> None:
    if tools is None:
        return
    if not isinstance(tools, list):
        raise GeminiRefusal("Invalid value at 'tools' (type.googleapis.com/google.ai.generativelanguage.v1beta.Tool)")
    names: set[str] = set()
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise GeminiRefusal(f"Invalid value at 'tools[{i}]'")
        _known_keys(tool, TOOL_KEYS, f"tools[{i}]")
        for j, declaration in enumerate(tool.get("functionDeclarations") or ()):
            where = f"tools[{i}].function_declarations[{j}]"
            if not isinstance(declaration, dict):
                raise GeminiRefusal(f"Invalid value at '{where}'")
            _known_keys(declaration, DECLARATION_KEYS, where)
            _check_name(declaration.get("name"), f"{where}.name")
            if "parameters" in declaration and "parametersJsonSchema" in declaration:
                raise GeminiRefusal(f"* GenerateContentRequest.{where}: parameters and parameters_json_schema are exclusive\n")
            if declaration["name"] in names:
                raise GeminiRefusal(f"* GenerateContentRequest.{where}.name: Duplicate function declaration name\n")
            names.add(declaration["name"])


def _check_generation_config(config: Any, model: str) -> None:
    if config is None:
        return
    if not isinstance(config, dict):
        raise GeminiRefusal("Invalid value at 'generation_config'")
    _known_keys(config, GENERATION_CONFIG_KEYS, "generation_config")
    thinking = config.get("thinkingConfig")
    if thinking is not None:
        if not isinstance(thinking, dict):
            raise GeminiRefusal("Invalid value at 'generation_config.thinking_config'")
        _known_keys(thinking, THINKING_CONFIG_KEYS, "generation_config.thinking_config")
        if ("thinkingLevel" in thinking or "thinking_level" in thinking) and not is_gemini_3(model):
            raise GeminiRefusal("Thinking level is not supported for this model.")
