"""Transparency: "point your agent at it and change nothing", for every client the suite drives.

Each test runs one scripted session twice — straight against the strict fake upstream, then
through a proxy on its DEFAULT settings — and compares what the upstream received, request by
request and message by message, by meaning (tests/clients/transparency.py): roles, part types, texts,
calls and results, the system prompt / instructions, the tools and the other parameters, with
what each run makes up (temp dirs, session ids, uuids, timestamps, the fake's call and reply ids)
blanked. A request anchored with `previous_response_id` is compared as the proxy sends it: the
stored history instead of the id.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anthropic
import pytest
from openai import AsyncOpenAI, OpenAI

from tests.clients.transparency import (
    TRANSCRIPT_KEY,
    Blanks,
    Format,
    compared,
    expand_anchors,
    first_difference,
    meaning,
)
from tests.conftest import ALICE, MakeProxy
from tests.fakes.fake_upstream import FakeUpstream, Reply
from tests.support.harness import ProxyServer

SYSTEM = "You are a careful test runner. Answer in one sentence."
TASK = "Run the tests under tests/ and tell me how many passed."
FOLLOW_UP = "Thanks. Is there anything else to run?"
RUN_TESTS_SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string", "description": "Where the tests are"}},
    "required": ["path"],
}
CHAT_TOOLS = [{"type": "function", "function": {"name": "run_tests", "description": "Run the tests under a path.",
                                                "parameters": RUN_TESTS_SCHEMA}}]
RESPONSES_TOOLS = [{"type": "function", "name": "run_tests", "description": "Run the tests under a path.",
                    "parameters": RUN_TESTS_SCHEMA, "strict": False}]


def tool_loop_script() -> list[Reply]:
    """The model's side of every session below: a call of run_tests, a summary, an answer to the
    follow-up (fresh Replies each run: the fake gives each call a new id)."""
    return [
        Reply.tool_calls([("run_tests", json.dumps({"path": "tests/"}))], reasoning="I should run them first."),
        Reply.text("All 12 tests passed.", reasoning="The tool said 12 passed."),
        Reply.text("No, that was everything."),
    ]


def run_tests(path: str) -> str:
    """Run the tests under a path."""
    return f"{path}: 12 passed"


API_PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
# Each hop's own: its connection, its compression, the length of its bytes.
TRANSPORT_HEADERS = frozenset({"host", "connection", "accept-encoding", "content-length"})


@pytest.fixture
def proxy(make_proxy: MakeProxy, upstream: FakeUpstream) -> ProxyServer:
    """A proxy on its default settings, in front of the fake's three APIs."""
    return make_proxy(upstream={"anthropic_base_url": upstream.anthropic.base_url})


def requests_of(upstream: FakeUpstream, format: Format) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The requests the fake accepted, as sent and as compared: anchored Responses requests
    expanded as the proxy's rule sends them (while the fake still holds what they name)."""
    if format == "chat":
        return upstream.chat_requests(), upstream.chat_requests()
    if format == "messages":
        return upstream.messages_requests(), upstream.messages_requests()
    sent = upstream.responses_requests()
    return sent, expand_anchors(sent, upstream.responses.stored)


def assert_transparent(
    upstream: FakeUpstream, format: Format, session: Callable[[str], Any], script: Callable[[], list[Reply]],
    literals: Callable[[str], dict[str, str]] = lambda target: {},
    patterns: Sequence[tuple[str, re.Pattern[str]]] = (),
) -> dict[str, list[dict[str, Any]]]:
    """Run `session(target)` ("direct", then "proxied") on a fresh fake, each with `script()`
    queued, and assert the upstream received the same requests by meaning; `literals(target)`
    names the run's own values (its temp dirs), `patterns` a client's own run-specific values.
    Returns the requests of each run as the fake received them."""
    sent, meant, headers = {}, {}, {}
    for target in ("direct", "proxied"):
        upstream.reset()
        upstream.enqueue(*script())
        session(target)
        sent[target], bodies = requests_of(upstream, format)
        meant[target] = compared(format, bodies, literals(target), patterns)
        blanks = Blanks(literals(target), patterns)
        headers[target] = [blanks({k: v for k, v in r.headers.items() if k not in TRANSPORT_HEADERS})
                           for r in upstream.requests if r.path == API_PATHS[format]]
    assert len(meant["direct"]) >= 2  # a session with history, not a single call
    assert meant["direct"] == meant["proxied"], first_difference(meant["direct"], meant["proxied"])
    # The client's headers too (its session ids, betas, versions), but for the connection's own.
    assert headers["direct"] == headers["proxied"]
    return sent


# -- the comparison itself --------------------------------------------------------------------


def test_meaning_blanks_what_a_run_makes_up_and_sees_what_a_proxy_would_change() -> None:
    def run(call_id: str, folder: str, cached: bool) -> list[dict[str, Any]]:
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": call_id, "content": f"{folder}/out: ok"}
        if cached:
            result["cache_control"] = {"type": "ephemeral"}
        return [{"system": SYSTEM, "messages": [
            {"role": "user", "content": TASK},
            {"role": "system", "content": [{"type": "text", "text": f"cwd: {folder}"}] if cached else f"cwd: {folder}"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": call_id, "name": "run_tests", "input": {}}]},
            {"role": "user", "content": [result]},
        ]}]

    direct = compared("messages", run("toolu_0123456789abcdef01234567", "/tmp/a", False), {"/tmp/a": "run"})
    proxied = compared("messages", run("toolu_fedcba9876543210fedcba98", "/tmp/b", True), {"/tmp/b": "run"})
    assert direct == proxied  # other ids and folders, blocks for a string, a cache breakpoint moved
    assert direct[0]["transcript"][2]["parts"][0][1] == direct[0]["transcript"][3]["parts"][0][1] == "<call1>"
    dropped = run("toolu_fedcba9876543210fedcba98", "/tmp/b", False)
    del dropped[0]["messages"][1]
    assert "4 elements direct, 3 proxied" in first_difference(direct, compared("messages", dropped, {"/tmp/b": "run"}))
    edited = run("toolu_fedcba9876543210fedcba98", "/tmp/b", False)
    edited[0]["messages"][0]["content"] = TASK + " "
    assert first_difference(direct, compared("messages", edited, {"/tmp/b": "run"})).startswith(
        "request 0, transcript[0], parts[0][1], at character")


# -- the openai SDK: Chat Completions ---------------------------------------------------------


def chat_session(client: OpenAI) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    for reply_to in (None, None, FOLLOW_UP):
        if reply_to:
            messages.append({"role": "user", "content": reply_to})
        answer = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=CHAT_TOOLS).choices[0].message
        messages.append(answer.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}))
        for call in answer.tool_calls or ():
            path = json.loads(call.function.arguments)["path"]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": run_tests(path)})


async def chat_session_streamed(client: AsyncOpenAI) -> None:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASK}]
    for reply_to in (None, None, FOLLOW_UP):
        if reply_to:
            messages.append({"role": "user", "content": reply_to})
        content, calls = "", {}
        stream = await client.chat.completions.create(
            model="gpt-4o-mini", messages=messages, tools=CHAT_TOOLS, stream=True, stream_options={"include_usage": True}
        )
        async for chunk in stream:
            for choice in chunk.choices:
                content += choice.delta.content or ""
                for d in choice.delta.tool_calls or ():
                    slot = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                    slot["id"] += d.id or ""
                    slot["name"] += (d.function.name if d.function else None) or ""
                    slot["arguments"] += (d.function.arguments if d.function else None) or ""
        message: dict[str, Any] = {"role": "assistant", "content": content or None}
        if calls:
            message["tool_calls"] = [{"id": c["id"], "type": "function",
                                      "function": {"name": c["name"], "arguments": c["arguments"]}} for c in calls.values()]
        messages.append(message)
        for c in calls.values():
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": run_tests(json.loads(c["arguments"])["path"])})


@pytest.mark.parametrize("mode", ["sync", "async-stream"])
def test_openai_sdk_chat_completions(proxy: ProxyServer, upstream: FakeUpstream, mode: str) -> None:
    def session(target: str) -> None:
        base_url = upstream.base_url if target == "direct" else proxy.base_url
        if mode == "sync":
            with OpenAI(base_url=base_url, api_key=ALICE, max_retries=0) as client:
                chat_session(client)
        else:
            asyncio.run(chat_session_streamed(AsyncOpenAI(base_url=base_url, api_key=ALICE, max_retries=0)))

    sent = assert_transparent(upstream, "chat", session, tool_loop_script)["proxied"]
    assert [m["role"] for m in sent[-1]["messages"]] == ["system", "user", "assistant", "tool", "assistant", "user"]


# -- the openai SDK: Responses ----------------------------------------------------------------


class ResponsesLoop:
    """The tool loop over Responses, one request at a time: each resends the whole input
    (`store: false`, the reasoning's encrypted content asked for and passed back), or names the
    previous response and carries only what is new."""

    def __init__(self, anchored: bool) -> None:
        self.anchored = anchored
        self.given: list[Any] = [{"role": "user", "content": TASK}]
        self.previous: str | None = None

    def request(self, reply_to: str | None) -> dict[str, Any]:
        if reply_to:
            self.given.append({"role": "user", "content": reply_to})
        options: dict[str, Any] = {"store": False, "include": ["reasoning.encrypted_content"]}
        if self.anchored:
            options = {"previous_response_id": self.previous} if self.previous else {}
        return {"model": "gpt-4o-mini", "instructions": SYSTEM, "tools": RESPONSES_TOOLS, "input": self.given, **options}

    def answered(self, response: Any) -> None:
        output = [item.model_dump(exclude_none=True) for item in response.output]
        results = [{"type": "function_call_output", "call_id": item["call_id"],
                    "output": run_tests(json.loads(item["arguments"])["path"])}
                   for item in output if item["type"] == "function_call"]
        if self.anchored:
            self.given, self.previous = results, response.id
        else:
            self.given = [*self.given, *output, *results]


def responses_session(client: OpenAI, anchored: bool) -> None:
    loop = ResponsesLoop(anchored)
    for reply_to in (None, None, FOLLOW_UP):
        loop.answered(client.responses.create(**loop.request(reply_to)))


async def responses_session_streamed(client: AsyncOpenAI, anchored: bool) -> None:
    loop = ResponsesLoop(anchored)
    for reply_to in (None, None, FOLLOW_UP):
        async with client.responses.stream(**loop.request(reply_to)) as stream:
            loop.answered(await stream.get_final_response())


@pytest.mark.parametrize("anchored", [False, True], ids=["resent", "previous_response_id"])
@pytest.mark.parametrize("mode", ["sync", "async-stream"])
def test_openai_sdk_responses(proxy: ProxyServer, upstream: FakeUpstream, mode: str, anchored: bool) -> None:
    def session(target: str) -> None:
        base_url = upstream.base_url if target == "direct" else proxy.base_url
        if mode == "sync":
            with OpenAI(base_url=base_url, api_key=ALICE, max_retries=0) as client:
                responses_session(client, anchored)
        else:
            asyncio.run(responses_session_streamed(AsyncOpenAI(base_url=base_url, api_key=ALICE, max_retries=0), anchored))

    sent = assert_transparent(upstream, "responses", session, tool_loop_script)
    kinds = [item.get("type", "message") for item in sent["proxied"][-1]["input"]]
    assert kinds == ["message", "reasoning", "function_call", "function_call_output", "reasoning", "message", "message"]
    # Straight, the anchored session sent only its new items; the proxy sent the history itself.
    assert [len(body["input"]) for body in sent["direct"]] == ([1, 1, 1] if anchored else [1, 4, 7])
    assert ["previous_response_id" in body for body in sent["direct"]] == [False, anchored, anchored]
    assert all("previous_response_id" not in body for body in sent["proxied"])


# -- the OpenAI Agents SDK, on both its models ------------------------------------------------


def agents_session(base_url: str, model_kind: str, streamed: bool) -> None:
    """An agent with one tool, run twice: the task, then the follow-up after the first run's items
    (`Runner.run_sync`, or `Runner.run_streamed` with its events read to the end); "anchored":
    each call names the previous response (`auto_previous_response_id`), and the second run
    only the follow-up after the first run's last response."""
    from agents import Agent, RunConfig, Runner, function_tool, set_tracing_disabled
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
    from agents.models.openai_responses import OpenAIResponsesModel

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=base_url, api_key=ALICE, max_retries=0)
    model_class = OpenAIChatCompletionsModel if model_kind == "chat" else OpenAIResponsesModel
    agent = Agent(name="tester", instructions=SYSTEM, tools=[function_tool(run_tests)],
                  model=model_class(model="gpt-4o-mini", openai_client=client))
    config = RunConfig(tracing_disabled=True)
    follow_up = {"role": "user", "content": FOLLOW_UP}
    anchored = model_kind == "responses-anchored"
    options: dict[str, Any] = {"auto_previous_response_id": True} if anchored else {}

    def next_run(first: Any) -> tuple[Any, dict[str, Any]]:
        if anchored:
            return [follow_up], {**options, "previous_response_id": first.last_response_id}
        return [*first.to_input_list(), follow_up], options

    if not streamed:
        first = Runner.run_sync(agent, TASK, run_config=config, **options)
        given, more = next_run(first)
        again = Runner.run_sync(agent, given, run_config=config, **more)
    else:
        async def read_to_the_end(given: Any, more: dict[str, Any]) -> Any:
            result = Runner.run_streamed(agent, given, run_config=config, **more)
            async for _ in result.stream_events():
                pass
            return result

        async def both() -> tuple[Any, Any]:  # on one loop: the client's connections belong to it
            first = await read_to_the_end(TASK, options)
            return first, await read_to_the_end(*next_run(first))

        first, again = asyncio.run(both())
    assert first.final_output == "All 12 tests passed."
    assert again.final_output == "No, that was everything."


@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
@pytest.mark.parametrize("model_kind", ["responses", "responses-anchored", "chat"],
                         ids=["OpenAIResponsesModel", "OpenAIResponsesModel-previous_response_id", "OpenAIChatCompletionsModel"])
def test_openai_agents_sdk(proxy: ProxyServer, upstream: FakeUpstream, model_kind: str, streamed: bool) -> None:
    def session(target: str) -> None:
        agents_session(upstream.base_url if target == "direct" else proxy.base_url, model_kind, streamed)

    format: Format = "chat" if model_kind == "chat" else "responses"
    sent = assert_transparent(upstream, format, session, tool_loop_script)
    assert len(sent["proxied"]) == 3
    if model_kind == "responses-anchored":
        assert ["previous_response_id" in body for body in sent["direct"]] == [False, True, True]
        assert all("previous_response_id" not in body for body in sent["proxied"])


# -- LangChain: langchain-openai's ChatOpenAI with a tool loop --------------------------------


def langchain_session(base_url: str, streamed: bool) -> None:
    from langchain_core.messages import HumanMessage, SystemMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def run_tests_tool(path: str) -> str:
        """Run the tests under a path."""
        return run_tests(path)

    llm = ChatOpenAI(model="gpt-4o-mini", base_url=base_url, api_key=ALICE, max_retries=0).bind_tools([run_tests_tool])
    messages: list[Any] = [SystemMessage(SYSTEM), HumanMessage(TASK)]
    for reply_to in (None, None, FOLLOW_UP):
        if reply_to:
            messages.append(HumanMessage(reply_to))
        if streamed:  # the chunks added up, as LangChain's own agents do
            answer = None
            for chunk in llm.stream(messages):
                answer = chunk if answer is None else answer + chunk
        else:
            answer = llm.invoke(messages)
        messages.append(answer)
        for call in answer.tool_calls:
            messages.append(ToolMessage(run_tests_tool.invoke(call["args"]), tool_call_id=call["id"]))


@pytest.mark.parametrize("streamed", [False, True], ids=["invoke", "stream"])
def test_langchain_chat_openai(proxy: ProxyServer, upstream: FakeUpstream, streamed: bool) -> None:
    def session(target: str) -> None:
        langchain_session(upstream.base_url if target == "direct" else proxy.base_url, streamed)

    sent = assert_transparent(upstream, "chat", session, tool_loop_script)["proxied"]
    assert [m["role"] for m in sent[-1]["messages"]] == ["system", "user", "assistant", "tool", "assistant", "user"]


def test_importing_langchain_openai_opens_no_socket() -> None:
    """langchain-openai (and langsmith, which langchain-core brings) must not reach the network
    when imported and a client is built: any connect or name lookup is recorded by an audit hook."""
    probe = textwrap.dedent("""
        import sys
        reached = []
        def hook(event, args):
            if event in ("socket.connect", "socket.getaddrinfo"):
                reached.append(f"{event} {args[1] if event == 'socket.connect' else args[0]}")
        sys.addaudithook(hook)
        from langchain_openai import ChatOpenAI
        ChatOpenAI(model="gpt-4o-mini", base_url="http://127.0.0.1:9/v1", api_key="sk-test")
        print(reached)
        import socket
        socket.getaddrinfo("localhost", 9)  # the hook sees a lookup: the probe itself works
        print(reached)
    """)
    done = subprocess.run([sys.executable, "-c", probe], check=False, capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["[]", "['socket.getaddrinfo localhost']"]


# -- the anthropic SDK: a tool loop, JSON and streamed ----------------------------------------

CLAUDE_TOOLS = [{"name": "run_tests", "description": "Run the tests under a path.", "input_schema": RUN_TESTS_SCHEMA}]


def anthropic_session(client: anthropic.Anthropic, stream: bool) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": TASK}]
    params = {"model": "claude-test-1", "max_tokens": 4096, "system": SYSTEM, "tools": CLAUDE_TOOLS,
              "thinking": {"type": "enabled", "budget_tokens": 1024}}
    for reply_to in (None, None, FOLLOW_UP):
        if reply_to:
            messages.append({"role": "user", "content": reply_to})
        if stream:
            with client.messages.stream(messages=messages, **params) as events:
                answer = events.get_final_message()
        else:
            answer = client.messages.create(messages=messages, **params)
        messages.append({"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in answer.content]})
        results = [{"type": "tool_result", "tool_use_id": block.id, "content": run_tests(block.input["path"])}
                   for block in answer.content if block.type == "tool_use"]
        if results:
            messages.append({"role": "user", "content": results})


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_anthropic_sdk(proxy: ProxyServer, upstream: FakeUpstream, stream: bool) -> None:
    def session(target: str) -> None:
        base_url = upstream.anthropic.base_url if target == "direct" else proxy.url
        with anthropic.Anthropic(base_url=base_url, api_key=ALICE, max_retries=0) as client:
            anthropic_session(client, stream)

    sent = assert_transparent(upstream, "messages", session, tool_loop_script)["proxied"]
    assert [m["role"] for m in sent[-1]["messages"]] == ["user", "assistant", "user", "assistant", "user"]


# -- instructions anywhere in the transcript, as string and as blocks ------------------------

ENVIRONMENT = "# Environment\n - Primary working directory: /home/dev/project\n - Platform: linux"
LATER = "From now on, answer in French."


def instruction(format: Format, text: str, blocks: bool) -> dict[str, Any]:
    """A system/developer message of the client's, in `format`, its content as blocks or a string."""
    part = {"chat": "text", "messages": "text", "responses": "input_text"}[format]
    role = "developer" if format == "responses" else "system"
    return {"role": role, "content": [{"type": part, "text": text}] if blocks else text}


def instructions_session(format: Format, base_url: str) -> None:
    """Three turns whose transcript holds the client's instructions after the task (blocks on the
    first turn, a string later: Claude Code's environment block) and again mid-conversation."""
    def ask(transcript: list[dict[str, Any]]) -> str:
        if format == "messages":
            with anthropic.Anthropic(base_url=base_url, api_key=ALICE, max_retries=0) as client:
                answer = client.messages.create(model="claude-test-1", max_tokens=1024, system=SYSTEM,
                                                messages=transcript)  # type: ignore[arg-type]
                return "".join(block.text for block in answer.content if block.type == "text")
        with OpenAI(base_url=base_url, api_key=ALICE, max_retries=0) as client:
            if format == "chat":
                given = [{"role": "system", "content": SYSTEM}, *transcript]
                return client.chat.completions.create(model="gpt-4o-mini", messages=given).choices[0].message.content or ""
            return client.responses.create(model="gpt-4o-mini", instructions=SYSTEM, input=transcript, store=False).output_text

    transcript = [{"role": "user", "content": TASK}, instruction(format, ENVIRONMENT, blocks=True)]
    for n, follow_up in enumerate((FOLLOW_UP, "Merci.")):
        reply = ask(transcript)
        transcript[1] = instruction(format, ENVIRONMENT, blocks=False)  # a string on the later turns
        transcript.append({"role": "assistant", "content": reply})
        if n == 0:
            transcript.append(instruction(format, LATER, blocks=True))
        transcript.append({"role": "user", "content": follow_up})
    ask(transcript)


@pytest.mark.parametrize("format", ["chat", "responses", "messages"])
def test_the_clients_instructions_in_every_position_reach_the_upstream(
    proxy: ProxyServer, upstream: FakeUpstream, format: Format
) -> None:
    def session(target: str) -> None:
        if target == "direct":
            base_url = upstream.anthropic.base_url if format == "messages" else upstream.base_url
        else:
            base_url = proxy.url if format == "messages" else proxy.base_url
        instructions_session(format, base_url)

    def script() -> list[Reply]:
        return [Reply.text("12 passed."), Reply.text("Nothing else."), Reply.text("De rien.")]

    sent = assert_transparent(upstream, format, session, script)["proxied"]
    roles = [m.get("role") for m in sent[-1][TRANSCRIPT_KEY[format]]]
    instruction_role = "developer" if format == "responses" else "system"
    expected = ["user", instruction_role, "assistant", instruction_role, "user", "assistant", "user"]
    assert roles == (["system", *expected] if format == "chat" else expected)


@pytest.mark.parametrize("format", ["chat", "responses", "messages"])
def test_when_the_window_cuts_the_clients_instructions_still_reach_the_upstream(
    make_proxy: MakeProxy, upstream: FakeUpstream, format: Format
) -> None:
    """Not transparency (the window is a documented stage), its limit: whatever the window leaves
    out of a history over its limit, the task and every instruction of the client's still go."""
    proxy = make_proxy(upstream={"anthropic_base_url": upstream.anthropic.base_url}, context={"history_token_limit": 300})
    long = "The tests ran one by one and each of them passed without a warning. " * 40
    upstream.enqueue(Reply.text(long), Reply.text(long), Reply.text("De rien."))
    instructions_session(format, proxy.url if format == "messages" else proxy.base_url)
    last = requests_of(upstream, format)[0][-1]
    meant = meaning(format, last)["transcript"]
    texts = [text for message in meant for _, text, *_ in message["parts"]]
    assert TASK in texts and ENVIRONMENT in texts and LATER in texts and "Merci." in texts
    assert long not in texts  # the history was cut


# -- Codex CLI: the shell tool, then `exec resume` --------------------------------------------


# What Codex writes into a command's output that differs from run to run.
CODEX_RUN_VALUES = (("chunk", re.compile(r"(?<=Chunk ID: )[0-9a-f]+")),
                    ("wall_time", re.compile(r"(?<=Wall time: )[0-9.]+(?= seconds)")))


def test_codex_cli(proxy: ProxyServer, upstream: FakeUpstream, tmp_path: Path) -> None:
    from tests.support.agents import codex_session

    def script() -> list[Reply]:
        return [
            Reply.tool_calls([("exec_command", json.dumps({"cmd": "echo hello"}))], reasoning="Run the command."),
            Reply.text("It printed hello.", reasoning="The command succeeded."),
            Reply.text("Still here."),
        ]

    def session(target: str) -> None:
        base_url = upstream.base_url if target == "direct" else proxy.base_url
        with codex_session(base_url, ALICE, tmp_path / target) as codex:
            first = codex.exec("Run `echo hello` in the shell, then say what it printed.")
            assert first.completed and first.messages == ["It printed hello."], first.stderr[-3000:]
            resumed = codex.resume("Are you still there?")
            assert resumed.completed and resumed.messages == ["Still here."], resumed.stderr[-3000:]
            assert codex.guard.attempts == []

    sent = assert_transparent(upstream, "responses", session, script, lambda target: {str(tmp_path / target): "run"},
                              CODEX_RUN_VALUES)["proxied"]
    assert len(sent) == 3


# -- Claude Code: a Bash tool loop, then `--resume` -------------------------------------------


# The device id Claude Code makes up in each HOME (in metadata.user_id).
CLAUDE_RUN_VALUES = (("device", re.compile(r'(?<="device_id":")[0-9a-f]+')),)


def test_claude_code(proxy: ProxyServer, upstream: FakeUpstream, tmp_path: Path) -> None:
    """Claude Code's ~9k tokens of system prompt and tools leave the default 10,000-token window
    little room: every message it sends must still reach the upstream (the '# Environment' system
    message after the task included, a string on later turns, blocks on the first)."""
    from tests.support.claude_agent import ClaudeAgent

    def script() -> list[Reply]:
        bash = json.dumps({"command": "echo hello", "description": "Print hello"})
        return [Reply.tool_calls([("Bash", bash)], reasoning="The user wants me to run echo hello."),
                Reply.text("It printed hello.", reasoning="The command printed hello."),
                Reply.text("Goodbye!")]

    def session(target: str) -> None:
        with ClaudeAgent(upstream.anthropic.base_url if target == "direct" else proxy.url, tmp_path / target) as agent:
            first = agent.run("Run `echo hello` with Bash and tell me what it printed.")
            assert (first["is_error"], first["result"]) == (False, "It printed hello."), first
            resumed = agent.run("Thanks. Now say goodbye.", resume=first["session_id"])
            assert (resumed["is_error"], resumed["result"]) == (False, "Goodbye!"), resumed

    def folders(target: str) -> dict[str, str]:  # the run's folder, and its work folder as Claude Code names its project
        work = str(tmp_path / target / "work")
        return {str(tmp_path / target): "run", re.sub(r"[^A-Za-z0-9]", "-", work): "project"}

    sent = assert_transparent(upstream, "messages", session, script, folders, CLAUDE_RUN_VALUES)["proxied"]
    assert [m["role"] for m in sent[-1]["messages"]] == ["user", "system", "assistant", "user", "assistant", "user"]
