"""History search: once a message has left the prompt, the upstream gets `search_history`, the proxy
answers it from the stored transcript in a read round the client never sees (chat, Responses,
Messages), the recall tools stay offered with the same bytes, and people search through the admin
API."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.conftest import ALICE, BOB, MakeProxy, admin_get, openai_client
from tests.fakes.fake_upstream import FakeUpstream, Reply, default_responder, last_user_text
from tests.support.messages_helpers import MODEL, claude_client, messages_proxy
from tests.ui.test_ui import browser  # noqa: F401  (a fixture)

QUESTION = "What was the ledger drift the log warned about?"
LOG = "\n".join(f"2024-05-01T10:{i % 60:02d}:00Z INFO order {10000 + i} processed in {i % 90} ms" for i in range(120))
WARNED = LOG.replace("order 10060 processed", "WARN ledger drift of 4711 cents in services/ledger/drift.py; order 10060 processed")
TOOLS = [{"type": "function", "function": {"name": "tail_log", "parameters": {"type": "object", "properties": {}}}}]
LIMIT = {"context": {"history_token_limit": 1500}}


def searching_model(body: dict[str, Any]) -> Reply:
    """Searches its history when asked the question, then answers from what the search showed."""
    text = json.dumps(body)
    if "4711 cents" in text and "search_history: " in text:
        return Reply.text("The log warned of a drift of 4711 cents.")
    if last_user_text(body) == QUESTION:
        return Reply.tool_calls([("search_history", json.dumps({"query": "ledger drift warned"}))])
    return default_responder(body)


def chat_turns(client, history: list[dict], texts: list[str]) -> None:
    for text in texts:
        history.append({"role": "user", "content": text})
        reply = client.chat.completions.create(model="m", messages=history, tools=TOOLS).choices[0].message
        history.append({"role": "assistant", "content": reply.content})


def chat_start() -> list[dict]:
    return [
        {"role": "system", "content": "You keep the ledger right."},
        {"role": "user", "content": "Check the ledger service."},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_log", "type": "function", "function": {"name": "tail_log", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_log", "content": WARNED},
        {"role": "assistant", "content": "The log is long; moving on."},
    ]


FILLER = [f"Next step {i}: " + "look at the invoices again and tell me what you see. " * 12 for i in range(8)]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_search_finds_what_left_the_prompt_out_of_the_clients_sight(make_proxy: MakeProxy, upstream: FakeUpstream, stream):
    proxy = make_proxy(**LIMIT)
    upstream.responder = searching_model
    client = openai_client(proxy, headers={"X-Conversation-ID": f"recall-{stream}"})
    history = chat_start()
    chat_turns(client, history, FILLER)
    assert "4711" not in json.dumps(upstream.chat_requests()[-1]["messages"])  # the log has left the prompt
    history.append({"role": "user", "content": QUESTION})
    upstream.reset()
    upstream.responder = searching_model
    if stream:
        chunks = list(client.chat.completions.create(model="m", messages=history, tools=TOOLS, stream=True))
        answer = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)
    else:
        message = client.chat.completions.create(model="m", messages=history, tools=TOOLS).choices[0].message
        answer, calls = message.content, message.tool_calls
        assert calls is None
    assert answer == "The log warned of a drift of 4711 cents."
    first, round_ = upstream.chat_requests()
    assert [t["function"]["name"] for t in first["tools"]] == ["tail_log", "read_tool_output", "search_history"]
    found = round_["messages"][-1]
    assert found["role"] == "tool" and "WARN ledger drift of 4711 cents in services/ledger/drift.py" in found["content"]
    assert "message seq 4, tool output" in found["content"] and 'read_tool_output(ref="out_4_' in found["content"]
    assert len(found["content"]) < 2000  # a passage with a little context, not the whole log


def test_the_recall_tools_stay_offered_with_the_same_bytes_once_offered(make_proxy: MakeProxy, upstream: FakeUpstream):
    proxy = make_proxy(truncation={"max_tool_response_length": 1000, "preview_length": 500})
    client = openai_client(proxy, headers={"X-Conversation-ID": "stay"})
    history = chat_start()  # the log is shortened: the recall tools join
    chat_turns(client, history, ["first"])
    offered = upstream.chat_requests()[-1]["tools"]
    assert [t["function"]["name"] for t in offered] == ["tail_log", "read_tool_output", "search_history"]
    # The client starts over from its task (a branch with nothing shortened, nothing left out):
    # what was offered stays, byte for byte, in the same place.
    branch = [history[0], history[1], {"role": "assistant", "content": "Nothing to read yet."}]
    chat_turns(client, branch, ["second", "third"])
    for request in upstream.chat_requests()[-2:]:
        assert json.dumps(request["tools"]) == json.dumps(offered)
        assert "4711" not in json.dumps(request["messages"])


def test_nothing_left_the_prompt_no_recall_tools(proxy, upstream: FakeUpstream):
    client = openai_client(proxy, headers={"X-Conversation-ID": "whole"})
    chat_turns(client, chat_start(), ["first", "second"])
    assert [t["function"]["name"] for t in upstream.chat_requests()[-1]["tools"]] == ["tail_log"]


def test_responses_search_is_answered_and_hidden(make_proxy: MakeProxy, upstream: FakeUpstream):
    proxy = make_proxy(**LIMIT)
    upstream.responder = searching_model
    client = openai_client(proxy, headers={"X-Conversation-ID": "recall-responses"})
    tools = [{"type": "function", "name": "tail_log", "parameters": {"type": "object", "properties": {}}}]
    items: list[dict] = [
        {"role": "user", "content": "Check the ledger service."},
        {"type": "function_call", "call_id": "call_log", "name": "tail_log", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_log", "output": WARNED},
    ]
    for text in [*FILLER, QUESTION]:
        items.append({"role": "user", "content": text})
        response = client.responses.create(model="gpt-4o-mini", input=items, tools=tools)
        items += [{"role": "assistant", "content": response.output_text}]
    assert response.output_text == "The log warned of a drift of 4711 cents."
    assert [o.type for o in response.output] == ["message"]
    answer = upstream.responses_requests()[-1]["input"][-1]
    assert answer["type"] == "function_call_output" and "WARN ledger drift of 4711 cents" in answer["output"]
    assert 'read_tool_output(ref="out_3_' in answer["output"]


def test_messages_search_is_answered_and_hidden(make_proxy: MakeProxy, upstream: FakeUpstream):
    proxy = messages_proxy(make_proxy, upstream, **LIMIT)
    upstream.responder = searching_model
    client = claude_client(proxy, headers={"X-Conversation-ID": "recall-messages"})
    tools = [{"name": "tail_log", "input_schema": {"type": "object", "properties": {}}}]
    messages: list[dict] = [{"role": "user", "content": "Check the ledger service."},
                            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_log", "name": "tail_log", "input": {}}]},
                            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_log", "content": WARNED}]},
                            {"role": "assistant", "content": "The log is long; moving on."}]
    for text in [*FILLER, QUESTION]:
        messages.append({"role": "user", "content": text})
        reply = client.messages.create(model=MODEL, max_tokens=1024, tools=tools, messages=messages)
        messages.append({"role": "assistant", "content": reply.content[0].text})
    assert [b.type for b in reply.content] == ["text"] and reply.content[0].text == "The log warned of a drift of 4711 cents."
    answer = upstream.messages_requests()[-1]["messages"][-1]["content"][0]
    assert answer["type"] == "tool_result" and "WARN ledger drift of 4711 cents" in json.dumps(answer["content"])


# -- for people: the admin API -----------------------------------------------------------------


def test_people_search_a_conversation_through_the_admin_api(proxy, upstream: FakeUpstream, http: httpx.Client):
    client = openai_client(proxy, headers={"X-Conversation-ID": "people"})
    chat_turns(client, chat_start(), ["first"])
    response = admin_get(http, "/people/search", q="ledger drift", limit="3")
    assert response.status_code == 200, response.text
    page = response.json()
    assert page["object"] == "list" and 1 <= len(page["data"]) <= 3
    hit = page["data"][0]
    assert set(hit) == {"seq", "role", "created_at", "text", "ref"}
    assert hit["seq"] == 4 and hit["role"] == "tool" and "WARN ledger drift of 4711 cents" in hit["text"]
    assert hit["ref"].startswith("out_4_")
    whole = admin_get(http, f"/people/tool_outputs/{hit['ref']}").json()["content"]
    assert whole == WARNED
    # A client key sees its own conversations only; bad input is a clear 400.
    assert admin_get(http, "/people/search", api_key=ALICE, q="ledger").status_code == 200
    assert admin_get(http, "/people/search", api_key=BOB, q="ledger").status_code == 404
    assert admin_get(http, "/people/search", q="").status_code == 400
    assert admin_get(http, "/people/search", q="ledger", limit="0").status_code == 400
    assert admin_get(http, "/people/search", q="x" * 600).status_code == 400


def test_the_ui_searches_a_conversations_messages(proxy, upstream: FakeUpstream, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC

    from tests.ui.test_ui import XSS, open_ui, text, wait

    client = openai_client(proxy, headers={"X-Conversation-ID": "searched"})
    start = chat_start()
    start[3] = {**start[3], "content": WARNED + "\n" + XSS}
    chat_turns(client, start, ["first"])
    open_ui(browser, proxy, "#/c/searched")
    box = wait(browser).until(EC.visibility_of_element_located((By.ID, "history-search")))
    box.send_keys("ledger drift")
    browser.find_element(By.ID, "history-search-go").click()
    hit = wait(browser).until(EC.presence_of_element_located((By.CSS_SELECTOR, ".history-hit")))
    assert "WARN ledger drift of 4711 cents" in text(hit) and "#4 · tool" in text(hit)
    box.clear()
    box.send_keys("onerror xss")  # the planted markup is shown as text, never run
    browser.find_element(By.ID, "history-search-go").click()
    wait(browser).until(lambda b: "<img src=x" in text(b.find_element(By.ID, "history-hits")))
    assert browser.execute_script("return window.__xss") is None


def test_a_bad_search_call_gets_a_clear_answer_and_the_model_goes_on(make_proxy: MakeProxy, upstream: FakeUpstream):
    proxy = make_proxy(**LIMIT)
    client = openai_client(proxy, headers={"X-Conversation-ID": "bad-search"})
    history = chat_start()
    chat_turns(client, history, FILLER)
    upstream.reset()

    def model(body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]
        if last["role"] == "tool" and "search_history" in last["content"]:
            return Reply.text("answered: " + last["content"])
        return Reply.tool_calls([("search_history", json.dumps({"limit": "many"}))])

    upstream.responder = model
    history.append({"role": "user", "content": QUESTION})
    answer = client.chat.completions.create(model="m", messages=history, tools=TOOLS).choices[0].message.content
    assert answer == 'answered: Error: search_history needs JSON arguments {"query": str, "limit": int}.'
