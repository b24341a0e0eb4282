"""A task of one's own whose rewards teach the wrong thing, in a real browser with the real default model: the
recipe's numeric reward flagged as the data changes, rewards built as a new user builds them (the bare answer as the
goal, a short reply, the answer anywhere), the pre-flight naming the trap, its first fix clicked, and the verdict
changed."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
from playwright import sync_api
from test_browser import (ASSETS_DIR, choose, choose_kind, open_tab, page, screenshot, screenshots,  # noqa: F401
                          started_config, studio, type_into, wait_until_loaded)

from dragon_ui.config import DEFAULT_MODEL_ID
from dragon_ui.engine import preflight

expect = sync_api.expect
pytestmark = [pytest.mark.timeout(600), pytest.mark.browser]

# Capitals the model knows and names in a sentence ("The capital of Kenya is Nairobi."): never the bare city.
CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Italy": "Rome", "Germany": "Berlin", "Spain": "Madrid",
            "Egypt": "Cairo", "Russia": "Moscow", "Greece": "Athens", "Kenya": "Nairobi", "Norway": "Oslo",
            "Peru": "Lima", "Austria": "Vienna", "Ireland": "Dublin", "Poland": "Warsaw", "Portugal": "Lisbon",
            "Sweden": "Stockholm", "China": "Beijing", "Cuba": "Havana", "Chile": "Santiago", "Thailand": "Bangkok",
            "Hungary": "Budapest", "Finland": "Helsinki", "Denmark": "Copenhagen", "Belgium": "Brussels"}


@pytest.fixture
def recipes_dir(tmp_path, monkeypatch) -> Path:
    """The arithmetic recipe on the real default model, at the sizes a workshop uses."""
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("DRAGON_UI_PUBLIC", raising=False)
    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / "arithmetic.yaml").write_text(f"""\
name: arithmetic
model: {DEFAULT_MODEL_ID}
data:
  source: {ASSETS_DIR / "datasets" / "arithmetic.csv"}
  prompt: question
  reference: answer
rewards:
  - kind: numeric
grpo:
  group_size: 6
  max_new_tokens: 24
training:
  batch_size: 4
  max_steps: 30
hardware:
  device: cpu
""", encoding="utf-8")
    return folder


def test_rewards_that_teach_the_wrong_thing_are_named_and_fixed(page, studio, screenshots, tmp_path, monkeypatch):
    monkeypatch.setattr(preflight, "MOST_PROMPTS", 16)  # two checks of a few seconds each
    with open(tmp_path / "capitals.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["country", "capital"])
        writer.writerows([[f"What is the capital of {country}? Give the city name only.", city]
                          for country, city in CAPITALS.items()])
    wait_until_loaded(page)
    page.locator("#data-upload input[type=file]").set_input_files(str(tmp_path / "capitals.csv"))
    mapping = page.locator("#data-mapping-status")
    expect(page.locator("#data-rendered")).to_contain_text("What is the capital of France?")  # the file is in
    type_into(page, "#data-reference input", "capital")
    page.locator("#data-reference input").press("Enter")
    expect(mapping).to_contain_text("numeric (numeric) cannot pay on this data: the reference answer contains no "
                                    "number, on all 24 references checked")
    open_tab(page, "rewards")
    expect(page.locator("#rewards-problem")).to_contain_text("numeric")
    choose_kind(page, "exact")  # the bare answer: the goal the user means
    type_into(page, "#rewards-name textarea", "exact")
    page.locator("#rewards-save").click()
    expect(page.locator("#rewards-problem")).not_to_contain_text("cannot pay")
    for kind, name, weight, setting in (("length", "short", "0.3", ("#rewards-settings-max-chars input", "20")),
                                        ("contains", "contains", "0.5", None)):
        choose(page, "#rewards-selected", "➕ New reward")
        choose_kind(page, kind)
        type_into(page, "#rewards-name textarea", name)
        type_into(page, "#rewards-weight input", weight)
        if setting:
            type_into(page, *setting)
        page.locator("#rewards-add").click()
        expect(page.locator("#rewards-table")).to_contain_text(name)
    table = page.locator("#rewards-table")
    expect(table.get_by_role("row", name=re.compile("^exact "))).to_contain_text("🎯 goal")

    open_tab(page, "model")
    page.locator("#model-preflight").click()
    status = page.locator("#preflight-status")
    expect(status).to_contain_text("Your goal, exact,")
    expect(status).to_contain_text("the other rewards pick a winner all the same")
    expect(status).to_contain_text("The spread by reward")
    fix = page.locator("#preflight-fix-0")
    expect(fix).to_contain_text("Make contains the goal")  # a button shows no code spans
    screenshot(page, screenshots, "preflight-goal")
    fix.click()
    expect(status).to_contain_text("Applied the pre-flight's fix: Make contains the goal")
    page.locator("#model-preflight").click()
    expect(status).to_contain_text("It can learn")
    expect(status).not_to_contain_text("Your goal")
    screenshot(page, screenshots, "preflight-goal-fixed")

    open_tab(page, "rewards")
    expect(table.get_by_role("row", name=re.compile("^contains "))).to_contain_text("🎯 goal")
    expect(table.get_by_role("row", name=re.compile("^exact "))).to_contain_text("a metric: not trained on")
    open_tab(page, "model")
    page.locator("#model-start").click()
    rewards = {reward["name"]: reward for reward in started_config(studio)["rewards"]}
    assert rewards["contains"]["goal"] is True and rewards["exact"]["train"] is False
