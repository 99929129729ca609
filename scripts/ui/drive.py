"""Drives inferno's chat page (`GET /` of `inferno serve`) in headless Chromium, as a person
would: it types, presses Enter, clicks Stop, reloads. Selenium with Debian's chromium and
chromium-driver.

    python drive.py BASE_URL SCENARIO [JSON_ARGS]

Each scenario prints one JSON object with what the page showed (texts as rendered and as the
page stored them, states, error lines, console errors); tests/serve_ui.rs compares it with the
API's own answers and the server's /metrics. A step that never happens fails with one line
(and a screenshot when JSON_ARGS has "shot"). Scenarios:

- chat: a greedy turn and a second one (with the settings panel), then a reload.
- stop: a long reply stopped mid-stream.
- conversations: new chat, switch, delete.
- errors: a prompt longer than the context (400), a body over the server's limit (413), a
  message while the server is full (503).
- reasoning: a gpt-oss reply (reasoning block, Markdown, text that must not become markup),
  and the Markdown renderer on hostile input.
- key: a server with --api-key: the page loads, asks for the key, shows the 401s, then works.
- shot: one message, then a screenshot (scripts/ui/screenshot.sh).
"""

import json
import os
import shutil
import sys
import tempfile
import time

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

BASE, SCENARIO = sys.argv[1], sys.argv[2]
ARGS = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
TIMEOUT = float(ARGS.get("timeout", 180))


def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    profile = tempfile.mkdtemp(prefix="inferno-ui-")
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900",
              "--no-first-run", "--disable-background-networking", "--disable-component-update",
              "--disable-sync", f"--user-data-dir={profile}"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver") or "/usr/bin/chromedriver")
    return webdriver.Chrome(service=service, options=opts)


D = browser()
CONSOLE = []


def fail(what):
    shot = ARGS.get("shot") or os.path.join(tempfile.gettempdir(), f"inferno-ui-{SCENARIO}.png")
    try:
        D.save_screenshot(shot)
    except WebDriverException:
        pass
    sys.exit(f"drive.py {SCENARIO}: {what} (screenshot {shot}; page error line: {error_line()!r})")


def wait_for(what, fn, timeout=TIMEOUT):
    end = time.time() + timeout
    while time.time() < end:
        try:
            v = fn()
        except StaleElementReferenceException:  # re-rendered while read
            v = None
        if v:
            return v
        time.sleep(0.05)
    fail(f"timed out after {timeout:.0f} s waiting for {what}")


def js(script, *args):
    return D.execute_script(script, *args)


def el(id_):
    return D.find_element(By.ID, id_)


def error_line():
    try:
        e = el("error")
        return e.text if e.is_displayed() else ""
    except WebDriverException:
        return ""


def console():
    """Console errors so far, less the failed loads the tests provoke (401, 413, 400)."""
    for entry in D.get_log("browser"):
        if entry["level"] == "SEVERE" and "Failed to load resource" not in entry["message"]:
            CONSOLE.append(entry["message"])
    return CONSOLE


def open_page():
    D.get(BASE + "/")
    wait_for("the model's name", lambda: el("model-name").text not in ("", "…"))


def effort_offered():
    """Whether the settings panel has the reasoning effort field (it may be closed)."""
    return js("return !document.getElementById('effort-field').hidden")


def set_settings(values):
    """Fills the settings panel as a person would (opens it, types, closes it)."""
    el("settings-toggle").click()
    for name, value in values.items():
        field = D.find_element(By.CSS_SELECTOR, f"#settings-form [name='{name}']")
        if field.tag_name == "select":
            field.find_element(By.CSS_SELECTOR, f"option[value='{value}']").click()
        else:
            field.clear()
            field.send_keys(str(value))
    el("settings-toggle").click()


def assistants():
    return D.find_elements(By.CSS_SELECTOR, "#messages .msg.assistant")


def last_reply():
    """The last reply as shown: state, rendered text, stats line, reasoning block."""
    return js("""
        const m = [...document.querySelectorAll('#messages .msg.assistant')].pop();
        if (!m) return null;
        const d = m.querySelector('details.reasoning');
        return {state: m.dataset.state, text: m.querySelector('.content').innerText,
                html: m.querySelector('.content').innerHTML,
                stats: m.querySelector('.stats').textContent,
                error: m.querySelector('.msg-error').textContent,
                reasoning: d.hidden ? null : {open: d.open, summary: d.querySelector('summary').textContent,
                                               text: d.querySelector('.reasoning-body').textContent}};
    """)


def stored():
    """The open conversation as the page keeps it in localStorage."""
    return js("""
        const id = JSON.parse(localStorage.getItem('inferno.current'));
        return id ? JSON.parse(localStorage.getItem('inferno.chat.' + id)) : null;
    """)


def watch_lengths():
    """Records the length of the streaming reply's text at every change of the DOM."""
    js("""
        window.__lengths = [];
        new MutationObserver(() => {
            const c = [...document.querySelectorAll('#messages .msg.assistant .content')].pop();
            if (c) window.__lengths.push(c.textContent.length);
        }).observe(document.getElementById('messages'), {subtree: true, childList: true, characterData: true});
    """)


def type_and_send(text):
    box = el("input")
    box.click()
    box.send_keys(text)
    box.send_keys(Keys.ENTER)


def put_and_send(text):
    """A text too long to type: set as a paste would, then the Send button."""
    js("const t = document.getElementById('input'); t.value = arguments[0];"
       "t.dispatchEvent(new Event('input'));", text)
    el("send").click()


def turn(text):
    """Sends a message, waits for the reply to finish; what the page shows and stored."""
    before = len(assistants())
    watch_lengths()
    type_and_send(text)
    wait_for("the reply", lambda: len(assistants()) > before and last_reply()["state"] != "streaming")
    reply = last_reply()
    reply["lengths"] = js("return window.__lengths")
    reply["stored"] = stored()["messages"][-1]
    return reply


def shot(path):
    if path:
        D.save_screenshot(path)


# ---- scenarios


def chat():
    open_page()
    out = {"model": el("model-name").text, "title": D.title,
           "effort_shown": effort_offered()}
    set_settings(ARGS.get("settings", {}))
    out["first"] = turn(ARGS["prompt"])
    out["second"] = turn(ARGS["followup"])
    before = stored()
    D.refresh()
    wait_for("the restored conversation", lambda: len(assistants()) == 2)
    out["restored"] = stored() == before
    out["restored_texts"] = [e.text for e in D.find_elements(By.CSS_SELECTOR, "#messages .msg .bubble, #messages .msg .content")]
    out["listed"] = [e.text for e in D.find_elements(By.CSS_SELECTOR, "#conversations .conv-open")]
    shot(ARGS.get("shot"))
    return out


def stop():
    open_page()
    set_settings(ARGS.get("settings", {}))
    type_and_send(ARGS["prompt"])
    wait_for("the reply to start", lambda: len((last_reply() or {}).get("text", "")) >= ARGS.get("min_chars", 40))
    el("stop").click()
    wait_for("the stopped state", lambda: last_reply()["state"] == "stopped", timeout=10)
    at_stop = last_reply()
    time.sleep(ARGS.get("settle", 2.0))
    later = last_reply()
    return {"at_stop": at_stop, "later": later, "stored": stored()["messages"][-1],
            "send_shown": el("send").is_displayed(), "stop_shown": el("stop").is_displayed()}


def conversations():
    open_page()
    set_settings(ARGS.get("settings", {}))
    convs = lambda: D.find_elements(By.CSS_SELECTOR, "#conversations .conv")  # noqa: E731
    turn(ARGS["first"])
    el("new-chat").click()
    empty = bool(D.find_elements(By.CSS_SELECTOR, "#messages .empty"))
    turn(ARGS["second"])
    titles = [e.text for e in D.find_elements(By.CSS_SELECTOR, "#conversations .conv-open")]
    # Back to the first (listed second: most recent first).
    convs()[1].find_element(By.CSS_SELECTOR, ".conv-open").click()
    shown_first = [e.text for e in D.find_elements(By.CSS_SELECTOR, "#messages .bubble")]
    # Delete the second: its button shows on hover; the first click asks, the second deletes.
    row = D.find_element(By.CSS_SELECTOR, "#conversations .conv:not(.current)")
    ActionChains(D).move_to_element(row).perform()
    button = row.find_element(By.CSS_SELECTOR, ".conv-delete")
    button.click()
    asked = button.text
    button.click()
    wait_for("the deletion", lambda: len(convs()) == 1)
    D.refresh()
    wait_for("the list after reload", lambda: len(convs()) == 1)
    return {"empty_after_new": empty, "titles": titles, "shown_first": shown_first, "asked": asked,
            "after_delete": [e.text for e in D.find_elements(By.CSS_SELECTOR, "#conversations .conv-open")],
            "shown_after_reload": [e.text for e in D.find_elements(By.CSS_SELECTOR, "#messages .bubble")]}


def errors():
    open_page()
    out = {}
    cases = [(name, ARGS[name]) for name in ("too_long", "too_large", "busy") if name in ARGS]
    for name, text in cases:
        put_and_send(text)
        out[name] = wait_for(f"the error line ({name})", error_line)
        out[name + "_input_back"] = js("return document.getElementById('input').value.length") == len(text)
        js("document.getElementById('input').value = ''")
    out["messages"] = len(D.find_elements(By.CSS_SELECTOR, "#messages .msg"))
    out["conversations"] = len(D.find_elements(By.CSS_SELECTOR, "#conversations .conv"))
    return out


def reasoning():
    open_page()
    out = {"effort_shown": effort_offered()}
    set_settings(ARGS.get("settings", {}))
    out["reply"] = turn(ARGS["prompt"])
    out["pwned"] = js("return window.__pwned === 1")
    out["img_in_messages"] = len(D.find_elements(By.CSS_SELECTOR, "#messages img"))
    out["code_blocks"] = [e.text for e in D.find_elements(By.CSS_SELECTOR, "#messages .code code")]
    out["markdown"] = markdown_cases(ARGS.get("markdown", []))
    if ARGS.get("shot"):  # as the reply ended (reasoning collapsed), then opened
        shot(ARGS["shot"])
        D.find_element(By.CSS_SELECTOR, "#messages details.reasoning:not([hidden]) summary").click()
        shot(ARGS["shot"].replace(".png", "-open.png"))
    return out


def markdown_cases(cases):
    """The page's renderer on each text: the elements and link targets it made."""
    return D.execute_async_script("""
        const [cases, done] = arguments;
        import('/ui/markdown.js').then((md) => done(cases.map((src) => {
            const t = document.createElement('template');
            t.innerHTML = md.render(src);
            const all = [...t.content.querySelectorAll('*')];
            return {tags: [...new Set(all.map((e) => e.tagName.toLowerCase()))].sort(),
                    attrs: [...new Set(all.flatMap((e) => [...e.attributes].map((a) => a.name)))].sort(),
                    hrefs: all.filter((e) => e.hasAttribute('href')).map((e) => e.getAttribute('href')),
                    text: t.content.textContent};
        }))).catch((e) => done({error: String(e)}));
    """, cases)


def key():
    D.get(BASE + "/")
    out = {"first_error": wait_for("the 401 line", error_line),
           "panel_open": el("key-panel").is_displayed()}
    type_and_send(ARGS["prompt"])
    time.sleep(0.5)
    out["send_error"] = wait_for("the 401 line after sending", error_line)
    out["input_back"] = el("input").get_attribute("value")
    for name, k in (("wrong", ARGS["wrong_key"]), ("right", ARGS["key"])):
        field = el("api-key")
        field.clear()
        field.send_keys(k)
        el("key-save").click()
        time.sleep(1.0)
        out[name] = {"error": error_line(), "model": el("model-name").text,
                     "panel_open": el("key-panel").is_displayed()}
    js("document.getElementById('input').value = ''")
    out["reply"] = turn(ARGS["prompt"])
    return out


def screenshot():
    open_page()
    set_settings(ARGS.get("settings", {}))
    for prompt in ARGS["prompts"]:
        turn(prompt)
    if ARGS.get("open_reasoning"):
        for s in D.find_elements(By.CSS_SELECTOR, "#messages details.reasoning:not([hidden]) summary"):
            s.click()
    time.sleep(0.3)
    D.save_screenshot(ARGS["out"])
    return {"out": ARGS["out"], "reply": last_reply()}


SCENARIOS = {"chat": chat, "stop": stop, "conversations": conversations, "errors": errors,
             "reasoning": reasoning, "key": key, "shot": screenshot}

try:
    result = SCENARIOS[SCENARIO]()
    result["console_errors"] = console()
    print(json.dumps(result))
finally:
    D.quit()
