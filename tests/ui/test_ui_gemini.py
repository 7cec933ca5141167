"""The /ui replay of a Gemini conversation, in a real headless browser: its thought, functionCall,
functionResponse (a long one expandable from its ref) and text parts shown readably."""

from __future__ import annotations

import json

from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC

from tests.dialects.test_gemini_pipeline import gemini_proxy, responses, turn, user
from tests.fakes.fake_upstream import Reply
from tests.ui.test_ui import browser, open_ui, screenshot, text, wait  # noqa: F401  # `browser` is a fixture

LOG = "".join(f"step {i:05d}: linking module_{i % 31}.o ok\n" for i in range(700)) + "LINK FAILED: undefined symbol foo"


def test_a_gemini_conversation_replays_with_its_parts(make_proxy, upstream, browser) -> None:  # noqa: F811
    proxy = gemini_proxy(make_proxy, upstream)
    upstream.enqueue(
        Reply.tool_calls([("run_build", json.dumps({"target": "all"}))], reasoning="I should build it first."),
        Reply.text("The link step fails: undefined symbol foo."),
    )
    contents = [user("Why does the build fail?")]
    first = turn(proxy, contents, "gemini-ui", thoughts=True)
    contents += [first, responses(first, LOG)]
    turn(proxy, contents, "gemini-ui")

    open_ui(browser, proxy, "#/c/gemini-ui")
    timeline = wait(browser).until(EC.presence_of_element_located((By.CSS_SELECTOR, "#timeline[data-complete]")))
    (thinking,) = timeline.find_elements(By.CSS_SELECTOR, "details.thinking")
    assert "I should build it first." in text(thinking)
    (call,) = timeline.find_elements(By.CSS_SELECTOR, ".tool-call")
    assert "run_build" in text(call) and '"target": "all"' in text(call)
    (result,) = timeline.find_elements(By.CSS_SELECTOR, ".message.role-tool")
    assert "result of run_build" in text(result)
    box = result.find_element(By.CSS_SELECTOR, ".tool-output.long .text")
    assert LOG.startswith(text(box)) and "LINK FAILED" not in text(box)  # a preview, the rest on demand
    answer = timeline.find_elements(By.CSS_SELECTOR, ".message")[-1]
    assert "undefined symbol foo" in text(answer)
    screenshot(browser, "ui-gemini-replay.png")
    button = result.find_element(By.CSS_SELECTOR, "button.expand")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", button)
    button.click()  # fetches tool_outputs/{ref}
    wait(browser).until(lambda _: text(box) == LOG)
