"""Dragon GRPO Studio: point-and-click GRPO (reinforcement learning with verifiable rewards) for small language models.

The engine modules (config, data, rewards, models, hardware, runstore, training, evaluation, cli) never import gradio;
the UI lives in ``dragon_ui.ui`` and is a thin layer over them. bitsandbytes is deferred here, before any module
can import peft, so only a 4-bit run imports it (see quantization.py).
"""

from .quantization import defer_bitsandbytes

__version__ = "0.1.0"

defer_bitsandbytes()
