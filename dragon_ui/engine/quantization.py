"""bitsandbytes, the package behind 4-bit loading, is imported only when a run asks for 4-bit weights.

peft imports bitsandbytes whenever it is installed (peft/helpers.py at import, LoRA's layer dispatch later), and
transformers imports peft along with its Trainer, so every start of the app and every run would import it; on a CPU
machine that import prints "Failed to load CPU gemm_4bit_forward from kernels-community". A ``None`` in sys.modules
makes ``import bitsandbytes`` fail and ``importlib.util.find_spec`` answer None, which peft and transformers read as
"not installed", so they never touch it. Whether it is installed is read from its package metadata instead.
"""

from __future__ import annotations

import importlib.metadata
import sys

PACKAGE = "bitsandbytes"


def bitsandbytes_installed() -> bool:
    """True when bitsandbytes is installed, found without importing it."""
    try:
        importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def defer_bitsandbytes() -> None:
    """Keep bitsandbytes unimported until allow_bitsandbytes(); leaves it alone if something imported it already."""
    sys.modules.setdefault(PACKAGE, None)  # type: ignore[arg-type]  # None there makes an import fail, as documented


def allow_bitsandbytes() -> None:
    """Let 4-bit loading import bitsandbytes, and make the libraries look for it again.

    transformers and peft remember "not installed" from the checks they made while it was deferred.
    """
    if PACKAGE in sys.modules and sys.modules[PACKAGE] is None:
        del sys.modules[PACKAGE]
    from peft import import_utils as peft_imports
    from transformers.utils import import_utils as transformers_imports

    for remembered in (transformers_imports.is_bitsandbytes_available, peft_imports.is_bnb_available,
                       peft_imports.is_bnb_4bit_available):
        remembered.cache_clear()
