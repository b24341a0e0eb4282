"""Dragon GRPO Studio: `python app.py` (or `make run`) opens the app; the same file runs as a Hugging Face Space."""

import sys

from dragon_ui.ui.app import main

if __name__ == "__main__":
    sys.exit(main())
