"""The folder list is the architecture, and these are its boundaries: checked on the imports in the source, so a
lazy import inside a function counts too."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "dragon_ui"


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, as absolute dotted names (relative imports resolved against its package)."""
    package = ".".join(("dragon_ui", *path.relative_to(PACKAGE).parent.parts))
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}  # "from . import training" names a module
    return found


def files(folder: str = "") -> list[Path]:
    return sorted((PACKAGE / folder).rglob("*.py"))


def importers(modules: list[Path], forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    hits = {}
    for path in modules:
        bad = sorted(name for name in imported_modules(path)
                     if any(name == f or name.startswith(f + ".") for f in forbidden))
        if bad:
            hits[str(path.relative_to(PACKAGE))] = bad
    return hits


def test_only_the_ui_imports_gradio():
    outside_ui = [path for path in files() if "ui" not in path.relative_to(PACKAGE).parts[:1]]
    assert importers(outside_ui, ("gradio", "gradio_client", "dragon_ui.ui")) == {}


def test_the_ui_talks_to_the_studio_not_the_engine():
    assert importers(files("ui"), ("dragon_ui.engine", "dragon_ui.scaleout", "dragon_ui.speedups")) == {}


@pytest.mark.parametrize("part", ["engine", "speedups", "scaleout", "cli.py"])
def test_the_engine_and_the_command_line_know_nothing_of_the_app(part):
    """Training, its speed-ups, the scale-out folder and the CLI run where the app's backend is not even copied."""
    modules = files(part) if (PACKAGE / part).is_dir() else [PACKAGE / part]
    assert importers(modules, ("dragon_ui.studio", "dragon_ui.ui", "gradio")) == {}


@pytest.mark.parametrize("module", ["data", "rewards", "config.py", "errors.py", "runstore.py", "system",
                                    "grpo_math.py"])
def test_the_runs_description_needs_no_torch(module):
    """Validating a config, mapping data and scoring rewards happen before (and without) a model."""
    modules = files(module) if (PACKAGE / module).is_dir() else [PACKAGE / module]
    assert modules and importers(modules, ("torch", "transformers", "peft", "dragon_ui.engine")) == {}
    trl_parts = {name for path in modules for name in imported_modules(path) if name.split(".")[0] == "trl"}
    # TRL's reward functions, which import no torch (tested below)
    assert all(name == "trl.rewards" or name.startswith("trl.rewards.") for name in trl_parts), trl_parts


def heavy_modules_after(script: str, heavy: tuple[str, ...], timeout: int) -> list[str]:
    """Which of ``heavy`` a fresh interpreter has imported once it has run ``script``."""
    script += f"import json, sys\nprint(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))\n"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout,
                          cwd=PACKAGE.parent)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_trls_reward_kinds_load_no_torch():
    """Building and scoring with TRL's kinds imports trl.rewards, which must not pull torch into a validation."""
    script = ("from dragon_ui.public import LAPTOP\n"
              "from dragon_ui.rewards import build_rewards, parse_rewards, score_completion\n"
              "specs = parse_rewards([{'kind': 'think_format'}, {'kind': 'repetition'}, {'kind': 'overlong'}], "
              "policy=LAPTOP)\n"
              "result = score_completion(build_rewards(specs, max_new_tokens=8, policy=LAPTOP), '<think>a</think> b')\n"
              "assert result.scores['think_format'] == 1.0, result\n")
    assert heavy_modules_after(script, ("torch", "transformers"), timeout=120) == []


def test_the_app_is_built_without_torch_or_the_training_libraries():
    """The server answers seconds sooner when building the page imports none of them: the warm-up (Studio.warm_up)
    loads them once it answers, and a Start, a preview or an estimate that comes first loads what it needs."""
    script = ("import tempfile\n"
              "from dragon_ui.public import LAPTOP\n"
              "from dragon_ui.studio.backend import Studio\n"
              "from dragon_ui.ui import build_app\n"
              "build_app(Studio(runs_dir=tempfile.mkdtemp(), policy=LAPTOP))\n")
    assert heavy_modules_after(script, ("torch", "transformers", "peft", "trl", "datasets"), timeout=300) == []


def test_the_checker_sees_relative_and_lazy_imports():
    """The checks above would pass on anything if the import reader missed imports."""
    found = imported_modules(PACKAGE / "engine" / "training.py")
    assert {"dragon_ui.config", "dragon_ui.engine.models", "dragon_ui.runstore"} <= found
    assert "dragon_ui.scaleout.distributed" in found
    assert "gradio" in imported_modules(PACKAGE / "ui" / "app.py")


def package_imports() -> dict[str, dict[str, list[str]]]:
    """{unit: {unit it imports: [the files that do]}}, a unit being a top-level module or package of dragon_ui."""
    units = {path.name.removesuffix(".py") for path in PACKAGE.iterdir()
             if path.suffix == ".py" or (path / "__init__.py").is_file()}
    graph: dict[str, dict[str, list[str]]] = {unit: {} for unit in units}
    for path in files():
        unit = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        for name in imported_modules(path):
            parts = name.split(".")
            if parts[0] == "dragon_ui" and len(parts) > 1 and parts[1] in units and parts[1] != unit:
                graph[unit].setdefault(parts[1], []).append(str(path.relative_to(PACKAGE)))
    return graph


def first_cycle(graph: dict) -> list[str] | None:
    """A path of imports that comes back to where it started ([a, b, a]), or None: depth first, in name order."""
    done: set[str] = set()

    def cycle_from(node: str, path: list[str]) -> list[str] | None:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        for imported in sorted(graph.get(node, ())):
            if (found := cycle_from(imported, [*path, node])) is not None:
                return found
        done.add(node)
        return None

    return next((cycle for node in sorted(graph) if (cycle := cycle_from(node, [])) is not None), None)


def test_packages_import_each_other_without_a_cycle():
    """The folder list reads top-down: a package that imports one that imports it back (public -> config -> data ->
    public, speedups -> engine -> speedups) has no place in it. A lazy import inside a function counts too."""
    graph = package_imports()
    cycle = first_cycle(graph)
    assert cycle is None, " -> ".join(cycle) + ": " + "; ".join(
        f"{a} -> {b} in {', '.join(sorted(set(graph[a][b])))}" for a, b in zip(cycle, cycle[1:]))


def module_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(("dragon_ui", *(parts[:-1] if parts[-1] == "__init__" else parts)))


def test_no_file_imports_one_that_imports_it_back():
    """Nor inside a package: evaluation, model_card and weights, or the reward kinds and their validation, each
    imported another that imported it. A package's own __init__ (its face) is left out: it imports its parts."""
    modules = {module_of(path): path for path in files()}
    graph = {name: {imported for imported in imported_modules(path) if imported in modules
                    and imported != name and not modules[imported].name == "__init__.py"}
             for name, path in modules.items()}
    cycle = first_cycle(graph)
    assert cycle is None, " -> ".join(cycle)


def policy_parameters() -> set[str]:
    """The functions of the package that take a ``policy`` (public.Policy), by name. A name that some other function
    of the package also has without one is left out, since a call cannot be told apart by its name."""
    taking, other = set(), set()
    for path in files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = [argument.arg for argument in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
                (taking if "policy" in names else other).add(node.name)
    return taking - other


def calls_without_a_policy(source: str, taking: set[str]) -> list[str]:
    """The calls in ``source`` to a function of ``taking`` (or to one imported under another name) that do not name
    the policy they pass."""
    tree = ast.parse(source)
    taking = taking | {alias.asname for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                       for alias in node.names if alias.asname and alias.name in taking}
    return [f"{name}() on line {node.lineno}" for node in ast.walk(tree) if isinstance(node, ast.Call)
            and (name := node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None))
            in taking and not any(keyword.arg in ("policy", None) for keyword in node.keywords)]


def test_every_policy_is_a_required_keyword_argument():
    """A policy fails closed: every function that takes one requires it, by name, so a call that forgot it fails at
    once instead of quietly giving a public demo's visitor the laptop's freedom (public.LAPTOP), and a call cannot
    pass it in another argument's place."""
    loose = []
    for path in files():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            keywords = {argument.arg: default for argument, default in zip(node.args.kwonlyargs, node.args.kw_defaults)}
            positional = [argument.arg for argument in node.args.posonlyargs + node.args.args]
            if "policy" in positional or keywords.get("policy") is not None:
                loose.append(f"{module_of(path)}.{node.name}")
    assert loose == []


def test_every_call_in_the_package_names_the_policy_it_passes():
    """One policy, built from the environment by the entry points (public.Policy.from_env) and passed down by name."""
    taking = policy_parameters()
    assert {"locate", "read_table", "load_and_map", "build_rewards", "check_run", "submit_start",
            "preview_data"} <= taking
    missing = {module_of(path): calls for path in files()
               if (calls := calls_without_a_policy(path.read_text(encoding="utf-8"), taking))}
    assert missing == {}


def test_the_policy_check_sees_a_forgotten_policy():
    taking = {"locate", "check_run"}
    source = ("locate(s)\nlocate(s, b, p)\ndata.locate(s, policy=p)\nx.check_run(c)\ncheck_run(c, **p)\nother(c)\n"
              "from .x import check_run as checked\nchecked(c, p)\n")
    assert calls_without_a_policy(source, taking) == ["locate() on line 1", "locate() on line 2",
                                                      "check_run() on line 4", "checked() on line 8"]


# The modules that may read or write the environment, and why; everything else is handed what it needs.
ENVIRONMENT_READERS = {
    "cli.py": "an entry point",
    "ui/app.py": "an entry point",
    "ui/desktop.py": "an entry point: the window's toolkit reads its display and flags from the environment",
    "engine/worker_main.py": "a training process's entry point: takes the app's settings with each job",
    "engine/dry_run.py": "the dry run's process entry point: takes the app's speed-up choice, as a training process",
    "public.py": "Policy.from_env, which the entry points call",
    "system/disk.py": "resolve_runs_dir, which the entry points call, and the cache folder (like HF_HOME for the Hub)",
    "scaleout/distributed.py": "what accelerate and torchrun tell each process they start",
    "system/processes.py": "the environment of a child process that reads what a visitor sent",
}
ENVIRONMENT_USE = re.compile(r"os\.getenv\(|os\.environ(\.(get|setdefault|update|pop)\(|\[)|in os\.environ\b|del os\.environ")


def test_only_the_entry_points_read_or_write_the_environment():
    """Below them a setting is passed in: the runs folder, the speed-ups chosen, a public demo's policy. A copy of
    the environment for a child process (``dict(os.environ)``) reads no setting."""
    users = {str(path.relative_to(PACKAGE)) for path in files() if ENVIRONMENT_USE.search(path.read_text("utf-8"))}
    assert users == set(ENVIRONMENT_READERS), (sorted(users - set(ENVIRONMENT_READERS)), "or an entry no longer needed")
    assert ENVIRONMENT_USE.search("x = os.environ.get('A')") and ENVIRONMENT_USE.search("os.environ['A'] = '1'")
    assert not ENVIRONMENT_USE.search("env = dict(os.environ, A='1')")


def test_only_the_entry_points_read_public_mode_from_the_environment():
    readers = {module_of(path) for path in files() if "Policy.from_env(" in path.read_text(encoding="utf-8")}
    assert readers == {"dragon_ui.cli", "dragon_ui.ui.app"}


# --- the UI's functions: a screen long at most, and handlers named at module level ------------------------------------

LONGEST_UI_FUNCTION = 80  # lines, from its ``def`` to its last line


def functions_in(source: str) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function of a module, by its qualified name (``Class.method``, ``outer.inner``)."""
    found = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if not isinstance(child, ast.ClassDef):
                    found.append((prefix + child.name, child))
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def ui_functions() -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    return {f"{path.relative_to(PACKAGE)}:{name}": node for path in files("ui")
            for name, node in functions_in(path.read_text(encoding="utf-8"))}


def lines_of(function: ast.AST) -> int:
    return function.end_lineno - function.lineno + 1


def gradio_events() -> set[str]:
    """The names of gradio's event listeners (``button.click``, ``.then``, ``gr.on``, ``gr.api``)."""
    from gradio.events import EventListener, Events

    return {value.event_name for value in vars(Events).values() if isinstance(value, EventListener)} | {
        "then", "success", "on", "api"}


def nested_handlers(function: ast.AST, events: set[str]) -> list[str]:
    """The functions (``def`` or ``lambda``) defined inside ``function`` where it wires events: its handlers would
    be closures, which no test can call alone."""
    wires = any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in events
                for node in ast.walk(function))
    inner = [node for node in ast.walk(function)
             if node is not function and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    return [f"{getattr(node, 'name', 'lambda')} on line {node.lineno}" for node in inner] if wires else []


def test_no_function_of_the_ui_is_longer_than_a_screen():
    """A tab's builder lays out its parts through named helpers; none reads as one long page."""
    long = {name: lines_of(node) for name, node in ui_functions().items() if lines_of(node) > LONGEST_UI_FUNCTION}
    assert long == {}


def test_the_ui_wires_events_to_handlers_named_in_its_modules():
    """A handler is a function of its tab's module, given what it needs (the studio, the labels) by
    functools.partial, common.asked or common.bound, so a test calls exactly what the button calls."""
    events = gradio_events()
    nesting = {name: found for name, node in ui_functions().items() if (found := nested_handlers(node, events))}
    assert nesting == {}


def test_the_ui_checks_see_long_functions_and_closures():
    source = ("def build(button):\n    def clicked(value):\n        return value\n    button.click(clicked)\n"
              "def wire(button):\n    button.click(lambda value: value)\n"
              "def helper(values):\n    return sorted(values, key=lambda value: -value)\n"
              "class Tab:\n    def long(self):\n" + "        pass\n" * LONGEST_UI_FUNCTION)
    functions = dict(functions_in(source))
    events = gradio_events()
    assert {name: nested_handlers(node, events) for name, node in functions.items()} == {
        "build": ["clicked on line 2"], "build.clicked": [], "wire": ["lambda on line 6"], "helper": [],
        "Tab.long": []}
    assert lines_of(functions["Tab.long"]) == LONGEST_UI_FUNCTION + 1
