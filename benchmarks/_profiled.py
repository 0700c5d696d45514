"""``python benchmarks/_profiled.py -m ragloop.cli …``: the ``ragloop`` command with a cProfile switched by signals.

``SIGUSR1`` starts profiling the main thread (the server's event loop: every request and turn), ``SIGUSR2`` stops
it and writes the stats to ``$RAGLOOP_PROFILE_OUT``. So a profile holds the measured turns only, not the imports
and the start-up. Used by ``profile_serve.py``.
"""

from __future__ import annotations

import cProfile
import os
import signal
import sys
from typing import Any

_PROFILE = cProfile.Profile()


def _on(signum: int, frame: Any) -> None:
    _PROFILE.enable()


def _off(signum: int, frame: Any) -> None:
    _PROFILE.disable()
    _PROFILE.dump_stats(os.environ["RAGLOOP_PROFILE_OUT"])


if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, _on)
    signal.signal(signal.SIGUSR2, _off)
    if sys.argv[1:3] == ["-m", "ragloop.cli"]:
        del sys.argv[1:3]
    from ragloop.cli._main import main

    sys.exit(main())
