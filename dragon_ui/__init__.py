"""Dragon GRPO Studio: point-and-click GRPO (reinforcement learning with verifiable rewards) for small language models.

The engine modules (config, data, rewards, models, hardware, runstore, training, evaluation, cli) never import gradio;
the UI lives in ``dragon_ui.ui`` and is a thin layer over them.
"""

__version__ = "0.1.0"
