"""A class in real browsers: the teacher (the demo's owner) opens a class on the owner panel, a learner takes a seat
with its code, the teacher hands out a recipe and the learner's page loads it (asking first, since the learner had
edited theirs), the learner's run is on the teacher's board, a click on its row opens it, and "Stop all runs" stops
it, and closing the class ends the seats. Two chromium contexts: two people's browsers."""

from __future__ import annotations

import pytest
from playwright import sync_api

from dragon_ui.ui import build_app
from test_browser import open_tab, screenshot, wait_until_loaded
from test_browser_public import OWNER_KEY, people, public_studio  # noqa: F401 (a fixture, used by name)

expect = sync_api.expect
pytestmark = [pytest.mark.timeout(300), pytest.mark.browser]
CODE = "dragons-of-room-4"


def test_a_teacher_hands_out_a_recipe_and_stops_every_run(public_studio, tmp_path):
    with people(build_app(public_studio), 2) as (teacher, learner):
        # The teacher unlocks the demo and opens a class.
        teacher.get_by_text("Owner of this demo?").click()
        teacher.get_by_label("Owner key", exact=True).fill(OWNER_KEY)
        teacher.get_by_role("button", name="Unlock").click()
        expect(teacher.locator("#owner-status")).to_contain_text("Unlocked")
        teacher.get_by_label("Class code to give out", exact=True).fill(CODE)
        teacher.get_by_role("button", name="Open the class").click()
        expect(teacher.locator("#owner-status")).to_contain_text("The class is open")

        # A learner takes a seat, and edits their settings.
        learner.get_by_text("In a class? Take your seat").click()
        learner.get_by_label("Class code", exact=True).fill("not-the-code")
        learner.get_by_label("Your name", exact=True).fill("Ana")
        learner.get_by_role("button", name="Take my seat").click()
        expect(learner.locator("#class-seat")).to_contain_text("not this class's code")
        learner.get_by_label("Class code", exact=True).fill(CODE)
        learner.get_by_role("button", name="Take my seat").click()
        expect(learner.locator("#class-seat")).to_contain_text("You sit as Ana")
        open_tab(learner, "model")
        learner.get_by_label("Max steps", exact=True).fill("777")
        learner.get_by_label("Max steps", exact=True).press("Tab")

        # The teacher's settings, handed out.
        open_tab(teacher, "model")
        teacher.get_by_label("Max steps", exact=True).fill("4321")
        teacher.get_by_label("Max steps", exact=True).press("Tab")
        open_tab(teacher, "experiments")
        teacher.get_by_text("Class board (the teacher's)").click()
        expect(teacher.locator("#class-board-said")).to_contain_text("1 seat taken; the queue is running")
        teacher.get_by_role("button", name="Give everyone this recipe").click()
        expect(teacher.locator("#class-board-said")).to_contain_text("Handed out to every seat")

        # The learner's page asks before replacing what they edited, then shows the teacher's recipe.
        expect(learner.locator("#replace-draft-text")).to_contain_text("Replace them with your teacher's recipe?")
        screenshot(learner, tmp_path, "class-learner-handout")
        learner.get_by_role("button", name="Replace my settings").click()
        expect(learner.locator("#recipe-status")).to_contain_text("Loaded your teacher's recipe")
        expect(learner.get_by_label("Max steps", exact=True)).to_have_value("4321")

        # The learner starts it; it is on the board, and its row opens it.
        learner.locator("#model-start").click()
        expect(learner.locator("#train-status")).to_contain_text("running")
        (run,) = public_studio.runs.summaries()
        assert run["seat"] == "Ana"
        teacher.get_by_role("button", name="↻ Refresh").last.click()
        board = teacher.locator("#class-board-table")
        expect(board).to_contain_text(run["id"])
        screenshot(teacher, tmp_path, "class-teacher-board")
        board.get_by_test_id("cell-0-0").click()  # the seat "Ana", in the first row
        expect(teacher.locator("#tab-train")).to_be_visible()
        expect(teacher.locator("#train-status")).to_contain_text(run["id"])

        # Stop all: the learner's run stops.
        open_tab(teacher, "experiments")
        teacher.get_by_role("button", name="Stop all runs").click()
        expect(teacher.locator("#class-board-said")).to_contain_text("Asked 1 run to stop")
        expect(learner.locator("#train-status")).to_contain_text("stopped — can resume", timeout=90_000)

        # The workshop is over: no seats; the learner's next page counts by address again.
        teacher.get_by_role("button", name="Close the class").click()
        expect(teacher.locator("#class-board-said")).to_contain_text("The class is closed")
        learner.reload()
        wait_until_loaded(learner)
        expect(learner.locator("#class-seat")).not_to_contain_text("You sit as")
