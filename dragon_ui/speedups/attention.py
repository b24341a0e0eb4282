"""``short_sequence_attention``: attention for bf16/fp16 on the CPU at GRPO's short lengths.

torch's fused CPU attention (SDPA) is slow in bf16 at GRPO's short lengths: its backward alone took 14 ms per layer
for 24 sequences of 60 tokens. The plain formula (the model's own "eager" attention, two matmuls and a float32
softmax) is 2-3.5 times faster there, but it keeps every attention matrix for the backward, so Dragon uses it only
for bf16/fp16 on the CPU while those matrices stay small (up to 4 M entries per layer: 24 sequences of 130 tokens
with SmolLM2's 9 heads); longer sequences keep SDPA. Decoding one token at a time keeps SDPA too, but with an
explicit all-true mask whenever transformers passes none: torch's kernel then takes a path 5 times faster in bf16
(0.14 instead of 0.7 ms per layer for 24 sequences). The same attention either way.

It is the loaded model's attention implementation, registered with transformers under its own name (which saved
configs never carry); every other model keeps transformers' functions.
"""

from __future__ import annotations

import sys

from .registry import enabled, falls_back

SHORT_ATTENTION = "dragon_short_sequence"
EAGER_MAX_SCORES = 1 << 22  # attention scores per layer (batch x heads x queries x keys) the eager formula may keep


@falls_back("short_sequence_attention")
def short_sequence_attention(model) -> None:
    """Route a model's attention through :func:`short_sequence_attention_forward`; see ``short_sequence_attention``.

    Only models on SDPA (transformers' default) change; one that asked for eager or flash attention keeps it.
    """
    if not enabled("short_sequence_attention") or getattr(model.config, "_attn_implementation", None) != "sdpa":
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(SHORT_ATTENTION, short_sequence_attention_forward)
    AttentionMaskInterface.register(SHORT_ATTENTION, sdpa_mask)  # SDPA's boolean masks; converted when eager runs
    model.set_attn_implementation(SHORT_ATTENTION)


def short_sequence_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention for bf16/fp16 on the CPU as fast as torch allows there; transformers' SDPA for everything else."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, queries, _ = query.shape
    keys = key.shape[2]

    def fused(mask):
        return sdpa_attention_forward(module, query, key, value, mask, scaling=scaling, dropout=dropout, **kwargs)

    if query.device.type != "cpu" or query.dtype not in (torch.bfloat16, torch.float16):
        return fused(attention_mask)
    if queries == 1:
        if attention_mask is None:  # torch's CPU kernel decodes one token 5x faster in bf16 when given a mask
            attention_mask = torch.ones(batch, 1, 1, keys, dtype=torch.bool, device=query.device)
        return fused(attention_mask)
    eager = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)
    if eager is None or scaling is None or batch * heads * queries * keys > EAGER_MAX_SCORES:
        return fused(attention_mask)
    if attention_mask is None:  # SDPA's masks leave out a plain causal one
        attention_mask = torch.ones(queries, keys, dtype=torch.bool, device=query.device).tril(keys - queries)
    if attention_mask.dtype == torch.bool:  # eager attention adds its mask to the scores
        attention_mask = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device).masked_fill_(
            ~attention_mask, torch.finfo(query.dtype).min)
    return eager(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
