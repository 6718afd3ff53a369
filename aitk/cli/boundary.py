"""The command line's error boundary: every verb's `main` is wrapped in `boundary`, so
a TrainerError that reaches it (aitk.errors) is one line on stderr and its exit code,
and Ctrl+C is exit 130. `python run.py` with several configs says each config's error
through `say` and goes on (--check, --recover); the job itself has its own boundary
(aitk.run.job). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable

from aitk.errors import EXIT_INTERRUPTED, ConfigError, TrainerError

Main = Callable[[list[str] | None], int]


def say(exc: TrainerError, prefix: str = "") -> int:
    """Print `exc` as the user sees it; returns its exit code. A ConfigError lists its
    problems under "config error(s) in FILE"; any other is `PREFIXerror: message`."""
    print(str(exc) if isinstance(exc, ConfigError) else f"{prefix}error: {exc}",
          file=sys.stderr)
    return exc.exit_code


def boundary(prefix: str = "") -> Callable[[Main], Main]:
    """Wrap a verb's main. `prefix`: what its error line starts with ("aitk audit: ")."""
    def wrap(main: Main) -> Main:
        @functools.wraps(main)
        def guarded(argv: list[str] | None = None) -> int:
            try:
                return main(argv)
            except TrainerError as exc:
                return say(exc, prefix)
            except KeyboardInterrupt:
                return EXIT_INTERRUPTED
        return guarded
    return wrap
