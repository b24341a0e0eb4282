"""``shared_prompts``: each group's prompt read once, in sampling's first forward and in TRL's scoring passes.

TRL gives each completion of a group its own copy of the group's prompt, so sampling's first forward and the
reference pass run every prompt through the model once per completion (6 times in the recipes), although the copies
compute the same keys and values each time: a prompt's tokens never see the completions, and nothing drops out in
those passes. Dragon runs each distinct prompt once, hands its keys and values to every completion of the group,
and runs only the rest on top: the same attention over the same keys, positions and masks, for a third of the rows
in the recipes (prompts are three times longer than completions). The policy pass shares prompts the same way when
nothing in the model drops out (``lora.dropout: 0``), gradients included; with dropout every copy of a prompt draws
masks of its own, so it keeps its copies.

The backbone's ``forward`` and the model's ``generate`` are replaced on that one model, for the block only. A pass
that raises (transformers' cache moved) runs every row's own prompt, as TRL does, and the speed-up stays off.
"""

from __future__ import annotations

import contextlib
import functools
import inspect

from .registry import enabled, replaced, switch_off


@contextlib.contextmanager
def scoring_shared_prompts(model, prompt_length: int):
    """While TRL scores ``prompt_length`` prompt tokens plus completions with ``model``, its backbone runs each
    distinct prompt once. Nothing changes where anything drops out, since each copy of a
    prompt would draw masks of its own, nor under gradient checkpointing with gradients on."""
    backbone = _backbone_of(model)
    if not enabled("shared_prompts") or backbone is None or prompt_length < 1 or _drops_out(model) \
            or _checkpoints_with_gradients(backbone):
        yield
        return
    original = backbone.forward

    def forward(input_ids=None, attention_mask=None, use_cache=None, **kwargs):
        shared = None
        if input_ids is not None and attention_mask is not None and input_ids.device.type == "cpu" \
                and input_ids.size(1) > prompt_length and not any(value is not None for value in kwargs.values()) \
                and enabled("shared_prompts"):  # off once it raised, for the rest of this pass too
            try:
                shared = forward_sharing_prompts(backbone, original, input_ids, attention_mask, prompt_length)
            except Exception as exc:  # transformers' cache moved: every row runs its own prompt, as in TRL
                switch_off("shared_prompts", exc)
        if shared is None:
            shared = original(input_ids=input_ids, attention_mask=attention_mask, use_cache=use_cache, **kwargs)
        return shared

    with replaced(backbone, "forward", forward):
        yield


@contextlib.contextmanager
def sampling_shared_prompts(model):
    """While the trainer samples, ``model.generate`` reads each distinct prompt once (``generate_sharing_prompts``).
    Only the trainer's own model may be changed so: another thread could be generating with a shared one."""
    if not enabled("shared_prompts") or _backbone_of(model) is None or _drops_out(model):
        yield
        return
    with replaced(model, "generate", functools.partial(generate_sharing_prompts, model, model.generate)):
        yield


def generate_sharing_prompts(model, generate, *args, input_ids=None, attention_mask=None, **kwargs):
    """``generate(*args, input_ids=..., attention_mask=..., **kwargs)`` (``model``'s generate) given a cache of
    every row's prompt but its last token (whose logits start the sampling), each distinct prompt computed once; as
    it is where every row has a prompt of its own, something drops out, or the call brings a cache of its own. Safe
    on a model that other threads use at once: nothing is replaced."""
    import torch

    backbone = _backbone_of(model)
    settings = kwargs.get("generation_config") or model.generation_config
    plain_text = not any(torch.is_tensor(value) for value in kwargs.values()) \
        and not {"cache", "past_key_values", "cache_implementation", "use_cache"} & set(kwargs)
    if enabled("shared_prompts") and backbone is not None and not _drops_out(model) and plain_text and not args \
            and input_ids is not None and attention_mask is not None and input_ids.device.type == "cpu" \
            and input_ids.size(1) > 1 and settings.use_cache is not False and settings.cache_implementation is None:
        try:
            cache = prefill_sharing_prompts(backbone, input_ids, attention_mask)
        except Exception as exc:  # transformers' cache or generate moved: generate reads every row's prompt
            switch_off("shared_prompts", exc)
            cache = None
        if cache is not None:
            kwargs[_cache_keyword(backbone)] = cache
    return generate(*args, input_ids=input_ids, attention_mask=attention_mask, **kwargs)


def prefill_sharing_prompts(backbone, input_ids, attention_mask):
    """A key-value cache of every row's prompt but its last token, each distinct prompt computed once, at the
    positions transformers' ``generate`` gives a left-padded prompt; None where every row has a prompt of its own."""
    distinct_rows = _distinct_prompts(input_ids, attention_mask)
    if distinct_rows is None:
        return None
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)
    _, cache = _run_prompts_once(backbone, backbone, *distinct_rows, input_ids=input_ids[:, :-1],
                                 attention_mask=attention_mask[:, :-1], position_ids=positions[:, :-1])
    return cache


def _run_prompts_once(backbone, forward, first_row, row_prompt, **inputs):
    """Run ``forward`` on the first row of each distinct prompt into a new cache, then give every row its prompt's
    keys and values: (the prompts' output, the cache)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=backbone.config)
    output = forward(**{name: value[first_row] for name, value in inputs.items()}, use_cache=True,
                     **{_cache_keyword(backbone): cache})
    for layer in cache.layers:
        layer.batch_select_indices(row_prompt)
    return output, cache


def _distinct_prompts(input_ids, attention_mask):
    """(the first row of each distinct prompt, tokens and padding alike; each row's prompt index), or None where
    every row has a prompt of its own."""
    import torch

    rows = torch.cat([input_ids, attention_mask.to(input_ids.dtype)], dim=1)
    distinct, index = torch.unique(rows, dim=0, return_inverse=True)
    if distinct.size(0) == rows.size(0):
        return None
    first = torch.full((distinct.size(0),), rows.size(0), dtype=torch.long, device=rows.device)
    return first.scatter_reduce_(0, index, torch.arange(rows.size(0), device=rows.device), "amin"), index


def _cache_keyword(backbone) -> str:
    """transformers 5 renamed ``past_key_values`` to ``cache`` (the old name still works until 5.40)."""
    return "cache" if "cache" in inspect.signature(type(backbone).forward).parameters else "past_key_values"


def forward_sharing_prompts(backbone, forward, input_ids, attention_mask, prompt_length: int):
    """``backbone``'s output (from its original ``forward``) for ``input_ids``, with each distinct prompt (tokens
    and padding) run once; None where every row has a prompt of its own.

    The prompts' keys and values go to every row that shares them, and the rest of each row runs on top of them, at
    the positions and under the masks the full rows would have had. Only the hidden states that score the
    completions are returned: the last prompt position's and the completion's; the earlier prompt positions, which
    TRL never scores, are zero.
    """
    import torch
    from transformers.modeling_outputs import BaseModelOutputWithPast

    rows = input_ids.size(0)
    distinct_rows = _distinct_prompts(input_ids[:, :prompt_length], attention_mask[:, :prompt_length])
    if distinct_rows is None:
        return None
    first_row, row_prompt = distinct_rows
    prompt, cache = _run_prompts_once(backbone, forward, first_row, row_prompt, input_ids=input_ids[:, :prompt_length],
                                      attention_mask=attention_mask[:, :prompt_length])
    rest = forward(input_ids=input_ids[:, prompt_length:], attention_mask=attention_mask, use_cache=True,
                   **{_cache_keyword(backbone): cache})
    last_prompt = prompt.last_hidden_state[row_prompt, -1:]
    unscored = last_prompt.new_zeros(rows, prompt_length - 1, last_prompt.size(-1))
    return BaseModelOutputWithPast(last_hidden_state=torch.cat([unscored, last_prompt, rest.last_hidden_state], dim=1))


def _backbone_of(model):
    """The transformer under the LM head that TRL's fused head calls (``base_model``), through PEFT and DDP."""
    model = getattr(model, "module", model)
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    backbone = getattr(model, "base_model", None)
    return None if backbone is None or backbone is model else backbone


def _checkpoints_with_gradients(backbone) -> bool:
    """Gradient checkpointing with gradients on: transformers then drops a layer's cache, so a completion run on top
    of its prompt's keys and values would lose them."""
    import torch

    return torch.is_grad_enabled() and any(getattr(module, "gradient_checkpointing", False) and module.training
                                           for module in backbone.modules())


def _drops_out(model) -> bool:
    """Whether a forward of ``model`` would drop anything out: in training mode, attention dropout or a dropout
    module with a rate, other than the dropouts of switched-off adapters (TRL's reference pass)."""
    import torch

    if not model.training:
        return False
    if getattr(getattr(model, "config", None), "attention_dropout", 0.0):
        return True
    idle = {id(dropout) for module in model.modules() if getattr(module, "disable_adapters", False)
            for dropout in getattr(module, "lora_dropout", {}).values()}
    return any(module.training and module.p > 0 and id(module) not in idle for module in model.modules()
               if isinstance(module, torch.nn.modules.dropout._DropoutNd))
