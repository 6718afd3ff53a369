"""`python run.py CONFIG [CONFIG ...] [--recover] [--name NAME] [--log FILE]`
(also `python -m aitk run ...`).

Configs run in order; a failure stops the list unless --recover. Ctrl+C always stops
the list. Exit code: 0 all finished; otherwise the first failure's code (1 training
failed, 2 bad config or inputs, 130 stopped by Ctrl+C/SIGTERM).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from aitk.config import ConfigError, load_config
from aitk.status import StatusFile, status_path


class _Tee:
    """Write to the console and to the --log file."""

    def __init__(self, *streams: TextIO) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()

    def isatty(self) -> bool:
        return False  # a log file wants plain progress lines, not a live bar


@contextmanager
def _logging_to(path: Path | None) -> Iterator[None]:
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        old = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(old[0], fh), _Tee(old[1], fh)
        try:
            yield
        finally:
            sys.stdout, sys.stderr = old


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python run.py",
                                     description="Run aitk training job configs.")
    parser.add_argument("configs", nargs="+", metavar="CONFIG",
                        help="config file, or a name under config/ (extension optional)")
    parser.add_argument("-r", "--recover", action="store_true",
                        help="continue with the next config when one fails")
    parser.add_argument("-n", "--name", help="value for [name] in the configs")
    parser.add_argument("-l", "--log", type=Path, help="also write the output to FILE")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # argparse: 2 on bad usage, 0 on --help
        return int(exc.code or 0)
    from aitk.job import EXIT_INTERRUPTED, EXIT_OK, run_job

    first_failure = EXIT_OK
    with _logging_to(args.log):
        for name in args.configs:
            try:
                loaded = load_config(name, name_override=args.name)
                code = run_job(loaded)
            except ConfigError as exc:
                print(exc.render(), file=sys.stderr)
                # A watcher (the web UI) gets the problems as data, field by field.
                StatusFile(status_path(None), name).finish(
                    ConfigError.exit_code, error=exc.render(), problems=exc.problems)
                code = ConfigError.exit_code
            except KeyboardInterrupt:  # Ctrl+C while loading, before handlers exist
                code = EXIT_INTERRUPTED
            if code != EXIT_OK:
                first_failure = first_failure or code
                if code == EXIT_INTERRUPTED or not args.recover:
                    return code
    return first_failure


if __name__ == "__main__":
    sys.exit(main())
