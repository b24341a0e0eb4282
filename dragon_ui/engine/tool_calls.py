"""Tool calling on the engine's side: a chat template that can call tools, and the run's tools as one bundle (the
held-out checks answer with them as training does: evaluation.reply_with_tools).

TRL's GRPOTrainer parses tool calls only for chat templates it knows (it matches them by exact text). The default
model, SmolLM2-135M-Instruct, writes ChatML (``<|im_start|>``) but its template cannot show tools, so such a model
gets TRL's own ChatML template that can (Qwen3-Instruct-2507's): the same tokens and turns, plus the tools' schemas
in the system turn and ``<tool_call>`` blocks. Other templates TRL does not know are refused with the reason.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field

from ..config import RunConfig
from ..errors import ConfigError
from ..public import LAPTOP, Policy
from ..tools import build_tools, demonstration, with_demonstration

CHATML_MARKERS = ("<|im_start|>", "<|im_end|>")
TOOL_FAMILIES = "a Qwen2.5, Qwen3, SmolLM2 or other ChatML model, or a Llama 3.1 or 3.2 one"


@dataclass
class ToolUse:
    """What a tools run hands the model: the tools, the worked examples before each question, and how many rounds
    of calls one reply may make."""

    functions: list[Callable]
    examples: list[dict] = field(default_factory=list)
    max_rounds: int = 1

    def shown(self, examples: list[dict]) -> list[dict]:
        """Mapped examples with the worked examples before each question, as the run's prompts hold them."""
        return [{**example, "prompt": with_demonstration(example["prompt"], self.examples)} for example in examples]


def tool_use(config: RunConfig, examples: list[dict], should_stop: Callable[[], bool] | None = None,
             policy: Policy = LAPTOP) -> ToolUse | None:
    """The run's tools built on the rows of its mapped ``examples`` (None when it has none); ConfigError at the first
    bad setting, or at a tool ``policy`` refuses."""
    if not config.tools:
        return None
    rows = [json.loads(example.get("row") or "{}") for example in examples]
    functions = build_tools(config.tools, rows, config.base_dir or None, should_stop, policy)
    return ToolUse(functions, demonstration(config.tools, functions), config.grpo.max_tool_calling_iterations)


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
