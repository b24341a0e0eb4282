"""Export a run configuration as a self-contained folder that trains on several GPUs or nodes.

The folder holds everything the run needs and nothing of this machine: the engine package, the config with its
paths made relative, the dataset file and custom reward files, an accelerate config for the chosen strategy, a
``launch.sh`` for one node, a SLURM template for several, and a README. Nothing here re-implements distributed
training: accelerate (DDP, DeepSpeed ZeRO, FSDP) and TRL's vLLM integration do the work.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import yaml

from ..config import RunConfig
from ..data import locate
from ..errors import ConfigError
from ..public import Policy
from ..rewards.spec import CustomReward
from ..tools.spec import CodeTool

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # dragon_ui, copied into the launch folder
ACCELERATE_CONFIGS = Path(__file__).resolve().parent / "accelerate_configs"
REQUIREMENTS = PACKAGE_DIR.parent / "requirements.txt"
VLLM_PORT = 8000
DISTRIBUTION = "dragon-grpo-studio"


def requirements() -> str:
    """The runtime requirements: requirements.txt in a checkout (or a Space), else the installed package's own
    (``pip install dragon-grpo-studio`` has no requirements.txt), without its optional extras."""
    if REQUIREMENTS.is_file():
        return REQUIREMENTS.read_text(encoding="utf-8")
    from importlib.metadata import requires

    return "".join(f"{line}\n" for line in requires(DISTRIBUTION) or [] if "extra ==" not in line)


def export_launch_folder(config: RunConfig, target: str | Path, gpus: int = 8, nodes: int = 1,
                         *, policy: Policy) -> Path:
    """Write the launch folder for ``gpus`` GPUs per node on ``nodes`` nodes and return its path."""
    if not 1 <= gpus <= 64:
        raise ConfigError(f"--gpus must be between 1 and 64 GPUs per node; got {gpus}.")
    if not 1 <= nodes <= 1024:
        raise ConfigError(f"--nodes must be between 1 and 1024; got {nodes}.")
    target = Path(target).expanduser().resolve()
    if target.exists() and any(target.iterdir()):
        raise ConfigError(f"{target} already exists and is not empty; choose a new folder so nothing is overwritten.")
    exported = copy.deepcopy(config)
    base_dir = config.base_dir or None
    source = locate(config.data.source, base_dir, policy=policy)  # in a public demo never a file of the server's
    if isinstance(source, Path) and not source.is_file():
        raise ConfigError(f"data.source: no file at {source} to copy into the export.")
    (target / "data").mkdir(parents=True, exist_ok=True)
    if isinstance(source, Path):  # a Hub dataset is downloaded by the cluster itself
        shutil.copy2(source, target / "data" / source.name)
        exported.data.source = f"data/{source.name}"
    # A custom reward's, tool's or environment's .py file travels with the config, which names it relative to the
    # folder.
    with_code: list[tuple[str, CustomReward | CodeTool]] = [
        *(("reward", spec) for spec in exported.rewards if isinstance(spec, CustomReward)),
        *(("tool", spec) for spec in exported.tools if isinstance(spec, CodeTool))]
    for what, spec in with_code:
        if spec.file:
            source = Path(spec.file) if Path(spec.file).is_absolute() else Path(base_dir or ".") / spec.file
            if not source.is_file():
                raise ConfigError(f"The custom {what} '{spec.name}' reads {source}, which does not exist.")
            (target / f"{what}s").mkdir(exist_ok=True)
            shutil.copy2(source, target / f"{what}s" / source.name)
            spec.file = f"{what}s/{source.name}"
    # The cluster decides its own devices (a precision chosen in the settings is kept); runs land next to the
    # launch files.
    exported.hardware.device, exported.hardware.cpu_threads, exported.hardware.gpu = "auto", None, None
    exported.runs_dir, exported.base_dir = "runs", ""

    (target / "config.yaml").write_text(exported.to_yaml(), encoding="utf-8")
    (target / "accelerate.yaml").write_text(_accelerate_config(config.distributed.strategy, gpus, nodes), encoding="utf-8")
    # The engine and the CLI; not the app (ui/ and its backend, studio/), which a cluster job never runs.
    shutil.copytree(PACKAGE_DIR, target / "dragon_ui",
                    ignore=shutil.ignore_patterns("__pycache__", "ui", "studio", "*.pyc"))
    (target / "requirements.txt").write_text(requirements(), encoding="utf-8")
    vllm_server = config.generation.backend == "vllm-server"
    _write_script(target / "launch.sh", _launch_script(gpus))
    _write_script(target / "slurm.sbatch", _slurm_script(config, gpus, nodes, vllm_server))
    (target / "README.md").write_text(_readme(config, gpus, nodes, vllm_server), encoding="utf-8")
    return target


def _accelerate_config(strategy: str, gpus: int, nodes: int) -> str:
    """The strategy's accelerate config for this many processes. Its mixed_precision stays "no": the run resolves
    hardware.dtype on the GPUs themselves and tells TRL (bf16/fp16), and transformers takes the launcher's value
    only when neither is set, so any other value here would turn an explicit float32 run into bf16."""
    template = yaml.safe_load((ACCELERATE_CONFIGS / f"{strategy}.yaml").read_text(encoding="utf-8"))
    template.update(num_processes=gpus * nodes, num_machines=nodes)
    header = f"# accelerate config for distributed.strategy {strategy}: {nodes} node(s) x {gpus} GPU(s).\n"
    return header + yaml.safe_dump(template, sort_keys=False)


def _write_script(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    path.chmod(0o755)


def _launch_script(gpus: int) -> str:
    return f"""#!/usr/bin/env bash
# Train this run on one node with {gpus} GPU(s):   ./launch.sh
# Continue it after a stop or a crash:         ./launch.sh --resume runs/<id>
# Smoke-test it on CPU processes (no GPU):      GPUS=2 ./launch.sh --cpu --set training.max_steps=2
# Extra arguments go to `python -m dragon_ui train`, e.g. --set training.max_steps=100.
# PYTHON picks the interpreter (default: python on PATH, e.g. your activated virtual environment).
set -euo pipefail
cd "$(dirname "$0")"
export PYTHONPATH="$PWD${{PYTHONPATH:+:$PYTHONPATH}}"
GPUS="${{GPUS:-{gpus}}}"

if [ "${{1:-}}" = "--resume" ]; then
  shift
  TRAIN=(train --resume "$@")
elif [ "${{1:-}}" = "--cpu" ]; then
  shift
  exec "${{PYTHON:-python}}" -m torch.distributed.run --standalone --nproc_per_node "$GPUS" \
    -m dragon_ui train config.yaml --set hardware.device=cpu "$@"
else
  TRAIN=(train config.yaml "$@")
fi
exec "${{PYTHON:-python}}" -m accelerate.commands.launch --config_file accelerate.yaml --num_processes "$GPUS" \
  --num_machines 1 -m dragon_ui "${{TRAIN[@]}}"
"""


def _slurm_script(config: RunConfig, gpus: int, nodes: int, vllm_server: bool) -> str:
    total_nodes = nodes + (1 if vllm_server else 0)
    vllm_block = ""
    vllm_override = ""
    if vllm_server:
        # Data parallel serving: every GPU of the node holds a whole copy of the model, which works for any model
        # that fits on one GPU. Tensor parallelism would need a GPU count that divides the attention heads (the
        # default model has 9), so it is left as a choice for models too big for one GPU.
        vllm_block = f"""
# The last node serves generations with vLLM; the training nodes send it prompts and weight updates.
# Each of its {gpus} GPU(s) serves a whole copy of the model (data parallel). For a model too big for one GPU, use
# --tensor_parallel_size N instead, with N dividing the model's number of attention heads.
VLLM_NODE="${{NODES[-1]}}"
VLLM_URL="http://$VLLM_NODE:{VLLM_PORT}"
TRAIN_NODES=$(IFS=,; echo "${{NODES[*]:0:{nodes}}}")
srun --nodes=1 --ntasks=1 --nodelist="$VLLM_NODE" \\
  trl vllm-serve --model "{config.model.id}" --data_parallel_size {gpus} --port {VLLM_PORT} &
echo "Waiting for the vLLM server at $VLLM_URL..."
for _ in $(seq "${{VLLM_WAIT_TRIES:-180}}"); do
  curl -sf "$VLLM_URL/health" >/dev/null && break
  sleep 5
done
curl -sf "$VLLM_URL/health" >/dev/null || {{ echo "The vLLM server at $VLLM_URL did not answer; see its output above." >&2; exit 1; }}
"""
        vllm_override = ' --set generation.vllm_server_url=\'"$VLLM_URL"\''
    else:
        vllm_block = '\nTRAIN_NODES=$(IFS=,; echo "${NODES[*]}")\n'
    return f"""#!/bin/bash
# SLURM template: {nodes} training node(s) x {gpus} GPU(s){' + 1 vLLM server node' if vllm_server else ''}.
# Adjust partition, account and time to your cluster, then: sbatch slurm.sbatch
#SBATCH --job-name=dragon-grpo
#SBATCH --nodes={total_nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:{gpus}
#SBATCH --exclusive
#SBATCH --time=24:00:00
#SBATCH --output=slurm-%j.out
set -euo pipefail
cd "$SLURM_SUBMIT_DIR"
export PYTHONPATH="$PWD${{PYTHONPATH:+:$PYTHONPATH}}"
NODES=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
MAIN_NODE="${{NODES[0]}}"
{vllm_block}
# One task per training node; accelerate starts {gpus} processes on each. All share one run folder.
# The quoted command is run by each task's own shell: this script's variables are spliced in with '"$NAME"'.
srun --nodes={nodes} --ntasks={nodes} --nodelist="$TRAIN_NODES" bash -c '
  accelerate launch --config_file accelerate.yaml \\
    --num_machines {nodes} --num_processes {nodes * gpus} --machine_rank "$SLURM_PROCID" \\
    --main_process_ip '"$MAIN_NODE"' --main_process_port 29500 \\
    -m dragon_ui train config.yaml --run-dir "runs/slurm-$SLURM_JOB_ID"{vllm_override}
'
"""


def _readme(config: RunConfig, gpus: int, nodes: int, vllm_server: bool) -> str:
    return f"""# {config.name or 'Dragon GRPO run'}: exported for {nodes} node(s) x {gpus} GPU(s)

This folder is self-contained: `config.yaml` (the run, with paths relative to this folder), `data/` (its dataset),
`rewards/` and `tools/` (custom reward and tool files, if any), `dragon_ui/` (the engine), `accelerate.yaml` (distributed strategy
**{config.distributed.strategy}**, generation with **{config.generation.backend}**), `launch.sh` and `slurm.sbatch`.

## Set up (once per machine)

```bash
python -m venv .venv && . .venv/bin/activate
pip install -r requirements.txt{'  deepspeed' if config.distributed.strategy.startswith('zero') else ''}{"  'vllm>=0.22,<=0.31'" if config.generation.backend != 'transformers' else ''}
```

## Run on one node

```bash
./launch.sh                                   # {gpus} GPU(s); GPUS=4 ./launch.sh to use fewer
./launch.sh --set training.max_steps=50       # any setting can be overridden
./launch.sh --resume runs/<id>                # continue after a stop or a crash
GPUS=2 ./launch.sh --cpu --set training.max_steps=2   # smoke test with 2 CPU processes, no GPU needed
```

## Run on a SLURM cluster

Edit the `#SBATCH` lines (partition, account, time), then `sbatch slurm.sbatch`.
{'The last node runs `trl vllm-serve` and the training nodes generate through it; the model must be one vLLM can load (a Hub id or a merged model folder).' if vllm_server else ''}

## Where results appear

Every process trains its share of each batch; only the main process writes the run folder `runs/<id>/`
(`runs/slurm-<job id>/` under SLURM): `status.json`, `progress.jsonl` (one row per step; `completions_per_step` and
`world_size` show the global batch), `rollouts.jsonl`, `checkpoints/`, `adapter/`, `eval.json`, `log.txt`.
To stop cleanly, create the file `runs/<id>/stop.request` (or run `python -m dragon_ui stop runs/<id>`): every process
sees it, they stop at the same step and a checkpoint is saved. Copy the run folder back and open it in the app's
Train and Compare tabs, or run `python -m dragon_ui eval runs/<id>`.
"""
