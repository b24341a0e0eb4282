"""A public demo shared by two visitors, each in their own real browser (two chromium contexts: two sets of
browser storage, as two people's laptops): B cannot stop A's run, A's Stop works, and B's Start is queued and starts
by itself when A's run ends. An upload is its visitor's alone, and the owner key is remembered only when asked."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
import time
from pathlib import Path

import gradio as gr
import pytest
from playwright import sync_api

from dragon_ui import public
from dragon_ui.ui import build_app
from dragon_ui.ui.app import DRAFT_STORAGE_KEY, OWNER_KEY_STORAGE_KEY, VISITOR_STORAGE_KEY
from conftest import stop_the_training
from test_app_client import served_app
from test_browser import (CHROMIUM, CHROMIUM_ARGS, VIEWPORT, open_tab, screenshot, type_into, wait_until_loaded,
                          write_recipe)

expect = sync_api.expect
pytestmark = [pytest.mark.timeout(300), pytest.mark.browser]
WAIT_MS = 60_000
OWNER_KEY = "the-owners-key"


@pytest.fixture
def public_studio(monkeypatch, tmp_path, tiny_model_dir, runs_dir, training_processes):
    monkeypatch.setenv(public.PUBLIC_ENV, "1")
    monkeypatch.setenv(public.MODELS_ENV, str(tiny_model_dir))
    monkeypatch.setenv(public.OWNER_KEY_ENV, OWNER_KEY)  # the instructor's, unlocking every run
    monkeypatch.delenv(public.CLASS_CODE_ENV, raising=False)  # a class is opened on the owner panel
    from dragon_ui.studio.backend import Studio

    # The arithmetic recipe on the tiny model, with nothing a public demo refuses, long enough to be stopped.
    recipes = write_recipe(tmp_path / "recipes", tiny_model_dir, custom_reward=False, max_steps=5000)
    studio = Studio(runs_dir=runs_dir, recipes_dir=recipes, policy=public.Policy.from_env(runs_dir),
                    workers=training_processes(public=True))
    scheduler = studio.runs.start_queue()
    yield studio
    scheduler.stop()
    stop_the_training()


def need_chromium() -> None:
    if not CHROMIUM.exists():
        message = "Debian's chromium is needed for the browser test: sudo apt-get install chromium"
        pytest.fail(message) if os.environ.get("CI") else pytest.skip(message)


@contextlib.contextmanager
def people(demo: gr.Blocks, count: int) -> Iterator[list]:
    """``count`` people's pages on ``demo``, served: a chromium context each (their own browser storage, as two
    laptops), each page opened and its data shown."""
    need_chromium()
    with served_app(demo) as url, sync_api.sync_playwright() as playwright:
        expect.set_options(timeout=WAIT_MS)
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            pages = [browser.new_context(viewport=VIEWPORT).new_page() for _ in range(count)]
            for page in pages:
                page.set_default_timeout(WAIT_MS)
                page.goto(url)
                wait_until_loaded(page)
            yield pages
        finally:
            browser.close()


def test_two_visitors_own_their_runs_and_take_turns(public_studio, tmp_path):
    demo = build_app(public_studio)
    with people(demo, 2) as (alice, bob):
        expect(alice.locator("#public-notice")).to_contain_text("your runs are yours")

        # Alice starts a run; it trains.
        open_tab(alice, "model")
        alice.locator("#model-start").click()
        expect(alice.locator("#train-status")).to_contain_text("running")
        (alices_run,) = public_studio.runs.summaries()

        # A browser that kept its token but not its draft (one closed before the draft was written) waits for its
        # load before it may act: what it did before would be done as a visitor of its own, not as its token's.
        bob.evaluate(f"() => localStorage.removeItem({json.dumps(DRAFT_STORAGE_KEY)})")
        bobs_load = HeldPageLoad(bob, demo)
        bob.reload()
        bobs_load.wait(bob)
        bob.locator("#load-recipe").click()  # a recipe loaded meanwhile does not show the form early either
        expect(bob.locator("#recipe-status")).to_contain_text("Loaded the")
        expect(bob.locator("#form-opening")).to_be_visible()
        expect(bob.locator("#form-area")).to_be_hidden()
        assert bobs_load.release() == 1
        # Bob sees it, read-only: his Stop stays greyed out, and the list says whose it is.
        wait_until_loaded(bob)
        open_tab(bob, "train")
        expect(bob.locator("#train-status")).to_contain_text(alices_run["id"])
        expect(bob.locator("#train-status")).to_contain_text("running")
        expect(bob.locator("#train-stop")).to_be_disabled()
        bob.get_by_text("Past runs").click()
        expect(bob.locator("#train-runs")).to_contain_text("another visitor's")

        # Bob's Start does not fail: his run waits its turn.
        open_tab(bob, "model")
        bob.locator("#model-start").click()
        expect(bob.locator("#train-status")).to_contain_text("Waiting in the queue: 1st in line")
        screenshot(bob, tmp_path, "public-bob-queued")
        bobs_run = next(run for run in public_studio.runs.summaries() if run["id"] != alices_run["id"])
        assert bobs_run["waiting"] == "start" and bobs_run["owner"] != alices_run["owner"]

        # Alice stops hers (Stop is hers to press); Bob's run then starts by itself.
        expect(alice.locator("#train-stop")).to_be_enabled()
        alice.locator("#train-stop").click()
        expect(alice.locator("#train-action")).to_contain_text("Stopping: the step under way ends at once")
        expect(alice.locator("#train-status")).to_contain_text("stopped — can resume")
        expect(bob.locator("#train-status")).to_contain_text("running", timeout=90_000)
        expect(bob.locator("#train-stop")).to_be_enabled()
        screenshot(bob, tmp_path, "public-bob-running")
        bob.locator("#train-stop").click()
        expect(bob.locator("#train-status")).to_contain_text("stopped — can resume")


class HeldPageLoad:
    """Holds the page's load event (the one that brings its browser's token) until ``release``; its other events
    go through."""

    def __init__(self, page, demo: gr.Blocks) -> None:
        self.fn_index = next(index for index, fn in demo.fns.items() if fn.name == "on_page_load")
        self.held: list | None = []  # None: nothing is held (set it to a list to hold the next load)
        page.route("**/queue/join*", self._hold)

    def _hold(self, route) -> None:
        if self.held is not None and json.loads(route.request.post_data or "{}").get("fn_index") == self.fn_index:
            self.held.append(route)
        else:
            route.continue_()

    def wait(self, page) -> None:
        """Until the page has sent its load (and it is held)."""
        deadline = time.monotonic() + WAIT_MS / 1000
        while not self.held and time.monotonic() < deadline:
            page.wait_for_timeout(20)  # lets playwright hand the page's requests to _hold

    def release(self) -> int:
        held, self.held = self.held, None
        for route in held:
            route.continue_()
        return len(held)


def test_an_upload_is_its_visitors_alone_and_the_owner_key_is_kept_only_when_asked(public_studio, tmp_path):
    """In a real browser: an uploaded file becomes a source in the visitor's own folder (gradio's copy is gone) and
    is previewed, even when it is sent before the page's load (which tells the browser's visitor) is answered: it
    stays this browser's after the load and after a reload (the chance failure: the load, answered just after the
    upload, made the page another visitor, to whom the file was not theirs). The owner panel unlocks this page, and
    the browser remembers the key only when asked to."""
    from conftest import write_arithmetic_csv

    need_chromium()
    reviews = write_arithmetic_csv(tmp_path / "my-sums.csv", rows=40)
    demo = build_app(public_studio)
    with served_app(demo) as url, sync_api.sync_playwright() as playwright:
        expect.set_options(timeout=WAIT_MS)
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_context(viewport=VIEWPORT).new_page()
            page.set_default_timeout(WAIT_MS)
            load = HeldPageLoad(page, demo)
            page.goto(url)
            wait_until_loaded(page)  # the first paint: a new browser may act at once
            load.wait(page)
            page.locator("#data-upload input[type=file]").set_input_files(str(reviews))
            expect(page.locator("#data-counts")).to_contain_text("40 rows")
            assert load.release() == 1, "the page's load was held while the upload was answered"
            page.wait_for_function(f"() => localStorage.getItem({json.dumps(VISITOR_STORAGE_KEY)}) !== null")
            type_into(page, "#data-max-rows input", "30")
            page.locator("#data-max-rows input").press("Enter")  # read again, as the visitor the load made the page
            expect(page.locator("#data-counts")).to_contain_text("30 rows")
            source = page.locator("#data-source textarea").input_value()
            assert source == "uploads/my-sums.csv"  # not where the server keeps it
            assert not list(Path(os.environ.get("GRADIO_TEMP_DIR", "/tmp/gradio")).rglob("my-sums.csv"))
            screenshot(page, tmp_path, "public-upload")

            page.get_by_text("Owner of this demo?").click()
            page.locator("#owner-key input").fill(OWNER_KEY)
            page.locator("#owner-unlock").click()
            expect(page.locator("#owner-status")).to_contain_text("Unlocked: this page (until it is closed)")
            screenshot(page, tmp_path, "public-owner")
            load.held = []
            page.reload()  # the page's unlocking ends with it: nothing was kept; the upload is still this browser's
            # A browser that kept its token waits for its load before it may act (it acts as the token's visitor).
            load.wait(page)
            expect(page.locator("#form-opening")).to_be_visible()
            expect(page.locator("#form-area")).to_be_hidden()
            assert load.release() == 1
            expect(page.locator("#data-counts")).to_contain_text("30 rows")
            expect(page.locator("#data-source-status")).not_to_contain_text("upload")
            assert not page.evaluate(f"() => localStorage.getItem('{OWNER_KEY_STORAGE_KEY}')")
            page.get_by_text("Owner of this demo?").click()
            page.locator("#owner-remember input").check()
            page.locator("#owner-key input").fill(OWNER_KEY)
            page.locator("#owner-unlock").click()
            expect(page.locator("#owner-status")).to_contain_text("Unlocked: this browser can stop")
            # Kept now, encoded with the key every page gets: readable by whoever uses this browser, as promised.
            assert page.evaluate(f"() => localStorage.getItem('{OWNER_KEY_STORAGE_KEY}')")
        finally:
            browser.close()
