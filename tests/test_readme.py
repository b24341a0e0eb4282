"""The README is the newcomer's manual and docs/ the reference behind it: what they state about the product is checked
here against the product itself (its settings, reward kinds, commands, run directory, layout) and against the
benchmark results their figures come from."""

import ast
import dataclasses
import importlib.util
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dragon_ui import speedups
from dragon_ui.config import RunConfig, documented_settings, settings_table
from dragon_ui.rewards import EXTRACT_MODES, REWARD_KINDS, kind_fields
from dragon_ui.rewards.spec import reward_kinds_table, reward_settings_table
from dragon_ui.tools.spec import environment_kinds_table, tool_kinds_table, tool_settings_table
from dragon_ui.runstore import RunDir

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
README_PATH = ROOT / "README.md"
README = README_PATH.read_text(encoding="utf-8")
REFERENCE = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
PERFORMANCE = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
PAGES = {path: path.read_text(encoding="utf-8") for path in [README_PATH, *sorted((ROOT / "docs").glob("*.md"))]}


# --------------------------------------------------------------------------------------------------------------------
# Reading markdown
# --------------------------------------------------------------------------------------------------------------------

def section(text: str, heading: str) -> str:
    """The text under ``## heading`` up to the next heading of that level or above."""
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^#{{1,2}} |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"no section '## {heading}'"
    return match.group(1)


def tables(text: str) -> list[list[list[str]]]:
    """Every markdown table in ``text``: its rows (header first, the |---| line left out), each a list of cells."""
    found, rows = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", cell) for cell in cells):
                rows.append(cells)
        elif rows:
            found.append(rows)
            rows = []
    return found


def table_with(text: str, header: str) -> list[list[str]]:
    """The rows under the header of the one table whose first header cell is ``header``."""
    matching = [table for table in tables(text) if table[0][0] == header]
    assert len(matching) == 1, f"expected one table headed '{header}', found {len(matching)}"
    return matching[0][1:]


def code_names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {slug(title) for title in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}


def number(cell: str) -> float:
    return float(cell.strip("*").strip())


def two_decimals(value: float) -> str:
    return f"{value:.2f}"


# --------------------------------------------------------------------------------------------------------------------
# The README's shape
# --------------------------------------------------------------------------------------------------------------------

def test_the_space_front_matter_comes_first():
    """Hugging Face Spaces read the YAML between the first two --- lines: the app to run and its SDK."""
    assert README.startswith("---\n")
    front = yaml.safe_load(README.split("---\n")[1])
    assert front["sdk"] == "gradio" and (ROOT / front["app_file"]).is_file()
    assert front["title"] == "Dragon GRPO Studio"


def test_the_space_builds_with_the_python_and_gradio_the_app_is_tested_with():
    """Spaces default to Python 3.10 and pick gradio by sdk_version: both must be ones the libraries accept."""
    import importlib.metadata

    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    front = yaml.safe_load(README.split("---\n")[1])
    python = Version(str(front["python_version"]))
    for package in ("torch", "trl", "transformers", "peft", "accelerate", "datasets", "gradio"):
        requires = importlib.metadata.metadata(package).get("Requires-Python") or ""
        assert python in SpecifierSet(requires), f"{package} needs Python {requires}, the Space has {python}"
    gradio = Version(front["sdk_version"])
    required = next(Requirement(line) for line in (ROOT / "requirements.txt").read_text().splitlines()
                    if line.startswith("gradio"))
    assert gradio in required.specifier and gradio == Version(importlib.metadata.version("gradio"))


def test_the_two_commands_come_first():
    body = README.split("---\n", 2)[2]
    before_any_section = body.split("\n## ")[0]
    first_block = before_any_section.split("```")[1]
    assert "make run" in first_block and "make test" in first_block


def test_the_readme_stays_a_manual():
    """Reference material belongs in docs/: the README is the tour, the recipes and the commands."""
    assert len(README.splitlines()) <= 300


def test_every_docs_page_is_linked_from_the_readme():
    for page in (ROOT / "docs").glob("*.md"):
        assert f"](docs/{page.name}" in README, page.name


@pytest.mark.parametrize("page", PAGES, ids=lambda path: path.name)
def test_every_link_and_picture_resolves(page):
    text = PAGES[page]
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://")):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.name} links to {target}, which does not exist"
        if anchor:
            assert anchor in anchors(file.read_text(encoding="utf-8")), f"{page.name}: no heading for {target}"


# --------------------------------------------------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------------------------------------------------

def makefile_targets() -> set[str]:
    return set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(encoding="utf-8"), re.MULTILINE))


@pytest.mark.parametrize("page", PAGES, ids=lambda path: path.name)
def test_every_make_command_is_a_makefile_target(page):
    named = set(re.findall(r"(?:^|`|\n)make ([a-z][\w-]*)", PAGES[page]))
    assert named <= makefile_targets(), named - makefile_targets()


def cli_commands() -> set[str]:
    """The subcommands `python -m dragon_ui --help` offers."""
    usage = subprocess.run([sys.executable, "-m", "dragon_ui", "--help"], capture_output=True, text=True, cwd=ROOT,
                           check=True).stdout
    return set(re.search(r"\{([\w,-]+)\}", usage).group(1).split(","))


def test_every_command_line_command_is_documented_and_every_documented_one_exists():
    commands = cli_commands()
    assert commands >= {"train", "runs", "eval", "score", "stop", "merge", "export"}
    for command in commands:
        assert f"dragon {command}" in README, command  # the console script, or python -m dragon_ui
    for page, text in PAGES.items():
        named = set(re.findall(r"(?:-m dragon_ui|\bdragon) ([a-z][\w-]*)", text))
        assert named <= commands, f"{page.name} names commands that do not exist: {named - commands}"


# --------------------------------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------------------------------

SECTIONS = [f.name for f in dataclasses.fields(RunConfig) if dataclasses.is_dataclass(getattr(RunConfig(), f.name))]


def settings() -> set[str]:
    """Every setting of a run configuration (rewards have a reference of their own)."""
    return {item.path for item in documented_settings()} - {"rewards"}


def test_the_reference_table_is_the_one_the_settings_make():
    """The table is made from the fields' own help (make reference): it is never edited by hand."""
    shown = REFERENCE.partition("<!-- settings: begin -->\n")[2].partition("<!-- settings: end -->")[0]
    assert shown == settings_table(), "docs/reference.md's table of settings is out of date: run make reference"


@pytest.mark.parametrize("page", PAGES, ids=lambda path: path.name)
def test_every_setting_named_anywhere_exists(page):
    """`training.learning_rate`, `--set grpo.group_size=4`, `lora.dropout: 0`: a renamed setting leaves none behind."""
    pattern = rf"(?:`|--set )((?:{'|'.join(SECTIONS)})\.\w+)"
    named = set(re.findall(pattern, PAGES[page]))
    assert named <= set(settings()), f"{page.name} names settings that do not exist: {named - set(settings())}"


# --------------------------------------------------------------------------------------------------------------------
# Rewards
# --------------------------------------------------------------------------------------------------------------------

KIND_TABLES = {"reward kinds": reward_kinds_table, "reward settings": reward_settings_table,
               "tool kinds": tool_kinds_table, "environment kinds": environment_kinds_table,
               "tool settings": tool_settings_table}


@pytest.mark.parametrize("name", KIND_TABLES)
def test_the_reward_and_tool_tables_are_the_ones_the_kinds_make(name):
    """Made from the kinds' own classes (make reference): a kind, a setting or a word of help changed in the code
    is changed here too, never by hand."""
    shown = REFERENCE.partition(f"<!-- {name}: begin -->\n")[2].partition(f"<!-- {name}: end -->")[0]
    assert shown == KIND_TABLES[name](), f"docs/reference.md's table of {name} is out of date: run make reference"


def test_every_reward_kind_has_a_row_with_its_settings():
    rows = {code_names(kind)[0]: code_names(settings_cell) for kind, settings_cell, _ in
            table_with(section(REFERENCE, "Rewards"), "kind")}
    assert rows == {kind: list(kind_fields(kind)) for kind in REWARD_KINDS}


def test_every_extraction_is_in_the_reference():
    rows = table_with(section(REFERENCE, "Rewards"), "`extract`")
    assert sorted(code_names(row[0])[0] for row in rows) == sorted(EXTRACT_MODES)


@pytest.mark.parametrize("kind", REWARD_KINDS + EXTRACT_MODES)
def test_the_readme_names_every_reward_kind_and_extraction(kind):
    assert f"`{kind}`" in section(README, "Rewards")


# --------------------------------------------------------------------------------------------------------------------
# The run directory and the code
# --------------------------------------------------------------------------------------------------------------------

def test_every_file_of_the_run_directory_is_documented(tmp_path):
    run = RunDir(tmp_path)
    files = {getattr(run, attr).name + ("/" if attr.endswith("_dir") else "")
             for attr in dir(RunDir) if attr.endswith(("_path", "_dir"))}
    rows = table_with(section(REFERENCE, "The run directory"), "file")
    documented = {code_names(row[0])[0] for row in rows}
    assert files == documented


def top_level_names(module: str) -> set[str]:
    """What a module defines at its top level, read from its source (nothing is imported)."""
    spec = importlib.util.find_spec(module)
    assert spec and spec.origin, f"no module {module}"
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {alias.asname or alias.name for alias in node.names}
        elif isinstance(node, ast.Assign):
            names |= {target.id for target in node.targets if isinstance(target, ast.Name)}
    return names


def is_module(name: str) -> bool:
    """Whether ``name`` is a module (``a.b.c`` only counts where ``a.b`` is a package; nothing is imported)."""
    parent, _, _ = name.rpartition(".")
    parent_spec = importlib.util.find_spec(parent) if parent else None
    if parent and (parent_spec is None or parent_spec.submodule_search_locations is None):
        return False
    return importlib.util.find_spec(name) is not None


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.DOTALL)


@pytest.mark.parametrize("page", PAGES, ids=lambda path: path.name)
def test_the_python_in_the_docs_names_what_the_package_has(page):
    """Every `from dragon_ui... import x` resolves, and every `module.function(...)` called on such a module exists."""
    for block in python_blocks(PAGES[page]):
        tree = ast.parse(block)
        modules = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module.startswith("dragon_ui"):
                for alias in node.names:
                    if is_module(f"{node.module}.{alias.name}"):
                        modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    else:
                        assert alias.name in top_level_names(node.module), f"{node.module} has no {alias.name}"
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
                assert node.attr in top_level_names(modules[node.value.id]), f"{modules[node.value.id]}.{node.attr}"


def test_the_layout_names_every_subpackage_and_only_real_ones():
    layout = section(README, "Development")
    packages = {path.parent.name for path in (ROOT / "dragon_ui").glob("*/__init__.py")}
    named = (set(re.findall(r"`dragon_ui/(\w+)/`", layout)) | set(re.findall(r"`(\w+)/`", layout))) - {"dragon_ui"}
    assert packages <= named, f"the Layout paragraph leaves out {packages - named}"
    assert named <= packages, f"the Layout paragraph names folders that are not packages: {named - packages}"


def test_the_recipes_table_lists_the_recipe_files():
    rows = table_with(section(README, "Recipes"), "recipe")
    documented = {code_names(row[0])[0] for row in rows}
    assert documented == {path.stem for path in (ROOT / "dragon_ui" / "assets" / "recipes").glob("*.yaml")}


# --------------------------------------------------------------------------------------------------------------------
# Performance figures come from bench/results
# --------------------------------------------------------------------------------------------------------------------

def result(name: str) -> dict:
    return json.loads((RESULTS / name).read_text(encoding="utf-8"))


# bench/overhead.py's sides, by the label both it and docs/performance.md give them
OVERHEAD_SIDES = {"plain TRL script": "plain", "Dragon, speed-ups off": "dragon-none",
                  "plain TRL script + Dragon's speed-ups": "plain-speedups", "Dragon as shipped": "dragon"}


def overhead_rows() -> dict[str, tuple[float, str]]:
    """docs/performance.md's Dragon-against-plain-TRL table: label -> (median seconds per step, results file)."""
    rows = table_with(section(PERFORMANCE, "Dragon against a plain TRL script"), "")
    return {row[0].strip("*"): (number(row[1]), code_names(row[-1])[0]) for row in rows}


def test_the_overhead_table_is_its_results_files():
    rows = overhead_rows()
    assert set(rows) == set(OVERHEAD_SIDES)
    for label, (seconds, file) in rows.items():
        assert two_decimals(seconds) == two_decimals(result(file)["median_s"][OVERHEAD_SIDES[label]]), label


def test_the_readme_step_times_are_the_documented_ones():
    rows = dict(table_with(section(README, "Performance"), "the same training step"))
    documented = overhead_rows()
    assert number(rows["a plain TRL script (`bench/plain_trl.py`)"]) == documented["plain TRL script"][0]
    assert number(rows["Dragon as shipped"]) == documented["Dragon as shipped"][0]
    plain_with_speedups = documented["plain TRL script + Dragon's speed-ups"][0]
    assert f"the plain script takes {two_decimals(plain_with_speedups)} s" in section(README, "Performance")
    ratio = documented["plain TRL script"][0] / documented["Dragon as shipped"][0]
    assert rows["Dragon's speed-up, in one sitting"] == f"{ratio:.1f}×"


def test_the_readme_names_the_machine_the_results_were_measured_on():
    stated = section(README, "Performance")
    for file in ["overhead-bfloat16.json", "learning.json"]:
        machine = result(file)["machine"]
        torch_version = ".".join(machine["torch"].split(".")[:2])
        assert f"{machine['cores']} vCPU {machine['cpu']}" in stated
        assert f"torch {torch_version}" + (" (CPU)" if "+cpu" in machine["torch"] else "") in stated


def test_the_readme_learning_table_is_the_learning_run():
    header, *rows = next(table for table in tables(section(README, "Performance")) if table[0][0] == "minutes trained")
    rows = {row[0]: row[1:] for row in rows}
    points = result("learning.json")["points"]
    assert [int(cell) for cell in header[1:]] == [round(point["minutes_trained"]) for point in points]
    assert [int(cell) for cell in rows["steps"]] == [point["step"] for point in points]
    assert rows["held-out reward (20 prompts)"] == [two_decimals(p["recipe_heldout"]["normalised"]) for p in points]
    assert rows["fresh additions (100 prompts)"] == [two_decimals(p["fresh_100"]["normalised"]) for p in points]


def speedup_tables() -> list[list[list[str]]]:
    return [table[1:] for table in tables(section(PERFORMANCE, "The speed-ups")) if table[0][0] == "speed-ups on"]


def test_every_speed_up_is_documented():
    documented = set(re.findall(r"^- \*\*`(\w+)`\*\*", section(PERFORMANCE, "The speed-ups"), re.MULTILINE))
    assert documented == set(speedups.ALL)
    assert f"`{speedups.ENV}`" in section(PERFORMANCE, "The speed-ups")
    measured = {name for table in speedup_tables() for row in table for name in code_names(row[0])}
    assert set(speedups.ALL) <= measured


def variant(variants: dict, label: str) -> dict:
    """The results entry a table row stands for: a '+ `name`' row is the variant '+ name…' (`lora.dropout: 0` is
    '+ lora.dropout 0 …'); the row without a + is the table's starting point, the first variant measured."""
    if not label.startswith("+"):
        return next(iter(variants.values()))
    name = code_names(label)[0].split(":")[0]
    matching = [key for key in variants if key.startswith(f"+ {name}")]
    assert len(matching) == 1, label
    return variants[matching[0]]


@pytest.mark.parametrize("index, files", [(0, ("speedups-bfloat16.json", "speedups-float32.json")),
                                          (1, ("speedups-bfloat16-from-merged_sampling.json",
                                               "speedups-float32-from-merged_sampling.json"))])
def test_the_speed_up_tables_are_their_results_files(index, files):
    bf16, fp32 = (result(file)["variants"] for file in files)
    for row in speedup_tables()[index]:
        assert two_decimals(number(row[1])) == two_decimals(variant(bf16, row[0])["step_s"]), row[0]
        assert two_decimals(number(row[7])) == two_decimals(variant(fp32, row[0])["step_s"]), row[0]


def test_the_step_breakdown_is_its_results_files():
    rows = table_with(section(PERFORMANCE, "Where a step goes"), "part")
    step = next(row for row in rows if row[0] == "**step**")
    for column, file in ((1, "breakdown-float32.json"), (3, "breakdown-bfloat16.json")):
        breakdown = result(file)
        assert two_decimals(number(step[column])) == two_decimals(breakdown["step_median_s"])
        assert two_decimals(number(step[column + 1])) == two_decimals(breakdown["floor_step_s"])


def test_the_learning_tables_are_their_results_files():
    learning = section(PERFORMANCE, "Learning per minute")
    points = result("learning.json")["points"]
    for row, point in zip(table_with(learning, "minutes trained"), points):
        assert int(row[1]) == point["step"]
        assert row[2] == f"{point['recipe_heldout']['normalised']:.3f}"
        assert row[3] == f"{point['fresh_100']['normalised']:.3f}"
    for row in table_with(learning, "variant"):
        points = result(code_names(row[-1])[0])["points"]
        assert int(row[1]) == points[1]["step"], row[0]
        assert row[2] == " / ".join(two_decimals(point["fresh_100"]["normalised"]) for point in points[1:]), row[0]


def test_the_grpo_variants_table_is_its_results_files():
    rows = table_with(section(PERFORMANCE, "Learning per minute"), "GRPO variant")
    assert len(rows) == 4
    for row in rows:
        found = result(code_names(row[-1])[0])
        points, progress = found["points"], found["progress"]
        weights = sum(reward["weight"] for reward in found["settings"]["config"]["rewards"])
        assert int(row[1]) == points[-1]["step"], row[0]
        assert row[2] == " / ".join(f"{point['recipe_heldout']['normalised']:.3f}" for point in points), row[0]
        assert row[3] == " / ".join(f"{point['fresh_100']['normalised']:.3f}" for point in points), row[0]
        assert row[4] == two_decimals(statistics.fmean(r["reward"] for r in progress[-5:]) / weights), row[0]
        assert row[5] == f"{statistics.fmean(r['kl'] for r in progress[-3:]):.3f}", row[0]


def test_the_loop_tables_are_their_results_files():
    """The README's loop table and docs/performance.md's: each moment, before and after, as bench/page_latency.py
    recorded it (the median, or the p95 where a row says so; "p50 / p95" where a cell holds both)."""
    thread, worker = (result(name)["rows"] for name in ("page-latency-thread.json", "page-latency-worker.json"))
    labels = {"a first page shows its data (cold)": ("first page load → data preview (cold)", "p50_s"),
              "Start → step 1 done, less the step's own time": ("Start → step 1 done, less the step's own time",
                                                                "p50_s"),
              "a typed reply scored while a run trains (p95)": ("score a typed reply (training)", "p95_s"),
              "a second browser shows the running run": ("second browser → Train tab shows the run", "p50_s")}
    rows = table_with(section(README, "Performance"), "moment")
    assert [row[0] for row in rows] == list(labels)
    for row in rows:
        moment, statistic = labels[row[0]]
        assert row[1:] == [two_decimals(thread[moment][statistic]), two_decimals(worker[moment][statistic])], row[0]
    for row in table_with(section(PERFORMANCE, "The loop a learner feels"), "what the learner waits for"):
        for cell, measured in zip(row[1:], (thread[row[0]], worker[row[0]]), strict=True):
            assert cell.split(" / ") == [two_decimals(measured[key]) for key in ("p50_s", "p95_s")][
                :len(cell.split(" / "))], row[0]
    before, after = (result(name)["rows"] for name in ("page-latency-before.json", "page-latency.json"))
    documented = table_with(section(PERFORMANCE, "The loop a learner feels"), "moment")
    assert [row[0] for row in documented] == list(after)
    for row in documented:
        assert row[2].split(" / ")[0] == two_decimals(after[row[0]]["p50_s"]), row[0]
        if row[1] != "–":
            assert row[1].split(" / ")[0] == two_decimals(before[row[0]]["p50_s"]), row[0]


def test_the_calculator_table_is_its_results_file():
    """Each cell of the calculator lesson's table, worked out from what bench/calculator.py recorded."""
    found = result("calculator.json")
    rows = table_with(section(PERFORMANCE, "The calculator lesson"), "run")
    alone, tool = found["alone"], found["with_tool"]
    assert [row[0] for row in rows] == ["the model alone (no tool, 1 step)", "with the calculator"]
    assert rows[0][1:] == [f"{alone['heldout_before']:.3f}", "–", "–", f"{alone['minutes']:.1f}"]
    assert rows[1][1:] == [f"{tool['heldout_before']:.3f} → {tool['heldout_after']:.3f}",
                           f"{tool['answer_first']:.3f} → {tool['answer_last']:.3f}",
                           f"{tool['calls_first']:.2f} → {tool['calls_last']:.2f}", f"{tool['minutes']:.1f}"]
    recipe = yaml.safe_load((ROOT / "dragon_ui" / "assets" / "recipes" / "calculator.yaml").read_text())
    assert found["steps"] == recipe["training"]["max_steps"] == len(tool["steps"]) and tool["state"] == "succeeded"
    assert tool["n_heldout"] == 30


def test_the_too_hard_table_is_its_results_file():
    """Each cell of the lesson's table, worked out from what bench/too_hard.py recorded."""
    found = result("too-hard.json")
    rows = table_with(section(PERFORMANCE, "The too-hard lesson"), "run")
    assert [row[0] for row in rows] == ["as shipped", "with its fix"]
    assert found["fix"] == "Add partial credit (close_number)"

    def percent(share: float) -> str:
        return f"{round(100 * share)} %"

    def moved(before: dict, after: dict, name: str) -> str:
        return f"{before[name]:.3f} → {after[name]:.3f}" if name in after else "–"

    for row, run in zip(rows, (found["as_shipped"], found["fixed"])):
        steps, heldout = run["steps"], run["heldout"]
        close = ("–" if steps[0]["close_number"] is None else
                 f"{statistics.fmean(s['close_number'] for s in steps[:8]):.3f} → "
                 f"{statistics.fmean(s['close_number'] for s in steps[-8:]):.3f}")
        verdict = ("can learn" if run["learns"] else "too hard" if run["verdict"].split(". ")[1].startswith("Too hard")
                   else "hard")
        assert row[1:] == [percent(run["preflight_no_spread"]), verdict,
                           percent(run["train_no_spread"]), close,
                           moved(heldout["before"], heldout["after"], "answer"),
                           moved(heldout["before"], heldout["after"], "close_number"),
                           f"{run['minutes']:.1f}"], row[0]
    assert len(found["as_shipped"]["steps"]) == 48 and found["as_shipped"]["state"] == "succeeded"
