"""Drives Open WebUI's default chat page in headless Chromium (Selenium with Debian's
chromium-driver), as a person would: type a message, send it, wait for the streamed answer.

    python drive.py UI_URL SCREENSHOT.png

Exits 0 when an assistant answer with text appeared and no error did; prints the answer.
Run by scripts/openwebui/check.sh.
"""

import os
import sys
import time

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

URL, SHOT = sys.argv[1], sys.argv[2]
MESSAGE = "Write one short sentence about the sea."
# A CPU model takes minutes to prefill the ~7k-token prompt of the built-in tools.
TIMEOUT = int(os.environ.get("OWUI_TIMEOUT", "600"))

opts = webdriver.ChromeOptions()
opts.binary_location = "/usr/bin/chromium"
for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
    opts.add_argument(a)
driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path="/usr/bin/chromedriver"), options=opts)


def find(css):
    try:
        return driver.find_elements(By.CSS_SELECTOR, css)
    except WebDriverException:
        return []


def wait_for(what, fn, timeout=TIMEOUT):
    end = time.time() + timeout
    while time.time() < end:
        try:
            v = fn()
        except StaleElementReferenceException:  # the page re-rendered as we read it
            v = None
        if v:
            return v
        time.sleep(0.5)
    driver.save_screenshot(SHOT)
    sys.exit(f"drive.py: timed out waiting for {what} (screenshot {SHOT})")


def errors():
    """Error texts the page shows: toasts and error blocks in the chat."""
    texts = [e.text for e in find("[data-sonner-toast]") if "rror" in e.text or "40" in e.text]
    texts += [e.text for e in find(".chat-assistant [class*='text-red'], .chat-assistant [class*='error']") if e.text]
    return texts


try:
    driver.get(URL)
    box = wait_for("the chat input", lambda: find("#chat-input"))[0]
    time.sleep(2)  # a first-visit dialog (what's new) may open: close it
    driver.find_element(By.TAG_NAME, "body").send_keys(Keys.ESCAPE)
    for b in find("button"):
        if b.text.strip().lower().startswith("okay"):
            b.click()
    box = find("#chat-input")[0]
    box.click()
    box.send_keys(MESSAGE)
    box.send_keys(Keys.ENTER)
    wait_for("an assistant message", lambda: find(".chat-assistant"))

    seen = {"text": None, "since": time.time()}

    def answered():
        """An error, or answer text that has not changed for 5 s (the stream ended)."""
        if errors():
            return True
        texts = [e.text.strip() for e in find(".chat-assistant #response-content-container")]
        text = texts[-1] if texts else ""
        if text != seen["text"]:
            seen.update(text=text, since=time.time())
        return bool(text) and time.time() - seen["since"] > 5

    wait_for("the answer to end", answered)
    time.sleep(1)
    driver.save_screenshot(SHOT)
    errs = errors()
    answer = [e.text.strip() for e in find(".chat-assistant #response-content-container")]
    print("answer:", answer[-1] if answer else None)
    if errs:
        sys.exit(f"drive.py: the page shows an error: {errs}")
    if not answer or not answer[-1]:
        sys.exit("drive.py: no answer text")
    print(f"ok (screenshot {SHOT})")
finally:
    driver.quit()
