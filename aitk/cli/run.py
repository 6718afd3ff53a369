"""`python run.py CONFIG [CONFIG ...] [--recover] [--name NAME] [--log FILE] [--check
[--json]]` (also `python -m aitk run ...`).

Each config is loaded and preflighted (aitk.audit.preflight: every problem that can be known
without model weights, all at once) before anything loads. `--check` stops there.
Configs run in order; a failure stops the list unless --recover. Ctrl+C always stops
the list. Exit code: 0 all finished (or, with --check, all passed); otherwise the first
failure's code (1 training failed or the disk is full, 2 bad config or inputs or the
output folder in use, 130 stopped by Ctrl+C/SIGTERM/SIGHUP). `--name` names the run
(output folder and files), replacing the config's own `name`. `--check --json` prints
one JSON object a line on stdout for each run (each process of each config): its
problems (the preflight's findings) and its memory forecast (aitk.memory.forecast);
a config that does not load is one object with its problems.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from aitk.cli.boundary import boundary, say
from aitk.config.loading import LoadedConfig, load_config
from aitk.errors import (
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    ConfigError,
    TrainerError,
    UsageError,
)
from aitk.run.status import StatusFile
from aitk_common.status import status_path


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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise UsageError(f"cannot write the log file {path} ({exc.strerror or exc})"
                         ) from None
    with fh:
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
    parser.add_argument("-n", "--name", help="name the run (its output folder and files, "
                        "and [name] in the configs), replacing the config's own name")
    parser.add_argument("-l", "--log", type=Path, help="also write the output to FILE")
    parser.add_argument("--check", action="store_true",
                        help="only check the configs (no model is loaded); exit 0 or 2")
    parser.add_argument("--json", action="store_true",
                        help="with --check: one JSON object a run on stdout (problems and "
                        "the memory forecast)")
    ranks = parser.add_argument_group("several GPUs or machines (runs torchrun)")
    ranks.add_argument("--gpus", type=int, help="processes (GPUs) on this machine; "
                       "overrides the configs' `gpus:`")
    ranks.add_argument("--nnodes", type=int, default=1, help="machines taking part")
    ranks.add_argument("--node-rank", type=int, help="this machine's rank (optional)")
    ranks.add_argument("--master-addr", help="rendezvous host every machine reaches")
    ranks.add_argument("--master-port", type=int, default=29500, help="rendezvous port")
    return parser.parse_args(argv)


def maybe_torchrun(args: argparse.Namespace, argv: list[str]) -> int | None:
    """Run this command under torchrun when more than one process is wanted and return
    its exit code; None when one process is wanted (or this already is a rank)."""
    from aitk.run import torchrun

    if torchrun.under_torchrun():
        return None
    req = torchrun.RankRequest(gpus=args.gpus or torchrun.config_gpus(args.configs),
                               nnodes=args.nnodes, node_rank=args.node_rank,
                               master_addr=args.master_addr, master_port=args.master_port)
    if not req.wanted:
        return None
    cuda = torchrun.cuda_gpu_count()
    script = Path(__file__).resolve().parents[2] / "run.py"
    command = torchrun.torchrun_args(req, script, strip_rank_flags(argv), cuda)
    return torchrun.launch(command, req.gpus, cuda)


RANK_FLAGS = ("--gpus", "--nnodes", "--node-rank", "--master-addr", "--master-port")


def strip_rank_flags(argv: list[str]) -> list[str]:
    """The arguments without the torchrun ones (`--gpus 2` and `--gpus=2` forms)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in RANK_FLAGS:
            skip = True
        elif not arg.startswith(tuple(f"{f}=" for f in RANK_FLAGS)):
            out.append(arg)
    return out


def checked(name: str, args: argparse.Namespace) -> LoadedConfig:
    """Load and preflight one config; raises ConfigError listing every error found.
    Preflight warnings and notes are printed here; config warnings by the caller."""
    from aitk.audit.preflight import preflight
    from aitk.findings import Level

    loaded = load_config(name, name_override=args.name)
    findings = preflight(loaded)
    errors = [f"{f.path}: {f.message}" + (f" ({f.fix})" if f.fix else "")
              for f in findings if f.level is Level.ERROR]
    if errors:
        raise ConfigError(str(loaded.source), errors)
    for f in findings:
        print(f.line(), file=sys.stderr)
    return loaded


@boundary()
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse_args(argv)
    except SystemExit as exc:  # argparse: 2 on bad usage, 0 on --help
        return int(exc.code or 0)
    if args.json and not args.check:
        print("python run.py: --json goes with --check", file=sys.stderr)
        return EXIT_INPUT
    if args.json:
        return check_json(args)
    if not args.check:  # a check is one process: nothing to spread over GPUs
        ranks_code = maybe_torchrun(args, argv)  # LaunchError: one line, exit 2
        if ranks_code is not None:
            return ranks_code
    first_failure = EXIT_OK
    with _logging_to(args.log):
        for name in args.configs:
            try:
                loaded = checked(name, args)
                code = check_passed(loaded) if args.check else _run(loaded)
            except TrainerError as exc:  # this config's problems; the next one may run
                code = say(exc)
                # A watcher (the web UI) gets the problems as data, field by field.
                StatusFile(status_path(None), name).finish(
                    code, error=str(exc),
                    problems=exc.problems if isinstance(exc, ConfigError) else None)
            except KeyboardInterrupt:  # Ctrl+C while loading, before handlers exist
                code = EXIT_INTERRUPTED
            if code != EXIT_OK:
                first_failure = first_failure or code
                # --check reports on every config; a run stops unless --recover
                if code == EXIT_INTERRUPTED or not (args.recover or args.check):
                    return code
    return first_failure


def check_passed(loaded: LoadedConfig) -> int:
    for warning in loaded.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"check passed: {loaded.name} ({loaded.source})", file=sys.stderr)
    return EXIT_OK


def check_json(args: argparse.Namespace) -> int:
    """`--check --json`: each run's problems and memory forecast as one JSON line."""
    from aitk.audit.preflight import preflight
    from aitk.findings import Level
    from aitk.memory.plan import memory_forecast

    first_failure = EXIT_OK
    for name in args.configs:
        try:
            loaded = load_config(name, name_override=args.name)
        except TrainerError as exc:
            problems = exc.problems if isinstance(exc, ConfigError) else [str(exc)]
            _emit({"config": name, "process": None, "name": None, "ok": False,
                   "problems": [{"level": "error", "message": p} for p in problems],
                   "warnings": [], "memory": None})
            first_failure = first_failure or exc.exit_code
            continue
        findings = preflight(loaded)
        for i, proc in enumerate(loaded.job.config.process):
            mine = [f for f in findings if _process_of(f.path) == i
                    or (i == 0 and _process_of(f.path) is None)]  # the job's own: with 0
            forecast = memory_forecast(proc)
            ok = not any(f.level is Level.ERROR for f in mine)
            _emit({"config": str(loaded.source), "process": i, "name": loaded.name,
                   "ok": ok, "problems": [f.as_dict() for f in mine],
                   "warnings": list(loaded.warnings),
                   "memory": None if forecast is None else forecast.to_json()})
            if not ok:
                first_failure = first_failure or EXIT_INPUT
    return first_failure


def _process_of(path: str) -> int | None:
    """The process a finding's path is in (`config.process[1].train.lr` -> 1); None for
    one of the whole job (`config.extract_model`, `config.device`)."""
    found = re.match(r"config\.process\[(\d+)\](?:[.\[]|$)", path)
    return int(found.group(1)) if found else None


def _emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def _run(loaded: LoadedConfig) -> int:
    from aitk.run.job import run_job

    return run_job(loaded)


if __name__ == "__main__":
    sys.exit(main())
