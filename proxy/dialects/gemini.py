"""The Gemini API (`POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent?alt=sse`):
Gemini CLI's wire format. Its items are gemini_codec.py's, its replies and streams gemini_stream.py's.

Items. One item per content (roles `user` and `model`), except that a user content's
`functionResponse` parts each become a TOOL item of their own: a user content holding that part
(with the other parts that stood before it, or after the last one; a response sent twice under
one id, as Gemini CLI's `--resume` does, stays with the first), joining the item before it, so
truncation, quota, the window and the pairing guard work per response. A model content's
`functionCall` parts are its calls: with the following responses they form one unit. What goes
upstream is the contents rebuilt: a run of TOOL items becomes one user content again, its parts
in order and byte for byte. Thought signatures, ids and every part the proxy does not rewrite
stay as the client sent them. A call without an `id` (the API sends none; Gemini CLI adds its
own) is known to the engine by its name; a response without one answers the call in its place,
as the API pairs them (the k-th response after a model content, its k-th call).

The model and whether the reply streams are in the URL, not the body: a request's dialect is
`GEMINI.bound(model, stream, version)`, and its upstream body a GeminiRequest that carries them.

`systemInstruction` stays the client's; the proxy's own notes (knowledge, the summary) are
appended to its parts. The proxy's own functions go in a `functionDeclarations` entry of their
own after the client's tools, never into a request in JSON mode or with a built-in tool
(Gemini CLI's router and web search side calls), which the API refuses with function calling. An inbox message goes into the newest functionResponse when the prompt
ends in one, else as a user content of its own (consecutive user contents are valid). Gemini CLI
replays a reply without its thought parts, with its own call ids, and on `--resume` with dummy
signatures: the canonical hash compares contents by meaning, so none of that looks new. Its
run's derived id reads the system prompt with the listed skills sorted: the CLI lists them in the
order it found them, which a resuming process may not repeat.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from ..errors import InvalidRequest, ProxyError
from ..messages import MAX_DEPTH, too_deep
from ..transcript import Call, Item, Raw, Role
from ..upstream.base import GeminiRequest
from .base import ByElements, Completion, Elements, JSONBody, ReplyRead, ToolSpec, token_limit
from .gemini_codec import GeminiCodec, canonical_parts, is_note, role_of, split_content
from .gemini_stream import GeminiRelay, calls_of, error_body, first_candidate, without_our_calls

log = logging.getLogger("proxy.gemini")

# Sent first when the window leaves a prompt starting on a model content (the API wants a user turn first).
OMITTED_NOTE = "(Earlier messages of this conversation are not shown.)"
METHODS = {"generateContent": False, "streamGenerateContent": True}  # method -> whether it streams


def system_key(body: dict[str, Any]) -> str:
    return "system_instruction" if "system_instruction" in body and "systemInstruction" not in body else "systemInstruction"


def system_parts(body: dict[str, Any]) -> list[Any]:
    system = body.get(system_key(body))
    parts = system.get("parts") if isinstance(system, dict) else None
    return list(parts) if isinstance(parts, list) else []


SKILLS_OPEN, SKILLS_CLOSE, SKILL_END = "<available_skills>", "</available_skills>", "</skill>"


def skills_in_order(text: str) -> str:
    """`text` with the `<skill>` entries of its `<available_skills>` list sorted. Gemini CLI lists
    its agent skills in the order a glob found their files, which differs from one process to the
    next: without this a `--resume` would often be a run of its own. Unchanged when already sorted
    (ids derived before stay), and order-free even if a description holds `</skill>`: the pieces
    between ends are sorted, and they are the same pieces whatever the entries' order. A find over
    the prompt (~30 KB for Gemini CLI) a turn."""
    start = text.find(SKILLS_OPEN)
    end = text.find(SKILLS_CLOSE, start) if start >= 0 else -1
    if end < 0:
        return text
    start += len(SKILLS_OPEN)
    *entries, tail = text[start:end].split(SKILL_END)
    ordered = sorted(entries)
    if ordered == entries:
        return text
    return text[:start] + "".join(e + SKILL_END for e in ordered) + tail + text[end:]


def declarations(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The function declarations of the body's tools."""
    out = []
    for tool in body.get("tools") or ():
        if isinstance(tool, dict):
            found = tool.get("functionDeclarations", tool.get("function_declarations"))
            out.extend(d for d in found or () if isinstance(d, dict))
    return out


def takes_functions(body: dict[str, Any]) -> bool:
    """Whether the proxy's functions may be added to the request: not to one in JSON mode (Gemini
    CLI's model router) nor one using a built-in tool (its web search: `googleSearch`), which the
    API refuses with function calling."""
    config = body.get("generationConfig", body.get("generation_config"))
    if isinstance(config, dict) and (
        config.get("responseMimeType", config.get("response_mime_type")) == "application/json"
        or any(k in config for k in ("responseSchema", "responseJsonSchema", "response_schema", "response_json_schema"))
    ):
        return False
    return all(
        set(tool) <= {"functionDeclarations", "function_declarations"} for tool in body.get("tools") or () if isinstance(tool, dict)
    )


# -- the request body ---------------------------------------------------------------------------


def rebuild_contents(items: Sequence[Item], firsts: list[int] | None = None) -> tuple[list[Raw], list[Raw]]:
    """(the contents to send, the proxy's notes for `systemInstruction`) from the transcript's
    items; the index of the item each content starts at appended to `firsts`, when given. A run
    of TOOL items is one user content again (what one client content held is sent as it came); a
    model content left empty (a reply that held only the proxy's calls) is not sent, the API
    refuses empty parts; the prompt starts on a user content, as the API wants."""
    contents, notes = contents_of(items, [] if firsts is None else firsts)
    if contents and role_of(contents[0]) == "model":
        contents.insert(0, {"role": "user", "parts": [{"text": OMITTED_NOTE}]})
        if firsts is not None:
            firsts.insert(0, firsts[0])
    return contents, notes


def contents_of(items: Sequence[Item], firsts: list[int]) -> tuple[list[Raw], list[Raw]]:
    """`rebuild_contents` but for where the prompt starts: of a run of a prompt's items that starts
    a content, the contents as they go in the whole prompt's."""
    contents: list[Raw] = []
    notes: list[Raw] = []
    merged = -1  # the index of the content rebuilt from TOOL items (our copy), if the last one is
    open_tool = False
    system, assistant, tool = Role.SYSTEM, Role.ASSISTANT, Role.TOOL  # looked up once (see transcript.Role)
    for at, item in enumerate(items):
        raw = item.raw
        if item.role is system and is_note(raw):
            notes.append(raw)
            continue
        if item.role is tool:
            if open_tool:
                if merged != len(contents) - 1:
                    contents[-1] = {**contents[-1], "parts": list(contents[-1].get("parts") or ())}
                    merged = len(contents) - 1
                contents[-1]["parts"].extend(raw.get("parts") or ())
                continue
            contents.append(raw)
            firsts.append(at)
            open_tool = True
            continue
        open_tool = False
        if item.role is assistant and not raw.get("parts"):
            continue
        contents.append(raw)
        firsts.append(at)
    return contents, notes


class GeminiDialect(JSONBody):
    """The Gemini dialect of one request's URL: its model, whether it streams, its API version."""

    name = "gemini"
    transcript_key = "contents"
    reply_markers = (b'"model"',)  # a model content's role (the model's name is in the URL, not the body)

    def __init__(self, model: str = "", stream: bool = False, version: str = "v1beta", codec: GeminiCodec | None = None) -> None:
        self.codec = codec or GeminiCodec()
        self._model, self._stream, self.version = model, stream, version
        self._last: tuple[dict[str, Any], list[Raw]] | None = None  # see MessagesDialect._last

    def bound(self, model: str, stream: bool, version: str = "v1beta") -> GeminiDialect:
        """This dialect for a request to `model` (its URL's), streamed or not."""
        return GeminiDialect(model, stream, version, self.codec)

    def model(self, body: dict[str, Any]) -> str:
        return self._model

    def streaming(self, body: dict[str, Any]) -> bool:
        return self._stream

    def transcript(self, body: dict[str, Any]) -> list[Raw]:
        last = self._last
        if last is not None and last[0] is body:
            return last[1]
        contents = body.get("contents")
        if not isinstance(contents, list) or not contents:
            raise InvalidRequest("* GenerateContentRequest.contents: contents is not specified", param="contents")
        out = self.transcript_parts(contents)
        self._last = (body, out)
        return out

    @staticmethod
    def transcript_parts(contents: list[Any]) -> list[Raw]:
        """The transcript's items of a `contents` array, content by content (the body cache,
        proxy/prefix.py, splits only what a request adds)."""
        out: list[Raw] = []
        for content in contents:
            out.extend(split_content(content))
        return out

    def validate(self, raws: Sequence[Raw], start: int) -> None:
        for i in range(start, len(raws)):
            _validate_part(raws[i], i)

    def by_elements(self) -> ByElements:
        return self  # a user content's functionResponse parts make one element

    def anchor(self, body: dict[str, Any]) -> str | None:
        return None  # a Gemini request carries its history

    def detach_anchor(self, body: dict[str, Any]) -> dict[str, Any]:
        return body

    def session_id(self, body: dict[str, Any], headers: Mapping[str, str]) -> str | None:
        return None  # Gemini CLI sends none: its runs are told apart by their derived ids

    def identity_basis(self, body: dict[str, Any], raws: Sequence[Raw]) -> Any:
        """The system prompt, its listed skills in a fixed order, and the first user content, by meaning."""
        system = [
            {**p, "text": skills_in_order(p["text"])} if isinstance(p, dict) and isinstance(p.get("text"), str) else p
            for p in canonical_parts(system_parts(body))
        ]
        first_user = next(
            (canonical_parts(r.get("parts")) for r in raws if isinstance(r, dict) and "parts" in r and role_of(r) == "user"),
            None,
        )
        return [system, first_user]

    def thread_basis(self, body: dict[str, Any], raws: Sequence[Raw]) -> Any:
        """A session thread's: its run's basis and its function names (main's JSONBody reads
        chat's and Messages' tool lists; Gemini's are under functionDeclarations)."""
        return [self.identity_basis(body, raws), sorted(str(d.get("name")) for d in declarations(body))]

    def reply_reserve(self, body: dict[str, Any]) -> int:
        config = body.get("generationConfig", body.get("generation_config"))
        if not isinstance(config, dict):
            return 0
        return token_limit(config.get("maxOutputTokens", config.get("max_output_tokens")))

    def fixed_parts(self, body: dict[str, Any]) -> list[str]:
        parts = [str(p.get("text") or "") for p in system_parts(body) if isinstance(p, dict)]
        tools = body.get("tools")
        return parts + ([orjson.dumps(tools).decode()] if isinstance(tools, list) and tools else [])

    def has_tool(self, body: dict[str, Any], name: str) -> bool:
        # A request that can take no function of ours says it has them all, so none is added.
        return not takes_functions(body) or any(d.get("name") == name for d in declarations(body))

    def tool_definition(self, tool: ToolSpec) -> dict[str, Any]:
        return {"name": tool.name, "description": tool.description, "parametersJsonSchema": tool.parameters}

    def upstream_body(self, body: dict[str, Any], items: Sequence[Item], tools: Sequence[ToolSpec]) -> dict[str, Any]:
        return self.upstream_body_elements(body, items, tools)[0]

    def upstream_body_elements(
        self, body: dict[str, Any], items: Sequence[Item], tools: Sequence[ToolSpec]
    ) -> tuple[dict[str, Any], Elements | None]:
        """`upstream_body`, and its contents as the fast path reuses them (proxy/engine/fastpath.py)."""
        firsts: list[int] = []
        contents, notes = rebuild_contents(items, firsts)
        out = {**body, "contents": contents}
        if notes:
            key = system_key(body)
            system = body.get(key) if isinstance(body.get(key), dict) else {}
            out[key] = {**system, "parts": [*system_parts(body), *notes]}
        if tools:
            out["tools"] = [*(body.get("tools") or ()), {"functionDeclarations": [self.tool_definition(t) for t in tools]}]
        return GeminiRequest(out, self._model, self._stream, self.version), Elements(contents, firsts)

    def upstream_elements(self, items: Sequence[Item]) -> Elements | None:
        firsts: list[int] = []
        contents, notes = contents_of(items, firsts)
        return None if notes else Elements(contents, firsts)

    def breakpoints(self, sendable: Sequence[Any]) -> int:
        return 0  # the Gemini API has no cache breakpoints in a request

    def encoded_body(self, body: dict[str, Any], encoded: bytes) -> GeminiRequest:
        return GeminiRequest(body, self._model, self._stream, self.version, encoded)

    def read_reply(self, data: bytes) -> ReplyRead | None:
        try:
            parsed = orjson.loads(data)
            if not isinstance(parsed, dict):
                raise TypeError
        except (ValueError, TypeError):
            log.warning("upstream 2xx reply that is not a GenerateContentResponse; nothing to persist")
            return None
        usage = parsed.get("usageMetadata") if isinstance(parsed.get("usageMetadata"), dict) else None
        candidate = first_candidate(parsed)
        content = candidate.get("content") if candidate is not None else None
        if not isinstance(content, dict) or not isinstance(content.get("parts"), list) or not content["parts"]:
            # Blocked (promptFeedback), or nothing said: no content to store, the turn still ends.
            return ReplyRead([], [], usage, response_id=parsed.get("responseId"), complete=candidate is not None)
        message = content if "role" in content else {"role": "model", **content}
        return ReplyRead(
            [message], list(calls_of(content["parts"])), usage, response_id=parsed.get("responseId"),
            complete=candidate.get("finishReason") is not None,  # type: ignore[union-attr]
        )

    def without_calls(self, data: bytes, reply: ReplyRead, keep: Sequence[Call]) -> tuple[bytes, ReplyRead]:
        parsed = orjson.loads(data)
        candidate = first_candidate(parsed)
        content = candidate["content"]  # type: ignore[index]
        parts, _ = without_our_calls(content["parts"], frozenset(), keep_ids=frozenset(c.id for c in keep))
        content = {**content, "parts": parts or [{"text": ""}]}
        parsed["candidates"] = [{**candidate, "content": content}, *parsed["candidates"][1:]]
        message = content if "role" in content else {"role": "model", **content}
        return orjson.dumps(parsed), ReplyRead([message], list(calls_of(content["parts"])), reply.usage, reply.response_id)

    def relay(self, anchor: str | None = None) -> GeminiRelay:
        return GeminiRelay()  # a Gemini request names no earlier reply: no anchor to echo

    def echo_anchor(self, data: bytes, anchor: str) -> bytes:
        return data

    def error_body(self, exc: ProxyError) -> dict[str, Any]:
        return error_body(exc)

    def summary_format(self) -> GeminiDialect:
        return self  # a Gemini key opens the Gemini API only: its summaries go there

    def summary_request(self, model: str, system: str, user: str, max_tokens: int) -> GeminiRequest:
        return GeminiRequest(
            {
                "systemInstruction": {"parts": [{"text": system}]},
                "contents": [{"role": "user", "parts": [{"text": user}]}],
                "generationConfig": {"maxOutputTokens": max_tokens},
            },
            model,
            stream=False,
        )

    def summary_reply(self, parsed: Any) -> Completion:
        """Its first candidate's text, its thoughts aside (they are output tokens too)."""
        candidate = parsed["candidates"][0]
        parts = (candidate.get("content") or {}).get("parts") or []
        text = "".join(p.get("text") or "" for p in parts if isinstance(p, dict) and not p.get("thought"))
        usage = parsed.get("usageMetadata") or {}
        tokens_out = int(usage.get("candidatesTokenCount") or 0) + int(usage.get("thoughtsTokenCount") or 0)
        return Completion(
            text.strip(), int(usage.get("promptTokenCount") or 0), tokens_out, cut=candidate.get("finishReason") == "MAX_TOKENS"
        )


def _validate_part(raw: Any, i: int) -> None:
    """What storing and forwarding need: objects, the two roles, non-empty parts that are objects,
    the names and arguments the engine reads. The upstream checks the rest (and its refusal
    reaches the client)."""
    where = f"contents (part {i})"
    if not isinstance(raw, dict):
        raise InvalidRequest(f"{where}: Input should be an object", param="contents")
    if raw.get("role", "user") not in ("user", "model"):
        raise InvalidRequest("Please use a valid role: user, model.", param="contents")
    parts = raw.get("parts")
    # A model content may come back empty: a reply that held only the proxy's calls, echoed by the
    # client. It is stored as it came and never sent (rebuild_contents), as the API refuses it.
    if not isinstance(parts, list) or (not parts and raw.get("role") != "model"):
        raise InvalidRequest(f"{where}: contents.parts must not be empty.", param="contents")
    for part in parts:
        if not isinstance(part, dict):
            raise InvalidRequest(f"{where}: every part must be an object", param="contents")
        call = part.get("functionCall")
        if call is not None and not (isinstance(call, dict) and isinstance(call.get("name"), str) and isinstance(call.get("args", {}), dict)):
            raise InvalidRequest(f"{where}: a functionCall needs a string name and object args", param="contents")
        response = part.get("functionResponse")
        if response is not None and not (
            isinstance(response, dict) and isinstance(response.get("name"), str) and isinstance(response.get("response"), dict)
        ):
            raise InvalidRequest(f"{where}: a functionResponse needs a string name and an object response", param="contents")
    if too_deep(raw, MAX_DEPTH - 2):
        raise InvalidRequest(f"{where} is nested too deeply", param="contents", code="invalid_json")


GEMINI = GeminiDialect()
