"""``python -m ragloop.cli``: the ``ragloop`` command."""

import sys

from ragloop.cli._main import main

sys.exit(main())
