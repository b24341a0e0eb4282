"""Models that are known to work well for GRPO on small machines, with their real shapes.

The shapes are copied from each model's ``config.json`` on the Hub, so the parameter count and the memory estimate
(see estimate.py) are computed, not guessed; ``tests/test_estimate.py`` checks the computed counts against the sizes
the model cards state. All presets are instruction-tuned: prompts are sent as chat messages.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import DEFAULT_MODEL_ID


@dataclass(frozen=True)
class ModelDims:
    """The architecture numbers of a decoder-only transformer with a gated MLP (Llama, Qwen, Gemma, SmolLM)."""

    hidden_size: int
    num_layers: int
    intermediate_size: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None = None  # None: hidden_size // num_heads
    tied_embeddings: bool = True

    @property
    def head_size(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def attention_width(self) -> int:
        return self.num_heads * self.head_size

    @property
    def kv_width(self) -> int:
        return self.num_kv_heads * self.head_size

    def projection_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer in one transformer block, by the module names PEFT targets."""
        h, i = self.hidden_size, self.intermediate_size
        return {"q_proj": (h, self.attention_width), "k_proj": (h, self.kv_width), "v_proj": (h, self.kv_width),
                "o_proj": (self.attention_width, h), "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)

    @property
    def linear_params(self) -> int:
        """Weights of the transformer blocks' linear layers: what 4-bit loading quantizes."""
        return self.num_layers * sum(n_in * n_out for n_in, n_out in self.projection_shapes().values())

    @property
    def params(self) -> int:
        norms = (2 * self.num_layers + 1) * self.hidden_size
        return self.embedding_params + self.linear_params + norms


@dataclass(frozen=True)
class ModelPreset:
    """``notes`` say what the model is good for and what it needs, never how fast it runs: speeds shown to a
    person come from estimate.py, computed for their machine and settings."""

    id: str
    dims: ModelDims
    notes: str
    gated: bool = False
    # Why a run with tools cannot use it (engine.tool_calls checks any model's template when the run starts; for a
    # preset the picker says so before anything is downloaded); None: it can call tools.
    no_tools: str | None = None

    @property
    def params(self) -> int:
        return self.dims.params


PRESETS: tuple[ModelPreset, ...] = (
    ModelPreset(DEFAULT_MODEL_ID, ModelDims(576, 30, 1536, 49152, 9, 3),
                "Default. Trains on a CPU; works offline via the bundled copy."),
    ModelPreset("HuggingFaceTB/SmolLM2-360M-Instruct", ModelDims(960, 32, 2560, 49152, 15, 5),
                "Answers better than 135M; a laptop CPU manages short runs, any GPU is comfortable."),
    ModelPreset("Qwen/Qwen2.5-0.5B-Instruct", ModelDims(896, 24, 4864, 151936, 14, 2),
                "Much better at maths than SmolLM2 of its size; a GPU is recommended."),
    ModelPreset("Qwen/Qwen3-0.6B", ModelDims(1024, 28, 3072, 151936, 16, 8, head_dim=128),
                "Thinks before answering (<think>...</think>) unless told not to; give it room in max new tokens. "
                "GPU recommended."),
    ModelPreset("google/gemma-3-1b-it", ModelDims(1152, 26, 6912, 262144, 4, 1, head_dim=256),
                "Gated: accept the licence on its Hub page and log in (`hf auth login`). Large vocabulary, so more "
                "memory per token. GPU.", gated=True,
                no_tools="Gemma 3's chat template has no turn for a tool's answer, so TRL cannot train it to call "
                         "tools"),
    ModelPreset("meta-llama/Llama-3.2-1B-Instruct", ModelDims(2048, 16, 8192, 128256, 32, 8),
                "Gated: accept the licence on its Hub page and log in (`hf auth login`). GPU.", gated=True),
    ModelPreset("Qwen/Qwen2.5-1.5B-Instruct", ModelDims(1536, 28, 8960, 151936, 12, 2),
                "Strong at maths and formats; a GPU with 8 GB or more, or 4-bit loading."),
    ModelPreset("HuggingFaceTB/SmolLM2-1.7B-Instruct", ModelDims(2048, 24, 8192, 49152, 32, 32),
                "The largest SmolLM2; a GPU with 8 GB or more, or 4-bit loading."),
)


def find_preset(model_id: str) -> ModelPreset | None:
    wanted = model_id.strip().lower()
    return next((preset for preset in PRESETS if preset.id.lower() == wanted), None)
