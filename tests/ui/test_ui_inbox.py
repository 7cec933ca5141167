"""The /ui page's inbox and knowledge views, in the real headless browser of tests/ui/test_ui.py: a
person sends the running agent a message from the conversation page and sees where it was
delivered; the knowledge page shows the document, saves an edit as a new version and diffs two."""

from __future__ import annotations

import json

import httpx
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC

from tests.conftest import ALICE, openai_client
from tests.fakes.fake_upstream import Reply
from tests.ui.test_ui import XSS, browser, open_ui, screenshot, text, wait  # noqa: F401  (browser: a fixture)

AUTH = {"Authorization": f"Bearer {ALICE}"}
SYSTEM = {"role": "system", "content": "You are a coding agent."}
TOOLS = [{"type": "function", "function": {"name": "run_build", "parameters": {"type": "object", "properties": {}}}}]


def test_the_conversation_page_sends_an_inbox_message_and_shows_where_it_went(proxy, upstream, browser):
    client = openai_client(proxy, headers={"X-Conversation-ID": "steered"})
    messages = [SYSTEM, {"role": "user", "content": "build it"}]
    upstream.enqueue(Reply.tool_calls([("run_build", "{}")]))
    call = client.chat.completions.create(model="m", messages=messages, tools=TOOLS).choices[0].message
    messages.append(call.model_dump(exclude_none=True))

    open_ui(browser, proxy, "#/c/steered")
    box = wait(browser).until(EC.visibility_of_element_located((By.ID, "inbox-input")))
    assert "No messages yet" in text(browser.find_element(By.ID, "inbox-empty"))
    box.send_keys("Use the release profile. " + XSS)
    browser.find_element(By.ID, "inbox-send").click()
    pending = wait(browser).until(EC.presence_of_element_located((By.CSS_SELECTOR, ".inbox-message[data-status='pending']")))
    assert "Use the release profile." in text(pending) and browser.execute_script("return window.__xss") is None

    messages.append({"role": "tool", "tool_call_id": call.tool_calls[0].id, "content": "build ok"})
    client.chat.completions.create(model="m", messages=messages, tools=TOOLS)  # the agent's next step
    assert "Use the release profile." in upstream.chat_requests()[-1]["messages"][-1]["content"]

    open_ui(browser, proxy, "#/c/steered")
    wait(browser).until(EC.presence_of_element_located((By.CSS_SELECTOR, "#timeline[data-complete]")))
    delivered = wait(browser).until(EC.presence_of_element_located((By.CSS_SELECTOR, ".inbox-message[data-status='delivered']")))
    assert "turn 2" in text(delivered) and "appended to the tool result" in text(delivered)
    marker = wait(browser).until(EC.presence_of_element_located((By.CSS_SELECTOR, ".message.role-tool .inbox-delivered")))
    assert "Use the release profile." in text(marker)
    assert browser.execute_script("return window.__xss") is None
    screenshot(browser, "ui-inbox.png")


def test_the_knowledge_page_shows_edits_and_diffs_the_document(make_proxy, upstream, browser):
    proxy = make_proxy(knowledge={"enabled": True, "editable": True})
    edit = json.dumps({"heading": "Build notes", "content": "The build needs make 4.3."})
    upstream.enqueue(Reply.tool_calls([("knowledge_append_section", edit)]), Reply.text("noted"))
    openai_client(proxy, headers={"X-Conversation-ID": "kn-ui"}).chat.completions.create(
        model="m", messages=[SYSTEM, {"role": "user", "content": "learn"}]
    )

    open_ui(browser, proxy, "#/c/kn-ui")
    link = wait(browser).until(EC.visibility_of_element_located((By.CSS_SELECTOR, "#knowledge-used a")))
    assert "version 1" in text(browser.find_element(By.ID, "knowledge-used"))  # what the prompt carried
    link.click()  # the admin (the URL's token) opens the conversation's tenant's document
    editor = wait(browser).until(EC.visibility_of_element_located((By.ID, "knowledge-text")))
    assert "The build needs make 4.3." in editor.get_property("value")
    versions = browser.find_elements(By.CSS_SELECTOR, "#knowledge-versions tbody tr")
    assert [v.get_attribute("data-version") for v in versions] == ["2", "1"]
    # Issue 32: every edit by the agent says which conversation and turn made it, and links there.
    by = versions[0].find_element(By.CSS_SELECTOR, "td.source")
    assert text(by) == "the agent of kn-ui, turn 1"
    assert by.find_element(By.TAG_NAME, "a").get_attribute("href").split("#", 1)[1].startswith("/c/kn-ui?tenant=")

    editor.send_keys("\n## Owners\n\nThe platform team.\n" + XSS)
    browser.find_element(By.ID, "knowledge-save").click()
    wait(browser).until(EC.presence_of_element_located((By.CSS_SELECTOR, ".knowledge-view[data-version='3']")))
    document = httpx.get(f"{proxy.url}/v1/knowledge", headers=AUTH).json()
    assert document["version"] == 3 and document["source"] == "admin" and "The platform team." in document["text"]

    browser.find_element(By.ID, "diff-show").click()  # from the version before to the newest
    diff = wait(browser).until(EC.visibility_of_element_located((By.ID, "knowledge-diff")))
    added = [text(line) for line in diff.find_elements(By.CSS_SELECTOR, ".add")]
    assert "+The platform team.\n" in added and browser.execute_script("return window.__xss") is None
    screenshot(browser, "ui-knowledge.png")
