"""Tests of the fake Gemini upstream itself, with the official `google-genai` client and raw HTTP:
it must answer as the real API does (JSON, SSE, function calls with their thought signatures),
accept what Gemini CLI sends (the recorded sample), and refuse what the real API refuses
(GEMINI-RULES.md) -- or the proxy's Gemini tests prove nothing."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import errors, types

from tests.fakes.fake_gemini import INVALID_KEY
from tests.fakes.fake_upstream import FakeUpstream, Reply

KEY = "gemini-test-key"
MODEL = "gemini-2.5-pro"
MODEL_3 = "gemini-3-flash-preview"
WAIT = 5.0
CLI_SAMPLE = Path("/work/shared/samples/gemini-cli-request.json")
WEATHER = types.FunctionDeclaration(
    name="get_weather",
    description="Current weather of a city",
    parameters_json_schema={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


@pytest.fixture
def client(upstream: FakeUpstream) -> Iterator[genai.Client]:
    options = types.HttpOptions(base_url=upstream.gemini.base_url, timeout=int(WAIT * 1000))
    yield genai.Client(api_key=KEY, http_options=options)


@pytest.fixture
def raw(upstream: FakeUpstream) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=upstream.gemini.base_url, timeout=WAIT, headers={"x-goog-api-key": KEY}) as http:
        yield http


def generate(raw: httpx.Client, body: dict[str, Any], model: str = MODEL) -> httpx.Response:
    return raw.post(f"/v1beta/models/{model}:generateContent", json=body)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"text": text}]}


def refusal(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == 400 and error["status"] == "INVALID_ARGUMENT"
    return error["message"]


def tool_turn(raw: httpx.Client, model: str = MODEL) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """A model content calling get_weather (as the fake answered), and the request it answered."""
    contents = [user("Weather in Paris?")]
    answered = generate(raw, {"contents": contents}, model)
    assert answered.status_code == 200, answered.text
    return answered.json()["candidates"][0]["content"], contents


def weather_response(call_id: str | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {"name": "get_weather", "response": {"output": "sunny"}}
    if call_id is not None:
        response["id"] = call_id
    return {"role": "user", "parts": [{"functionResponse": response}]}


def test_a_tool_loop_with_the_sdk(upstream: FakeUpstream, client: genai.Client) -> None:
    upstream.enqueue(Reply.tool_calls([("get_weather", '{"city": "Paris"}')]), Reply.text("It is sunny."))
    config = types.GenerateContentConfig(tools=[types.Tool(function_declarations=[WEATHER])])
    first = client.models.generate_content(model=MODEL, contents="Weather in Paris?", config=config)
    call = first.function_calls[0]
    assert (call.name, call.args) == ("get_weather", {"city": "Paris"})
    assert first.candidates[0].content.parts[0].thought_signature  # the first call is signed
    history = [
        types.Content(role="user", parts=[types.Part(text="Weather in Paris?")]),
        first.candidates[0].content,
        types.Content(role="user", parts=[types.Part.from_function_response(name="get_weather", response={"output": "sunny"})]),
    ]
    second = client.models.generate_content(model=MODEL, contents=history, config=config)
    assert second.text == "It is sunny."
    sent = upstream.gemini.calls()[-1]
    assert sent.model == MODEL and not sent.stream
    assert [c["role"] for c in sent.body["contents"]] == ["user", "model", "user"]


def test_streaming_with_the_sdk_is_sse_in_pieces(upstream: FakeUpstream, client: genai.Client, raw: httpx.Client) -> None:
    upstream.enqueue(Reply.text("Hello there, world", chunk_size=5))
    chunks = list(client.models.generate_content_stream(model=MODEL, contents="hi"))
    assert "".join(c.text or "" for c in chunks) == "Hello there, world"
    assert len(chunks) == 4 and chunks[-1].candidates[0].finish_reason == types.FinishReason.STOP
    assert upstream.gemini.calls()[-1].stream
    upstream.enqueue(Reply.text("x"))
    streamed = raw.post(f"/v1beta/models/{MODEL}:streamGenerateContent", params={"alt": "sse"}, json={"contents": [user("hi")]})
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.content.startswith(b"data: {") and streamed.content.endswith(b"\r\n\r\n")


def test_thoughts_come_first_when_asked_for(upstream: FakeUpstream, raw: httpx.Client) -> None:
    upstream.enqueue(Reply.text("answer", reasoning="let me think"), Reply.text("answer", reasoning="let me think"))
    thinking = {"thinkingConfig": {"includeThoughts": True, "thinkingBudget": 8192}}
    parts = generate(raw, {"contents": [user("q")], "generationConfig": thinking}).json()["candidates"][0]["content"]["parts"]
    assert parts == [{"text": "let me think", "thought": True}, {"text": "answer"}]
    parts = generate(raw, {"contents": [user("q")]}).json()["candidates"][0]["content"]["parts"]
    assert parts == [{"text": "answer"}]


def test_the_cli_first_request_and_its_later_shapes_pass(upstream: FakeUpstream, raw: httpx.Client) -> None:
    sample = json.loads(CLI_SAMPLE.read_text())
    body = copy.deepcopy(sample["first_request"]["body"])
    assert generate(raw, body).status_code == 200
    # The resumed session: a dummy signature, and one call's response sent twice under its id.
    resumed = {**body, "contents": [*body["contents"], *sample["resumed_session"]["replayed_items"], user("say bye")]}
    assert generate(raw, resumed).status_code == 200, generate(raw, resumed).text
    # Gemini 3: two parallel calls, the signature on the first only (the fake's own signature here).
    upstream.enqueue(Reply.tool_calls([("run_shell_command", '{"command": "echo hi"}'), ("run_shell_command", '{"command": "echo second"}')]))
    model_content, contents = tool_turn(raw, MODEL_3)
    answers = {"role": "user", "parts": [
        {"functionResponse": {"name": "run_shell_command", "response": {"output": "hi"}}},
        {"functionResponse": {"name": "run_shell_command", "response": {"output": "second"}}},
    ]}
    assert generate(raw, {"contents": [*contents, model_content, answers]}, MODEL_3).status_code == 200


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda b: b.update(stream=True), 'Unknown name "stream"'),
        (lambda b: b["contents"][0].update(role="assistant"), "Please use a valid role: user, model."),
        (lambda b: b["contents"][0].update(parts=[]), "contents.parts must not be empty"),
        (lambda b: b.update(contents=[]), "contents is not specified"),
        (lambda b: b["contents"][0]["parts"].append({"thought": True}), "'data' must have one initialized field"),
        (lambda b: b["contents"][0]["parts"][0].update(cache_control={}), 'Unknown name "cache_control"'),
        (lambda b: b.update(tools=[{"functionDeclarations": [{"name": "9bad"}]}]), "Invalid function name"),
        (lambda b: b.update(generationConfig={"thinkingConfig": {"thinkingLevel": "HIGH"}}), "Thinking level is not supported"),
        (lambda b: b["contents"][0]["parts"][0].update(thoughtSignature="not base64!"), "Base64 decoding failed"),
        (lambda b: b["contents"][0]["parts"][0].update(thoughtSignature="Zm9yZWlnbiBzaWduYXR1cmUgYnl0ZXM="), "Invalid thought signature"),
    ],
)
def test_what_the_real_api_refuses(raw: httpx.Client, change: Any, message: str) -> None:
    body = {"contents": [user("hi")]}
    change(body)
    assert message in refusal(generate(raw, body))


def test_call_and_response_order_and_counts(upstream: FakeUpstream, raw: httpx.Client) -> None:
    upstream.enqueue(Reply.tool_calls([("get_weather", '{"city": "Paris"}')]))
    model_content, contents = tool_turn(raw)
    assert "comes immediately after a user turn" in refusal(generate(raw, {"contents": [model_content, weather_response()]}))
    assert "immediately after a function call turn" in refusal(generate(raw, {"contents": [*contents, weather_response()]}))
    two = {"role": "user", "parts": weather_response()["parts"] * 2}
    assert "number of function response parts" in refusal(generate(raw, {"contents": [*contents, model_content, two]}))
    consecutive = [*contents, user("and more"), model_content, weather_response()]  # consecutive user contents pass
    assert generate(raw, {"contents": consecutive}).status_code == 200


def test_gemini_3_wants_the_step_signature_back(upstream: FakeUpstream, raw: httpx.Client) -> None:
    upstream.enqueue(Reply.tool_calls([("get_weather", '{"city": "Paris"}')]))
    model_content, contents = tool_turn(raw, MODEL_3)
    unsigned = {**model_content, "parts": [{k: v for k, v in p.items() if k != "thoughtSignature"} for p in model_content["parts"]]}
    assert "missing a thought_signature" in refusal(generate(raw, {"contents": [*contents, unsigned, weather_response()]}, MODEL_3))
    dummy = {**unsigned, "parts": [{**unsigned["parts"][0], "thoughtSignature": "skip_thought_signature_validator"}]}
    assert generate(raw, {"contents": [*contents, dummy, weather_response()]}, MODEL_3).status_code == 200
    # Older turns (before the last user text) are not checked, nor are pre-3 models.
    older = [*contents, unsigned, weather_response(), {"role": "model", "parts": [{"text": "ok"}]}, user("next")]
    assert generate(raw, {"contents": older}, MODEL_3).status_code == 200
    assert generate(raw, {"contents": [*contents, unsigned, weather_response()]}).status_code == 200


def test_call_ids_when_asked_for(upstream: FakeUpstream, raw: httpx.Client) -> None:
    upstream.gemini.call_ids = True
    upstream.enqueue(Reply.tool_calls([("get_weather", '{"city": "Paris"}')]))
    model_content, contents = tool_turn(raw)
    call_id = model_content["parts"][0]["functionCall"]["id"]
    assert generate(raw, {"contents": [*contents, model_content, weather_response(call_id)]}).status_code == 200


def test_keys_and_errors_in_googles_shape(upstream: FakeUpstream, raw: httpx.Client) -> None:
    body = {"contents": [user("hi")]}
    bare = httpx.post(f"{upstream.gemini.base_url}/v1beta/models/{MODEL}:generateContent", json=body, timeout=WAIT)
    assert bare.status_code == 403 and bare.json()["error"]["status"] == "PERMISSION_DENIED"
    by_query = httpx.post(f"{upstream.gemini.base_url}/v1beta/models/{MODEL}:generateContent?key={KEY}", json=body, timeout=WAIT)
    assert by_query.status_code == 200
    bad = httpx.post(f"{upstream.gemini.base_url}/v1beta/models/{MODEL}:generateContent?key={INVALID_KEY}", json=body, timeout=WAIT)
    assert "API key not valid" in refusal(bad)
    upstream.enqueue(Reply.error(429, {"error": {"message": "slow down"}}))
    limited = generate(raw, body)
    assert limited.status_code == 429
    assert limited.json() == {"error": {"code": 429, "message": "slow down", "status": "RESOURCE_EXHAUSTED"}}


def test_an_sdk_error_is_the_apis_error(upstream: FakeUpstream, client: genai.Client) -> None:
    with pytest.raises(errors.ClientError) as raised:
        client.models.generate_content(model=MODEL, contents=[types.Content(role="system", parts=[types.Part(text="x")])])
    assert raised.value.code == 400 and raised.value.status == "INVALID_ARGUMENT"
    assert "valid role" in raised.value.message


def test_count_tokens(upstream: FakeUpstream, raw: httpx.Client) -> None:
    counted = raw.post(f"/v1beta/models/{MODEL}:countTokens", json={"contents": [user("hello world")]})
    assert counted.status_code == 200 and counted.json()["totalTokens"] > 0
    assert upstream.gemini.count_tokens_requests() == [{"contents": [user("hello world")]}]
