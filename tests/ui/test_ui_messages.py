"""The /ui replay of an Anthropic Messages conversation, in a real headless browser: thinking,
tool_use, tool_result (a long one expandable from its ref) and text blocks shown readably."""

from __future__ import annotations

import json

from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC

from tests.fakes.fake_upstream import Reply
from tests.support.messages_helpers import BUILD, MODEL, THINKING, as_params, claude_client, messages_proxy, results
from tests.ui.test_ui import browser, open_ui, screenshot, text, wait  # noqa: F401  # `browser` is a fixture

LOG = "".join(f"step {i:05d}: linking module_{i % 31}.o ok\n" for i in range(700)) + "LINK FAILED: undefined symbol foo"


def test_a_messages_conversation_replays_with_its_blocks(make_proxy, upstream, browser) -> None:  # noqa: F811
    proxy = messages_proxy(make_proxy, upstream)
    client = claude_client(proxy, headers={"X-Conversation-ID": "claude-ui"})
    upstream.enqueue(
        Reply.tool_calls([("run_build", json.dumps({"target": "all"}))], reasoning="I should build it first."),
        Reply.text("The link step fails: undefined symbol foo.", reasoning="The log ends in a link error."),
    )
    messages = [{"role": "user", "content": "Why does the build fail?"}]
    first = client.messages.create(model=MODEL, max_tokens=4096, tools=[BUILD], thinking=THINKING, messages=messages)
    messages += [as_params(first), results(first, LOG, {"type": "text", "text": "<system-reminder>be brief</system-reminder>"})]
    client.messages.create(model=MODEL, max_tokens=4096, tools=[BUILD], thinking=THINKING, messages=messages)

    open_ui(browser, proxy, "#/c/claude-ui")
    timeline = wait(browser).until(EC.presence_of_element_located((By.CSS_SELECTOR, "#timeline[data-complete]")))
    thinking = timeline.find_elements(By.CSS_SELECTOR, "details.thinking")
    assert [t.get_attribute("data-block") for t in thinking] == ["thinking", "thinking"]
    assert "I should build it first." in text(thinking[0])
    (call,) = timeline.find_elements(By.CSS_SELECTOR, ".tool-call")
    assert "run_build" in text(call) and '"target": "all"' in text(call)
    (result,) = timeline.find_elements(By.CSS_SELECTOR, ".message.role-tool")
    assert "result of run_build" in text(result) and first.content[1].id in text(result)
    box = result.find_element(By.CSS_SELECTOR, ".tool-output.long .text")
    assert LOG.startswith(text(box)) and "LINK FAILED" not in text(box)  # a preview, the rest on demand
    reminder, answer = timeline.find_elements(By.CSS_SELECTOR, ".message")[-2:]
    assert "be brief" in text(reminder) and "[tool_result]" not in text(reminder)
    assert "undefined symbol foo" in text(answer)
    screenshot(browser, "ui-messages-replay.png")
    button = result.find_element(By.CSS_SELECTOR, "button.expand")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", button)
    button.click()  # fetches tool_outputs/{ref}
    wait(browser).until(lambda _: text(box) == LOG)
