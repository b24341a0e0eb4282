"""The Experiments tab in a real browser: the leaderboard sorts and filters, two runs are drawn over each other with
the settings that differ between them, and the CSV downloads."""

from __future__ import annotations

import csv

import pytest
from playwright import sync_api
from test_browser import open_tab, page, recipes_dir, screenshot, screenshots, studio, wait_until_loaded  # noqa: F401
from test_experiments import three_runs  # noqa: F401

expect = sync_api.expect
pytestmark = [pytest.mark.timeout(300), pytest.mark.browser]


ROWS = "#experiments-leaderboard .virtual-row"  # gradio's Dataframe draws its body rows as these (virtual scrolling)


def leaderboard_runs(page) -> list[str]:
    """The Run column as the table shows it, top to bottom."""
    return [row.locator("[role=gridcell]").first.inner_text().strip() for row in page.locator(ROWS).all()]


def test_runs_are_ranked_filtered_drawn_together_and_exported(page, studio, three_runs, screenshots):
    wait_until_loaded(page)
    open_tab(page, "experiments")
    best, first, running = "20261201-110000-stronger", "20261201-100000-tiny", "20261201-120000-tiny"
    expect(page.locator("#experiments-leaderboard")).to_contain_text(best)
    assert leaderboard_runs(page) == [best, first, running]  # best held-out reward after first

    rank_by = page.locator("#experiments-rank-by input")
    rank_by.click()
    page.get_by_role("option", name="numeric", exact=True).click()  # the one reward both finished runs were scored on
    expect(page.locator("#experiments-leaderboard thead")).to_contain_text("numeric after")
    expect(page.locator(ROWS).first).to_contain_text(first)
    assert leaderboard_runs(page) == [first, best, running]
    screenshot(page, screenshots, "experiments-rank-by")
    rank_by.click()
    page.get_by_role("option", name="held-out total").click()
    expect(page.locator("#experiments-leaderboard thead")).to_contain_text("Held-out after")
    expect(page.locator(ROWS).first).to_contain_text(best)

    minutes = page.locator("#experiments-leaderboard thead th", has_text="Minutes").first
    minutes.hover()
    minutes.locator("button.cell-menu-button").click()  # a column's menu sorts by it
    page.get_by_role("menuitem", name="Sort ascending").click()
    expect(page.locator(ROWS).first).to_contain_text(running)
    assert leaderboard_runs(page) == [running, best, first]  # 0.8, 1.0, 2.0 minutes: as numbers

    page.locator("#experiments-filter textarea").fill("stronger")
    expect(page.locator(ROWS)).to_have_count(1)
    page.locator("#experiments-filter textarea").fill("")
    expect(page.locator(ROWS)).to_have_count(3)

    picker = page.locator("#experiments-runs input")
    for run_id in (first, best):
        picker.click()
        page.get_by_role("option", name=run_id, exact=False).first.click()
    expect(page.locator("#experiments-said")).to_contain_text("4 settings differ between these runs")
    differing = page.locator("#experiments-differing")
    expect(differing).to_contain_text("grpo.beta")
    expect(differing).to_contain_text("reward · digits_only")
    expect(differing).not_to_contain_text("training.learning_rate")
    chart = page.locator("#experiments-chart-0")
    expect(chart.locator(".legendtext", has_text="stronger")).to_be_visible()
    expect(chart.locator(".legendtext", has_text="tiny")).to_be_visible()
    heldout = page.locator("#experiments-chart-1")  # the held-out checks during training, beside the training reward
    expect(heldout).to_contain_text("Held-out reward during training")
    expect(heldout.locator(".legendtext")).to_have_count(2)
    page.locator("#experiments-x label", has_text="minutes").click()
    expect(chart.locator(".xtitle")).to_have_text("minutes")
    screenshot(page, screenshots, "experiments")

    with page.expect_download() as download:
        page.locator("#experiments-export").click()
        page.locator("#experiments-csv a").first.click()
    with open(download.value.path(), newline="", encoding="utf-8") as fh:
        header, *rows = list(csv.reader(fh))
    assert header[0] == "Run" and [row[0] for row in rows] == [best, first, running]


@pytest.fixture
def lesson_recipe(recipes_dir):
    """The test's arithmetic recipe with notes, as a lesson recipe has them; written before the page lists recipes."""
    lesson = (recipes_dir / "arithmetic.yaml").read_text().replace(
        "name: arithmetic", "name: lesson\nnotes: |\n  **Lesson: beta.** Train twice, then overlay the runs.", 1)
    assert "notes:" in lesson
    (recipes_dir / "lesson.yaml").write_text(lesson)


def test_a_lesson_recipe_says_what_to_try_and_what_to_look_for(lesson_recipe, page, studio, screenshots):
    wait_until_loaded(page)
    notes = page.locator("#draft-notes")
    expect(notes).to_be_hidden()  # the arithmetic recipe has no notes
    page.locator("#recipe input").click()
    page.get_by_role("option", name="lesson").click()
    page.locator("#load-recipe").click()
    expect(page.locator("#recipe-status")).to_contain_text("Loaded the lesson recipe")
    expect(notes).to_be_visible()
    expect(page.locator("#draft-notes-text strong")).to_have_text("Lesson: beta.")  # Markdown, drawn
    expect(notes).to_contain_text("Train twice, then overlay the runs.")
    screenshot(page, screenshots, "lesson")
    page.locator("#recipe input").click()
    page.get_by_role("option", name="arithmetic").click()
    page.locator("#load-recipe").click()
    expect(page.locator("#recipe-status")).to_contain_text("Loaded the arithmetic recipe")
    expect(notes).to_be_hidden()
