"""The /ui page, driven in a real headless browser: Debian's chromium and chromedriver (installed by
scripts/ensure-chromium.sh) through Selenium. Conversations are made by real requests through the
proxy to the strict fake upstream; the page reads them from the admin API like a person's browser.
Screenshots of each view land in test-artifacts/."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from selenium import webdriver
from selenium.common.exceptions import WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from tests.conftest import BOB, leave_mid_stream, openai_client
from tests.fakes.fake_upstream import Reply, default_responder
from tests.support.harness import ROOT, wait_until

ARTIFACTS = ROOT / "test-artifacts"
INSTALL_HINT = "chromium and chromedriver are needed for tests/ui/test_ui.py: run scripts/ensure-chromium.sh (as root)"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--force-device-scale-factor=1",
    "--window-size=1280,900",
)
SUMMARIZER_MARK = "You maintain the working memory of an AI agent"
BUILD_LOG = "".join(f"line {i:05d}: compiling module_{i % 97}.c ... ok\n" for i in range(400)) + "END OF BUILD LOG: 3 warnings"
TOOLS = [{"type": "function", "function": {"name": "run_build", "parameters": {"type": "object", "properties": {}}}}]
ADMIN_TOKEN = "ui-admin-token-0123456789"
XSS = '<img src=x onerror="window.__xss=1"><script>window.__xss=2</script>'


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebDriver]:
    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver_path:
        pytest.fail(INSTALL_HINT, pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    # An explicit driver path: Selenium Manager (which would download one) is never consulted.
    driver = webdriver.Chrome(options=options, service=Service(executable_path=driver_path))
    try:
        yield driver
    finally:
        driver.quit()


def wait(driver: WebDriver, timeout: float = 15) -> WebDriverWait:
    return WebDriverWait(driver, timeout, ignored_exceptions=(WebDriverException,))


def open_ui(driver: WebDriver, proxy, fragment: str = "", token: str | None = "admin") -> None:
    """The page as the URL printed at start-up opens it: signed in with the admin token (or
    `token`; None: no token in the URL)."""
    driver.get("about:blank")  # a fresh page: nothing left over from the previous test
    path, fragment = ("/ui/", fragment[1:]) if fragment.startswith("/") else ("/ui", fragment)
    query = "" if token is None else f"?token={proxy.admin_token if token == 'admin' else token}"
    driver.get(f"{proxy.url}{path}{query}{fragment}")


def text(element: WebElement) -> str:
    """The DOM text (not layout-dependent, so it holds for off-screen messages too)."""
    return element.get_property("textContent") or ""


def screenshot(driver: WebDriver, name: str) -> Path:
    """The whole page, not just the viewport: the window is made as tall as the document."""
    ARTIFACTS.mkdir(exist_ok=True)
    driver.execute_script("window.scrollTo(0, 0)")
    height = driver.execute_script("return Math.min(document.documentElement.scrollHeight, 7000)")
    driver.set_window_size(1280, max(900, int(height)))
    path = ARTIFACTS / name
    driver.save_screenshot(str(path))
    driver.set_window_size(1280, 900)
    return path


def responder(body: dict) -> Reply:
    """Summaries for the summarizer; a build tool call when asked to build; else the default."""
    messages = body["messages"]
    if messages[0]["role"] == "system" and SUMMARIZER_MARK in messages[0]["content"]:
        return Reply.text("SUMMARY: the agent is fixing the build of src/app.py; the build ran with 3 warnings.")
    if messages[-1]["role"] == "user" and messages[-1]["content"] == "run the build":
        return Reply.tool_calls([("run_build", json.dumps({"target": "all", "jobs": 4}))])
    return default_responder(body)


def build_conversation(proxy, upstream, cid: str = "ui-demo") -> None:
    """A tool call whose output is truncated, a compaction summary, a failed turn, an edited turn."""
    client = openai_client(proxy, headers={"X-Conversation-ID": cid})
    messages: list[dict] = [{"role": "system", "content": "You are a coding agent."}]

    def say(content: str) -> dict:
        messages.append({"role": "user", "content": content})
        reply = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
        message = reply.choices[0].message.model_dump(exclude_none=True)
        messages.append(message)
        return message

    say("task: fix the failing build in src/app.py")
    call = say("run the build")["tool_calls"][0]
    messages.append({"role": "tool", "tool_call_id": call["id"], "content": BUILD_LOG})
    reply = client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
    messages.append(reply.choices[0].message.model_dump(exclude_none=True))
    say("now fix the warnings")
    say("and commit")  # the 4th user message: compacted first (turns, every 3, foreground)
    messages.append({"role": "user", "content": "this request fails upstream"})
    upstream.enqueue(Reply.error(500, {"error": {"message": "upstream broke", "type": "server_error"}}))
    with pytest.raises(openai.InternalServerError):  # the upstream's 500, passed through
        client.chat.completions.create(model="gpt-4o-mini", messages=messages, tools=TOOLS)
    messages.pop()
    say("push it")
    messages[-2:] = []  # the client edits its last message: the old one and its reply are superseded
    say("push it to the main branch")


def test_list_and_replay_show_calls_summaries_and_expandable_outputs(make_proxy, upstream, browser):
    upstream.responder = responder
    proxy = make_proxy(
        quota={"max_llm_calls": 50},
        compaction={"strategy": "turns", "every_n_user_messages": 2, "background": False},
    )
    build_conversation(proxy, upstream)
    openai_client(proxy, headers={"X-Conversation-ID": "another-agent"}).chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hello"}]
    )

    open_ui(browser, proxy)
    row = wait(browser).until(EC.visibility_of_element_located((By.CSS_SELECTOR, "tr.conversation[data-id='ui-demo']")))
    assert text(row.find_element(By.CSS_SELECTOR, "a.title")) == "task: fix the failing build in src/app.py"
    assert text(row.find_element(By.CSS_SELECTOR, ".conv-id")) == "ui-demo"
    assert len(text(row.find_element(By.CSS_SELECTOR, ".tenant"))) == 12  # the tenant-hash prefix
    cells = [text(td) for td in row.find_elements(By.TAG_NAME, "td")]
    assert cells[1].startswith("OpenAI Python SDK ") and cells[2] == "gpt-4o-mini"  # client, model
    assert "#2" in cells[6]  # two compactions so far
    assert cells[7] == "1 failed"
    assert len(browser.find_elements(By.CSS_SELECTOR, "tr.conversation")) == 2
    search = browser.find_element(By.ID, "search")  # searched by the server
    search.send_keys("demo")
    wait(browser).until(EC.invisibility_of_element_located((By.CSS_SELECTOR, "tr.conversation[data-id='another-agent']")))
    row = browser.find_element(By.CSS_SELECTOR, "tr.conversation[data-id='ui-demo']")
    assert row.is_displayed()
    screenshot(browser, "ui-list.png")

    row.find_element(By.TAG_NAME, "a").click()
    timeline = wait(browser).until(EC.presence_of_element_located((By.CSS_SELECTOR, "#timeline[data-complete]")))
    calls = timeline.find_elements(By.CSS_SELECTOR, ".tool-call")
    assert len(calls) == 1 and "run_build" in text(calls[0]) and '"target": "all"' in text(calls[0])
    summaries = timeline.find_elements(By.CSS_SELECTOR, "li.summary")
    assert [s.get_attribute("data-summary-id") for s in summaries] == ["1", "2"]
    assert all("SUMMARY: the agent is fixing the build" in text(s) for s in summaries)
    # The summary in use sits right after the last message it covers, the compacted ones before it.
    [current] = timeline.find_elements(By.CSS_SELECTOR, "li.summary.current")
    last_seq = int(current.get_attribute("data-last-seq"))
    compacted = [int(m.get_attribute("data-seq")) for m in timeline.find_elements(By.CSS_SELECTOR, ".message.status-compacted")]
    assert compacted and max(compacted) == last_seq
    assert timeline.find_elements(By.CSS_SELECTOR, ".message.status-failed")
    assert timeline.find_elements(By.CSS_SELECTOR, "details.branch .message.status-superseded")
    turns = timeline.find_elements(By.CSS_SELECTOR, "li.turn")
    assert turns and "tokens sent" in text(turns[-1]) and "LLM calls used" in text(turns[-1])
    # "show window" highlights what the turn sent upstream, as its turn record says.
    [last_turn] = httpx.get(f"{proxy.url}/v1/conversations/ui-demo/turns", headers=proxy.admin_headers).json()["data"][-1:]
    toggle = turns[-1].find_element(By.CSS_SELECTOR, "button.window-toggle")

    def in_window() -> list[int]:
        return [int(m.get_attribute("data-seq")) for m in timeline.find_elements(By.CSS_SELECTOR, ".message.in-window")]

    # The click's handler runs in the page, not in the click command: wait for what it draws. The
    # click is dispatched on the button in the page: a WebDriver click lands where it measured the
    # button, and once, in a full run under load, it toggled nothing (cause not found).
    def click() -> None:
        browser.execute_script("arguments[0].click()", toggle)

    click()
    wait(browser).until(lambda _: toggle.get_attribute("aria-pressed") == "true")
    assert in_window() == last_turn["sent_seqs"]
    click()
    wait(browser).until(lambda _: toggle.get_attribute("aria-pressed") == "false")
    assert in_window() == []
    assert browser.find_elements(By.CSS_SELECTOR, "#token-chart svg rect.bar.sent")
    assert browser.find_elements(By.CSS_SELECTOR, "#token-chart svg polyline.line.stored")
    # The failed turn: marked in the replay and the chart, with the upstream's status and message.
    [failed] = timeline.find_elements(By.CSS_SELECTOR, "li.turn.failed")
    assert text(failed.find_element(By.CSS_SELECTOR, ".turn-error")) == "Failed500 from the upstream: upstream broke"
    [band] = browser.find_elements(By.CSS_SELECTOR, "#token-chart svg rect.failed-band")
    assert band.get_attribute("data-turn") == failed.get_attribute("data-turn")
    assert "500 from the upstream: upstream broke" in text(band)
    assert browser.find_elements(By.CSS_SELECTOR, "#token-chart svg line.tick-reported")  # the upstream's own count

    output = timeline.find_element(By.CSS_SELECTOR, ".message.role-tool .tool-output.long")
    box = output.find_element(By.CSS_SELECTOR, ".text")
    assert BUILD_LOG.startswith(text(box)) and "END OF BUILD LOG" not in text(box)  # a preview
    screenshot(browser, "ui-replay.png")
    button = output.find_element(By.CSS_SELECTOR, "button.expand")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", button)
    button.click()  # fetches tool_outputs/{ref}
    wait(browser).until(lambda _: text(box) == BUILD_LOG)
    assert text(button) == "Collapse"
    browser.execute_script("arguments[0].scrollIntoView({block: 'start'})", output)
    browser.save_screenshot(str(ARTIFACTS / "ui-replay-expanded.png"))


def test_the_list_loads_more_with_the_after_cursor_and_the_server_searches_what_is_not_loaded(proxy, browser):
    for n in range(51):  # one more than the page's 50 per request
        openai_client(proxy, headers={"X-Conversation-ID": f"agent-{n:03d}"}).chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": f"job {n}"}]
        )
    open_ui(browser, proxy)
    more = wait(browser).until(EC.visibility_of_element_located((By.ID, "load-more")))
    assert len(browser.find_elements(By.CSS_SELECTOR, "tr.conversation")) == 50  # newest first
    more.click()
    wait(browser).until(EC.visibility_of_element_located((By.CSS_SELECTOR, "tr.conversation[data-id='agent-000']")))
    assert not more.is_displayed() and len(browser.find_elements(By.CSS_SELECTOR, "tr.conversation")) == 51
    open_ui(browser, proxy)
    wait(browser).until(EC.visibility_of_element_located((By.ID, "load-more")))
    browser.find_element(By.ID, "search").send_keys("agent-000")  # the oldest: not loaded, found by the server
    wait(browser).until(lambda b: [r.get_attribute("data-id") for r in b.find_elements(By.CSS_SELECTOR, "tr.conversation")] == ["agent-000"])
    assert not browser.find_element(By.ID, "load-more").is_displayed()
    assert browser.current_url.endswith("#/?q=agent-000")  # the search is in the URL


def say(proxy, task: str, **headers: str) -> None:
    """A new conversation (a derived id: nothing in it names the task) whose first turn is `task`."""
    openai_client(proxy, headers=headers or None).chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "system", "content": "You are an agent."}, {"role": "user", "content": task}]
    )


def test_search_finds_a_conversation_by_a_word_of_its_task_and_failures_filter_the_list(proxy, upstream, browser):
    say(proxy, "reconcile the quarterly ledger in books/2024.csv")
    say(proxy, "write the release notes for 2.0")
    say(proxy, "import the nightly batch", **{"X-Conversation-Title": "Nightly import"})
    upstream.enqueue(Reply.error(429, {"error": {"message": "Rate limit reached for gpt-4o-mini", "type": "rate_limit_error"}}))
    with pytest.raises(openai.RateLimitError):
        say(proxy, "summarize the incident report")
    ids = {c["title"]: c["id"] for c in httpx.get(f"{proxy.url}/v1/conversations", headers=proxy.admin_headers).json()["data"]}
    assert all(cid.startswith("auto-") for cid in ids.values())

    open_ui(browser, proxy)
    wait(browser).until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "tr.conversation")) == 4)
    titles = [text(a) for a in browser.find_elements(By.CSS_SELECTOR, "tr.conversation a.title")]
    assert titles == ["summarize the incident report", "Nightly import", "write the release notes for 2.0",
                      "reconcile the quarterly ledger in books/2024.csv"]
    search = browser.find_element(By.ID, "search")
    search.send_keys("LEDGER")  # a word of its task, any case
    wait(browser).until(lambda b: [r.get_attribute("data-id") for r in b.find_elements(By.CSS_SELECTOR, "tr.conversation")]
                        == [ids["reconcile the quarterly ledger in books/2024.csv"]])
    assert text(browser.find_element(By.ID, "list-count")) == "1 match"
    search.clear()
    search.send_keys("nightly batch")  # the task of a conversation with a title of its own
    wait(browser).until(lambda b: [text(a) for a in b.find_elements(By.CSS_SELECTOR, "tr.conversation a.title")] == ["Nightly import"])
    search.clear()
    search.send_keys("no such words")
    empty = wait(browser).until(EC.visibility_of_element_located((By.ID, "list-empty")))
    assert text(empty) == "No conversation matches."
    search.clear()
    browser.find_element(By.ID, "failed-only").click()
    wait(browser).until(lambda b: [text(a) for a in b.find_elements(By.CSS_SELECTOR, "tr.conversation a.title")] == ["summarize the incident report"])
    badge = browser.find_element(By.CSS_SELECTOR, "tr.conversation .badge.status-failed")
    assert text(badge) == "1 failed" and "429 from the upstream: Rate limit reached for gpt-4o-mini" in badge.get_attribute("title")
    screenshot(browser, "ui-list-failed.png")

    browser.find_element(By.CSS_SELECTOR, "tr.conversation a.title").click()
    turn = wait(browser).until(EC.presence_of_element_located((By.CSS_SELECTOR, "li.turn.failed")))
    assert "429 from the upstream: Rate limit reached for gpt-4o-mini" in text(turn)
    assert text(browser.find_element(By.CSS_SELECTOR, "h1.conversation-title .title")) == "summarize the incident report"


def test_a_turn_the_client_left_is_marked_incomplete_with_why(proxy, upstream, browser):
    with httpx.Client(base_url=proxy.url, timeout=30, auth=proxy.admin_auth) as http:
        reply, _ = leave_mid_stream(http, upstream, "left", "a long answer the client stops reading", "stream me the ledger")
        reply.release()  # the proxy sees the client gone at its next write
        wait_until(lambda: http.get("/v1/conversations/left/turns").json()["data"], what="the turn's record")
    open_ui(browser, proxy, "#/c/left")
    turn = wait(browser).until(EC.presence_of_element_located((By.CSS_SELECTOR, "#timeline[data-complete] li.turn")))
    assert text(turn.find_element(By.CSS_SELECTOR, ".turn-error")) == "IncompleteThe client went away before the reply was complete"
    assert browser.find_elements(By.CSS_SELECTOR, "#timeline .message.status-incomplete")
    [band] = browser.find_elements(By.CSS_SELECTOR, "#token-chart svg rect.failed-band")
    assert "Turn 1 is incomplete" in text(band)


LONG = "Migrate every service of the payments platform to the new ledger schema and verify the balances " * 3


def test_the_list_holds_every_column_at_1280_px(proxy, upstream, browser):
    say(proxy, LONG)
    say(proxy, "a short one", **{"User-Agent": "my-very-own-agent-framework-with-a-long-name/12.34.56789 (linux; x86_64)"})
    upstream.enqueue(Reply.error(500, {"error": {"message": "upstream broke", "type": "server_error"}}))
    with pytest.raises(openai.InternalServerError):
        openai_client(proxy, headers={"X-Conversation-ID": "x" * 128}).chat.completions.create(
            model="gpt-4o-mini-2024-07-18-with-a-fine-tuned-suffix", messages=[{"role": "user", "content": LONG}]
        )
    open_ui(browser, proxy)
    wait(browser).until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "tr.conversation")) == 3)
    assert browser.execute_script("return window.innerWidth") <= 1280
    geometry = browser.execute_script(
        """const wrap = document.querySelector('.table-wrap').getBoundingClientRect();
        const cells = [...document.querySelectorAll('#conversations th, #conversations td')].map(c => c.getBoundingClientRect());
        return {wrap: [wrap.left, wrap.right], page: document.documentElement.clientWidth,
                scroll: document.querySelector('.table-wrap').scrollWidth - document.querySelector('.table-wrap').clientWidth,
                cells: cells.map(r => [r.left, r.right, r.width])};"""
    )
    left, right = geometry["wrap"]
    assert right <= geometry["page"] and geometry["scroll"] <= 0  # nothing to scroll to: every column in view
    assert all(left - 0.5 <= l and r <= right + 0.5 and w > 30 for l, r, w in geometry["cells"])
    headers = [text(th) for th in browser.find_elements(By.CSS_SELECTOR, "#conversations th")]
    assert headers == ["Conversation", "Client", "Model", "Turns", "Messages", "LLM calls", "Compaction", "Failures", "Last activity"]
    cut = browser.execute_script(
        "return [...document.querySelectorAll('#conversations th, #conversations td.num, #conversations td.time-col')]"
        ".filter(c => c.scrollWidth > c.clientWidth).map(c => c.textContent)"
    )
    assert cut == []  # headings, figures and times whole: only titles, ids, clients and models may end in "…"
    screenshot(browser, "ui-list-1280.png")


def test_with_an_admin_token_the_page_asks_for_one_and_keeps_it_for_the_tab(make_proxy, browser):
    proxy = make_proxy(admin={"token": ADMIN_TOKEN})
    openai_client(proxy, headers={"X-Conversation-ID": "guarded"}).chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
    )
    assert httpx.get(f"{proxy.url}/v1/conversations").status_code == 401  # what the page's call gets
    page = httpx.get(f"{proxy.url}/ui/")
    assert page.status_code == 200 and "guarded" not in page.text  # the shell holds no data
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    assert httpx.get(f"{proxy.url}/ui").headers["Location"] == "ui/"  # relative: fine behind a path prefix
    assert httpx.get(f"{proxy.url}/ui/a/secrets.txt").status_code == 404  # only its own files, never upstream

    open_ui(browser, proxy, token=None)
    form = wait(browser).until(EC.visibility_of_element_located((By.ID, "token-form")))
    assert "401" in text(form.find_element(By.CSS_SELECTOR, ".api-answer"))
    assert not browser.find_elements(By.CSS_SELECTOR, "tr.conversation")
    screenshot(browser, "ui-token-prompt.png")
    browser.find_element(By.ID, "token-input").send_keys(ADMIN_TOKEN)
    browser.find_element(By.ID, "token-submit").click()
    wait(browser).until(EC.visibility_of_element_located((By.CSS_SELECTOR, "tr.conversation[data-id='guarded']")))
    assert browser.execute_script("return sessionStorage.getItem('context-proxy.ui.token')") == ADMIN_TOKEN

    # Another key is a client key: it sees only its own conversations (none here).
    browser.find_element(By.ID, "forget-token").click()
    wait(browser).until(EC.visibility_of_element_located((By.ID, "token-input"))).send_keys(BOB)
    browser.find_element(By.ID, "token-submit").click()
    empty = wait(browser).until(EC.visibility_of_element_located((By.ID, "list-empty")))
    assert "No conversations yet" in text(empty)
    assert not browser.find_elements(By.CSS_SELECTOR, "tr.conversation")


def test_a_2000_message_conversation_loads_page_by_page_and_content_stays_text(make_proxy, browser):
    proxy = make_proxy()
    messages: list[dict] = [{"role": "system", "content": "You are a chatty agent."}]
    for i in range(1, 2000):
        role = "user" if i % 2 else "assistant"
        messages.append({"role": role, "content": XSS if i == 7 else f"{role} message {i}: " + "words " * (i % 40)})
    client = openai_client(proxy, headers={"X-Conversation-ID": "long-one"})
    client.chat.completions.create(model="gpt-4o-mini", messages=messages)  # stored: 2,000 + the reply

    start = time.monotonic()
    open_ui(browser, proxy, "/#/c/long-one")
    timeline = wait(browser, 30).until(EC.presence_of_element_located((By.CSS_SELECTOR, "#timeline[data-complete]")))
    elapsed = time.monotonic() - start
    seqs = browser.execute_script("return [...document.querySelectorAll('#timeline .message')].map(m => +m.dataset.seq)")
    assert seqs == list(range(1, 2002))
    pages = browser.execute_script(
        "return performance.getEntriesByType('resource').filter(e => e.name.includes('/trajectory')).length"
    )
    assert pages >= 8  # read with the API's `after` cursor, 250 at a time
    payload = timeline.find_element(By.CSS_SELECTOR, ".message[data-seq='8'] .text")  # messages[7]
    assert text(payload) == XSS  # shown as text ...
    assert browser.execute_script("return window.__xss === undefined && !document.querySelector('#timeline img, #timeline script')")
    print(f"2,001 messages rendered in {elapsed:.2f} s ({pages} trajectory pages)")
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "ui-long.png"))  # the viewport: the page is ~2,000 messages tall


def test_a_sessions_other_thread_links_to_its_main_thread(proxy, browser):
    """Two threads of one Codex session (its `session-id` header; the second with instructions of
    its own, as a subagent's): the list shows the second as a thread of the first's id."""
    session = "019a4c1e-5b7e-7d52-9d00-4f1d2c3b4a59"
    client = openai_client(proxy, headers={"session-id": session})
    client.responses.create(model="gpt-4o-mini", instructions="You are the main agent.", input="plan the release")
    client.responses.create(model="gpt-4o-mini", instructions="You are a reviewer subagent.", input="review the plan")
    open_ui(browser, proxy)
    link = wait(browser).until(EC.visibility_of_element_located((By.CSS_SELECTOR, "tr.conversation .thread-of a")))
    row = link.find_element(By.XPATH, "ancestor::tr")
    assert row.get_attribute("data-id").startswith(session + ":") and text(link) == session
    link.click()
    wait(browser).until(lambda b: b.current_url.endswith(session) or session in b.current_url)
    facts = wait(browser).until(EC.visibility_of_element_located((By.XPATH, "//*[contains(text(), 'the main thread of its client')]")))
    assert session in text(facts)
