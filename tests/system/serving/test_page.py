"""The page at `/` in a real browser: headless chromium types a German sentence, reads the English, and shows errors.

The model (`de_en_run`, in shared_fixtures.py) is a tiny de->en Transformer trained for a few hundred updates
on the first 3,000 Multi30k pairs (about 20 s on one CPU core): enough to translate a short training-like sentence
such as "Ein Hund rennt am Strand." into "A dog ... beach." with any seed tried.
The browser is Debian's `chromium` with its `chromedriver` (`make browser` installs both).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import serving

from mtkit.decoding.translator import Translator
from mtkit.serving.app import ServeLimits

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
GERMAN = "Ein Hund rennt am Strand."
WAIT_S = 60


@pytest.fixture(scope="module")
def translator(de_en_run) -> Translator:
    return Translator.load(de_en_run.run_path, device="cpu")


@pytest.fixture(scope="module")
def browser():
    """Headless chromium through the system chromedriver; skipped (failed under CI) when either is missing."""
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.exists()]
    if missing:
        message = f"{' and '.join(missing)} missing: `make browser` installs Debian's chromium and chromium-driver (as root)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; under CI `make test` should have installed them")
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    try:
        yield driver
    finally:
        driver.quit()


def text_of(driver, element_id: str) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id).text


def open_page_and_translate(driver, url: str, text: str) -> None:
    """Load the page, wait until it has described the model, type `text` and press Translate."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url + "/")
    WebDriverWait(driver, WAIT_S).until(lambda d: "engine" in text_of(d, "info"))
    source = driver.find_element(By.ID, "source")
    source.clear()
    source.send_keys(text)
    driver.find_element(By.ID, "translate").click()


def test_the_page_translates_a_german_sentence_into_english(browser, translator, de_en_run):
    from selenium.webdriver.support.ui import WebDriverWait

    with serving(translator, ServeLimits(), str(de_en_run.run_path)) as (port, _):
        url = f"http://127.0.0.1:{port}"
        open_page_and_translate(browser, url, GERMAN)
        WebDriverWait(browser, WAIT_S).until(lambda d: text_of(d, "result") or text_of(d, "error"))
        info, result, error = text_of(browser, "info"), text_of(browser, "result"), text_of(browser, "error")
    assert error == ""
    assert info.startswith("de → en: transformer") and "pytorch engine" in info
    assert result == translator.translate([GERMAN])[0]  # the page shows what the model says...
    assert result.startswith("A dog") and "beach" in result  # ...and the model says it in English


def test_an_error_from_the_server_shows_on_the_page(browser, translator, de_en_run):
    from selenium.webdriver.support.ui import WebDriverWait

    with serving(translator, ServeLimits(max_lines=1), str(de_en_run.run_path)) as (port, _):
        url = f"http://127.0.0.1:{port}"
        open_page_and_translate(browser, url, f"{GERMAN}\nEin Mann sitzt auf einem Stein.")
        WebDriverWait(browser, WAIT_S).until(lambda d: text_of(d, "error"))
        error, result = text_of(browser, "error"), text_of(browser, "result")
    assert error == "Error: 2 sentences in one request; the limit is 1"
    assert result == ""


def test_a_multilingual_model_gets_a_menu_of_target_languages(browser, tagged_run):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    with serving(Translator.load(tagged_run.run_path, device="cpu"), ServeLimits(), "tagged") as (port, _):
        browser.get(f"http://127.0.0.1:{port}/")
        WebDriverWait(browser, WAIT_S).until(lambda d: "engine" in text_of(d, "info"))
        menu = Select(browser.find_element(By.ID, "tgt_lang"))
        assert [option.text for option in menu.options] == ["cp", "rv"]
        assert browser.find_element(By.ID, "tgt_lang").is_displayed()
        menu.select_by_visible_text("rv")
        source = browser.find_element(By.ID, "source")
        source.clear()
        source.send_keys("a b c")
        browser.find_element(By.ID, "translate").click()
        WebDriverWait(browser, WAIT_S).until(lambda d: text_of(d, "result") or text_of(d, "error"))
        info, result, error = text_of(browser, "info"), text_of(browser, "result"), text_of(browser, "error")
    assert error == "" and result == "c b a"
    assert info.startswith("multilingual → cp, rv")
