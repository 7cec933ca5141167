"""The Gemini API through the proxy, with the official `google-genai` client against the strict
fake Gemini upstream: managed turns (JSON and SSE), their units and signatures replayed byte for
byte, the conversation in the admin API, truncation and read-back hidden from the client, errors
in Google's shape, countTokens from the dry run, and the other paths passed through."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import errors, types

from tests.conftest import ALICE, BOB, MakeProxy, admin_get, live_messages, trajectory
from tests.fakes.fake_gemini import gemini_error
from tests.fakes.fake_upstream import FakeUpstream, Reply
from tests.support.harness import ProxyServer
from tests.telemetry.test_telemetry import has_turns, otlp, turns  # noqa: F401  # `otlp` is a fixture
from tests.test_metrics import scrape, value

MODEL = "gemini-2.5-pro"
MODEL_3 = "gemini-3-flash-preview"
SYSTEM = "You are a careful build engineer."
RUN_BUILD = types.FunctionDeclaration(
    name="run_build", description="Run the build and return its log", parameters_json_schema={"type": "object", "properties": {}}
)
# A build log whose end matters: only a read of the stored output finds the failing step.
BUILD_LOG = "".join(f"step {i:05d}: compiled module_{i % 97}.c ok\n" for i in range(900)) + "FAILED at step 00900: linker error in libfoo.so\n"


def gemini_proxy(make_proxy: MakeProxy, upstream: FakeUpstream, **sections: Any) -> ProxyServer:
    gemini = {"upstream": {"gemini_base_url": upstream.gemini.base_url}}
    for name, values in sections.items():
        gemini.setdefault(name, {}).update(values)
    return make_proxy(**gemini)


@pytest.fixture
def proxy(make_proxy: MakeProxy, upstream: FakeUpstream) -> ProxyServer:  # the `http` fixture's proxy too
    return gemini_proxy(make_proxy, upstream)


def client_of(base_url: str, api_key: str = ALICE, headers: dict[str, str] | None = None) -> genai.Client:
    options = types.HttpOptions(base_url=base_url, api_version="v1beta", headers=headers, timeout=60_000)
    return genai.Client(api_key=api_key, http_options=options)


def config(**more: Any) -> types.GenerateContentConfig:
    return types.GenerateContentConfig(system_instruction=SYSTEM, tools=[types.Tool(function_declarations=[RUN_BUILD])], **more)


def ask(client: genai.Client, contents: list[types.Content], stream: bool, model: str = MODEL) -> types.GenerateContentResponse:
    """One turn; streamed, its chunks joined as the client keeps them (the SDK's own way)."""
    if not stream:
        return client.models.generate_content(model=model, contents=contents, config=config())
    chunks = list(client.models.generate_content_stream(model=model, contents=contents, config=config()))
    parts: list[types.Part] = []
    for chunk in chunks:
        for part in chunk.candidates[0].content.parts or []:
            if parts and part.text is not None and parts[-1].text is not None and not part.thought and not parts[-1].thought:
                parts[-1] = types.Part(text=parts[-1].text + part.text, thought_signature=part.thought_signature or parts[-1].thought_signature)
            else:
                parts.append(part)
    last = chunks[-1]
    candidate = last.candidates[0].model_copy(update={"content": types.Content(role="model", parts=parts)})
    return last.model_copy(update={"candidates": [candidate]})


def user(text: str) -> types.Content:
    return types.Content(role="user", parts=[types.Part(text=text)])


def results(reply: types.GenerateContentResponse, output: str) -> types.Content:
    return types.Content(role="user", parts=[
        types.Part.from_function_response(name=call.name, response={"output": output}) for call in reply.function_calls
    ])


def only_conversation(http: httpx.Client, api_key: str = ALICE) -> str:
    listed = admin_get(http, "", api_key).json()["data"]
    assert len(listed) == 1, listed
    return listed[0]["id"]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_tool_loop_is_one_conversation_replayed_byte_for_byte(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client, stream: bool
) -> None:
    upstream.enqueue(Reply.tool_calls([("run_build", "{}")], reasoning="I will build."), Reply.text("It built fine."))
    client = client_of(proxy.url)
    contents = [user("Does it build?")]
    first = ask(client, contents, stream)
    assert [c.name for c in first.function_calls] == ["run_build"]
    contents += [first.candidates[0].content, results(first, "ok")]
    second = ask(client, contents, stream)
    assert second.text == "It built fine."

    one, two = upstream.gemini.calls()
    assert one.stream is two.stream is stream and one.model == MODEL
    assert one.headers["x-goog-api-key"] == ALICE
    assert one.body["systemInstruction"] == {"parts": [{"text": SYSTEM}], "role": "user"}
    # The model's content went back as the client sent it: its call, its signature.
    sent_call = two.body["contents"][1]
    assert sent_call["role"] == "model" and sent_call["parts"][0]["functionCall"]["name"] == "run_build"
    assert sent_call["parts"][0]["thoughtSignature"]

    conversation_id = only_conversation(http)
    assert conversation_id.startswith("auto-")
    stored = live_messages(http, conversation_id)
    assert [m["role"] for m in stored] == ["user", "model", "user", "model"]
    assert stored[2]["parts"][0]["functionResponse"]["response"] == {"output": "ok"}
    assert stored[3]["parts"] == [{"text": "It built fine."}]


def skills_prompt(*names: str) -> str:
    """A system prompt listing agent skills as Gemini CLI renders them, in the order given."""
    entries = "\n".join(
        f"  <skill>\n    <name>{n}</name>\n    <description>Use for {n}.</description>\n"
        f"    <location>/skills/{n}/SKILL.md</location>\n  </skill>"
        for n in names
    )
    return f"{SYSTEM}\n\n<available_skills>\n{entries}\n</available_skills>\n\n# Final Reminder\nKeep going."


def test_a_run_resumed_with_its_skills_listed_in_another_order_is_the_same_run(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client
) -> None:
    """Gemini CLI lists its skills in the order a glob finds them, which changes from one process to
    the next: its `--resume` names no conversation, so only the run's derived id finds it again.
    Another set of skills is another agent: a run of its own."""
    client = client_of(proxy.url)

    def turn(system: str, contents: list[types.Content]) -> types.Content:
        upstream.enqueue(Reply.text("Done."))
        config = types.GenerateContentConfig(system_instruction=system)
        return client.models.generate_content(model=MODEL, contents=contents, config=config).candidates[0].content

    contents = [user("Does it build?")]
    contents += [turn(skills_prompt("skill-creator", "antigravity-support"), contents), user("say bye")]
    turn(skills_prompt("antigravity-support", "skill-creator"), contents)  # the resumed process
    conversation_id = only_conversation(http)
    assert [m["role"] for m in live_messages(http, conversation_id)] == ["user", "model", "user", "model"]

    turn(skills_prompt("antigravity-support", "code-review"), [user("Does it build?")])
    assert len(admin_get(http, "").json()["data"]) == 2


def test_parallel_calls_and_their_responses_are_one_unit_each_response_an_item(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client
) -> None:
    upstream.enqueue(Reply.tool_calls([("run_build", "{}"), ("run_build", '{"target": "docs"}')]), Reply.text("Both ran."))
    client = client_of(proxy.url, headers={"X-Conversation-ID": "parallel-1"})
    contents = [user("Build twice")]
    first = ask(client, contents, stream=True, model=MODEL_3)
    contents += [first.candidates[0].content, results(first, "ok")]
    assert ask(client, contents, stream=True, model=MODEL_3).text == "Both ran."
    sent = upstream.gemini.calls()[-1].body["contents"]
    assert [[next(iter(p)) for p in c["parts"]] for c in sent] == [
        ["text"], ["functionCall", "functionCall"], ["functionResponse", "functionResponse"],
    ]
    stored = live_messages(http, "parallel-1")
    assert [len(m["parts"]) for m in stored] == [1, 2, 1, 1, 1]  # each response stored as its own part


def reading_model(body: dict[str, Any]) -> Reply:
    """A model that reads the end of a shortened output once, then answers from what it read."""
    text = json.dumps(body["contents"][-1])
    if "FAILED at step 00900" in text:
        return Reply.text("The build failed at step 900: a linker error in libfoo.so.", chunk_size=16)
    if "read_tool_output" in text:
        ref = text.split('ref \\"', 1)[1].split('\\"', 1)[0]
        args = {"ref": ref, "offset": len(BUILD_LOG) - 200, "length": 200}
        return Reply.tool_calls([("read_tool_output", json.dumps(args))], content="Let me read the end.")
    return Reply.tool_calls([("run_build", "{}")])


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_long_function_response_is_shortened_and_read_back_out_of_the_clients_sight(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client, stream: bool
) -> None:
    upstream.responder = reading_model
    client = client_of(proxy.url, headers={"X-Conversation-ID": "read-1"})
    contents = [user("Why does the build fail?")]
    first = ask(client, contents, stream, model=MODEL_3)
    contents += [first.candidates[0].content, results(first, BUILD_LOG)]
    answer = ask(client, contents, stream, model=MODEL_3)
    assert "linker error" in answer.text
    assert not answer.function_calls
    # The reply kept is the one the client was given: neither our call nor its round's own view.
    kept = live_messages(http, "read-1")[-1]["parts"]
    assert not any("functionCall" in part for part in kept)
    assert "".join(part.get("text", "") for part in kept) == answer.text

    _, round1, round2 = upstream.gemini.calls()
    sent_output = round1.body["contents"][-1]["parts"][0]["functionResponse"]["response"]["output"]
    assert len(sent_output) < 3000 and "read_tool_output" in sent_output and "FAILED" not in sent_output
    declared = [d["name"] for t in round1.body["tools"] for d in t.get("functionDeclarations", [])]
    assert declared == ["run_build", "read_tool_output", "search_history"]  # the recall tools, as Gemini declarations
    # The read round: the model's own call, signed, then the proxy's answer (the fake checks both).
    call_content, answer_content = round2.body["contents"][-2:]
    assert call_content["parts"][-1]["functionCall"]["name"] == "read_tool_output"
    assert "FAILED at step 00900" in answer_content["parts"][0]["functionResponse"]["response"]["output"]

    # Streamed, the client saw the read round's text and the answer, never our call (as JSON,
    # the final round's reply: the earlier one's text is gone with our call, as in every format).
    assert answer.text.startswith("Let me read the end.") is stream
    # It sends the reply back: valid, and the read round stays out of the transcript.
    upstream.responder = lambda body: Reply.text("You're welcome.")
    contents += [answer.candidates[0].content, user("Thanks")]
    assert ask(client, contents, stream, model=MODEL_3).text == "You're welcome."
    later = upstream.gemini.calls()[-1].body["contents"]
    names = [p["functionCall"]["name"] for c in later for p in c["parts"] if "functionCall" in p]
    assert names == ["run_build"]
    stored = live_messages(http, "read-1")
    assert stored[2]["parts"][0]["functionResponse"]["response"]["output"] == BUILD_LOG  # the full output is kept
    statuses = [m["status"] for m in trajectory(http, "read-1")]
    assert statuses.count("internal") == 2


def test_bad_input_is_refused_in_googles_shape_and_changes_nothing(proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client) -> None:
    client = client_of(proxy.url, headers={"X-Conversation-ID": "bad-1"})
    with pytest.raises(errors.ClientError) as raised:
        client.models.generate_content(model=MODEL, contents=[types.Content(role="system", parts=[types.Part(text="x")])])
    assert raised.value.code == 400 and raised.value.status == "INVALID_ARGUMENT"
    assert "valid role" in raised.value.message
    response = httpx.post(
        proxy.url + f"/v1beta/models/{MODEL}:generateContent", content=b"{not json", headers={"x-goog-api-key": ALICE}, timeout=30,
    )
    assert response.status_code == 400 and set(response.json()["error"]) == {"code", "message", "status"}
    assert upstream.gemini.calls() == []
    assert admin_get(http, "/bad-1").status_code == 404


def test_the_upstreams_own_error_passes_through_unmodified(proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client) -> None:
    upstream.enqueue(gemini_error(429, "Resource has been exhausted (e.g. check quota)."))
    response = httpx.post(
        proxy.url + f"/v1beta/models/{MODEL}:generateContent",
        json={"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
        headers={"x-goog-api-key": ALICE, "X-Conversation-ID": "limited-1"}, timeout=30,
    )
    assert response.status_code == 429
    assert response.json() == {"error": {"code": 429, "message": "Resource has been exhausted (e.g. check quota).", "status": "RESOURCE_EXHAUSTED"}}
    assert live_messages(http, "limited-1") == []


def test_the_conversation_named_by_header_or_path_and_the_tenant_by_key(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client
) -> None:
    client = client_of(proxy.url + "/c/by-path")  # held: a client collected closes its connection pool
    client.models.generate_content(model=MODEL, contents="hello")
    assert [m["role"] for m in live_messages(http, "by-path")] == ["user", "model"]
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    by_query = httpx.post(proxy.url + f"/v1beta/models/{MODEL}:generateContent?key={BOB}", json=body, headers={"X-Conversation-ID": "bobs"}, timeout=30)
    assert by_query.status_code == 200, by_query.text
    sent = upstream.gemini.calls()[-1]
    assert sent.query["key"] == BOB  # the credential went on as it came,
    assert sent.headers["x-goog-api-key"] == BOB  # and as the header calls without the query (summaries) carry
    assert admin_get(http, "/bobs", BOB).status_code == 200
    assert admin_get(http, "/bobs", ALICE).status_code == 404  # another key's conversation


def test_count_tokens_counts_the_managed_prompt(proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client) -> None:
    contents = [{"role": "user", "parts": [{"text": "run it"}]}, {"role": "model", "parts": [{"functionCall": {"name": "run_build", "args": {}}}]},
                {"role": "user", "parts": [{"functionResponse": {"name": "run_build", "response": {"output": BUILD_LOG}}}]}]
    response = httpx.post(proxy.url + f"/v1beta/models/{MODEL}:countTokens", json={"contents": contents}, headers={"x-goog-api-key": ALICE}, timeout=30)
    assert response.status_code == 200, response.text
    (counted,) = upstream.gemini.count_tokens_requests()
    inner = counted["generateContentRequest"]
    assert inner["model"] == f"models/{MODEL}"
    assert len(inner["contents"][-1]["parts"][0]["functionResponse"]["response"]["output"]) < 3000  # shortened, as a turn sends it
    assert response.json()["totalTokens"] < len(BUILD_LOG) // 4
    assert admin_get(http, "").json()["data"] == []  # a dry run writes nothing


def test_other_gemini_paths_go_to_the_gemini_api(proxy: ProxyServer, upstream: FakeUpstream) -> None:
    response = httpx.get(proxy.url + "/v1beta/models", headers={"x-goog-api-key": ALICE}, timeout=30)
    assert response.status_code == 401  # the fake's catch-all wants a Bearer: it reached the fake's root
    assert upstream.requests[-1].path == "/v1beta/models"


def test_gemini_turns_are_gemini_chat_spans_with_its_usage(make_proxy: MakeProxy, upstream: FakeUpstream, otlp: Any) -> None:
    proxy = make_proxy(telemetry={"otlp_endpoint": otlp.endpoint}, upstream={"gemini_base_url": upstream.gemini.base_url})
    client = client_of(proxy.url, headers={"X-Conversation-ID": "gemini-ledger"})
    reply = client.models.generate_content(model=MODEL, contents="Sum the ledger.", config=config())
    spans = otlp.wait_for(lambda spans: has_turns(1)(spans) and any(s.kind == "CLIENT" for s in spans))
    (turn,) = turns(spans)
    a = turn.attributes
    assert turn.name == f"chat {MODEL}" and a["gen_ai.provider.name"] == "gcp.gemini"
    assert a["gen_ai.conversation.id"] == "gemini-ledger" and a["server.port"] == upstream.port
    assert a["gen_ai.usage.input_tokens"] == reply.usage_metadata.prompt_token_count
    assert a["gen_ai.usage.output_tokens"] == reply.usage_metadata.candidates_token_count
    assert a["gen_ai.response.id"] == reply.response_id


@pytest.mark.parametrize("named", [True, False], ids=["named", "unnamed"])
def test_a_later_turn_reuses_the_previous_ones_work(proxy: ProxyServer, upstream: FakeUpstream, named: bool) -> None:
    """The body cache and the fast path work for a transcript in the middle of the body (Gemini's
    `contents` come before `systemInstruction` and `tools`): later turns are rewritten only where new.
    Gemini CLI names no conversation: its run is known by its bytes up to the first model content
    (whose role is "model", not "assistant"), so from its second request on it is fast too."""
    client = client_of(proxy.url, headers={"X-Conversation-ID": "fast-1"} if named else None)
    contents = [user("Build it.")]
    for _ in range(5):
        upstream.enqueue(Reply.tool_calls([("run_build", "{}")]))
        reply = ask(client, contents, stream=True)
        contents += [reply.candidates[0].content, results(reply, "ok")]
    samples = scrape(proxy)
    counted = {o: value(samples, "context_proxy_fast_path_turns_total", outcome=o) for o in ("taken", "declined", "none")}
    # The first request: no previous turn. Unnamed, the second finds the first (which had no
    # reply to name its run by) in an opening slot of the tenant's.
    assert counted == {"none": 1.0, "taken": 4.0, "declined": 0.0}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_reply_mixing_our_call_with_the_clients_gives_the_client_the_signature(
    proxy: ProxyServer, upstream: FakeUpstream, stream: bool
) -> None:
    """Gemini 3 signs a step's first call only: when that is ours, taken out, the client's call
    gets the signature, and the client's next request passes the API's check."""
    client = client_of(proxy.url, headers={"X-Conversation-ID": f"mixed-{stream}"})
    upstream.enqueue(Reply.tool_calls([("run_build", "{}")]))
    contents = [user("Why does the build fail?")]
    first = ask(client, contents, stream, model=MODEL_3)
    contents += [first.candidates[0].content, results(first, BUILD_LOG)]
    upstream.responder = lambda body: Reply.tool_calls(
        [("read_tool_output", json.dumps({"ref": "out_1_000000000000000000000000", "offset": 0})), ("run_build", '{"clean": true}')]
    )
    second = ask(client, contents, stream, model=MODEL_3)
    (call,) = second.function_calls
    assert (call.name, call.args) == ("run_build", {"clean": True})
    signed = [p for p in second.candidates[0].content.parts if p.function_call is not None]
    assert signed[0].thought_signature  # moved from our call, taken out
    upstream.responder = lambda body: Reply.text("Clean build passes.")
    contents += [second.candidates[0].content, results(second, "ok")]
    assert ask(client, contents, stream, model=MODEL_3).text == "Clean build passes."  # the fake checked the signature


def test_side_calls_in_json_mode_or_with_search_get_none_of_our_functions(make_proxy: MakeProxy, upstream: FakeUpstream) -> None:
    proxy = make_proxy(upstream={"gemini_base_url": upstream.gemini.base_url}, knowledge={"enabled": True})
    router = {"contents": [{"role": "user", "parts": [{"text": "classify"}]}, {"role": "user", "parts": [{"text": "run echo hi"}]}],
              "generationConfig": {"responseMimeType": "application/json", "responseJsonSchema": {"type": "OBJECT"}}}
    search = {"contents": [{"role": "user", "parts": [{"text": "x"}]}], "tools": [{"googleSearch": {}}]}
    for body in (router, search):
        response = httpx.post(proxy.url + f"/v1beta/models/{MODEL}:generateContent", json=body, headers={"x-goog-api-key": ALICE}, timeout=30)
        assert response.status_code == 200, response.text
        sent = upstream.gemini.requests()[-1]
        assert sent.get("tools") == body.get("tools")  # no function of ours added
        assert "Long-term knowledge" in json.dumps(sent["systemInstruction"])  # the notes still go


def test_a_stream_the_upstream_breaks_off_ends_in_an_error_event_and_is_kept_incomplete(
    proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client
) -> None:
    upstream.enqueue(Reply.text("A long answer that breaks off", chunk_size=4).failing_after(3))
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    response = httpx.post(
        proxy.url + f"/v1beta/models/{MODEL}:streamGenerateContent?alt=sse", json=body,
        headers={"x-goog-api-key": ALICE, "X-Conversation-ID": "broken-1"}, timeout=30,
    )
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1]["error"]["status"] == "UNAVAILABLE"  # the upstream's own, relayed unmodified
    assert [e["error"] for e in events if "error" in e] == [events[-1]["error"]]  # once
    # The request failed (the reply never came whole), the part that came is kept as incomplete.
    assert [m["status"] for m in trajectory(http, "broken-1")] == ["failed", "incomplete"]


def test_an_empty_model_content_echoed_back_is_kept_and_never_sent(proxy: ProxyServer, upstream: FakeUpstream, http: httpx.Client) -> None:
    """A reply that held only the proxy's calls (past the read-back limit) reaches the client
    empty; a client that echoes it as a model content without parts is not refused for it."""
    contents = [{"role": "user", "parts": [{"text": "hi"}]}, {"role": "model", "parts": []}, {"role": "user", "parts": [{"text": "again"}]}]
    response = httpx.post(
        proxy.url + f"/v1beta/models/{MODEL}:generateContent", json={"contents": contents},
        headers={"x-goog-api-key": ALICE, "X-Conversation-ID": "empty-1"}, timeout=30,
    )
    assert response.status_code == 200, response.text
    assert upstream.gemini.requests()[-1]["contents"] == [contents[0], contents[2]]  # the fake refuses empty parts
    assert [m["role"] for m in live_messages(http, "empty-1")] == ["user", "model", "user", "model"]
