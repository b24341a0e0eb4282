"""Tools in a real browser: a calculator added on the Rewards tab, shown as the model sees it and tried, a run
started with it, and the Train tab's sampled groups showing each turn (the call, the tool's answer greyed and not
trained on, the final answer). The model is tests/tool_model.py's tiny Qwen2, taught to call the calculator.

`make screenshots` runs it on the bundled calculator recipe with the real SmolLM2 instead (its tool already listed),
for the README's picture of the turns (assets/screenshots/tools.png): a first step takes about a minute."""

from __future__ import annotations

import csv

import pytest
from test_browser import (choose, choose_kind, expect, open_tab, page, screenshot, screenshots, studio,  # noqa: F401
                          type_into)

from test_browser import README_SCREENSHOTS
from tool_model import ANSWER, EXPRESSION, QUESTION

from dragon_ui import ASSETS_DIR

pytestmark = [pytest.mark.timeout(300), pytest.mark.browser]


@pytest.fixture
def recipes_dir(tmp_path, tiny_tool_model_dir, monkeypatch):
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("DRAGON_UI_PUBLIC", raising=False)
    folder = tmp_path / "recipes"
    folder.mkdir()
    if README_SCREENSHOTS:  # the lesson itself, as a participant opens it
        recipe = (ASSETS_DIR / "recipes" / "calculator.yaml").read_text(encoding="utf-8")
        data = ASSETS_DIR / "datasets" / "big_products.csv"
        (folder / "arithmetic.yaml").write_text(recipe.replace("../datasets/big_products.csv", str(data)),
                                                encoding="utf-8")
        return folder
    data = tmp_path / "questions.csv"
    with open(data, "w", newline="", encoding="utf-8") as handle:
        csv.writer(handle).writerows([["question", "answer"], *[[QUESTION, ANSWER]] * 25])
    (folder / "arithmetic.yaml").write_text(f"""\
name: tools
model: {tiny_tool_model_dir}
data:
  source: {data}
  prompt: question
  reference: answer
  eval_frac: 0.2
rewards:
  - kind: exact
    name: answer
grpo:
  group_size: 2
  max_new_tokens: 64
training:
  learning_rate: 0.01
  batch_size: 2
  max_steps: 400
  save_steps: 400
lora:
  r: 4
  alpha: 8
hardware:
  device: cpu
  dtype: float32
  cpu_threads: 1
n_samples: 2
""", encoding="utf-8")
    return folder


def test_a_calculator_is_added_tried_and_trained_with_and_every_turn_is_shown(page, studio, screenshots):
    if README_SCREENSHOTS:
        return the_lessons_turns(page, screenshots)
    expect(page.locator("#data-counts")).to_contain_text("25 rows")
    open_tab(page, "rewards")
    expect(page.locator("#tools-table")).to_be_hidden()  # no tools yet
    choose(page, "#tools-kind", "lookup")
    expect(page.locator("#tools-key-column")).to_be_visible()
    choose(page, "#tools-kind", "calculator")
    expect(page.locator("#tools-key-column")).to_be_hidden()
    expect(page.locator("#tools-kind-help")).to_contain_text("Works out arithmetic exactly")
    page.locator("#tools-add").click()
    expect(page.locator("#tools-status")).to_contain_text("Added the tool calculator.")
    expect(page.locator("#tools-table")).to_contain_text("Work out an arithmetic expression exactly")
    expect(page.locator("#tools-schema")).to_contain_text('"name": "calculator"')
    type_into(page, "#tools-arguments textarea", '{"expression": "347 × 862"}')
    page.locator("#tools-try").click()
    expect(page.locator("#tools-answer")).to_contain_text("299114")
    page.locator("#tools-table").scroll_into_view_if_needed()
    screenshot(page, screenshots, "rewards-tools")

    trains_showing_every_turn(page, screenshots, "train-tools")


def trains_showing_every_turn(page, screenshots, picture: str) -> None:
    """Start the run, see a sampled reply's turns on the Train tab (the call, the tool's answer greyed and not
    trained on, the final answer), picture them, and stop."""
    open_tab(page, "model")
    page.locator("#model-start").click()
    open_tab(page, "train")
    rollouts = page.locator("#train-rollouts")
    expect(rollouts.locator(".tool-call").first).to_contain_text(f'calculator(expression="{EXPRESSION}")')
    answer = rollouts.locator(".tool-answer").first
    expect(answer).to_contain_text(f"calculator answered: {ANSWER}")
    expect(answer).to_contain_text("(not trained on)")
    expect(rollouts.locator(".final-answer").first).to_contain_text(f"Answer: {ANSWER}")
    rollouts.scroll_into_view_if_needed()
    screenshot(page, screenshots, picture)
    page.locator("#train-stop").click()
    expect(page.locator("#train-status")).to_contain_text("stopped", ignore_case=True)


def the_lessons_turns(page, screenshots) -> None:
    """The calculator lesson started as it ships, and its first sampled groups pictured for the README."""
    expect(page.locator("#data-counts")).to_contain_text("300 rows")
    open_tab(page, "rewards")
    expect(page.locator("#tools-table")).to_contain_text("calculator")
    open_tab(page, "model")
    page.locator("#model-start").click()
    open_tab(page, "train")
    group = page.locator("#train-rollouts .rollout-group").first
    expect(group.locator(".tool-answer").first).to_be_visible(timeout=600_000)
    group.scroll_into_view_if_needed()
    page.mouse.move(0, 0)
    group.screenshot(path=str(screenshots / "tools.png"), animations="disabled")
    page.locator("#train-stop").click()


def test_an_environment_is_added_played_by_hand_and_trained_with(page, studio, screenshots):
    """The arithmetic environment: added (no worked examples offered), its tools shown, a conversation played by
    hand and scored, its reward added, and a run that plays it shows the environment's calculator answering."""
    if README_SCREENSHOTS:
        pytest.skip("the README pictures the calculator lesson (the test above)")
    expect(page.locator("#data-counts")).to_contain_text("25 rows")
    open_tab(page, "rewards")
    choose(page, "#tools-kind", "arithmetic")
    expect(page.locator("#tools-kind-help")).to_contain_text("submits one result")
    expect(page.locator("#tools-examples")).to_be_hidden()
    page.locator("#tools-add").click()
    expect(page.locator("#tools-status")).to_contain_text("Added the tool arithmetic.")
    expect(page.locator("#tools-table")).to_contain_text("Its tools: calculator, submit.")
    expect(page.locator("#tools-schema")).to_contain_text('"name": "submit"')
    type_into(page, "#tools-arguments textarea",
              f'[{{"calculator": {{"expression": "{EXPRESSION}"}}}}, {{"submit": {{"answer": "{ANSWER}"}}}}]')
    page.locator("#tools-try").click()
    expect(page.locator("#tools-answer")).to_contain_text(f"calculator({{\"expression\": \"{EXPRESSION}\"}}) → "
                                                          f"{ANSWER}")
    expect(page.locator("#tools-answer")).to_contain_text("It scores the conversation 1 (the environment reward).")
    choose(page, "#rewards-selected", "➕ New reward")
    choose_kind(page, "environment")
    page.locator("#rewards-add").click()
    expect(page.locator("#rewards-table")).to_contain_text("the environment it played says it earned")
    page.locator("#tools-answer").scroll_into_view_if_needed()
    screenshot(page, screenshots, "rewards-environment")
    trains_showing_every_turn(page, screenshots, "train-environment")
