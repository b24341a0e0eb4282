"""Command line: ``python -m dragon_ui train|check|settings|runs|eval|score|export|stop|merge|export-gguf|push|speedups``
(installed: ``dragon``).

Bad input ends with one line on stderr and exit status 2; a training that fails exits with 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
from pathlib import Path

from .errors import ConfigError, DragonError
from .system.disk import resolve_runs_dir
from . import speedups
from .public import Policy
from .runstore import state_label

EXIT_BAD_INPUT = 2


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    from .scaleout.distributed import is_main_process

    # Under accelerate/torchrun only the main process talks; the others report problems only.
    logging.basicConfig(level=logging.INFO if is_main_process() else logging.WARNING,
                        format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    for noisy in ("httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        # A public demo's limits apply to its command line too, in the runs folder its app keeps.
        args.policy = Policy.from_env(resolve_runs_dir(getattr(args, "runs_dir", None)))
        speedups.choose(os.environ.get(speedups.ENV, ""))
        return args.func(args)
    except DragonError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _parser() -> argparse.ArgumentParser:
    # Installed, the same commands are the `dragon` console script; usage lines name what the person typed.
    prog = "dragon" if Path(sys.argv[0]).name == "dragon" else "python -m dragon_ui"
    parser = argparse.ArgumentParser(prog=prog, description="Dragon GRPO Studio: GRPO training from the command line.")
    sub = parser.add_subparsers(dest="command", required=True)

    train = sub.add_parser("train", help="train a run from a YAML/JSON config, or resume one")
    train.add_argument("config", nargs="?", help="run configuration (YAML or JSON), or a bundled recipe by name, e.g. arithmetic")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue a stopped or failed run from its latest checkpoint")
    train.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a setting, e.g. --set training.max_steps=5 (repeatable; `settings` lists them)")
    train.add_argument("--run-dir", help="exact run directory to use (default: a new timestamped one under runs_dir)")
    train.set_defaults(func=_cmd_train)

    check = sub.add_parser("check", help="check a config as Start would, without training: data, prompts, "
                                         "hardware and the estimate")
    check.add_argument("config", help="run configuration (YAML or JSON), or a bundled recipe by name")
    check.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a setting, e.g. --set data.max_rows=100 (repeatable; `settings` lists them)")
    check.add_argument("--preflight", action="store_true",
                       help="will it learn? sample the run's groups for some training prompts (about a minute) and "
                            "say whether they give GRPO a signal, with fixes")
    check.add_argument("--prompts", type=int, metavar="N",
                       help="with --preflight: sample this many prompts (default: about a minute's worth, at least 16)")
    check.add_argument("--dry-run", action="store_true",
                       help="train one real step of the run's settings on its longest prompts, in a process of its "
                            "own, and say how long it took and the memory it needed at its peak (leaves nothing "
                            "behind)")
    check.set_defaults(func=_cmd_check)

    described = sub.add_parser("settings", help="every setting a configuration may hold: its default and what it does")
    described.add_argument("prefix", nargs="?", default="",
                           help="only the settings whose name starts with this, e.g. grpo or training.learning")
    described.add_argument("--markdown", action="store_true", help="print them as docs/reference.md's table")
    described.set_defaults(func=_cmd_settings)

    runs = sub.add_parser("runs", help="list runs")
    runs.add_argument("--runs-dir", help="folder holding the runs (default: $DRAGON_UI_RUNS_DIR or ./runs)")
    runs.add_argument("--csv", metavar="FILE", help="also write the leaderboard (the Experiments tab's) to FILE")
    runs.add_argument("--rank-by", metavar="REWARD", default=None,
                      help="rank the leaderboard by one reward or metric's held-out score instead of the total (the "
                           "totals of runs whose rewards differ do not compare)")
    runs.set_defaults(func=_cmd_runs)

    ev = sub.add_parser("eval", help="held-out reward of a run before vs after training, per reward")
    ev.add_argument("run_dir")
    ev.add_argument("--recompute", action="store_true", help="generate and score again instead of reading eval.json")
    ev.set_defaults(func=_cmd_eval)

    score = sub.add_parser("score", help="score one completion against a rewards file and print JSON")
    score.add_argument("--rewards", required=True, help="YAML/JSON file: a list of rewards, or a run config with `rewards:` "
                                                        "(a bundled recipe by name too)")
    score.add_argument("--completion", required=True)
    score.add_argument("--reference")
    score.add_argument("--prompt", default="")
    score.set_defaults(func=_cmd_score)

    export = sub.add_parser("export", help="write a self-contained folder that trains this config on several GPUs/nodes")
    export.add_argument("config", help="run configuration (YAML or JSON), or a bundled recipe by name")
    export.add_argument("--to", required=True, metavar="DIR", help="new folder to create")
    export.add_argument("--gpus", type=int, default=8, help="GPUs per node (default 8)")
    export.add_argument("--nodes", type=int, default=1, help="number of training nodes (default 1)")
    export.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a setting first")
    export.set_defaults(func=_cmd_export)

    stop = sub.add_parser("stop", help="ask a running training (in any process) to stop after its current step")
    stop.add_argument("run_dir")
    stop.set_defaults(func=_cmd_stop)

    merge = sub.add_parser("merge", help="save a run's starting model with its trained adapter merged in, as a full model")
    merge.add_argument("run_dir")
    merge.add_argument("--to", metavar="DIR", help="folder to save the merged model in (default: RUN_DIR/merged)")
    merge.set_defaults(func=_cmd_merge)

    gguf = sub.add_parser("export-gguf", help="save a run's trained model as one GGUF file for llama.cpp, Ollama and LM "
                                              "Studio, with an Ollama Modelfile")
    gguf.add_argument("run_dir")
    gguf.add_argument("--quant", choices=("q8_0", "f16"), default="q8_0",
                      help="precision of the weights: q8_0 (the default) is half the size of f16 and answers almost "
                           "exactly alike")
    gguf.add_argument("--to", metavar="DIR", help="folder to write the files in (default: RUN_DIR/gguf)")
    gguf.set_defaults(func=_cmd_export_gguf)

    push = sub.add_parser("push", help="publish a run's adapter (or merged model) to the Hugging Face Hub, with its "
                                       "model card")
    push.add_argument("run_dir")
    push.add_argument("--repo", required=True, metavar="USER/NAME", help="the Hub repo to create, e.g. you/arith-grpo")
    push.add_argument("--merged", action="store_true", help="upload the merged full model instead of the adapter")
    push.add_argument("--private", action="store_true", help="make the new repo private")
    push.add_argument("--update", action="store_true", help="add a new commit to a repo that exists already")
    push.set_defaults(func=_cmd_push)

    fast = sub.add_parser("speedups", help="which speed-ups are on with the libraries installed here, and why")
    fast.add_argument("--verify", action="store_true",
                      help="run every speed-up's self-check now (a few seconds) and keep the results")
    fast.add_argument("--json", action="store_true", help="print the table as JSON")
    fast.set_defaults(func=_cmd_speedups)
    return parser


def config_file(name_or_path: str, what: str = "configuration file") -> Path:
    """The file a command line names: a path, or the name of a recipe shipped with the package (``arithmetic``), so
    an installed ``dragon train arithmetic`` works from any folder."""
    from . import ASSETS_DIR

    path = Path(name_or_path)
    recipe = ASSETS_DIR / "recipes" / f"{name_or_path}.yaml"
    if path.is_file():
        return path
    if path.name == name_or_path and recipe.is_file():
        return recipe
    names = ", ".join(sorted(p.stem for p in (ASSETS_DIR / "recipes").glob("*.yaml")))
    raise ConfigError(f"No {what} at {path}; give a YAML/JSON file or a bundled recipe: {names}.")


def load_config_with_overrides(path: str, overrides: list[str], *, policy):
    """Read a config file and apply ``section.key=value`` overrides (values parsed as YAML) before validating."""
    from .config import RunConfig, apply_overrides

    config_path = config_file(path)
    if not overrides:
        return RunConfig.from_file(config_path, policy=policy)
    settings = apply_overrides(RunConfig.from_file(config_path, policy=policy).to_dict(), overrides)
    return RunConfig.from_dict(settings, policy=policy)


def _cmd_train(args) -> int:
    """Train here, in this process (the runner the app's worker processes run), to the end or to a Ctrl+C, which
    stops at the next forward pass and saves the last whole step (a second one quits at once)."""
    from .engine import trackers, training

    os.environ.update(trackers.missing_environment(os.environ))
    interrupts = 0
    stopping: list = []  # the training, once it has its folder

    def on_interrupt(signum, frame):
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1 and stopping:
            print("\nStopping now and saving the last whole step (press Ctrl+C again to quit at once)...",
                  file=sys.stderr, flush=True)
            stopping[0].stop()
        else:
            os._exit(130)

    def on_start(job) -> None:
        stopping.append(job)
        if not job.run.read_only:
            print(f"Run folder: {job.run.path}", flush=True)

    if args.resume and (args.config or args.set):
        raise ConfigError("--resume continues a run with its own saved configuration; give no config file or --set with it.")
    if not (args.resume or args.config):
        raise ConfigError("Give a configuration file or a bundled recipe (e.g. arithmetic), or --resume RUN_DIR.")
    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        if args.resume:
            run = training.resume_here(args.resume, policy=args.policy, on_start=on_start)
        else:
            config = load_config_with_overrides(args.config, args.set, policy=args.policy)
            config.runs_dir = str(resolve_runs_dir(config.runs_dir))
            run = training.train_config(config, run_dir=args.run_dir, policy=args.policy, on_start=on_start)
    finally:
        signal.signal(signal.SIGINT, previous)
    status = run.read_status()
    state = status.get("state")
    if run.read_only:
        return 1 if state == "failed" else 0
    if state == "failed":
        print(f"Training failed: {status.get('error')}", file=sys.stderr)
        print(f"Resume with: python -m dragon_ui train --resume {run.path}", file=sys.stderr)
        return 1
    _print_eval(run.read_eval())
    print(f"Run {state_label(state)}: {run.path}")
    if state == "cancelled":
        print(f"Resume with: python -m dragon_ui train --resume {run.path}")
    return 0


def _cmd_check(args) -> int:
    """Exit 0 when a training of the config could start, 2 with the first problem's sentence when it could not."""
    from .engine import training
    from .engine.estimate import estimate_run
    from .engine.hardware import detect_hardware
    from .engine.redteam import red_team_of
    from .rewards import cannot_pay, goal_names

    config = load_config_with_overrides(args.config, args.set, policy=args.policy)
    found = training.inspect(config, policy=args.policy)
    hardware = found.hardware
    threads = f", {hardware.cpu_threads} thread{'s' if hardware.cpu_threads > 1 else ''}" \
        if hardware.device == "cpu" else ""
    print(f"Data: {found.mapped.summary()}")
    goal = goal_names(config.rewards)
    print(f"Rewards: {', '.join(spec.name for spec in config.rewards)}"
          + (f" (the goal: {', '.join(goal)})" if goal else " (no reward checks the answer: the total is the goal)"))
    references = [example.get("reference") for example in found.mapped.train + found.mapped.eval]
    for said in cannot_pay(config.rewards, references, policy=args.policy).values():
        print(f"Warning: {said}")
    if config.tools:
        print(f"Tools: {', '.join(f'{spec.name} ({spec.kind})' for spec in config.tools)}, up to "
              f"{config.grpo.max_tool_calling_iterations} rounds a reply")
    print(f"Hardware: {hardware.device} {hardware.dtype}{threads}" +
          "".join(f"\n  - {reason}" for reason in hardware.reasons))
    try:
        estimate = estimate_run(config, hardware, detect_hardware(), prompt_tokens=max(1, round(found.prompts.mean)))
        print(f"Estimate:\n{estimate.describe()}")
    except DragonError as exc:  # an unknown model size: the run can still start
        print(f"Estimate: none ({exc})")
    if not args.preflight:  # the pre-flight's report has its own, on the prompts it samples
        print("Red team: " + red_team_of(config, found.mapped.train, hardware.device, policy=args.policy).describe())
    print(f"A training could start: python -m dragon_ui train {args.config}"
          + "".join(f" --set {item}" for item in args.set))
    if args.dry_run:
        from .engine.dry_run import dry_run

        print("\nDry run: training one step, after a first to warm up…", flush=True)
        print(dry_run(config, policy=args.policy).describe())
    if args.preflight:
        _preflight(config, found, args)
    return 0


def _preflight(config, found, args) -> None:
    from .engine.models import ModelCache
    from .engine.preflight import preflight

    if args.prompts is not None and args.prompts < 1:
        raise ConfigError("--prompts must be at least 1.")
    print("\nPre-flight: sampling the run's groups…", flush=True)
    report = preflight(config, ModelCache().load, policy=args.policy, prompts=args.prompts, inspection=found,
                       on_progress=lambda done, total: print(f"  {done} of {total} prompts sampled", flush=True))
    print(report.describe())


def _cmd_settings(args) -> int:
    import textwrap

    from .config import RunConfig, documented_settings, settings_table
    from .settings import plain

    if args.markdown:
        print(settings_table(), end="")
        return 0
    chosen = [item for item in documented_settings() if item.path.startswith(args.prefix)]
    if not chosen:
        sections = ", ".join(spec.name for spec in dataclasses.fields(RunConfig) if spec.name != "base_dir")
        raise ConfigError(f"No setting starts with {args.prefix!r}; the configuration's settings and sections are: "
                          f"{sections}.")
    for item in chosen:
        print(f"{item.path} ({'empty' if item.default == '–' else 'default ' + plain(item.default)})")
        print(textwrap.fill(plain(item.help), width=100, initial_indent="    ", subsequent_indent="    "))
    return 0


def _cmd_runs(args) -> int:
    from .runstore import list_runs

    runs_dir = resolve_runs_dir(args.runs_dir)
    runs = list_runs(runs_dir)
    if not runs:
        print(f"No runs in {runs_dir}.")
        return 0
    rows = [("id", "state", "step", "reward", "held-out before -> after", "model")]
    for run in runs:
        heldout = (f"{run['heldout_before']:.3f} -> {run['heldout_after']:.3f}" if run["heldout_after"] is not None
                   and run["heldout_before"] is not None else "-")
        rows.append((run["id"], state_label(run["state"]), f"{run['step']}/{run['total_steps'] or '?'}",
                     "-" if run["reward"] is None else f"{run['reward']:.3f}", heldout, run["model"]))
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())
    if args.csv:
        from . import experiments

        by = args.rank_by or experiments.HELDOUT_TOTAL
        choices = experiments.rank_choices(runs)
        if by not in choices:
            print(f"No run was scored on {by!r}; rank by one of: {', '.join(choices)}.", file=sys.stderr)
            return 2
        board = [entry.row(public=False) for entry in experiments.leaderboard(runs, by=by)]
        experiments.write_csv(Path(args.csv), experiments.leaderboard_columns(False, by), board)
        print(f"Leaderboard written to {args.csv}.")
    return 0


def _cmd_eval(args) -> int:
    from .engine.evaluation import evaluate_now
    from .engine.models import ModelCache
    from .runstore import RunDir

    run = RunDir(Path(args.run_dir))
    evaluation = run.read_eval()
    if args.recompute or "before" not in evaluation or "after" not in evaluation:
        for progress in evaluate_now(ModelCache().load, run, rescore_before=args.recompute, policy=args.policy):
            print(progress)
        evaluation = run.read_eval()
    _print_eval(evaluation)
    _print_heldout_curve(run)
    return 0


def _print_heldout_curve(run) -> None:
    from .engine.evaluation import heldout_curve

    rows = run.read_heldout()
    if rows:
        print(f"Held-out reward during training, on {rows[-1].get('n_prompts', '?')} of those prompts:")
        print(f"  {heldout_curve(rows)}")


def _print_eval(evaluation: dict) -> None:
    from .engine.evaluation import before_and_after, metric_names, shown_reward_name

    if not evaluation.get("before") and not evaluation.get("after"):
        return
    print(f"Held-out reward on {evaluation.get('n_prompts', '?')} prompts (greedy):")
    print(f"  {'reward':<20}{'before':>10}{'after':>10}{'change':>10}")
    metrics = metric_names(evaluation)
    for name, before, after in before_and_after(evaluation):
        change = after - before if before is not None and after is not None else None
        print(f"  {shown_reward_name(name, metrics):<20}"
              + "".join(f"{'-' if v is None else f'{v:.3f}':>10}" for v in (before, after))
              + (f"{change:>+10.3f}" if change is not None else f"{'-':>10}"))


def _cmd_score(args) -> int:
    import yaml

    from .errors import ConfigError, first_line
    from .config import RunConfig
    from .engine.reward_models import classifiers_on
    from .rewards import build_rewards, counts_tokens, parse_rewards, score_completion

    path = config_file(args.rewards, what="--rewards file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path.name} is not valid YAML or JSON: {first_line(exc)}") from None
    items = data.get("rewards") if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise ConfigError(f"{path.name} must hold a list of rewards, or a run configuration with a `rewards:` list.")
    # A whole config gives TRL's length and repetition rewards their tokenizer and length limit; a list of rewards
    # (alone or as {"rewards": [...]}) counts with the default model's up to the default limit.
    whole_config = isinstance(data, dict) and set(data) - {"rewards"}
    base = (RunConfig.from_dict(data, policy=args.policy) if whole_config
            else RunConfig(rewards=parse_rewards(items, policy=args.policy)))
    specs = base.rewards
    tokenizer = None
    if counts_tokens(specs):
        from .engine.models import load_tokenizer, resolve_model

        tokenizer = load_tokenizer(resolve_model(base.model))
    rewards = build_rewards(specs, base_dir=str(path.parent.resolve()), tokenizer=tokenizer,
                            max_new_tokens=base.grpo.max_new_tokens, classifiers=classifiers_on("cpu"),
                            policy=args.policy)
    result = score_completion(rewards, args.completion, reference=args.reference, prompt=args.prompt)
    print(json.dumps(result.to_dict(), indent=2, ensure_ascii=False))
    return 0


def _cmd_export(args) -> int:
    from .scaleout.launch_folder import export_launch_folder

    config = load_config_with_overrides(args.config, args.set, policy=args.policy)
    folder = export_launch_folder(config, args.to, args.gpus, args.nodes, policy=args.policy)
    print(f"Exported to {folder}:")
    for path in sorted(p for p in folder.iterdir() if p.name != "dragon_ui"):
        print(f"  {path.name}{'/' if path.is_dir() else ''}")
    print(f"Run it with: {folder}/launch.sh   (details in {folder}/README.md)")
    return 0


def _cmd_stop(args) -> int:
    from .runstore import ACTIVE_STATES, RunDir

    run = RunDir(Path(args.run_dir))
    state = run.read_status().get("state")
    if state not in ACTIVE_STATES:
        print(f"The run {run.id} is not running (it is {state_label(state)}); nothing to stop.")
        return 0
    run.request_stop()
    print(f"Asked {run.id} to stop after its current step; it will save a checkpoint first.")
    return 0


def _cmd_merge(args) -> int:
    from .engine.weights import merge_message, merge_model
    from .runstore import RunDir

    run = RunDir(Path(args.run_dir))
    folder = merge_model(run, target_dir=args.to)
    print(merge_message(run, folder))
    return 0


def _cmd_export_gguf(args) -> int:
    from .engine.gguf_export import export_gguf, export_message, run_commands
    from .runstore import RunDir

    run = RunDir(Path(args.run_dir))
    export = export_gguf(run, args.quant, target_dir=args.to)
    ollama, llama_cpp = run_commands(export, export.path.parent)
    print(f"{export_message(run, export)}\n  {export.path}\n  {export.modelfile}")
    print(f"Run it in Ollama:  {ollama}\nor in llama.cpp:   {llama_cpp}")
    return 0


def _cmd_push(args) -> int:
    """Uses the token of `hf auth login` or $HF_TOKEN: a token on the command line would stay in the shell's history."""
    from .engine.publish import publish
    from .runstore import RunDir

    run = RunDir(Path(args.run_dir))
    print(f"Uploading the {'merged model' if args.merged else 'adapter'} of {run.id} to {args.repo}...", flush=True)
    published = publish(run, args.repo, merged=args.merged, private=args.private, update=args.update,
                        policy=args.policy)
    print(f"Published {len(published.files)} files: {published.url}")
    return 0


def _cmd_speedups(args) -> int:
    from .engine.libraries import import_all
    from .engine.models import quiet_library_deprecations
    from .speedups import registry, selfcheck

    import_all()
    quiet_library_deprecations()
    if args.verify:
        selfcheck.run()
    rows = registry.table()
    if args.json:
        print(json.dumps({"versions": registry.stack(), "speedups": rows}, indent=1))
        return 0
    versions = ", ".join(f"{name} {value}" for name, value in registry.stack().items())
    print(f"Speed-ups with {versions}:")
    width = max(len(row["name"]) for row in rows)
    for row in rows:
        print(f"  {row['name']:<{width}}  {'on ' if row['on'] else 'off'}  {row['why']}")
        print(f"  {'':<{width}}       CI verified {row['verified']}")
    on = sum(row["on"] for row in rows)
    print(f"{on} of {len(rows)} on." + ("" if args.verify else " dragon speedups --verify runs the self-checks now."))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
