"""A tiny Qwen2 chat model taught to use a calculator tool, built offline in seconds for tool-calling tests.

A randomly initialised model never writes a well-formed tool call, so it can't exercise the tool loop of GRPO
training (assistant tool call -> tool result -> answer). This module builds one that can: a 2-layer Qwen2 with a
locally trained byte-level BPE tokenizer and TRL's Qwen3 chat template (TRL recognises that exact template, so it
knows how to parse the tool calls), supervised-trained on the CPU until it answers "What is 12 * 34?" with a
``calculator`` call and then, given the tool's result ``408``, answers ``408``. Both replies are so likely (every token
above 1 - 1e-6, in practice about 1 - 1e-11) that sampling at temperature 1 gives them every time.

The tool's description is rendered into the system prompt, so the model is taught with many descriptions and system
messages, most of them random words, which makes its replies independent of how a test documents its tool.
"""

from __future__ import annotations

import random
from pathlib import Path

QUESTION = "What is 12 * 34?"
EXPRESSION = "12 * 34"
ANSWER = "408"
TOOL_CALL = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": EXPRESSION}}}
MIN_TOKEN_PROBABILITY = 1 - 1e-6  # the build fails unless every taught token is at least this likely

_DESCRIPTIONS = [
    "Work out an arithmetic expression exactly: + - * / ** and brackets.",
    "Evaluate an arithmetic expression and return the result.",
    "A calculator for arithmetic.",
    "Use this tool for any sum, product, difference or quotient; it never makes mistakes and is always exact.",
]
_ARG_DESCRIPTIONS = [
    'The arithmetic to work out, for example "12 * 34".',
    "The expression to evaluate.",
    "An arithmetic expression such as (2 + 3) ** 2.",
]
_SYSTEMS = [
    "You are a helpful assistant.",
    "Use the tools when they help. Answer with just the number.",
    "You are a careful maths tutor. Check every calculation before you reply, and keep replies short.",
]
_WORDS = " ".join(_DESCRIPTIONS + _ARG_DESCRIPTIONS + _SYSTEMS).split() + ["the", "question", "tool", "12", "408"]


def _tool_schema(description: str, arg_description: str, returns: bool) -> dict:
    """The JSON schema transformers makes of a ``calculator(expression: str) -> str`` tool with these docstrings."""
    function = {
        "name": "calculator",
        "description": description,
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": arg_description}},
            "required": ["expression"],
        },
    }
    if returns:
        function["return"] = {"type": "string"}
    return {"type": "function", "function": function}


def _conversation(system: str | None) -> list[dict]:
    """The whole exchange to teach: question, tool call, tool result, answer."""
    messages = [{"role": "system", "content": system}] if system else []
    return messages + [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
        {"role": "tool", "name": "calculator", "content": ANSWER},
        {"role": "assistant", "content": ANSWER},
    ]


def _variants(count: int = 64) -> list[tuple[list[dict], list[dict]]]:
    """``count`` (tools, conversation) pairs that differ only in the system prompt: the tool's descriptions and the
    system message, each half the time one of the examples above and otherwise random words (or no system message)."""
    rng = random.Random(0)

    def text(examples: list[str | None]) -> str | None:
        return rng.choice(examples) if rng.random() < 0.5 else " ".join(rng.choices(_WORDS, k=rng.randint(1, 40)))

    return [([_tool_schema(text(_DESCRIPTIONS), text(_ARG_DESCRIPTIONS), rng.random() < 0.5)],
             _conversation(text(_SYSTEMS + [None]))) for _ in range(count)]


def _tokenizer(chat_template: str, variants):
    """A Qwen2 tokenizer whose byte-level BPE was trained on the rendered conversations (so they take few tokens).

    It is built as a ``Qwen2Tokenizer`` because that's what AutoTokenizer loads for a Qwen2 model, and that class
    sets its own pre-tokenizer: a BPE trained with any other would tokenize differently once saved and loaded."""
    import json

    from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX
    from transformers.utils.chat_template_utils import render_jinja_template

    corpus = [render_jinja_template([conversation], tools=tools, chat_template=chat_template)[0][0]
              for tools, conversation in variants]
    corpus += ["0123456789", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
               '{"name": "calculator", "arguments": {"expression": "12 * 34"}}']
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=1000, special_tokens=specials,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    trained = json.loads(bpe.to_str())["model"]
    tokenizer = Qwen2Tokenizer(vocab=trained["vocab"], merges=[tuple(merge) for merge in trained["merges"]],
                               eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.add_tokens([AddedToken(token, special=True) for token in specials], special_tokens=True)
    tokenizer.chat_template = chat_template
    return tokenizer


def _example(tokenizer, tools: list[dict], conversation: list[dict]) -> tuple[list[int], list[bool]]:
    """The conversation's token ids as TRL's tool loop builds them, and which of them the model must learn to write
    (the two assistant replies, each up to and including ``<|im_end|>``)."""

    def ids(messages, add_generation_prompt=False):
        return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                             tokenize=True, return_dict=False)

    turns = len(conversation) - 3  # the messages before the tool call
    sequence, taught = [], []
    for prompt_len in (turns, turns + 2):
        prompt, full = ids(conversation[:prompt_len], True), ids(conversation[: prompt_len + 1])
        assert prompt[: len(sequence)] == sequence and full[: len(prompt)] == prompt, "template not prefix-preserving"
        reply = full[len(prompt):]
        reply = reply[: reply.index(tokenizer.eos_token_id) + 1]
        taught += [False] * (len(prompt) - len(sequence)) + [True] * len(reply)
        sequence = prompt + reply
    return sequence, taught


def _batch(tokenizer, variants):
    """Right-padded input ids and the labels of the taught tokens (-100 elsewhere), as tensors."""
    import torch

    examples = [_example(tokenizer, tools, conversation) for tools, conversation in variants]
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), tokenizer.pad_token_id)
    labels = torch.full((len(examples), width), -100)
    for row, (ids, taught) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(ids)] = torch.where(torch.tensor(taught), torch.tensor(ids), -100)
    return input_ids, labels


def taught_token_probabilities(model, input_ids, labels):
    """The model's probability of each taught token, as a flat float64 tensor."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=input_ids).logits[:, :-1]
    targets = labels[:, 1:]
    taught = targets != -100
    return logits[taught].double().log_softmax(-1).gather(-1, targets[taught].unsqueeze(-1)).squeeze(-1).exp()


def build_tiny_tool_model(target: Path) -> Path:
    """Build, teach and save (model and tokenizer) the tiny tool-calling Qwen2 into ``target``; return ``target``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from trl.chat_template_utils import qwen3_instruct_2507_chat_template

    variants = _variants()
    tokenizer = _tokenizer(qwen3_instruct_2507_chat_template, variants)
    input_ids, labels = _batch(tokenizer, variants)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
                         tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(150):
        rows = torch.randperm(len(input_ids))[:16]
        loss = model(input_ids=input_ids[rows], labels=labels[rows]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    # The training leaves each taught token above 0.99 or so. Scaling the final norm scales the logits: the model then
    # samples at temperature 1 as it did at temperature 1/4, which takes each taught token to about 1 - 1e-11.
    with torch.no_grad():
        model.model.norm.weight.mul_(4)
    lowest = taught_token_probabilities(model.eval(), input_ids, labels).min().item()
    assert lowest > MIN_TOKEN_PROBABILITY, f"the tiny tool model learned too little: a taught token has p={lowest}"
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


if __name__ == "__main__":
    import tempfile
    import time

    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    folder = build_tiny_tool_model(Path(tempfile.mkdtemp()) / "tiny-tool-qwen2")
    print(f"built {folder} in {time.perf_counter() - start:.1f}s")
    saved = AutoTokenizer.from_pretrained(folder)
    lowest = taught_token_probabilities(AutoModelForCausalLM.from_pretrained(folder), *_batch(saved, _variants()))
    print(f"lowest probability of a taught token: 1 - {1 - lowest.min().item():.1e}")
