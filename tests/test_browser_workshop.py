"""What a workshop sees, in a real browser, as a teacher plays it: their own countries → capitals data uploaded,
rewards built, the pre-flight, Start, a reload while it trains, Stop, Compare. Every screen says what is true now:
the banner follows the run, a reward is named after its kind, the recipe box lets go of a recipe the form no longer
holds, the playground follows the rewards, an explanation opens under its group, the two held-out sets have their
own names and counts, a stopped run gets its "after" score by itself, the header reads one state, a bundled dataset
goes by its name, and every tab, idle and training, passes axe-core with every field named by its label alone.

The run uses the tiny random model of test_browser's recipe, whose custom reward sleeps so that a step lasts long
enough to be watched."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright import sync_api
from test_browser import (NEW_REWARD, choose, choose_kind, edit_rewards, open_tab, page, pick_reward,  # noqa: F401
                          recipes_dir, screenshot, screenshots, studio, wait_until_loaded)

from dragon_ui.ui.app import OWN_SETTINGS

expect = sync_api.expect
pytestmark = [pytest.mark.timeout(600), pytest.mark.browser]

TABS = ["data", "rewards", "model", "train", "compare", "experiments"]
CAPITALS = {"France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Portugal": "Lisbon",
            "Greece": "Athens", "Austria": "Vienna", "Poland": "Warsaw", "Sweden": "Stockholm", "Norway": "Oslo",
            "Finland": "Helsinki", "Denmark": "Copenhagen", "Ireland": "Dublin", "Hungary": "Budapest",
            "Romania": "Bucharest", "Bulgaria": "Sofia", "Croatia": "Zagreb", "Serbia": "Belgrade",
            "Slovakia": "Bratislava", "Slovenia": "Ljubljana", "Estonia": "Tallinn", "Latvia": "Riga",
            "Lithuania": "Vilnius", "Belgium": "Brussels", "Netherlands": "Amsterdam", "Switzerland": "Bern",
            "Czechia": "Prague", "Iceland": "Reykjavik", "Japan": "Tokyo", "China": "Beijing", "India": "New Delhi",
            "Egypt": "Cairo", "Kenya": "Nairobi", "Peru": "Lima", "Chile": "Santiago", "Canada": "Ottawa",
            "Mexico": "Mexico City", "Cuba": "Havana", "Ghana": "Accra", "Nepal": "Kathmandu", "Brazil": "Brasilia",
            "Argentina": "Buenos Aires", "Colombia": "Bogota", "Thailand": "Bangkok", "Vietnam": "Hanoi",
            "Indonesia": "Jakarta", "Turkey": "Ankara", "Iran": "Tehran", "Morocco": "Rabat", "Nigeria": "Abuja"}
HELD_OUT = 10  # a fifth of 50 rows: the app keeps at least 10 aside, and its checks during training answer 8
# What the screen's accessibility tree must name: every field, button and table.
NAMED_ROLES = {"textbox", "combobox", "spinbutton", "slider", "checkbox", "radio", "button", "table", "grid",
               "searchbox", "listbox", "group", "radiogroup"}
# A settled page: axe-core reads colours as they are drawn, and gradio's buttons fade from one colour to another.
NO_TRANSITIONS = "*, *::before, *::after { transition: none !important; animation: none !important; }"


def accessibility_problems(page, axe: Axe) -> list:
    """axe-core's serious and critical violations on the page as shown, and every field, button or table of the
    accessibility tree without a name, or whose help text is part of its name (help is a description)."""
    found = axe.run(page).response["violations"]
    problems: list = [(v["id"], v["impact"], [node["target"] for node in v["nodes"]][:4]) for v in found
                      if v["impact"] in ("serious", "critical")]
    tree = page.context.new_cdp_session(page).send("Accessibility.getFullAXTree")["nodes"]
    for node in tree:
        role = (node.get("role") or {}).get("value")
        if role not in NAMED_ROLES or node.get("ignored"):
            continue
        name = (node.get("name") or {}).get("value", "").strip()
        help_text = (node.get("description") or {}).get("value", "").strip()
        if not name and role not in ("group", "radiogroup"):  # gradio's rows and columns are unnamed groups
            problems.append(("no name", role, node.get("backendDOMNodeId")))
        elif help_text and help_text != name and help_text in name:
            problems.append(("help in the name", role, name[:80]))
    return problems


def check_every_tab(page, axe: Axe, when: str) -> None:
    for tab in TABS:
        open_tab(page, tab)
        page.wait_for_timeout(300)  # the tab's components drawn, and named by the page's script
        assert accessibility_problems(page, axe) == [], f"the {tab} tab, {when}"


def reached_by_keyboard(page, selector: str, most_presses: int = 300) -> bool:
    """Whether pressing Tab from the top of the page reaches ``selector``."""
    page.locator("body").focus()
    page.evaluate("() => document.activeElement?.blur()")
    for _ in range(most_presses):
        page.keyboard.press("Tab")
        if page.evaluate(f"() => document.activeElement?.matches({selector!r})"):
            return True
    return False


def on_one_line(page, selector: str, text: str) -> bool:
    """Whether the element of ``selector`` showing exactly ``text`` draws it on one line."""
    return page.evaluate("""([selector, text]) => {
        const cell = [...document.querySelectorAll(selector)].find((e) => e.innerText.trim() === text);
        const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
        const lines = new Set();
        while (walker.nextNode()) {
            const range = document.createRange(); range.selectNodeContents(walker.currentNode);
            for (const box of range.getClientRects()) if (box.width > 0) lines.add(Math.round(box.top));
        }
        return lines.size === 1; }""", [selector, text])


def banner_step(page) -> int:
    return int(re.search(r"step (\d+) of", page.locator("#running-banner-text").inner_text()).group(1))


def test_a_workshop_plays_its_own_task_and_every_screen_tells_the_truth(page, studio, screenshots, tmp_path):
    axe = Axe()
    wait_until_loaded(page)
    page.add_style_tag(content=NO_TRANSITIONS)
    # 10 · A bundled dataset goes by its name, not the folder the package lies in (nor in a screenshot).
    expect(page.get_by_label("Data source", exact=True)).to_have_value("arithmetic.csv")
    # 11 · Every tab, idle: no serious or critical violation, every field named by its label, help a description.
    check_every_tab(page, axe, "idle")
    open_tab(page, "model")
    expect(page.locator("#model-start")).to_be_enabled()
    assert reached_by_keyboard(page, "#model-start"), "Tab never reaches Start"

    # Data: the teacher's own file, mapped by label.
    open_tab(page, "data")
    capitals = tmp_path / "capitals.csv"
    capitals.write_text("country,capital\n" + "".join(f"{c},{k}\n" for c, k in CAPITALS.items()), encoding="utf-8")
    page.locator("#data-upload input[type=file]").set_input_files(str(capitals))
    expect(page.locator("#data-counts")).to_contain_text(f"{len(CAPITALS)} rows")
    prompt = page.get_by_label("Prompt", exact=True)
    prompt.fill("What is the capital of {country}? Reply with the city alone.")
    choose(page, "#data-reference", "capital")
    expect(page.locator("#data-rendered")).to_contain_text("What is the capital of France?")
    # 3 · The recipe box lets go of the recipe once the form holds the teacher's own settings.
    expect(page.locator("#recipe input")).to_have_value(OWN_SETTINGS)

    # 2 · Rewards: the recipe's numeric reward becomes an exact match, and its name follows its kind.
    open_tab(page, "rewards")
    pick_reward(page, "numeric")
    choose_kind(page, "exact")
    expect(page.locator("#rewards-name textarea")).to_have_value("exact")
    edit_rewards(page, "save", "Saved the reward exact")
    expect(page.locator("#rewards-table")).to_contain_text("exact")
    expect(page.locator("#rewards-table")).not_to_contain_text("numeric")
    # 9 · The rewards table's "weight" stays on one line.
    assert on_one_line(page, "#rewards-table th", "weight")
    # 4 · A typed reply scored, then a reward removed: the scores follow the rewards.
    page.get_by_label("Row", exact=True).click()
    page.get_by_role("option").first.click()
    reference = page.locator("#rewards-row-text").inner_text().rsplit("Reference:", 1)[1].strip()
    page.get_by_label("A reply to score", exact=True).fill(reference)
    page.get_by_role("button", name="Score this reply").click()
    scores = page.locator("#rewards-scores")
    expect(scores).to_contain_text("length")
    pick_reward(page, "length")
    edit_rewards(page, "remove", "Removed the reward length")
    expect(scores).not_to_contain_text("length")
    expect(scores).to_contain_text("exact")
    screenshot(page, screenshots, "workshop-rewards")

    # The pre-flight, then Start, for longer than the test watches.
    open_tab(page, "model")
    page.get_by_label("Max steps", exact=True).fill("5000")
    page.get_by_role("button", name="Will it learn?").click()
    expect(page.locator("#preflight-status")).to_contain_text("groups")
    page.locator("#model-start").click()
    expect(page.locator("#train-status")).to_contain_text("running")
    expect(page.locator("#train-progress [role=progressbar]")).to_have_attribute("aria-valuenow",
                                                                                 re.compile(r"^([3-9]|\d\d+)$"))

    # 1 · A reload while it trains: the banner names the run and follows its steps.
    page.reload()
    page.add_style_tag(content=NO_TRANSITIONS)
    banner = page.locator("#running-banner-text")
    expect(banner).to_contain_text("A run is training")
    first = banner_step(page)
    expect(banner).not_to_contain_text(f"step {first} of")
    assert banner_step(page) > first
    # 11 · Every tab while it trains.
    check_every_tab(page, axe, "while a run trains")

    open_tab(page, "train")
    # 6 · The checks during training are named apart from the held-out set Compare scores.
    expect(page.locator("#train-plot-reward")).to_contain_text(f"held-out check (first 8 of {HELD_OUT} prompts)")
    # 5 · An explanation opens under its own group, and the step stays until it is closed.
    page.locator("#train-rollouts button.explain-group").first.click()
    panel = page.locator("#train-rollouts .rollout-group").first.locator(".explain-panel")
    expect(panel).to_contain_text("group 1: what did this step do?")
    held_step = page.locator("#train-rollouts p b").first.inner_text()
    screenshot(page, screenshots, "workshop-explained")
    page.wait_for_timeout(2500)  # steps go on meanwhile
    assert page.locator("#train-rollouts p b").first.inner_text() == held_step
    panel.get_by_role("button", name="Close this explanation").click()
    expect(page.locator("#train-rollouts .explain-panel")).to_have_count(0)

    page.locator("#train-stop").click()
    status = page.locator("#train-status")
    # 8 · The header reads one state.
    expect(status).to_contain_text("stopped — can resume")
    expect(status).not_to_contain_text("· done")
    # 1 · The banner goes with the run it named.
    expect(page.locator("#running-banner")).to_be_hidden()
    screenshot(page, screenshots, "workshop-stopped")

    # 7 · Compare scores the stopped run's "after" without a click; 6 · it names its set and its count.
    open_tab(page, "compare")
    expect(page.locator("#compare-evaluate-status")).to_contain_text("Done")
    summary = page.locator("#compare-summary")
    expect(summary).to_contain_text(f"on all {HELD_OUT} held-out prompts")
    expect(summary).to_contain_text("The Train tab's held-out checks answer the first 8 of them")
    expect(page.locator("#compare-chart")).to_contain_text("after training")
    assert accessibility_problems(page, axe) == [], "the compare tab with a comparison"
    screenshot(page, screenshots, "workshop-compare")
    (run,) = studio.runs.summaries()
    assert run["state"] == "cancelled" and Path(run["dir"], "eval.json").is_file()
