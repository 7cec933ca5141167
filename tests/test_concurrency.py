"""Many agents at once: the stored logs equal the transcripts exactly."""

from __future__ import annotations

import asyncio
import json

import httpx

from tests.conftest import ALICE, async_openai_client
from tests.fakes.fake_upstream import Reply, default_responder

CONVERSATIONS = 50
# Two tool loops an agent (turns 3 and 8), every agent in flight at once. Most of the test's time is
# the openai client's own Python (its params transform grows with the transcript): more turns cost
# seconds of CI and test nothing more.
TURNS = 10
TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": {}}}}
    for n in ("read_file", "run_tests")
]


def responder(body: dict) -> Reply:
    last = body["messages"][-1]
    if last["role"] == "user" and last["content"].startswith("use tools"):
        return Reply.tool_calls([("read_file", json.dumps({"path": last["content"]})), ("run_tests", "{}")])
    return default_responder(body)


async def agent(proxy, index: int) -> list[dict]:
    """One agent run: TURNS user turns, some with a parallel tool loop, streaming every other turn."""
    client = async_openai_client(proxy, ALICE, headers={"X-Conversation-ID": f"agent-{index}"})
    transcript: list[dict] = [{"role": "system", "content": f"agent {index}"}]
    for turn in range(TURNS):
        text = f"use tools {index}/{turn}" if turn % 5 == 3 else f"turn {index}/{turn}"
        transcript.append({"role": "user", "content": text})
        while True:
            stream = (turn + index) % 2 == 0
            message = await complete(client, transcript, stream)
            transcript.append(message)
            if "tool_calls" not in message:
                break
            for call in message["tool_calls"]:
                transcript.append({"role": "tool", "tool_call_id": call["id"], "content": f"out of {call['id']}"})
    return transcript


async def complete(client, transcript: list[dict], stream: bool) -> dict:
    if not stream:
        reply = await client.chat.completions.create(model="m", messages=transcript, tools=TOOLS)
        return reply.choices[0].message.model_dump(exclude_none=True, include={"role", "content", "tool_calls"})
    content, calls = "", {}
    async for chunk in await client.chat.completions.create(model="m", messages=transcript, tools=TOOLS, stream=True):
        delta = chunk.choices[0].delta if chunk.choices else None
        if delta is None:
            continue
        content += delta.content or ""
        for d in delta.tool_calls or []:
            slot = calls.setdefault(d.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
            slot["id"] += d.id or ""
            slot["function"]["name"] += d.function.name or ""
            slot["function"]["arguments"] += d.function.arguments or ""
    message: dict = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def normalise(message: dict) -> dict:
    """The stored form of a message: tool_calls entries as the wire shape, no null content key drift."""
    out = {k: v for k, v in message.items() if k not in ("seq", "created_at", "status")}
    if out.get("tool_calls"):
        out["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}}
            for c in out["tool_calls"]
        ]
    if out.get("content") is None:
        out["content"] = None
    return out


async def test_fifty_concurrent_agents_lose_and_duplicate_nothing(proxy, upstream):
    upstream.responder = responder
    transcripts = await asyncio.gather(*(agent(proxy, i) for i in range(CONVERSATIONS)))
    async with httpx.AsyncClient(base_url=proxy.url, headers={"Authorization": f"Bearer {ALICE}"}) as http:
        for index, transcript in enumerate(transcripts):
            live = (await http.get(f"/v1/conversations/agent-{index}/messages", params={"limit": 1000})).json()
            everything = (await http.get(f"/v1/conversations/agent-{index}/trajectory", params={"limit": 1000})).json()
            assert [normalise(m) for m in live["data"]] == [normalise(m) for m in transcript]
            assert len(everything["data"]) == len(transcript)  # nothing written twice, nothing failed
            assert [m["seq"] for m in live["data"]] == list(range(1, len(transcript) + 1))
    tool_turns = sum(1 for t in transcripts for m in t if m["role"] == "tool")
    assert tool_turns == CONVERSATIONS * (TURNS // 5) * 2
