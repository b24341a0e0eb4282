"""Dragon GRPO Studio: point-and-click GRPO (reinforcement learning with verifiable rewards) for small language models.

The layout is the architecture: the run's config, its data, rewards and run directory at the top (with errors, the
atomic file writes and the cli); ``engine/`` trains and evaluates; ``speedups`` makes the CPU path faster; ``scaleout/`` takes a run to many
GPUs; ``studio/`` is the app's gradio-free backend; ``ui/`` is gradio only, thin tabs over the studio. Only ``ui/``
imports gradio, and ``engine/`` imports neither ``studio/`` nor ``ui/`` (tests/test_layout.py). bitsandbytes is deferred here, before any module
can import peft, so only a 4-bit run imports it (see engine/quantization.py).
"""

from pathlib import Path

from .engine.quantization import defer_bitsandbytes

# The example datasets, recipes, stylesheet and icon, shipped inside the package so an installed copy has them.
ASSETS_DIR = Path(__file__).resolve().parent / "assets"

__version__ = "0.1.0"

defer_bitsandbytes()
