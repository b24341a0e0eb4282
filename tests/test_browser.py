"""The app in a real browser (Debian's chromium through Playwright): every tab opened, a run started, watched,
stopped and compared, the way a workshop participant clicks through it.

The Studio reads its recipes from a temporary folder whose "arithmetic" recipe points at the tiny random Llama, so
the page opens pre-filled exactly as the real app does, only with a model that trains in a fraction of a second per
step. A custom reward that sleeps per completion keeps the run going long enough to be watched and stopped. Each tab
is saved as a full-page screenshot (in the test's temporary folder).

`make screenshots` runs this same test for the README's pictures: DRAGON_UI_SCREENSHOTS names the folder to save
them in, and the run uses the real default model (its offline copy) instead of the tiny one, so the pictures show
what a participant sees. That takes a few minutes of CPU training.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import textwrap
import threading
import time
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from playwright import sync_api

from dragon_ui.config import DEFAULT_MODEL_ID
from dragon_ui.engine import preflight, training
from dragon_ui.runstore import RunDir, slug
from dragon_ui.settings import plain
from dragon_ui import ASSETS_DIR
from dragon_ui.ui import build_app
from dragon_ui.ui.app import DRAFT_STORAGE_KEY, OWN_SETTINGS
from dragon_ui.ui import rewards_tab
from dragon_ui.ui.rewards_tab import KIND_HELP
from conftest import stop_the_training
from test_app_client import served_app

expect = sync_api.expect

pytestmark = [pytest.mark.timeout(300), pytest.mark.browser]
CHROMIUM = Path("/usr/bin/chromium")  # Debian's; .ci/run installs it (Playwright's own download is not used)
CHROMIUM_ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
README_SCREENSHOTS = os.environ.get("DRAGON_UI_SCREENSHOTS")  # set by `make screenshots`
VIEWPORT = {"width": 1400, "height": 1000}
STEPS_BEFORE_STOP = 6
# The tiny random model trains in a fraction of a second per step; the real SmolLM2-135M takes seconds.
SCENARIO = ({"model": DEFAULT_MODEL_ID, "group_size": 4, "max_new_tokens": 16, "learning_rate": 2e-5, "lora_r": 16,
             "hardware": "device: cpu", "wait_ms": 600_000} if README_SCREENSHOTS else
            {"model": None, "group_size": 2, "max_new_tokens": 8, "learning_rate": 0.01, "lora_r": 4,
             "hardware": "device: cpu\n  dtype: float32\n  cpu_threads: 1", "wait_ms": 60_000})
WAIT_MS = SCENARIO["wait_ms"]

# A reward a participant might write: pays for a reply that is only digits. The sleep stands for an expensive
# check, so that a step takes long enough for the test to watch several steps and stop the run before step 200.
DIGITS_ONLY = '''
import time

def reward(prompt, completion, reference, row):
    time.sleep(0.05)
    return 1.0 if completion.strip().isdigit() else 0.0
'''


def write_recipe(folder: Path, model_dir: Path | str, custom_reward: bool = True, max_steps: int = 200) -> Path:
    """The arithmetic recipe at sizes a 2-CPU machine trains quickly (the tiny model: well under a second a step),
    with the digits_only custom reward unless ``custom_reward`` is False (a public demo refuses it)."""
    folder.mkdir(parents=True)
    code = textwrap.indent(DIGITS_ONLY.strip("\n"), " " * 6)
    custom = f"""\
  - kind: custom
    name: digits_only
    weight: 0.5
    code: |
{code}
""" if custom_reward else ""
    (folder / "arithmetic.yaml").write_text(f"""\
name: arithmetic
model: {model_dir}
data:
  source: {ASSETS_DIR / "datasets" / "arithmetic.csv"}
  prompt: question
  reference: answer
  eval_frac: 0.05
rewards:
  - kind: numeric
  - kind: length
    max_chars: 12
    weight: 0.3
{custom}grpo:
  group_size: {SCENARIO["group_size"]}
  max_new_tokens: {SCENARIO["max_new_tokens"]}
training:
  learning_rate: {SCENARIO["learning_rate"]}
  batch_size: 2
  max_steps: {max_steps}
  save_steps: 50
  eval_every: 5
lora:
  r: {SCENARIO["lora_r"]}
  alpha: {2 * SCENARIO["lora_r"]}
hardware:
  {SCENARIO["hardware"]}
n_samples: 5
""", encoding="utf-8")
    return folder


@pytest.fixture
def recipes_dir(tmp_path, tiny_model_dir, monkeypatch) -> Path:
    # Not a public demo, which would refuse the custom reward; cleared before conftest's studio reads it.
    monkeypatch.delenv("SPACE_ID", raising=False)
    monkeypatch.delenv("DRAGON_UI_PUBLIC", raising=False)
    return write_recipe(tmp_path / "recipes", SCENARIO["model"] or tiny_model_dir)


@pytest.fixture
def studio(recipes_dir, studio):
    """conftest's studio (its teardown stops any training left behind), reading the tiny arithmetic recipe."""
    studio.recipes.folder = recipes_dir
    return studio


@pytest.fixture
def page(studio):
    """A chromium page on the app, served with the real app's theme and CSS so the screenshots match it."""
    if not CHROMIUM.exists():
        message = "Debian's chromium is needed for the browser test: sudo apt-get install chromium"
        pytest.fail(message) if os.environ.get("CI") else pytest.skip(message)
    with served_app(build_app(studio)) as url, sync_api.sync_playwright() as playwright:
        expect.set_options(timeout=WAIT_MS)
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.set_default_timeout(WAIT_MS)
            page.goto(url)
            yield page
        finally:
            browser.close()


def open_tab(page, tab: str) -> None:
    page.locator(f"#tab-{tab}-button").click()
    expect(page.locator(f"#tab-{tab}")).to_be_visible()


@pytest.fixture
def screenshots(tmp_path) -> Path:
    folder = Path(README_SCREENSHOTS) if README_SCREENSHOTS else tmp_path / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def screenshot(page, folder: Path, tab: str) -> None:
    page.mouse.move(0, 0)  # no hover effects (plot toolbars, tooltips) left from the last click...
    # ...and no fade-out still under way when the picture is taken
    page.screenshot(path=str(folder / f"{tab}.png"), full_page=True, animations="disabled")


def test_click_through_every_tab_train_stop_and_compare(page, studio, tiny_model_dir, screenshots):
    model = SCENARIO["model"] or str(tiny_model_dir)
    # 1 · Data: the recipe's table and the prompts as the model reads them.
    expect(page.locator("#data-preview")).to_contain_text("What is")
    expect(page.locator("#data-counts")).to_contain_text("400 rows")
    expect(page.locator("#data-rendered")).to_contain_text("What is")
    screenshot(page, screenshots, "data")

    # 2 · Rewards: the recipe's three rewards, and a typed reply scored in the playground.
    open_tab(page, "rewards")
    rewards = page.locator("#rewards-table")
    for name in ("numeric", "length", "digits_only"):
        expect(rewards).to_contain_text(name)
    expect(page.locator("#rewards-row-text")).to_contain_text("Reference:")
    reference = page.locator("#rewards-row-text").inner_text().rsplit("Reference:", 1)[1].strip()
    page.locator("#rewards-completion textarea").fill(reference)
    page.locator("#rewards-score").click()
    expect(page.locator("#rewards-total")).to_contain_text("Total (weighted sum): 1.800")
    expect(page.locator("#rewards-scores")).to_contain_text("digits_only")
    page.locator("#rewards-generate").click()  # a GRPO group sampled from the starting model, as one step would
    expect(page.locator("#rewards-progress")).to_contain_text(f"Sampled {SCENARIO['group_size']} replies")
    expect(page.locator("#rewards-groups")).to_contain_text("advantage")
    screenshot(page, screenshots, "rewards")

    # 3 · Model & Hardware: the tiny model in the form, a valid YAML, and Start.
    open_tab(page, "model")
    expect(page.locator("#model-check")).to_contain_text("The settings are valid")
    expect(page.locator("#model-estimate")).to_contain_text("200 steps")
    screenshot(page, screenshots, "model")  # before opening the YAML: its editor draws only the lines scrolled into view
    page.get_by_text("The whole configuration (YAML)").click()
    yaml_view = page.locator("#model-yaml")
    expect(yaml_view).to_contain_text(model)
    for line in yaml_view.locator(".cm-line").all()[-1:]:  # the editor draws only the lines in view: show its end
        line.scroll_into_view_if_needed()
        page.mouse.wheel(0, 600)
    expect(yaml_view).to_contain_text(f"group_size: {SCENARIO['group_size']}")
    with page.expect_download() as saving:  # the browser saves the YAML shown; the server writes nothing for it
        page.get_by_role("button", name="Download the YAML").click()
    saved = saving.value
    assert saved.suggested_filename == f"{slug(page.locator('#model-run-name textarea').input_value())}.yaml"
    kept = yaml.safe_load(Path(saved.path()).read_text(encoding="utf-8"))
    assert kept["model"]["id"] == model and kept["grpo"]["group_size"] == SCENARIO["group_size"]
    page.locator("#model-start").click()

    # 4 · Train: Start switches here; the charts and the latest completions fill in as steps complete.
    expect(page.locator("#tab-train")).to_be_visible()
    status = page.locator("#train-status")
    expect(status).to_contain_text("running")
    several_steps = re.compile(rf"^([{STEPS_BEFORE_STOP}-9]|[1-9]\d+)$")
    expect(page.locator("#train-progress [role=progressbar]")).to_have_attribute("aria-valuenow", several_steps)
    expect(page.locator("#train-plot-reward .js-plotly-plot")).to_be_visible()
    expect(page.locator("#train-plot-reward")).to_contain_text("digits_only")
    # The first held-out check (step 5) scores the starting model too, with the adapter off: steps 0 and 5.
    expect(page.locator("#train-plot-reward")).to_contain_text("held-out check (first 8 of 20 prompts)")
    expect(page.locator("#train-rollouts table").first).to_be_visible()
    screenshot(page, screenshots, "train")
    page.locator("#train-stop").click()
    expect(page.locator("#train-action")).to_contain_text("Stopping: the step under way ends at once")
    expect(status).to_contain_text("stopped — can resume")
    expect(page.locator("#train-resume")).to_be_enabled()
    # What did this step do? A group's numbers worked out in words, checked against TRL's, the formula on request.
    page.locator("#train-rollouts button.explain-group").first.click()
    explanation = page.locator("#train-rollouts .rollout-group").first.locator(".explain-panel")  # under its group
    expect(explanation).to_contain_text("group 1: what did this step do?")
    expect(explanation).to_contain_text("match the ones TRL logged for this step")
    expect(explanation.locator("table tbody tr")).to_have_count(SCENARIO["group_size"])
    explanation.get_by_text("Show the formula").click()
    expect(explanation).to_contain_text("A_i = (r_i − mean) / (std + 0.0001)")
    page.mouse.move(0, 0)
    explanation.screenshot(path=str(screenshots / "explain.png"), animations="disabled")
    (run,) = studio.runs.summaries()
    assert run["state"] == "cancelled" and STEPS_BEFORE_STOP <= run["step"] < run["total_steps"] == 200, run
    # The worker thread writes "cancelled" just before it exits; Evaluate now refuses while it is alive.
    assert all(handle.wait(30) == "cancelled" for handle in training.active_runs())
    assert not training.active_runs()

    # 5 · Compare: opening the tab shows the stopped run, which has a checkpoint but no "after" score yet, and
    # scores it without a click, saying how long that takes.
    open_tab(page, "compare")
    expect(page.locator("#compare-evaluate-status")).to_contain_text("Done")
    expect(page.locator("#compare-chart .js-plotly-plot")).to_be_visible()
    expect(page.locator("#compare-chart")).to_contain_text("after training")
    # Each row shows the part of its prompt that differs; the summary says once what every prompt shares.
    expect(page.locator("#compare-table")).to_contain_text(re.compile(r"\d+ \+ \d+\?"))
    expect(page.locator("#compare-table")).not_to_contain_text("What is")
    expect(page.locator("#compare-summary")).to_contain_text("before")
    expect(page.locator("#compare-summary")).to_contain_text("Every prompt reads “What is … Reply with just the number.”")
    expect(page.locator("#compare-prompt textarea")).to_have_attribute("placeholder", re.compile(r"^What is \d+"))
    screenshot(page, screenshots, "compare")

    # The run's settings come back into every tab: after an edit, Load these settings asks first, then replaces it.
    open_tab(page, "model")
    type_into(page, "#model-training-max-steps input", "5")
    open_tab(page, "compare")
    page.locator("#compare-load-settings").click()
    expect(page.locator("#replace-draft-text")).to_contain_text(f"the settings of run {run['id']}")
    page.locator("#replace-draft-yes").click()
    expect(page.locator("#recipe-status")).to_contain_text(f"Loaded the settings of run {run['id']}")
    open_tab(page, "model")
    expect(page.locator("#model-training-max-steps input")).to_have_value("200")


# ---------------------------------------------------------------------------------------------------------------
# The form is the run: what a fast typist sees on screen is what trains, a reload keeps it, the rewards list is
# what the editor shows.

KEY_DELAY_MS = 20  # faster than a fast typist (30-40 ms a key)


def type_into(page, selector: str, text: str) -> None:
    """Clear a field and type into it key by key, the way a person does (no blur afterwards)."""
    field = page.locator(selector)
    field.click()
    field.press("ControlOrMeta+a")
    field.press_sequentially(text, delay=KEY_DELAY_MS)


def choose(page, selector: str, option: str) -> None:
    """Pick an option of a gradio dropdown by its label."""
    page.locator(f"{selector} input").click()
    page.get_by_role("option", name=option, exact=True).click()


NEW_REWARD = "➕ New reward"


def pick_reward(page, name: str) -> None:
    """Pick a reward of the list to edit (or NEW_REWARD) and wait for the editor to show it, as a person looks
    before the next click: two clicks sent within milliseconds reach gradio's queue in either order."""
    choose(page, "#rewards-selected", name)
    if name == NEW_REWARD:
        expect(page.locator("#rewards-add")).to_be_visible()
    else:
        expect(page.locator("#rewards-name textarea")).to_have_value(name)


def edit_rewards(page, button: str, said: str) -> None:
    """Click Add, Save or Remove and wait for its answer (``said`` in the status), for the reason pick_reward gives."""
    page.locator(f"#rewards-{button}").click()
    expect(page.locator("#rewards-status")).to_contain_text(said)


def choose_kind(page, kind: str) -> None:
    """Pick a reward kind and wait for the editor to show it: the answer writes every field of the editor (the name
    that follows the kind, the kind's settings), so typing before it lands would be overwritten, as a person's
    would be who typed within those milliseconds."""
    choose(page, "#rewards-kind", kind)
    expect(page.locator("#rewards-kind-help")).to_contain_text(plain(KIND_HELP[kind])[:40])  # as Markdown shows it


def wait_until_loaded(page) -> None:
    expect(page.locator("#data-counts")).to_contain_text("400 rows")


def started_config(studio) -> dict:
    """The config.json of the one run Start made (stopped at once: only its settings matter here)."""
    deadline = time.monotonic() + 60
    while not studio.runs.summaries() and time.monotonic() < deadline:
        time.sleep(0.1)
    (run,) = studio.runs.summaries()
    # The folder is written first; the run is handed to a training process a moment later (training._launch).
    while not training.active_runs() and RunDir(Path(run["dir"])).read_status().get("state") == "queued" \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    stop_the_training()
    return json.loads((Path(run["dir"]) / "config.json").read_text(encoding="utf-8"))


# (selector, typed text, config path, value expected in config.json)
TYPED_MODEL_FIELDS = [
    ("#model-hardware-cpu-threads input", "1", "hardware.cpu_threads", 1),
    ("#model-lora-r input", "6", "lora.r", 6),
    ("#model-lora-alpha input", "12", "lora.alpha", 12),
    ("#model-lora-dropout input", "0.1", "lora.dropout", 0.1),
    ("#model-lora-target-modules textarea", "q_proj, v_proj", "lora.target_modules", ["q_proj", "v_proj"]),
    ("#model-grpo-group-size input", "3", "grpo.group_size", 3),
    ("#model-grpo-beta input", "0.02", "grpo.beta", 0.02),
    ("#model-grpo-temperature input", "0.9", "grpo.temperature", 0.9),
    ("#model-grpo-max-new-tokens input", "7", "grpo.max_new_tokens", 7),
    ("#model-training-learning-rate input", "0.0002", "training.learning_rate", 0.0002),
    ("#model-training-epochs input", "2.5", "training.epochs", 2.5),
    ("#model-training-max-steps input", "30", "training.max_steps", 30),
    ("#model-training-eval-every input", "0", "training.eval_every", 0),
    ("#model-training-batch-size input", "3", "training.batch_size", 3),
    ("#model-training-save-steps input", "15", "training.save_steps", 15),
    ("#model-run-name textarea", "fast-typist", "name", "fast-typist"),
]


def at_path(config: dict, path: str):
    for part in path.split("."):
        config = config[part]
    return config


def test_typed_fast_every_field_trains_exactly_what_the_form_shows(page, studio):
    wait_until_loaded(page)
    type_into(page, "#data-system input", "Answer with digits only.")
    type_into(page, "#data-prompt textarea", "Q: {question}")
    open_tab(page, "rewards")
    type_into(page, "#rewards-name textarea", "numeric_answer")  # the selected reward (numeric), renamed and saved
    type_into(page, "#rewards-weight input", "2.5")
    page.locator("#rewards-save").click()
    expect(page.locator("#rewards-table")).to_contain_text("numeric_answer")
    open_tab(page, "model")
    for selector, text, _, _ in TYPED_MODEL_FIELDS:
        type_into(page, selector, text)
    page.locator("#model-start").click()  # at once: no pause for any event to catch up

    config = started_config(studio)
    for _, text, path, expected in TYPED_MODEL_FIELDS:
        assert at_path(config, path) == expected, (path, text, at_path(config, path))
    assert config["data"]["prompt"] == "Q: {question}" and config["data"]["system"] == "Answer with digits only."
    assert [(r["name"], r["weight"]) for r in config["rewards"]] == [("numeric_answer", 2.5), ("length", 0.3),
                                                                     ("digits_only", 0.5)]


def test_the_advanced_grpo_settings_say_what_is_wrong_and_train_what_they_show(page, studio, screenshots):
    wait_until_loaded(page)
    open_tab(page, "model")
    page.locator("#model-advanced").get_by_text("Advanced GRPO").click()
    type_into(page, "#model-grpo-epsilon-high input", "0.28")
    problem = page.locator("#model-advanced-problem")
    expect(problem).to_contain_text("Upper clip (epsilon high) only changes training when each batch is trained on "
                                    "more than once")
    expect(page.locator("#model-start")).to_be_disabled()
    type_into(page, "#model-grpo-num-iterations input", "2")
    page.locator("#model-grpo-mask-truncated-completions input").check()
    choose(page, "#model-grpo-multi-objective-aggregation", "normalize_then_sum")
    expect(problem).to_be_empty()
    expect(page.locator("#model-start")).to_be_enabled()
    screenshot(page, screenshots, "model-advanced")
    page.locator("#model-start").click()

    config = started_config(studio)
    assert {key: config["grpo"][key] for key in ("epsilon_high", "num_iterations", "mask_truncated_completions",
                                                 "multi_objective_aggregation", "epsilon", "top_p")} == {
        "epsilon_high": 0.28, "num_iterations": 2, "mask_truncated_completions": True,
        "multi_objective_aggregation": "normalize_then_sum", "epsilon": 0.2, "top_p": 1.0}
    # Each field left alone keeps the loaded value, empty ones too (gradio's number field would have sent 0).
    assert (config["grpo"]["min_p"], config["training"]["eval_every"], config["hardware"]["gpu"]) == (None, 5, None)


def kept_draft(page, studio) -> dict:
    """The draft this browser keeps in its storage, decrypted as gradio's BrowserState does (CryptoJS: AES-256-CBC,
    key and iv from the SHA-256 of the secret by OpenSSL's EVP_BytesToKey with MD5, in "Salted__" form)."""
    stored = page.evaluate(f"localStorage.getItem({DRAFT_STORAGE_KEY!r})")
    if not stored:
        return {}
    salted = base64.b64decode(stored.split(":", 1)[1])
    assert salted[:8] == b"Salted__", stored[:40]
    password, salt = hashlib.sha256(studio.browser_storage_key().encode()).hexdigest().encode(), salted[8:16]
    derived, block = b"", b""
    while len(derived) < 48:
        block = hashlib.md5(block + password + salt).digest()
        derived += block
    decryptor = Cipher(algorithms.AES(derived[:32]), modes.CBC(derived[32:48])).decryptor()
    padded = decryptor.update(salted[16:]) + decryptor.finalize()
    unpadder = padding.PKCS7(128).unpadder()
    return (json.loads(unpadder.update(padded) + unpadder.finalize()) or {}).get("draft") or {}


def test_a_reload_just_after_an_edit_keeps_every_kind_of_field(page, studio, monkeypatch):
    """A number, a text box, a radio, a dropdown, a checkbox and a slider, each changed, then a reload as soon as
    the browser has kept them. The keeping waits for no preview: here the Model tab's check hangs (its hardware
    detection, which a cold start's torch import made take seconds) until after the reload, and a reload three
    seconds after typing Max steps found 0 again."""
    wait_until_loaded(page)
    checkpointing = "#model-training-gradient-checkpointing input"
    open_tab(page, "model")
    was_checked = page.locator(checkpointing).is_checked()
    released, detect = threading.Event(), studio.hardware
    monkeypatch.setattr(studio, "hardware", lambda refresh=False: released.wait(120) and detect(refresh))
    try:
        type_into(page, "#model-training-max-steps input", "42")
        page.locator("#model-hardware-device").get_by_label("cpu").check()
        choose(page, "#model-grpo-loss-type", "bnpo")
        page.locator(checkpointing).click()
        open_tab(page, "data")
        type_into(page, "#data-eval-frac input[type=number]", "0.2")
        open_tab(page, "model")
        type_into(page, "#model-run-name textarea", "kept-run")
        page.locator("#model-run-name textarea").press("Tab")
        wanted = {("training", "max_steps"): 42, ("hardware", "device"): "cpu", ("grpo", "loss_type"): "bnpo",
                  ("training", "gradient_checkpointing"): not was_checked, ("data", "eval_frac"): 0.2,
                  ("name",): "kept-run"}
        deadline = time.monotonic() + 30
        while any(at(kept_draft(page, studio), path) != value for path, value in wanted.items()):
            assert time.monotonic() < deadline, kept_draft(page, studio)
            time.sleep(0.2)
    finally:
        released.set()

    page.reload()
    wait_until_loaded(page)
    open_tab(page, "model")
    expect(page.locator("#model-training-max-steps input")).to_have_value("42")
    expect(page.locator("#model-hardware-device").get_by_label("cpu")).to_be_checked()
    expect(page.locator("#model-grpo-loss-type input")).to_have_value("bnpo")
    expect(page.locator(checkpointing)).to_be_checked(checked=not was_checked)
    expect(page.locator("#model-run-name textarea")).to_have_value("kept-run")
    open_tab(page, "data")
    expect(page.locator("#data-eval-frac input[type=number]")).to_have_value("0.2")


def at(draft: dict, path: tuple[str, ...]):
    for key in path:
        draft = draft.get(key) if isinstance(draft, dict) else None
    return draft


def test_a_reload_mid_edit_keeps_the_draft(page, studio):
    wait_until_loaded(page)
    open_tab(page, "model")
    type_into(page, "#model-training-max-steps input", "37")
    type_into(page, "#model-grpo-temperature input", "0.7")
    open_tab(page, "rewards")
    choose(page, "#rewards-selected", "digits_only")
    page.locator("#rewards-remove").click()
    expect(page.locator("#rewards-table")).not_to_contain_text("digits_only")
    open_tab(page, "data")
    type_into(page, "#data-system input", "Be brief.")
    page.locator("#data-system input").press("Enter")
    deadline = time.monotonic() + 30
    while (kept_draft(page, studio).get("data") or {}).get("system") != "Be brief.":  # the last change is kept
        assert time.monotonic() < deadline, kept_draft(page, studio)
        time.sleep(0.1)

    page.reload()
    expect(page.locator("#data-counts")).to_contain_text("400 rows")
    expect(page.locator("#data-system input")).to_have_value("Be brief.")
    open_tab(page, "model")
    expect(page.locator("#model-training-max-steps input")).to_have_value("37")
    expect(page.locator("#model-grpo-temperature input")).to_have_value("0.7")
    open_tab(page, "rewards")
    expect(page.locator("#rewards-table")).to_contain_text("length")
    expect(page.locator("#rewards-table")).not_to_contain_text("digits_only")

    # The recipe box says the form holds one's own settings; loading a recipe over them asks first, and keeping
    # them changes nothing (the box says so again).
    expect(page.locator("#recipe input")).to_have_value(OWN_SETTINGS)
    choose(page, "#recipe", "arithmetic")
    page.locator("#load-recipe").click()
    expect(page.locator("#replace-draft-text")).to_contain_text("Replace them with the arithmetic recipe?")
    page.locator("#replace-draft-no").click()
    expect(page.locator("#recipe input")).to_have_value(OWN_SETTINGS)
    open_tab(page, "model")
    expect(page.locator("#model-training-max-steps input")).to_have_value("37")
    choose(page, "#recipe", "arithmetic")
    page.locator("#load-recipe").click()
    page.locator("#replace-draft-yes").click()
    expect(page.locator("#model-training-max-steps input")).to_have_value("200")


def test_one_of_trls_rewards_is_added_and_tried_in_the_playground(page, studio, screenshots):
    """A length penalty counted in the starting model's tokens: its settings appear with the kind, and a long reply
    typed in the playground loses the whole point."""
    wait_until_loaded(page)
    open_tab(page, "rewards")
    choose(page, "#rewards-selected", "➕ New reward")
    choose_kind(page, "overlong")
    expect(page.locator("#rewards-kind-help")).to_contain_text("soft overlong punishment")
    expect(page.locator("#rewards-settings-ngram-size")).to_be_hidden()
    type_into(page, "#rewards-settings-max-tokens input", "4")
    page.locator("#rewards-add").click()
    expect(page.locator("#rewards-table")).to_contain_text("takes up to 1 away as the reply nears 4 tokens")
    page.locator("#rewards-completion textarea").fill("12 12 12 12 12 12 12 12")
    page.locator("#rewards-score").click()
    expect(page.locator("#rewards-scores").get_by_role("row", name="overlong 1 -1 -1")).to_be_visible()
    screenshot(page, screenshots, "rewards-trl")


def test_a_classifier_reward_is_added_and_scores_a_typed_reply(page, studio, classifier_dir):
    wait_until_loaded(page)
    open_tab(page, "rewards")
    choose(page, "#rewards-selected", "➕ New reward")
    choose_kind(page, "classifier")
    expect(page.locator("#rewards-settings-max-tokens")).to_be_hidden()
    type_into(page, "#rewards-settings-model textarea", str(classifier_dir))
    type_into(page, "#rewards-settings-label textarea", "POSITIVE")
    page.locator("#rewards-add").click()
    expect(page.locator("#rewards-table")).to_contain_text("says POSITIVE (its probability)")
    page.locator("#rewards-completion textarea").fill("The answer is 42")
    page.locator("#rewards-score").click()
    row = page.locator("#rewards-scores").get_by_role("row", name=re.compile(r"^classifier 1 0\.\d+"))
    expect(row).to_be_visible()


def test_rewards_added_edited_and_removed_in_any_order_are_what_trains(page, studio, screenshots):
    wait_until_loaded(page)
    open_tab(page, "rewards")
    table = page.locator("#rewards-table")
    for name in ("numeric", "length", "digits_only"):  # the recipe's rewards, removed in list order
        pick_reward(page, name)
        page.locator("#rewards-remove").click()
        expect(table).not_to_contain_text(name)  # its answer (the last one's status says no reward is left)
    expect(page.locator("#rewards-name textarea")).to_have_value("numeric")  # a new reward, with its defaults
    choose_kind(page, "json")
    expect(page.locator("#rewards-name textarea")).to_have_value("json")
    expect(page.locator("#rewards-weight input")).to_have_value("1")
    edit_rewards(page, "add", "Added the reward json")
    pick_reward(page, NEW_REWARD)
    choose_kind(page, "keyword")
    type_into(page, "#rewards-settings-words textarea", "hello, world")
    edit_rewards(page, "add", "Added the reward keyword")
    pick_reward(page, "json")
    expect(page.locator("#rewards-kind input")).to_have_value("json")
    type_into(page, "#rewards-weight input", "2")
    edit_rewards(page, "save", "Saved the reward json")
    pick_reward(page, NEW_REWARD)
    choose_kind(page, "length")
    type_into(page, "#rewards-settings-max-chars input", "40")
    edit_rewards(page, "add", "Added the reward length")
    pick_reward(page, NEW_REWARD)
    choose_kind(page, "exact")
    type_into(page, "#rewards-name textarea", "accuracy")
    page.locator("#rewards-settings-train input").uncheck()  # a metric: measured, never trained on
    edit_rewards(page, "add", "Added the reward accuracy")
    expect(table).to_contain_text("a metric: not trained on")
    page.locator("#rewards-completion textarea").fill("12")
    page.locator("#rewards-score").click()
    expect(page.locator("#rewards-scores").get_by_role("row", name=re.compile(r"^accuracy \(metric\) 0 "))) \
        .to_be_visible()
    screenshot(page, screenshots, "rewards-metric")
    pick_reward(page, "keyword")
    edit_rewards(page, "remove", "Removed the reward keyword")
    expect(table).not_to_contain_text("keyword")
    open_tab(page, "model")
    page.locator("#model-start").click()

    config = started_config(studio)
    assert [(r["name"], r["kind"], r["weight"], r.get("train", True)) for r in config["rewards"]] == [
        ("json", "json", 2.0, True), ("length", "length", 1.0, True), ("accuracy", "exact", 1.0, False)]
    assert config["rewards"][1]["max_chars"] == 40


SLOW_ANSWER_S = 2.0  # a busy server's answer to one edit of the rewards list


@pytest.fixture
def slow_list_edits(monkeypatch) -> dict[str, threading.Event]:
    """Add and a choice of reward answered as a busy server answers them, before the page is built. Each handler
    sets its Event as it starts: two clicks sent within milliseconds reach gradio's queue in either order (each is
    its own request), so the test sends the next click once it knows the queue has the one before."""
    started = {}
    for handler in ("add_reward", "select_reward"):
        fast, started[handler] = getattr(rewards_tab, handler), threading.Event()

        def slow(*args, _fast=fast, _started=started[handler], **kwargs):
            _started.set()
            time.sleep(SLOW_ANSWER_S)
            return _fast(*args, **kwargs)

        monkeypatch.setattr(rewards_tab, handler, slow)
    return started


def test_a_kind_chosen_while_a_slow_answer_lands_changes_the_reward_chosen(slow_list_edits, page, studio):
    """The answer to Add selects the added reward. Where it lands after the person has already picked "New reward",
    the picker shows the added reward again until the choice is answered; a kind chosen in that moment changes the
    new reward the person picked, and leaves Add to add it."""
    wait_until_loaded(page)
    open_tab(page, "rewards")
    pick_reward(page, NEW_REWARD)
    choose_kind(page, "json")
    slow_list_edits["select_reward"].clear()
    page.locator("#rewards-add").click()
    assert slow_list_edits["add_reward"].wait(WAIT_MS / 1000)
    choose(page, "#rewards-selected", NEW_REWARD)  # picked before Add is answered
    assert slow_list_edits["select_reward"].wait(WAIT_MS / 1000)  # the pick runs: the Add's answer is on its way
    expect(page.locator("#rewards-table")).to_contain_text("json")  # and has landed; the pick's has not
    choose_kind(page, "exact")
    expect(page.locator("#rewards-selected input")).to_have_value(NEW_REWARD)
    expect(page.locator("#rewards-name textarea")).to_have_value("exact")
    page.locator("#rewards-add").click()
    table = page.locator("#rewards-table")
    for name, kind in (("json", "json"), ("exact", "exact")):  # both added, the json reward still a json one
        expect(table.get_by_role("row", name=re.compile(rf"^{name} {kind} "))).to_be_visible()


def test_measure_one_step_says_its_time_and_peak_until_a_setting_changes(page, studio, screenshots):
    """The Model tab's dry run: one real step of the settings shown, its time and peak memory under the estimate,
    forgotten as soon as a setting changes (it measured other settings)."""
    open_tab(page, "model")
    expect(page.locator("#model-check")).to_contain_text("The settings are valid")
    measured = page.locator("#model-measured")
    expect(measured).to_contain_text("trains one real step of these settings")
    page.get_by_role("button", name="Measure one step").click()
    expect(measured).to_contain_text(re.compile(r"Dry run: one step of \d+ prompts .* took .+ on the cpu, after a first "
                                                r"step to warm up; peak memory [\d.]+ GB"), timeout=120_000)
    measured.scroll_into_view_if_needed()
    screenshot(page, screenshots, "model-measured")
    type_into(page, "#model-grpo-group-size input", "3")
    expect(measured).to_contain_text("trains one real step of these settings")


def test_will_it_learn_says_why_not_and_its_fix_changes_the_settings_shown(page, studio, screenshots, monkeypatch):
    """The pre-flight on the Model tab: the verdict with the numbers, the prompts hardest first, and fixes that write
    into the form. At a temperature of 0.01 the tiny model's replies to a prompt are all alike and fail: too hard."""
    monkeypatch.setattr(preflight, "MOST_PROMPTS", 16)  # the tiny model samples so fast that the default is the most
    wait_until_loaded(page)
    open_tab(page, "model")
    type_into(page, "#model-grpo-temperature input", "0.01")
    expect(page.locator("#preflight-cancel")).to_be_hidden()  # shown only while a pre-flight runs
    page.locator("#model-preflight").click()
    status = page.locator("#preflight-status")
    expect(status).to_contain_text("% of groups have no spread")
    expect(status).to_contain_text("all fail. Too hard for this model")
    expect(page.locator("#preflight-prompts")).to_contain_text("all fail")
    warmer = page.locator("#preflight-fix-0")
    expect(warmer).to_have_text("Raise the temperature to 0.31")
    expect(page.locator("#preflight-fix-1")).to_have_text("Add partial credit (close_number)")
    expect(page.locator("#preflight-fix-2")).to_have_text("Drop the prompts that all fail or all pass (16)")
    expect(page.locator("#preflight-cancel")).to_be_hidden()
    screenshot(page, screenshots, "preflight")
    first = page.locator("#preflight-prompts [role=row]:has([role=gridcell])").first  # hardest first
    row, prompt = (first.locator("[role=gridcell]").nth(n).inner_text().strip() for n in (0, 3))
    first.locator("[role=gridcell]").nth(3).click()  # opens in the playground, whichever row of the file it is
    expect(page.locator("#rewards-row-text")).to_contain_text(prompt)
    expect(page.locator("#rewards-row input")).to_have_value(re.compile(rf"^{row}: "))
    expect(page.locator("#rewards-score")).to_be_visible()  # the Rewards tab is the one shown
    open_tab(page, "model")
    warmer.click()
    expect(status).to_contain_text("Applied the pre-flight's fix: Raise the temperature to 0.31")
    expect(page.locator("#model-grpo-temperature input")).to_have_value("0.31")
    page.locator("#preflight-fix-1").click()
    expect(status).to_contain_text("Applied the pre-flight's fix: Add partial credit (close_number)")
    expect(page.locator("#model-grpo-temperature input")).to_have_value("0.31")  # the first fix stays
    open_tab(page, "rewards")
    expect(page.locator("#rewards-table")).to_contain_text("close_number")
    open_tab(page, "model")
    page.locator("#preflight-fix-2").click()  # the difficulty filter: shown, and cleared, on the Data tab
    expect(status).to_contain_text("Applied the pre-flight's fix: Drop the prompts that all fail or all pass (16)")
    open_tab(page, "data")
    difficulty = page.locator("#data-difficulty")
    expect(difficulty).to_contain_text("training leaves out the 16 of 16 rows measured by a pre-flight whose pass "
                                       "rate is outside 0.01 to 0.99")
    expect(page.locator("#data-counts")).to_contain_text("The difficulty filter leaves out 16 more training rows")
    screenshot(page, screenshots, "difficulty-filter")
    page.locator("#data-difficulty-clear").click()
    expect(difficulty).to_contain_text("Cleared the difficulty filter: every row trains.")
    expect(page.locator("#data-difficulty-clear")).to_be_hidden()
    expect(page.locator("#data-counts")).not_to_contain_text("difficulty filter")
    open_tab(page, "model")
    page.locator("#preflight-fix-2").click()
    expect(page.locator("#model-grpo-temperature input")).to_have_value("0.31")  # the other fixes stay
    page.locator("#model-start").click()
    config = started_config(studio)
    assert config["grpo"]["temperature"] == 0.31 and config["rewards"][-1]["name"] == "close_number"
    assert len(config["data"]["pass_rates"]) == 16 and set(config["data"]["pass_rates"].values()) == {0.0}
    (run,) = studio.runs.summaries()
    assert len(json.loads((Path(run["dir"]) / "data" / "dropped.json").read_text())) == 16


def test_the_playground_tries_to_game_the_rewards(page, studio, screenshots):
    """The red team on the Rewards tab: the recipe's rewards pass; a heavy reward for mentioning the reference is
    gamed by naming it beside a wrong answer, and the page says which reward pays and how to close it."""
    wait_until_loaded(page)
    open_tab(page, "rewards")
    page.locator("#rewards-red-team").click()
    verdict = page.locator("#rewards-red-team-verdict")
    expect(verdict).to_contain_text("No gaming reply earns half of what an honest one does (11 tried on 8 rows)")
    pick_reward(page, NEW_REWARD)
    choose_kind(page, "contains")
    type_into(page, "#rewards-weight input", "3")
    edit_rewards(page, "add", "Added the reward contains")
    page.locator("#rewards-red-team").click()
    expect(verdict).to_contain_text("These rewards can be gamed: 'the reference in a negation'")
    expect(verdict).to_contain_text("contains: it pays for the reference anywhere in the reply")
    expect(page.locator("#rewards-red-team-table")).to_contain_text("⚠️ yes")
    screenshot(page, screenshots, "rewards-red-team")
