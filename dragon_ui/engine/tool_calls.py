"""Tool calling on the engine's side: a chat template that can call tools, the run's tools as one bundle, and
greedy multi-turn replies for the held-out checks, which must answer the way training samples (call, read the
answer, go on) or a tools run's before and after would not compare what it learned.

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

from ..chat import completion_text
from ..config import RunConfig
from ..errors import ConfigError, Stopped
from ..tools import build_tools, demonstration, with_demonstration
from .. import speedups

CHATML_MARKERS = ("<|im_start|>", "<|im_end|>")
TOOL_FAMILIES = "a Qwen2.5, Qwen3, SmolLM2 or other ChatML model, or a Llama 3.1 or 3.2 one"


@dataclass
class ToolUse:
    """What a tools run hands the model: the tools, the worked examples before each question, and how many rounds
    of calls one reply may make."""

    functions: list[Callable]
    examples: list[dict] = field(default_factory=list)
    max_rounds: int = 1

    def prompt(self, messages: list[dict]) -> list[dict]:
        return with_demonstration(messages, self.examples)


def tool_use(config: RunConfig, examples: list[dict], should_stop: Callable[[], bool] | None = None) -> ToolUse | None:
    """The run's tools built on the rows of its mapped ``examples`` (None when it has none); ConfigError at the first
    bad setting."""
    if not config.tools:
        return None
    rows = [json.loads(example.get("row") or "{}") for example in examples]
    functions = build_tools(config.tools, rows, config.base_dir or None, should_stop)
    return ToolUse(functions, demonstration(config.tools, functions), config.grpo.max_tool_calling_iterations)


def tool_template_refusal(tokenizer) -> str | None:
    """Why this tokenizer's model cannot be trained to call tools, as the end of a sentence; None when it can
    (possibly once :func:`ready_for_tools` gives it TRL's ChatML template)."""
    if _readable(tokenizer) or _speaks_chatml(tokenizer):
        return None
    return (f"its chat template is not one TRL can show tools with and read tool calls from; pick "
            f"{TOOL_FAMILIES}")


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
    raise ConfigError(f"tools: {label} cannot call tools: {tool_template_refusal(tokenizer)}.")


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


def reply_with_tools(model, tokenizer, conversations: list[list[dict]], use: ToolUse, max_new_tokens: int,
                     batch_size: int, should_stop: Callable[[], bool] | None = None) -> list[list[dict]]:
    """Greedy replies that call tools as training does: each round generates for the conversations still going,
    runs the tools they call and hands the answers back, up to ``use.max_rounds`` rounds. Each reply is the messages
    it added (the last assistant message is the final answer the rewards score); its generated tokens and the tools'
    answers share ``max_new_tokens``, as in training."""
    import torch
    from trl.chat_template_utils import parse_response

    histories = [list(conversation) for conversation in conversations]
    added: list[list[dict]] = [[] for _ in conversations]
    left = [max_new_tokens] * len(conversations)
    going = list(range(len(conversations)))
    device = next(model.parameters()).device
    stop_ids = {tokenizer.eos_token_id, tokenizer.pad_token_id}
    for round_number in range(use.max_rounds + 1):
        calling = []
        for start in range(0, len(going), batch_size):
            if should_stop is not None and should_stop():
                raise Stopped("stopped while generating replies")
            batch_rows = going[start:start + batch_size]
            texts = [tokenizer.apply_chat_template(histories[i], tools=use.functions, add_generation_prompt=True,
                                                   tokenize=False) for i in batch_rows]
            batch = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left",
                              add_special_tokens=False).to(device)
            with torch.inference_mode():
                out = speedups.generate(model, False, **batch, max_new_tokens=max(left[i] for i in batch_rows),
                                        pad_token_id=tokenizer.pad_token_id, do_sample=False, top_k=None)
            prompt_length = batch["input_ids"].shape[1]
            for row, i in enumerate(batch_rows):
                ids = _until_end(out[row, prompt_length:].tolist()[:left[i]], stop_ids, tokenizer.eos_token_id)
                left[i] -= len(ids)
                prefix = tokenizer(texts[row], add_special_tokens=False)["input_ids"]
                message = parse_response(tokenizer, ids, prefix=prefix, tools=use.functions)
                message.setdefault("role", "assistant")
                histories[i].append(message)
                added[i].append(message)
                if message.get("tool_calls") and round_number < use.max_rounds and left[i] > 0:
                    calling.append(i)
        for i in calling:
            for answer in _answers(added[i][-1]["tool_calls"], use.functions):
                left[i] -= len(tokenizer(answer["content"], add_special_tokens=False)["input_ids"])
                histories[i].append(answer)
                added[i].append(answer)
        going = [i for i in calling if left[i] > 0]
        if not going:
            break
    return added


def _until_end(ids: list[int], stop_ids: set, eos_id: int) -> list[int]:
    """A row's generated tokens up to and including its end of turn (the padding after it dropped)."""
    for position, token in enumerate(ids):
        if token in stop_ids:
            return ids[:position] + ([eos_id] if token == eos_id else [])
    return ids


def _answers(calls: list[dict], functions: list[Callable]) -> list[dict]:
    """The tool messages answering ``calls``, as TRL makes them: an error becomes {"error": ...} for the model."""
    by_name = {function.__name__: function for function in functions}
    messages = []
    for call in calls:
        function = call.get("function") or {}
        name = function.get("name", "unknown")
        try:
            if name not in by_name:
                raise ValueError(f"Tool {name} not found.")
            content = by_name[name](**(function.get("arguments") or {}))  # build_tools' functions answer text
        except Stopped:
            raise
        except Exception as error:  # as TRL: any failure of the call is the model's to read
            content = str({"error": str(error)})
        messages.append({"role": "tool", "name": name, "content": content})
    return messages


def final_text(reply: list[dict]) -> str:
    """What the rewards score of a multi-turn reply: its last assistant message's text."""
    return completion_text(reply)
