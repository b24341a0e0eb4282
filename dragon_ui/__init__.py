"""Dragon GRPO Studio: point-and-click GRPO (reinforcement learning with verifiable rewards) for small language models.

The engine modules (config, data, rewards, models, hardware, runstore, training, evaluation, cli) never import gradio;
the UI lives in ``dragon_ui.ui`` and is a thin layer over them.
"""

__version__ = "0.1.0"

_M_ARENA_MAX = -8  # glibc's mallopt parameter number (malloc.h)


def use_one_malloc_arena() -> bool:
    """Have every thread of this process allocate from glibc's main heap; True where glibc took the setting.

    Why: training runs in a worker thread (the UI and the CLI both keep their main thread free), and glibc gives each
    new thread a heap ("arena") of its own. TRL frees and reallocates hundreds of MB per step, and from a thread's
    heap that cost up to a third more per step: in one process on the 2-vCPU test machine, plain TRL with Dragon's
    speed-ups off took 12.8 s per step in a thread against 9.8 s on the main thread, and Dragon's engine 11.9 s;
    with one arena the engine's thread took 10.5 s against the main thread's 11.1 s. The setting only holds for
    threads that have not allocated yet, so the entry points (app.py, ``python -m dragon_ui``) call this before
    importing anything that starts threads (numpy's BLAS does). Elsewhere than glibc (macOS, Windows, musl) it does
    nothing.
    """
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        return ctypes.CDLL(None).mallopt(_M_ARENA_MAX, 1) == 1
    except (OSError, AttributeError):
        return False
