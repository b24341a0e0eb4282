"""First contact, in a real browser: the page takes input only once its settings are in it, the prompt is a
multi-line template previewed as it is typed, Start is offered only for settings that work, an uploaded spreadsheet
says which file and sheet it is, the recipe picker lets go of a recipe the data no longer is, and a second page
opens saying that a run trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from playwright import sync_api
from test_browser import (CHROMIUM, CHROMIUM_ARGS, VIEWPORT, WAIT_MS, open_tab, page, recipes_dir,  # noqa: F401
                          started_config, studio, type_into, wait_until_loaded)

from conftest import stop_the_training
from dragon_ui.ui.app import DRAFT_STORAGE_KEY, OWN_SETTINGS, VISITOR_STORAGE_KEY

expect = sync_api.expect
pytestmark = [pytest.mark.timeout(300), pytest.mark.browser]


def test_the_page_takes_input_only_once_its_settings_are_in_it(page, studio):
    """The issue: typing into Max steps within a second of the page appearing was overwritten by the settings
    arriving after it. The form now appears with its settings in it, and Start waits for their check."""
    page.reload()
    expect(page.locator("#tab-data-button")).to_be_visible()  # the moment the form appears...
    assert page.locator("#data-source textarea").input_value().endswith("arithmetic.csv")  # ...it holds its data
    open_tab(page, "model")
    type_into(page, "#model-training-max-steps input", "7")
    type_into(page, "#model-training-learning-rate input", "0.02")
    expect(page.locator("#model-start")).to_be_enabled()
    page.locator("#model-start").click()
    config = started_config(studio)
    assert config["training"]["max_steps"] == 7 and config["training"]["learning_rate"] == 0.02
    expect(page.locator("#train-status")).not_to_contain_text("No run to show yet")


def test_a_multi_line_prompt_is_previewed_as_it_is_typed_and_start_waits_for_working_settings(page, studio):
    wait_until_loaded(page)
    prompt = page.locator("#data-prompt textarea")
    prompt.click()
    prompt.press("ControlOrMeta+a")
    prompt.press_sequentially("Q: {question}")
    prompt.press("Enter")  # a new line, not the end of the field
    prompt.press_sequentially("Answer with a number.")
    # Previewed while typing: no Enter, no leaving the field.
    expect(page.locator("#data-rendered")).to_contain_text("Q: What is 66 + 24? Reply with just the number.")
    expect(page.locator("#data-rendered")).to_contain_text("Answer with a number.")

    open_tab(page, "rewards")
    for _ in range(3):  # every reward removed: nothing to train on
        page.locator("#rewards-remove").click()
    expect(page.locator("#rewards-problem")).to_contain_text("Add at least one reward")
    open_tab(page, "model")
    expect(page.locator("#model-start")).to_be_disabled()
    expect(page.locator("#model-check")).to_contain_text("Rewards")
    expect(page.locator("#model-check")).not_to_contain_text("rewards must be a non-empty list")

    open_tab(page, "rewards")
    page.locator("#rewards-add").click()  # a numeric reward again
    open_tab(page, "model")
    expect(page.locator("#model-start")).to_be_enabled()
    page.locator("#model-start").click()
    assert started_config(studio)["data"]["prompt"] == "Q: {question}\nAnswer with a number."


def test_an_uploaded_spreadsheet_says_which_file_and_sheet_and_the_recipe_lets_go(page, studio, tmp_path):
    from openpyxl import Workbook

    book = Workbook()
    book.active.title = "Reviews"
    book.active.append(["review", "label"])
    for number in range(30):
        book.active.append([f"Review {number}: {'great' if number % 2 else 'awful'}.", "pos" if number % 2 else "neg"])
    book.create_sheet("Notes").append(["nothing"])
    book.save(tmp_path / "reviews.xlsx")

    wait_until_loaded(page)
    page.locator("#data-upload input[type=file]").set_input_files(str(tmp_path / "reviews.xlsx"))
    expect(page.locator("#data-source-status")).to_contain_text("Your file reviews.xlsx, sheet 'Reviews'")
    expect(page.locator("#data-sheet input")).to_have_value("Reviews")
    expect(page.locator("#data-counts")).to_contain_text("30 rows")
    expect(page.locator("#recipe input")).to_have_value(OWN_SETTINGS)  # no recipe is what the form shows now


def test_a_second_page_opens_saying_that_a_run_trains(page, studio, tmp_path):
    wait_until_loaded(page)
    open_tab(page, "model")
    expect(page.locator("#model-start")).to_be_enabled()
    page.locator("#model-start").click()
    expect(page.locator("#train-status")).to_contain_text("running")
    (run,) = studio.runs.summaries()
    second = page.context.browser.new_page(viewport=VIEWPORT)
    second.set_default_timeout(WAIT_MS)
    second.goto(page.url)
    expect(second.locator("#running-banner-text")).to_contain_text(f"A run is training: {run['id']}")
    second.locator("#running-banner-open").click()
    expect(second.locator("#train-status")).to_contain_text(run["id"])
    expect(second.locator("#running-banner")).to_be_hidden()
    stop_the_training()
    assert json.loads((Path(run["dir"]) / "config.json").read_text())["name"]


def test_a_page_whose_previews_are_slow_keeps_every_setting_across_a_reload(page, studio, monkeypatch):
    """While the app imports its libraries (its first seconds), a page's previews wait for them. When the tabs were
    filled, and the form shown, in one answer, the reference field's stored value went empty while it still showed
    the column, and the draft the browser keeps lost it: after a reload, the run had no reference answers. (The tabs
    are filled in one answer again; the form is shown by a step in the page after it.)"""
    import time as clock

    from dragon_ui.ui import data_tab, model_tab

    def slowly(function):
        def slow(*args, **kwargs):
            clock.sleep(2)
            return function(*args, **kwargs)

        return slow

    monkeypatch.setattr(data_tab, "show_preview", slowly(data_tab.show_preview))
    monkeypatch.setattr(model_tab, "build_preview", slowly(model_tab.build_preview))
    page.reload()
    wait_until_loaded(page)
    expect(page.locator("#data-reference input")).to_have_value("answer")
    page.wait_for_timeout(3000)  # the watchers' answers, and the draft the browser keeps, settle
    page.reload()
    wait_until_loaded(page)
    expect(page.locator("#data-reference input")).to_have_value("answer")
    open_tab(page, "model")
    page.get_by_text("The whole configuration (YAML)").click()
    expect(page.locator("#model-yaml")).to_contain_text("reference: answer")


class HeldEvents:
    """Holds every event a page sends to the server (its queue joins) until ``release``."""

    def __init__(self, page) -> None:
        self.held: list | None = []
        page.route("**/queue/join*", self._hold)

    def _hold(self, route) -> None:
        if self.held is None:
            route.continue_()
        else:
            self.held.append(route)

    def release(self) -> int:
        """Let the held events through, and every later one; how many were held."""
        held, self.held = self.held, None
        for route in held:
            route.continue_()
        return len(held)


def test_the_first_paint_shows_the_settings_before_the_server_has_answered_anything(page):
    """The issue: a page opened as the app started showed its data preview 4.5 s later, after the page's load event
    and the preview's (which waits for the tokenizer) were answered. A browser that kept no draft now paints the
    form with the recipe, its table and its counts at once; what is typed before the load is answered stays. A
    browser that kept a draft shows "Opening…" until the draft is in (else its fields would show another one)."""
    context = page.context.browser.new_context(viewport=VIEWPORT)  # a browser that kept nothing
    try:
        fresh = context.new_page()
        fresh.set_default_timeout(WAIT_MS)
        events = HeldEvents(fresh)
        fresh.goto(page.url)
        expect(fresh.locator("#form-area")).to_be_visible()
        expect(fresh.locator("#form-opening")).to_be_hidden()
        assert fresh.locator("#data-source textarea").input_value().endswith("arithmetic.csv")
        expect(fresh.locator("#data-preview")).to_contain_text("What is 66 + 24? Reply with just the number.")
        expect(fresh.locator("#data-counts")).to_contain_text("400 rows: 380 for training, 20 held out")
        open_tab(fresh, "rewards")
        expect(fresh.locator("#rewards-table")).to_contain_text("numeric")
        expect(fresh.locator("#rewards-row-text")).to_contain_text("What is 66 + 24?")
        open_tab(fresh, "data")
        type_into(fresh, "#data-prompt textarea", "Q: {question}")
        assert events.release(), "the page's load event was sent (and held)"
        fresh.wait_for_function(f"() => localStorage.getItem({json.dumps(VISITOR_STORAGE_KEY)}) !== null")
        # The load has answered (the visitor's token is its), and the preview after it shows the typed prompt.
        expect(fresh.locator("#data-rendered")).to_contain_text("Q: What is 66 + 24?")
        expect(fresh.locator("#data-prompt textarea")).to_have_value("Q: {question}")
        fresh.wait_for_function(f"() => localStorage.getItem({json.dumps(DRAFT_STORAGE_KEY)}) !== null")

        kept = context.new_page()  # the same browser: it kept the edited draft
        kept.set_default_timeout(WAIT_MS)
        events = HeldEvents(kept)
        kept.goto(page.url)
        expect(kept.locator("#form-opening")).to_contain_text("Opening your settings")
        kept.wait_for_timeout(500)  # the page's own steps have run: they keep the form hidden
        assert kept.locator("#form-opening").is_visible() and not kept.locator("#form-area").is_visible()
        events.release()
        expect(kept.locator("#form-area")).to_be_visible()
        expect(kept.locator("#data-prompt textarea")).to_have_value("Q: {question}")
    finally:
        context.close()
