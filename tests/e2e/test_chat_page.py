"""The chat page at GET /, driven in a real headless Chromium against a real server."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
KEY = "page-test-key"
CODE_PROMPT = "Write a Python function that adds two numbers."
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1100,860", "--host-resolver-rules=MAP ui.test 127.0.0.1"]  # another origin, for CORS

if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
    pytest.skip("Chromium or chromedriver is not installed (make system-packages installs them)",
                allow_module_level=True)

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_script_timeout(10)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver, predicate, timeout: float = 30, message: str = ""):
    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: predicate(d), message)


def open_page(driver, server, query: str = "") -> None:
    driver.get(server.base_url + "/" + query)
    wait_for(driver, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-state") in ("ready", "error"),
             message="the page never became ready")


def page_state(driver) -> str:
    return driver.find_element(By.TAG_NAME, "body").get_attribute("data-state")


def last_reply(driver):
    return driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1]


def reply_text(driver) -> str:
    return driver.execute_script(
        "const m = document.querySelectorAll('.msg.assistant .content'); return m[m.length - 1].textContent;")


def ask(driver, prompt: str) -> None:
    box = driver.find_element(By.ID, "prompt")
    box.clear()
    box.send_keys(prompt)
    driver.find_element(By.ID, "send").click()


def watch_reply(driver, timeout: float = 120) -> tuple[str, list[int]]:
    """Poll the reply being streamed until it ends: (its state, each distinct length seen on the way)."""
    lengths: list[int] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = last_reply(driver).get_attribute("data-state")
        n = len(reply_text(driver))
        if n and (not lengths or lengths[-1] != n):
            lengths.append(n)
        if state in ("done", "stopped", "error"):
            return state, lengths
        time.sleep(0.03)
    raise AssertionError("the reply never finished")


def api_reply(server, messages: list[dict], max_tokens: int, headers: dict | None = None) -> str:
    r = requests.post(server.base_url + "/v1/chat/completions", headers=headers or {}, timeout=120,
                      json={"messages": messages, "max_tokens": max_tokens, "temperature": 0})
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]


def as_rendered(markdown: str) -> str:
    """What the page shows for a reply: fence lines and inline backticks gone, whitespace aside."""
    lines = [line for line in markdown.split("\n") if not line.strip().startswith("```")]
    return re.sub(r"\s+", "", "\n".join(lines).replace("`", ""))


def test_the_page_is_self_contained_and_open(server):
    r = requests.get(server.base_url + "/", timeout=10)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/html")
    assert "default-src 'none'" in r.headers["Content-Security-Policy"]
    assert not re.search(r"""(src|href)\s*=|@import|url\(""", r.text), "the page must load nothing else"
    assert "innerHTML" not in r.text


def test_a_greedy_multi_turn_chat_streams_what_the_api_returns(server, browser):
    model = requests.get(server.base_url + "/v1/models", timeout=10).json()["data"][0]["id"]
    first = [{"role": "user", "content": CODE_PROMPT}]
    expected = api_reply(server, first, 60)

    open_page(browser, server, "?temperature=0&max_tokens=60")
    assert page_state(browser) == "ready"
    assert browser.find_element(By.ID, "model").text == model

    ask(browser, CODE_PROMPT)
    state, lengths = watch_reply(browser)
    assert state == "done"
    # shown in steps as it streamed (a ``` line can shrink the shown text when it becomes a fence)
    assert len(lengths) >= 3 and lengths[-1] > lengths[0], f"the reply did not stream: {lengths}"
    conversation = browser.execute_script("return etserveChat.chat.messages")
    assert conversation == [first[0], {"role": "assistant", "content": expected}]
    assert re.sub(r"\s+", "", reply_text(browser)) == as_rendered(expected)
    stats = last_reply(browser).find_element(By.CLASS_NAME, "stats").text
    assert re.search(r"\d+ tokens · [\d.]+ tok/s", stats), stats
    if "```" in expected:  # fenced code is shown as code
        assert last_reply(browser).find_elements(By.CSS_SELECTOR, "pre > code")

    follow_up = "Now make it subtract instead."
    expected_2 = api_reply(server, [*conversation, {"role": "user", "content": follow_up}], 40)
    browser.find_element(By.CSS_SELECTOR, "#settings summary").click()
    browser.find_element(By.ID, "max-tokens").clear()
    browser.find_element(By.ID, "max-tokens").send_keys("40")
    ask(browser, follow_up)
    state, _ = watch_reply(browser)
    assert state == "done"
    conversation = browser.execute_script("return etserveChat.chat.messages")
    assert [m["role"] for m in conversation] == ["user", "assistant", "user", "assistant"]
    assert conversation[3]["content"] == expected_2

    shot = ROOT / "test-artifacts" / "chat-page.png"
    shot.parent.mkdir(exist_ok=True)
    browser.execute_script("document.getElementById('settings').open = false;"
                           "document.getElementById('messages').scrollTop = 0")
    assert browser.save_screenshot(str(shot))


def test_replies_are_rendered_from_text_never_as_html(server, browser):
    open_page(browser, server)
    hostile = ("Look: <img src=x onerror=\"window.pwned=1\"> and `<b>bold</b>`\n"
               "```html\n<script>window.pwned=2</script>\n```\nafter")
    found = browser.execute_script("""
        const div = document.createElement('div');
        document.body.appendChild(div);
        etserveChat.renderMarkdown(div, arguments[0]);
        const out = {elements: [...div.querySelectorAll('*')].map(e => e.tagName.toLowerCase()),
                     code: [...div.querySelectorAll('pre > code')].map(e => e.textContent),
                     lang: div.querySelector('pre').dataset.lang, inline: div.querySelector('.text code').textContent,
                     text: div.textContent};
        div.remove();
        return out;""", hostile)
    time.sleep(0.2)  # an injected <img> would have fired onerror by now
    assert browser.execute_script("return window.pwned === undefined")
    assert "img" not in found["elements"] and "script" not in found["elements"] and "b" not in found["elements"]
    assert found["code"] == ["<script>window.pwned=2</script>"] and found["lang"] == "html"
    assert found["inline"] == "<b>bold</b>"
    assert '<img src=x onerror="window.pwned=1">' in found["text"]


def test_stop_aborts_the_fetch_and_the_server_stops_generating(server, browser):
    open_page(browser, server, "?temperature=0&max_tokens=400")
    server.wait_idle()
    calls_before = server.health()["engine"]["forward_calls"]
    ask(browser, "Write a long story about a lighthouse keeper and the sea.")
    wait_for(browser, lambda d: len(reply_text(d)) > 20, 60, "no streamed text")
    browser.find_element(By.ID, "stop").click()
    stopped_at = time.monotonic()
    wait_for(browser, lambda d: last_reply(d).get_attribute("data-state") == "stopped", 10, "the page did not stop")

    while server.health()["engine"]["generating"]:
        assert time.monotonic() - stopped_at < 5, "the server kept generating after Stop"
        time.sleep(0.02)
    calls = server.health()["engine"]["forward_calls"]
    time.sleep(1.0)
    assert server.health()["engine"]["forward_calls"] == calls, "forward calls went on after Stop"
    assert calls - calls_before < 200, "generation ran far past the Stop"  # 400 were allowed
    assert "stopped" in last_reply(browser).find_element(By.CLASS_NAME, "stats").text
    conversation = browser.execute_script("return etserveChat.chat.messages")
    assert conversation[-1]["role"] == "assistant" and conversation[-1]["content"]
    assert not browser.find_element(By.ID, "send").get_attribute("disabled")


@pytest.fixture(scope="module")
def other_origin(tmp_path_factory):
    """A page of another web site (http://ui.test:PORT, Chromium resolving ui.test to this machine),
    as a browser chat UI served from elsewhere is."""
    import functools
    import http.server

    from e2e.servers import free_port

    root = tmp_path_factory.mktemp("ui")
    (root / "index.html").write_text("<!doctype html><title>ui</title><p>another site</p>")
    port = free_port()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://ui.test:{port}"
    httpd.shutdown()


STREAM_FROM_PAGE = """
const [url, key, done] = [arguments[0], arguments[1], arguments[arguments.length - 1]];
const headers = {"Content-Type": "application/json"};
if (key) headers["Authorization"] = "Bearer " + key;
fetch(url + "/v1/chat/completions", {method: "POST", headers,
      body: JSON.stringify({messages: [{role: "user", content: "Hello!"}], max_tokens: 4, stream: true})})
  .then(async r => done({status: r.status, body: await r.text(), id: r.headers.get("X-Request-Id")}))
  .catch(e => done({error: String(e)}));
"""


def test_a_chat_ui_on_another_site_streams_once_allowed(make_server, server, browser, other_origin):
    """Cross-origin fetch from a real browser: refused by default (a 403, nothing generated); with
    --cors-origins naming the site, or an API key, the preflight passes and the stream is readable."""
    browser.get(other_origin + "/index.html")
    refused = browser.execute_async_script(STREAM_FROM_PAGE, server.base_url, None)
    assert "Failed to fetch" in refused.get("error", ""), refused
    allowed = make_server({"ETSERVE_CORS_ORIGINS": "http://ui.test:*"})
    out = browser.execute_async_script(STREAM_FROM_PAGE, allowed.base_url, None)
    assert out.get("status") == 200 and "data: [DONE]" in out["body"] and out["id"], out
    keyed = make_server({"ETSERVE_API_KEY": KEY})
    out = browser.execute_async_script(STREAM_FROM_PAGE, keyed.base_url, KEY)
    assert out.get("status") == 200 and "data: [DONE]" in out["body"], out
    out = browser.execute_async_script(STREAM_FROM_PAGE, keyed.base_url, "wrong")
    assert out.get("status") == 401, out  # the 401 readable by the page, to say so


def test_with_an_api_key_the_page_asks_for_it_and_then_chats(make_server, browser):
    srv = make_server({"ETSERVE_API_KEY": KEY})
    assert requests.get(srv.base_url + "/", timeout=10).status_code == 200
    assert requests.get(srv.base_url + "/v1/models", timeout=10).status_code == 401
    open_page(browser, srv, "?max_tokens=6")
    assert page_state(browser) == "error"
    assert browser.find_element(By.ID, "status").text == "API key needed"
    assert browser.find_element(By.ID, "settings").get_attribute("open") is not None

    browser.find_element(By.ID, "api-key").send_keys(KEY)
    browser.find_element(By.ID, "save-key").click()
    wait_for(browser, lambda d: page_state(d) == "ready", 20, "the key was not taken")
    assert browser.execute_script("return localStorage.getItem('etserve.apiKey')") == KEY
    ask(browser, "Hello!")
    state, _ = watch_reply(browser)
    assert state == "done" and reply_text(browser)


def test_the_page_is_served_and_says_so_when_the_model_cannot_load(broken_model_dir, make_server, browser):
    srv = make_server({"ETSERVE_MODEL_PATH": str(broken_model_dir)}, status="failed")
    assert requests.get(srv.base_url + "/", timeout=10).status_code == 200
    open_page(browser, srv)
    assert "failed to load" in browser.find_element(By.ID, "status").text
    assert browser.find_element(By.ID, "send").get_attribute("disabled")


LONG_QUESTION = ("Here are my notes about lighthouses. " + "A lighthouse keeper trims the wick, winds the clockwork "
                 "that turns the lens, logs the weather and watches for ships in trouble. " * 14
                 + "What does a keeper do at dusk?")


def test_a_progress_bar_shows_while_the_prompt_is_read(make_server, browser):
    srv = make_server({"ETSERVE_PREFILL_CHUNK": "4"})  # many small chunks: a slow, visible prefill
    probe = requests.post(srv.base_url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "stream": True, "return_progress": True})
    if probe.status_code == 400 and probe.json()["error"].get("param") == "return_progress":
        pytest.skip("this server does not take return_progress yet (its API wiring, issue 13)")
    assert probe.status_code == 200 and "prompt_progress" in probe.text

    open_page(browser, srv, "?temperature=0&max_tokens=4")
    ask(browser, LONG_QUESTION)
    bars = []
    deadline = time.monotonic() + 120
    while last_reply(browser).get_attribute("data-state") not in ("done", "stopped", "error"):
        assert time.monotonic() < deadline, "the reply never finished"
        shown = browser.execute_script(
            "const r = document.querySelector('.msg.assistant:last-child .reading');"
            "return r ? [r.querySelector('.fill').style.width, r.textContent] : null;")
        if shown:
            bars.append(shown)
        time.sleep(0.02)
    assert last_reply(browser).get_attribute("data-state") == "done"
    assert bars, "no progress bar was shown while the prompt was read"
    assert all(re.fullmatch(r"reading the prompt: \d+ / \d+ tokens( \(\d+ cached\))?", text) for _, text in bars)
    reports = browser.execute_script("return etserveChat.chat.progress")
    processed = [p["processed"] for p in reports]
    assert len(reports) >= 3 and processed == sorted(processed)
    assert processed[-1] == reports[-1]["total"] and reports[0]["processed"] == reports[0]["cache"]
    assert not last_reply(browser).find_elements(By.CLASS_NAME, "reading")  # gone once the reply came
    assert reply_text(browser)


def test_on_a_router_the_page_loads_no_model_and_offers_a_choice(make_server, model_dir, broken_model_dir,
                                                                 tmp_path, browser):
    """--models-dir: the page and a browser's favicon ask load nothing; the page never picks a
    model that failed, offers the others in a list, and chats with the one chosen."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "a-broken").symlink_to(broken_model_dir)  # first by name
    (models / "smollm2").symlink_to(model_dir)
    (models / "smollm2-copy").symlink_to(model_dir)
    srv = make_server({"ETSERVE_MODELS_DIR": str(models), "ETSERVE_MODELS_MAX": "1"})
    statuses = lambda: {m["id"]: m["status"]["value"] for m in  # noqa: E731
                        requests.get(srv.base_url + "/v1/models", timeout=10).json()["data"]}
    assert requests.get(srv.base_url + "/", timeout=10).status_code == 200
    assert requests.get(srv.base_url + "/favicon.ico", timeout=10).status_code == 404
    assert set(statuses().values()) == {"unloaded"}
    requests.post(srv.base_url + "/v1/chat/completions", timeout=60, json={
        "model": "a-broken", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
    assert statuses()["a-broken"] == "failed"
    requests.post(srv.base_url + "/v1/chat/completions", timeout=60, json={
        "model": "smollm2-copy", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
    open_page(browser, srv)
    assert page_state(browser) == "ready"
    select = browser.find_element(By.ID, "model-select")
    options = [o.get_attribute("value") for o in select.find_elements(By.TAG_NAME, "option")]
    assert options == ["smollm2", "smollm2-copy"] and select.get_attribute("value") == "smollm2-copy"
    select.find_element(By.CSS_SELECTOR, "option[value='smollm2']").click()
    ask(browser, "Say hello.")
    assert watch_reply(browser)[0] == "done"
    assert statuses()["smollm2"] == "loaded"  # the chosen one answered
