"""torch, transformers, TRL, PEFT and datasets: imported once, by one thread, before anything uses them.

The app's server answers before they are imported (they take seconds), and imports them in the background while its
first page opens (``Studio.warm_up``). transformers 5 imports its parts lazily, on first use, and that is not
thread-safe: a thread that first uses it while another is importing it can get a half-imported module ("cannot
import name 'AutoConfig' from 'transformers'"). So whatever may be first to use them (loading a tokenizer or a
model, detecting the hardware, a training's thread) calls :func:`import_all` first, which waits for an import under
way instead of racing it, and costs nothing once it is done.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
_imported = False

# Everything of transformers that Dragon uses by name: its lazy module imports each one's part on first access.
TRANSFORMERS_NAMES = ("AutoConfig", "AutoModelForCausalLM", "AutoModelForSequenceClassification", "AutoTokenizer",
                      "PreTrainedTokenizerFast", "DynamicCache", "PrinterCallback", "StoppingCriteria",
                      "StoppingCriteriaList", "TrainerCallback", "AttentionInterface", "GenerationConfig")


def import_all() -> None:
    """Import the libraries training and generation need, unless done; other threads wait for it meanwhile."""
    global _imported
    if _imported:
        return
    with _lock:
        if _imported:
            return
        import torch  # noqa: F401
        import transformers

        for name in TRANSFORMERS_NAMES:
            getattr(transformers, name)
        import transformers.integrations  # noqa: F401
        import transformers.masking_utils  # noqa: F401
        from datasets import Dataset  # noqa: F401
        from peft import LoraConfig, PeftModel  # noqa: F401
        from trl import GRPOConfig, GRPOTrainer  # noqa: F401
        _imported = True
