"""The /ui replay shows what a conversation's requests sent besides the transcript, in a real
headless browser: the current system prompt and tools collapsed, earlier versions with their turns,
and all of it as text (a system prompt that looks like markup stays text)."""

from __future__ import annotations

from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC

from tests.support.messages_helpers import BUILD, MODEL, WEATHER, as_params, claude_client, messages_proxy
from tests.ui.test_ui import XSS, browser, open_ui, screenshot, text, wait  # noqa: F401  # `browser` is a fixture


def test_the_replay_shows_the_system_prompt_and_tools_collapsed_with_earlier_versions(make_proxy, upstream, browser) -> None:  # noqa: F811
    proxy = messages_proxy(make_proxy, upstream)
    client = claude_client(proxy, headers={"X-Conversation-ID": "parts-ui"})
    messages = [{"role": "user", "content": "What is the weather?"}]
    first = client.messages.create(model=MODEL, max_tokens=256, system="You are terse.", tools=[WEATHER], messages=messages)
    messages += [as_params(first), {"role": "user", "content": "Build it."}]
    system = [{"type": "text", "text": "You build things. " + XSS}]
    client.messages.create(model=MODEL, max_tokens=256, system=system, tools=[WEATHER, BUILD], messages=messages)

    open_ui(browser, proxy, "#/c/parts-ui")
    wait(browser).until(EC.presence_of_element_located((By.CSS_SELECTOR, "#timeline[data-complete]")))
    card = browser.find_element(By.ID, "request-parts")
    current = card.find_element(By.ID, "request-system")
    assert current.get_attribute("open") is None  # collapsed
    assert "turns 2" in text(current) and text(current.find_element(By.CSS_SELECTOR, "pre")) == system[0]["text"]
    tools = card.find_element(By.ID, "request-tools")
    assert "Tools · 2: get_weather, run_build" in text(tools) and tools.get_attribute("open") is None
    earlier = card.find_element(By.ID, "request-system-versions")
    assert "1 earlier system prompt" in text(earlier) and "You are terse." in text(earlier) and "turns 1" in text(earlier)
    assert "get_weather" in text(card.find_element(By.ID, "request-tools-versions"))
    assert browser.execute_script("return window.__xss") is None  # the markup stayed text
    current.find_element(By.CSS_SELECTOR, "summary").click()
    assert current.get_attribute("open") is not None
    screenshot(browser, "ui-request-parts.png")
