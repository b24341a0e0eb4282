"""Dragon GRPO Studio: `python app.py` (or `make run`) opens the app; the same file runs as a Hugging Face Space."""

import sys

import dragon_ui

dragon_ui.use_one_malloc_arena()  # first, before gradio or torch start threads (see the function)

from dragon_ui.ui.app import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
