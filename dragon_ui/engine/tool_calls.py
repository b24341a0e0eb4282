"""Tool calling on the engine's side: a chat template that can call tools, and the run's tools as one bundle (the
held-out checks answer with them as training does: evaluation.reply_with_tools).

TRL's GRPOTrainer parses tool calls only for chat templates it knows (it matches them by exact text). The default
model, SmolLM2-135M-Instruct, writes ChatML (``<|im_start|>``) but its template cannot show tools, so such a model
gets TRL's own ChatML template that can (Qwen3-Instruct-2507's): the same tokens and turns, plus the tools' schemas
in the system turn and ``<tool_call>`` blocks. Other templates TRL does not know are refused with the reason.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from ..config import RunConfig
from ..errors import ConfigError
from ..public import Policy
from ..rewards import EPISODE_SCORE
from ..tools import Played, build_environments, build_tools, demonstration, environment_tools, with_demonstration
from ..tools.environments import check_playable, episode_score

CHATML_MARKERS = ("<|im_start|>", "<|im_end|>")
EPISODE_TOOLS = "episode_tools"  # the key of a played example (ToolUse.episodes) that holds what it may call
TOOL_FAMILIES = "a Qwen2.5, Qwen3, SmolLM2 or other ChatML model, or a Llama 3.1 or 3.2 one"


@dataclass
class ToolUse:
    """What a tools run hands the model: the tools, the worked examples before each question, how many rounds of
    calls one reply may make, and the environments (by name; ``column``: the data column naming each row's, with
    two or more), one of which each conversation plays."""

    functions: list[Callable]
    examples: list[dict] = field(default_factory=list)
    max_rounds: int = 1
    environments: dict[str, type[Played]] = field(default_factory=dict)
    column: str | None = None

    def shown(self, examples: list[dict]) -> list[dict]:
        """Mapped examples as the run's prompts hold them: the worked examples before each question and, with
        several environments, the one each row plays (TRL's ``environment`` column); ConfigError naming the first
        row an environment cannot play."""
        shown = []
        for example in examples:
            example = {**example, "prompt": with_demonstration(example["prompt"], self.examples)}
            if self.column:
                example["environment"] = self._named(example)
            name = self.environment_of(example)
            if name is not None:
                check_playable(self.environments[name], example.get("reference"), f"Row {example.get('number', '?')}")
            shown.append(example)
        return shown

    def _named(self, example: dict) -> str:
        name = json.loads(example.get("row") or "{}").get(self.column)
        if name not in self.environments:
            said = "has no value" if not name else f"says {str(name)[:40]!r}"
            raise ConfigError(f"Row {example.get('number', '?')}: data.environment_column {self.column!r} {said}, "
                              f"which is not one of the environments: {', '.join(self.environments)}.")
        return name

    def environment_of(self, example: dict) -> str | None:
        """The name of the environment a shown example plays; None without environments."""
        if not self.environments:
            return None
        return example.get("environment") if self.column else next(iter(self.environments))

    @property
    def every_function(self) -> list[Callable]:
        """Every tool some prompt shows: what its tokens are counted with (the most a prompt can show)."""
        return self.functions + [tool for kind in self.environments.values() for tool in environment_tools(kind)]

    def trl_environments(self):
        """TRL's ``environment_factory``: the one environment, or (with a column) every environment by name."""
        if not self.environments:
            return None
        return dict(self.environments) if self.column else next(iter(self.environments.values()))

    def episodes(self, examples: list[dict]) -> list[dict]:
        """Each shown example as one conversation, as TRL plays it: its own environment (if any) reset with it, that
        environment's first words after the question, what it may call (EPISODE_TOOLS) and what gives the
        environment's score of it (rewards.EPISODE_SCORE)."""
        played = []
        for example in examples:
            name = self.environment_of(example)
            if name is None:
                played.append({**example, EPISODE_TOOLS: self.functions})
                continue
            environment = self.environments[name]()
            observation = environment.reset(**example)
            prompt = example["prompt"]
            if observation is not None:
                prompt = [*prompt[:-1], {**prompt[-1], "content": prompt[-1]["content"] + observation}]
            played.append({**example, "prompt": prompt, EPISODE_TOOLS: self.functions + environment_tools(environment),
                           EPISODE_SCORE: functools.partial(episode_score, environment)})
        return played


def scoring_episodes(reward_function: Callable) -> Callable:
    """A TRL reward function of the run's that reads each reply's environment score (rewards.EPISODE_SCORE) from
    the environments TRL played them in, which TRL hands every reward function."""
    @functools.wraps(reward_function)
    def scored(*args, environments=None, **kwargs):
        if environments is not None:
            kwargs["episode_scores"] = [functools.partial(episode_score, environment) for environment in environments]
        return reward_function(*args, **kwargs)

    return scored


def played(tools: ToolUse | None, examples: list[dict]) -> list[dict]:
    """``examples`` as conversations with the run's tools (ToolUse.episodes); unchanged without tools."""
    return examples if tools is None else tools.episodes(examples)


def tool_use(config: RunConfig, examples: list[dict], should_stop: Callable[[], bool] | None = None,
             *, policy: Policy) -> ToolUse | None:
    """The run's tools and environments built on the rows of its mapped ``examples`` (None when it has none);
    ConfigError at the first bad setting, or at a tool ``policy`` refuses."""
    if not config.tools:
        return None
    rows = [json.loads(example.get("row") or "{}") for example in examples]
    base_dir = config.base_dir or None
    functions = build_tools(config.tools, rows, base_dir, should_stop, policy=policy)
    return ToolUse(functions, demonstration(config.tools, functions), config.grpo.max_tool_calling_iterations,
                   build_environments(config.tools, base_dir, should_stop, policy=policy), config.data.environment_column)


def ready_for_tools(tokenizer, label: str):
    """A copy of the tokenizer (the app's model cache shares the original) that can show tools and have its tool
    calls read; ConfigError saying why a model cannot."""
    tokenizer = copy.copy(tokenizer)
    if _readable(tokenizer):
        return tokenizer
    if _speaks_chatml(tokenizer):
        from trl.chat_template_utils import add_response_schema, qwen3_instruct_2507_chat_template

        tokenizer.chat_template = qwen3_instruct_2507_chat_template
        return add_response_schema(tokenizer)
    raise ConfigError(f"tools: {label} cannot call tools: its chat template is not one TRL can show tools with and "
                      f"read tool calls from; pick {TOOL_FAMILIES}.")


def _readable(tokenizer) -> bool:
    """TRL can show tools with this tokenizer's template and read the calls back (it sets the parser it knows)."""
    from trl.chat_template_utils import add_response_schema, supports_tool_calling

    if getattr(tokenizer, "response_template", None) is None and getattr(tokenizer, "response_schema", None) is None:
        try:
            add_response_schema(tokenizer)
        except ValueError:
            return False
    return supports_tool_calling(tokenizer)


def _speaks_chatml(tokenizer) -> bool:
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    vocabulary = tokenizer.get_vocab()
    return all(marker in template and marker in vocabulary for marker in CHATML_MARKERS)
