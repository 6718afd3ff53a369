"""End to end in a real headless browser (Debian's chromium through chromedriver): the
page refuses a browser that has not signed in, then signs in on the one-time link the
server opens a browser on; create a job from the example, start it, see progress, the
loss chart and a sample image, stop it, resume it to completion, download the LoRA; the
page's Content-Security-Policy is never violated. Screenshots are kept in
test-artifacts/ under pytest's temporary folder (pytest keeps the last three runs':
/tmp/pytest-of-$USER/pytest-N/test-artifacts/), never in the checkout.

The trainer is tests/aitk/paused_run.py: it pauses mid-step until the stop arrives, so
the test never races the trainer's speed."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from aitk_server.app import create_app
from tests.aitk_server.conftest import (
    REPO,
    WAIT_S,
    free_socket,
    no_pause,
    pause_at,
    short_job,
    uvicorn_serving,
    wait_marker,
)

UI = REPO / "ui" / "dist"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = [
    pytest.mark.slow,  # it trains (tests/aitk/paused_run.py)
    pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                       reason="needs Debian's chromium and chromium-driver (.ci/run installs "
                              "them)"),
    pytest.mark.skipif(not (UI / "index.html").exists(),
                       reason="the web UI is not built (python3 -m manager sync builds it)"),
]


@pytest.fixture
def served(settings, tmp_path, example_model) -> Iterator[tuple[str, object]]:
    """The app on an ephemeral 127.0.0.1 port, in this process (the trainer it starts
    is a real child), serving the built front end; with the app, for its sign-in links."""
    from dataclasses import replace

    example = short_job("example_lora", tmp_path / "out", example_model, steps=6)
    (settings.examples_dir / "train_lora_example_cpu.yaml").write_text(yaml.safe_dump(
        example, sort_keys=False))
    sock = free_socket()
    app = create_app(replace(settings, ui_dir=UI, port=sock.getsockname()[1]))
    with uvicorn_serving(app, sock) as url:
        yield url, app


@pytest.fixture
def browser(tmp_path) -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # CSP reports
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--disable-gpu", "--window-size=1400,1100", "--no-first-run",
                "--disable-background-networking", "--disable-component-update"):
        options.add_argument(arg)
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    options.add_experimental_option("prefs", {"download.default_directory": str(downloads),
                                              "download.prompt_for_download": False})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.execute_cdp_cmd("Browser.setDownloadBehavior",
                           {"behavior": "allow", "downloadPath": str(downloads)})
    driver.downloads = downloads
    try:
        yield driver
    finally:
        driver.quit()


def until(driver, condition, what: str):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(
        condition, message=f"waited for {what}")


def text_of(driver, css: str) -> str:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return driver.find_element("css selector", css).text
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


@pytest.fixture
def shoot(tmp_path_factory: pytest.TempPathFactory, browser) -> Callable[[str], Path]:
    """shoot(name) saves a screenshot of the browser's page and returns its path."""
    folder = tmp_path_factory.getbasetemp() / "test-artifacts"
    folder.mkdir(exist_ok=True)

    def save(name: str) -> Path:
        path = folder / f"webui-{name}.png"
        browser.save_screenshot(str(path))
        return path

    return save


def test_create_start_watch_stop_resume_download(served, browser, shoot, settings,
                                                 monkeypatch):
    url, app = served
    driver = browser
    cats = settings.datasets_dir / "cats"
    cats.mkdir()
    shutil.copy(next((REPO / "datasets" / "example").glob("*.png")), cats / "a.png")
    driver.get(url)  # not signed in: the page says how to, and shows nothing else
    until(driver, lambda d: "manager" in text_of(d, "#sign-in"), "the sign-in notice")
    assert not driver.find_elements("css selector", "#datasets")
    # What `python -m aitk_server` does at start: open the browser on a one-time link.
    driver.get(f"{url}auth/{app.state.keys.new_link()}")
    until(driver, lambda d: d.current_url == url, "the page after signing in")
    until(driver, lambda d: d.find_elements("css selector", "#datasets li"), "the datasets")
    driver.find_element("css selector", "#datasets li").click()
    until(driver, lambda d: "1 images · 1 without a caption" in text_of(d, "#audit"),
          "the dataset audit")
    until(driver, lambda d: d.find_elements("css selector", "#create"), "the new-job form")
    until(driver, lambda d: "example_lora" in d.find_element("id", "yaml").get_attribute(
        "value"), "the example's YAML in the editor")
    driver.find_element("id", "job-name").send_keys("browser_lora")
    driver.find_element("id", "create").click()
    until(driver, lambda d: text_of(d, "#job-state") == "created", "the created job")
    assert "browser_lora" in text_of(driver, "#job-detail h2")

    pause_at(monkeypatch, 3)  # mid-step 3: a save and samples at step 2 are on disk
    driver.find_element("id", "start").click()
    wait_marker(settings.data_dir.parent / "markers")
    until(driver, lambda d: text_of(d, "#step") == "2 / 6", "progress at step 2")
    assert text_of(driver, "#job-state") == "running"
    # The step-2 save may still be the phase the page last heard of; it moves on.
    until(driver, lambda d: text_of(d, "#phase") == "training", "the training phase")
    until(driver, lambda d: d.find_elements("css selector", "#loss-chart polyline"),
          "the loss chart")
    until(driver, lambda d: d.execute_script(
        "const i = document.querySelector('img.sample');"
        "return i && i.complete && i.naturalWidth > 0;"), "a sample image")
    shoot("running")

    driver.find_element("id", "stop").click()
    until(driver, lambda d: text_of(d, "#job-state") == "stopped", "the stopped job")

    no_pause(monkeypatch)
    driver.find_element("id", "resume").click()
    until(driver, lambda d: text_of(d, "#job-state") == "finished", "the finished job")
    assert text_of(driver, "#step") == "6 / 6"
    link = until(driver, lambda d: d.find_elements("css selector", "a.lora.final"),
                 "the final LoRA link")[0]
    assert link.text == "browser_lora.safetensors"
    shoot("finished")
    link.click()
    target = driver.downloads / "browser_lora.safetensors"
    until(driver, lambda d: target.exists(), "the downloaded LoRA")
    out = Path(settings.examples_dir.parent / "out" / "browser_lora")
    assert target.read_bytes() == (out / "browser_lora.safetensors").read_bytes()
    refused = [e["message"] for e in driver.get_log("browser")
               if "Content Security Policy" in e["message"]]
    assert refused == []
