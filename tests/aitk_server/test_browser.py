"""End to end in a real headless browser (Debian's chromium through chromedriver): the
page refuses a browser that has not signed in, then signs in on the one-time link the
server opens a browser on; then the newcomer path of issue 26 (test_the_newcomer_path's
docstring); the page's Content-Security-Policy is never violated. Screenshots are kept in
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


def set_field(driver, path: str, value: str) -> None:
    """Type into the form field of a config path, as a user does (select, type, Tab)."""
    from selenium.webdriver.common.keys import Keys

    field = until(driver, lambda d: d.find_elements("name", path), f"the field {path}")[0]
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(value, Keys.TAB)


def field_value(driver, path: str) -> str:
    found = driver.find_elements("name", path)
    return found[0].get_attribute("value") if found else ""


def edit_and_save(driver, fields: dict[str, str]) -> None:
    """View / edit config on a job that is not running, change fields, save."""
    driver.find_element("id", "edit").click()
    until(driver, lambda d: "Edit" in text_of(d, "#job-form h2"), "the job's form")
    for path, value in fields.items():
        set_field(driver, path, value)
        until(driver, lambda d, p=path, v=value: field_value(d, p) == v, f"{path} = {value}")
    until(driver, lambda d: d.find_elements("id", "check-ok"), "the trainer's check")
    driver.find_element("id", "create").click()
    until(driver, lambda d: d.find_elements("id", "job-detail"), "the job again")


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from aitk.caption.tiny import build_tiny_vlm

    return build_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny vlm")


def test_the_newcomer_path(served, browser, shoot, settings, monkeypatch, tiny_vlm):
    """Sign in, make a dataset, upload pictures, caption them (a tiny VLM), edit a
    caption, make a job with the form (steps and rank changed there, seen in the YAML
    view), start it, watch the
    progress, stop, edit the config while stopped, resume, sample now, view previews
    across steps, stop, resume to the end, download the LoRA."""
    url, app = served
    driver = browser
    pictures = sorted((REPO / "datasets" / "example").glob("*.png"))[:3]
    driver.get(url)  # not signed in: the page says how to, and shows nothing else
    until(driver, lambda d: "manager" in text_of(d, "#sign-in"), "the sign-in notice")
    assert not driver.find_elements("css selector", "#nav-datasets")
    # What `python -m aitk_server` does at start: open the browser on a one-time link.
    driver.get(f"{url}auth/{app.state.keys.new_link()}")
    until(driver, lambda d: d.current_url == url, "the page after signing in")

    # A dataset of three pictures, one caption written in the page.
    until(driver, lambda d: d.find_elements("id", "nav-datasets"), "the header")[0].click()
    driver.find_element("id", "dataset-name").send_keys("cats")
    driver.find_element("id", "create-dataset").click()
    until(driver, lambda d: d.find_elements("id", "drop"), "the new dataset")
    driver.find_element("id", "upload").send_keys("\n".join(str(p) for p in pictures))
    until(driver, lambda d: len(d.find_elements("css selector", ".tile img.thumb")) == 3,
          "three thumbnails")
    until(driver, lambda d: "3 images · 3 without a caption" in text_of(d, "#audit"),
          "the audit of the upload")
    # Caption them all with a vision-language model (a tiny random one: noise words).
    driver.find_element("css selector", "#captioning summary").click()
    driver.find_element("id", "caption-model").send_keys(str(tiny_vlm))
    driver.find_element("id", "caption-trigger").send_keys("p1xel")
    driver.find_element("id", "caption-start").click()
    until(driver, lambda d: "finished: 3 / 3" in text_of(d, "#caption-progress"),
          "the captioning run")
    until(driver, lambda d: "0 without a caption" in text_of(d, "#audit"), "all captioned")
    cats = settings.datasets_dir / "cats"
    first = pictures[0].name
    assert (cats / first).with_suffix(".txt").read_text().startswith("p1xel")
    # Then one caption edited in place.
    from selenium.webdriver.common.keys import Keys

    caption = until(driver, lambda d: [c for c in d.find_elements(
        "name", f"caption:{first}") if c.get_attribute("value").startswith("p1xel")],
        "the written caption in its box")[0]
    caption.send_keys(Keys.CONTROL, "a")
    caption.send_keys("[trigger] a small picture")
    driver.find_element("id", "dataset-name").click()  # leaving the box saves it
    until(driver, lambda d: (cats / first).with_suffix(".txt").read_text() ==
          "[trigger] a small picture", "the edited caption on disk")
    shoot("dataset")

    # The job form: the example arch, steps and rank changed in the form.
    driver.find_element("id", "nav-jobs").click()
    until(driver, lambda d: d.find_elements("id", "job-form"), "the job form")
    until(driver, lambda d: field_value(d, "config.name") == "example_lora",
          "the CPU example in the form")
    assert field_value(driver, "config.process[0].model.arch") == "example"
    set_field(driver, "config.name", "browser_lora")
    until(driver, lambda d: field_value(d, "config.name") == "browser_lora", "the name")
    set_field(driver, "config.process[0].datasets[0].folder_path", str(cats))
    set_field(driver, "config.process[0].train.steps", "8")
    set_field(driver, "config.process[0].network.linear", "8")
    until(driver, lambda d: field_value(d, "config.process[0].network.linear") == "8",
          "the rank")
    until(driver, lambda d: d.find_elements("id", "check-ok"), "the trainer's check")
    # The memory forecast of the check, beside the memory choices (README).
    forecast = until(driver, lambda d: d.find_elements("id", "memory"), "the forecast")[0]
    assert forecast.get_attribute("textContent").startswith(("Fits", "Does not fit"))
    shoot("form")
    driver.find_element("id", "yaml-tab").click()
    text = until(driver, lambda d: d.find_element("id", "yaml").get_attribute("value"),
                 "the YAML view")
    data = yaml.safe_load(text)["config"]
    proc = data["process"][0]
    assert (data["name"], proc["train"]["steps"], proc["network"]["linear"]) == (
        "browser_lora", 8, 8)
    assert proc["datasets"][0]["folder_path"] == str(cats)
    driver.find_element("id", "form-tab").click()
    driver.find_element("id", "create").click()
    until(driver, lambda d: text_of(d, "#job-state") == "created", "the created job")
    assert "browser_lora" in text_of(driver, "#job-detail h2")

    # Start: a phase at once, then progress (the trainer waits mid-step 3).
    pause_at(monkeypatch, 3)  # mid-step 3: the step-2 save and previews are on disk
    driver.find_element("id", "start").click()
    until(driver, lambda d: text_of(d, "#phase-text") != "", "a phase at once")
    wait_marker(settings.data_dir.parent / "markers")
    until(driver, lambda d: text_of(d, "#step") == "2 / 8", "progress at step 2")
    assert text_of(driver, "#job-state") == "running"
    until(driver, lambda d: text_of(d, "#phase") == "training", "the training phase")
    until(driver, lambda d: d.find_elements("css selector", "#loss-chart polyline"),
          "the loss chart")
    shoot("running")
    driver.find_element("id", "stop").click()
    until(driver, lambda d: text_of(d, "#job-state") == "stopped", "the stopped job")

    # Edited while stopped (through the same form): longer, previews only when asked.
    edit_and_save(driver, {"config.process[0].train.steps": "400",
                           "config.process[0].sample.sample_every": "1000"})
    no_pause(monkeypatch)
    driver.find_element("id", "resume").click()
    until(driver, lambda d: int(text_of(d, "#step").split(" /")[0] or 0) >= 5,
          "the resumed run training")
    driver.find_element("id", "sample-now").click()
    samples = settings.examples_dir.parent / "out" / "browser_lora" / "samples"
    asked = until(driver, lambda d: [p for p in samples.glob("*_0.png")
                                     if int(p.name[:9]) >= 5], "the preview asked for")
    asked_step = int(asked[0].name[:9])
    driver.find_element("id", "stop").click()
    until(driver, lambda d: text_of(d, "#job-state") == "stopped", "stopped again")
    stopped_at = int(text_of(driver, "#step").split(" /")[0])
    assert asked_step <= stopped_at

    # Finish soon: two more steps.
    edit_and_save(driver, {"config.process[0].train.steps": str(stopped_at + 2)})
    driver.find_element("id", "resume").click()
    until(driver, lambda d: text_of(d, "#job-state") == "finished", "the finished job")
    assert text_of(driver, "#step") == f"{stopped_at + 2} / {stopped_at + 2}"
    assert text_of(driver, "#speed") == "–" and text_of(driver, "#eta") == "–"
    # Previews across steps: the slider moves between them, the prompt is shown.
    until(driver, lambda d: d.find_elements("css selector", "#previews input.steps"),
          "a step slider")
    figure = driver.find_element("css selector", "#previews figure")
    assert "p1xel a red circle" in figure.text and "seed" in figure.text
    last = figure.find_element("css selector", ".shown-step").text
    driver.execute_script(
        "const r = arguments[0]; const set = Object.getOwnPropertyDescriptor("
        "HTMLInputElement.prototype, 'value').set; set.call(r, 0);"
        "r.dispatchEvent(new Event('input', {bubbles: true}));",
        figure.find_element("css selector", "input.steps"))
    until(driver, lambda d: figure.find_element("css selector", ".shown-step").text != last,
          "an earlier step's preview")
    figure.find_element("css selector", "img.sample").click()
    until(driver, lambda d: d.find_elements("id", "lightbox"), "the full-size preview")
    driver.find_element("id", "lightbox").click()
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
