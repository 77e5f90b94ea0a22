"""A real browser for the page tests: Debian's headless ``chromium`` driven by
Selenium through Debian's ``chromium-driver`` (``tests/run_all.sh`` installs
both where it can). Nothing is fetched: the binaries are the system's, and
Selenium Manager is never asked to download one.
"""

import os
import shutil

import pytest

CHROMIUM = os.environ.get("KT_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("KT_CHROMEDRIVER", "/usr/bin/chromedriver")


def chromium():
    """A headless chromium (a Selenium ``WebDriver``); ``quit()`` it."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    missing = [path for path in (CHROMIUM, CHROMEDRIVER) if not shutil.which(path)]
    if missing:
        pytest.fail(
            f"no {' or '.join(missing)}: install Debian's chromium and "
            "chromium-driver (apt-get install chromium chromium-driver; "
            "tests/run_all.sh does it as root)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # root in a container has no user namespaces
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1100,1300",
    ):
        options.add_argument(argument)
    return webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))


def translate_on_page(driver, url, text, key=None, timeout=120):
    """Opens the page at ``url``, types ``text`` (and the API key, if
    given), clicks Translate and waits for the answer or an error.

    Returns ``(translation, error)``: the text of ``#translation`` and of
    ``#error``.
    """
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(url)
    wait = WebDriverWait(driver, timeout)
    # The beam sizes arrive from GET /health: the page is ready.
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#beam option"))
    if key is not None:
        field = driver.find_element(By.ID, "api-key")
        field.clear()
        field.send_keys(key)
    driver.find_element(By.ID, "source").send_keys(text)
    driver.find_element(By.ID, "translate").click()
    wait.until(
        lambda d: (
            d.find_element(By.ID, "translation").text
            or d.find_element(By.ID, "error").text
        )
    )
    return (
        driver.find_element(By.ID, "translation").text,
        driver.find_element(By.ID, "error").text,
    )


def wait_for(driver, script, timeout=60):
    """The first true value ``script`` (JavaScript) returns."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(lambda d: d.execute_script(script))


def heat_map_shape(driver):
    """``(rows, columns per row, row labels, column labels)`` of the heat
    map as the browser shows it."""
    from selenium.webdriver.common.by import By

    rows = driver.find_elements(By.CSS_SELECTOR, "#heat-map tbody tr")
    columns = [len(row.find_elements(By.TAG_NAME, "td")) for row in rows]
    row_labels = [row.find_element(By.TAG_NAME, "th").text for row in rows]
    column_labels = [
        th.get_attribute("textContent")
        for th in driver.find_elements(By.CSS_SELECTOR, "#heat-map thead th")[1:]
    ]
    return len(rows), columns, row_labels, column_labels


def cell_weights(driver):
    """The heat map's weights, row by row, as the page computed them."""
    from selenium.webdriver.common.by import By

    return [
        [
            float(td.get_attribute("data-weight"))
            for td in row.find_elements(By.TAG_NAME, "td")
        ]
        for row in driver.find_elements(By.CSS_SELECTOR, "#heat-map tbody tr")
    ]


def screenshot(driver, folder, name):
    """Saves a PNG of the page in ``folder`` (the test's output folder)."""
    return screenshot_to(driver, os.path.join(folder, f"{name}.png"))


def screenshot_to(driver, path):
    """Saves a PNG of the browser's window at ``path``."""
    if not driver.save_screenshot(os.fspath(path)):
        raise OSError(f"chromium wrote no screenshot at {path}")
    return path
