import sys

from . import use_one_malloc_arena

use_one_malloc_arena()  # first, before any import starts a thread (see the function)

from .cli import main  # noqa: E402

sys.exit(main())
