"""/ui replays a Responses conversation (what Codex sends) item by item, in a real headless browser
as tests/ui/test_ui.py does: messages with their text parts, reasoning summaries, function calls with
their arguments, the long function_call_output expandable from tool_outputs/{ref}, the compaction
summary, and an item type the page does not know shown as its JSON."""

from __future__ import annotations

from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC

from tests.conftest import openai_client
from tests.dialects.test_responses import TOOLS, user
from tests.dialects.test_responses_trajectory import BUILD_LOG, DEVELOPER, SUMMARY, TASK, codex_run, responder
from tests.ui.test_ui import ARTIFACTS, browser, open_ui, screenshot, text, wait

__all__ = ["browser"]  # the module's fixture, shared with test_ui.py

UNKNOWN = {
    "type": "local_shell_call",
    "id": "lsh_1",
    "call_id": "call_shell",
    "status": "completed",
    "action": {"type": "exec", "command": ["ls", "-la"], "env": {}},
}


def test_a_codex_conversation_replays_with_its_items(make_proxy, upstream, browser):
    upstream.responder = responder
    proxy = make_proxy(compaction={"strategy": "turns", "every_n_user_messages": 2, "background": False})
    run = codex_run(proxy, upstream, "codex-ui")
    # An item type the proxy keeps whole without knowing it (the fake has no such tool): stored as sent.
    openai_client(proxy, headers={"session-id": "codex-ui"}).responses.create(
        model="gpt-4o-mini",
        input=run.history + [UNKNOWN, user("what did ls say?")],
        tools=TOOLS,
        store=False,
        include=["reasoning.encrypted_content"],
    )

    open_ui(browser, proxy, "/#/c/codex-ui")
    timeline = wait(browser).until(EC.presence_of_element_located((By.CSS_SELECTOR, "#timeline[data-complete]")))
    items = timeline.find_elements(By.CSS_SELECTOR, "li.message")
    kinds = [(i.get_attribute("data-type"), i.get_attribute("data-role")) for i in items]
    assert kinds[:6] == [
        ("message", "developer"),
        ("message", "user"),
        ("reasoning", "reasoning"),
        ("function_call", "assistant"),
        ("function_call_output", "tool"),
        ("reasoning", "reasoning"),
    ]
    assert ("local_shell_call", "assistant") in kinds
    assert text(items[0].find_element(By.CSS_SELECTOR, ".text")) == DEVELOPER["content"][0]["text"]  # parts as text
    assert text(items[1].find_element(By.CSS_SELECTOR, ".text")) == TASK
    reasoning = items[2]
    assert text(reasoning.find_element(By.CSS_SELECTOR, ".reasoning-text")) == "Run the build first."
    assert "encrypted reasoning" in text(reasoning)
    call = items[3].find_element(By.CSS_SELECTOR, ".tool-call")
    assert "exec_command" in text(call) and '"cmd": "make -j4"' in text(call) and run.call_id in text(call)
    output = items[4]
    assert "result of exec_command" in text(output) and f"{len(BUILD_LOG):,} chars" in text(output)
    answer = timeline.find_element(By.CSS_SELECTOR, "li.message[data-type='message'][data-role='assistant'] .text")
    assert text(answer) == "The build passes, with 3 warnings."
    [unknown] = [i for i in items if i.get_attribute("data-type") == "local_shell_call"]
    assert '"command": [' in text(unknown) and '"seq"' not in text(unknown)  # its JSON, not our bookkeeping
    summaries = timeline.find_elements(By.CSS_SELECTOR, "li.summary")
    assert summaries and SUMMARY in text(summaries[-1])
    assert timeline.find_elements(By.CSS_SELECTOR, ".message.item-reasoning.status-compacted")
    assert not browser.execute_script("return document.querySelector('#timeline img, #timeline script')")

    box = output.find_element(By.CSS_SELECTOR, ".tool-output.long .text")
    assert BUILD_LOG.startswith(text(box)) and "END OF BUILD LOG" not in text(box)  # a preview
    screenshot(browser, "ui-responses.png")
    button = output.find_element(By.CSS_SELECTOR, "button.expand")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", button)
    button.click()  # fetches tool_outputs/{ref}: the function_call_output's text
    wait(browser).until(lambda _: text(box) == BUILD_LOG)
    browser.execute_script("arguments[0].scrollIntoView({block: 'start'})", output)
    browser.save_screenshot(str(ARTIFACTS / "ui-responses-expanded.png"))
