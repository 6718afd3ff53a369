"""The trainer's error tree. Two boundaries catch these and nothing else does: the job's
(aitk.run.job.run_job: one line, the status file, the exit code) and the command
line's (aitk.cli.boundary). Code in between lets them rise. Standard library only, so
`run.py --check` and the web UI's server can import it.

    TrainerError                  exit 1    something failed; the message says what
    ├── NonFiniteLoss             exit 1    the loss became NaN/inf (names the step)
    ├── PeerLost                  exit 1    another rank of a torchrun job ended (killed,
    │                                       crashed) while this one waited for it
    ├── PromptEmbedsFileError     exit 1    a cached embeds file that cannot be read back
    │                                       (its callers recompute the entry)
    ├── ContractError             exit 1    code broke an internal rule: a bug, reported
    │   │                                   with its traceback
    │   └── PromptEmbedsError               embeds of the wrong rank, size or keys
    ├── InputError                exit 2    the config, an argument or what they point
    │   │                                   at is unusable; fixing the input fixes it
    │   ├── UsageError                      a bad command-line argument or path
    │   ├── ConfigError                     the config file: syntax, keys, values, arch
    │   │                                   (every problem at once, each with its path)
    │   ├── DatasetError                    a dataset folder: missing, empty, unpaired
    │   │   ├── BadInputFile                a file not read: not a regular file, too
    │   │   │                               large (also an OSError; skipped at the scan)
    │   │   └── UnreadableVideo             a video that cannot be used (skipped at the
    │   │                                   scan)
    │   ├── ModelError                      a model folder that does not load, a part
    │   │   │                               that is missing, no tiny model to build
    │   │   ├── ModelLoadError              `load_model()` failed (path and what is
    │   │   │   │                           missing)
    │   │   │   └── ModelKwargsError        `model_kwargs` that do not fit the arch's
    │   │   │                               typed knobs (one problem per key)
    │   │   └── ModelRegistryError          the registry cannot give the class
    │   │       └── UnknownArchError        an arch no built-in or extension has (lists
    │   │                                   the known ones)
    │   ├── AdapterError                    a network that matches no layer, an adapter
    │   │   │                               file that does not fit the model
    │   │   ├── AdapterKeyError             a LoRA key outside the public layout
    │   │   ├── AdapterFileError            not a safetensors file (`aitk audit adapter`)
    │   │   ├── PeftExportError             not an aitk LoRA file (prx_pixel's export)
    │   │   └── LoraFileError               a LoRA file extract/merge/rescale/generate
    │   │                                   cannot read, or LoRAs that do not combine
    │   ├── AttentionBackendError           an unknown attention backend, or flash-attn
    │   │                                   asked for but not installed
    │   ├── QuantizeError                   an unknown qtype, or optimum-quanto missing
    │   ├── PromptFlagError                 a prompt's `--flag value` that is unknown or
    │   │                                   does not parse (also a ValueError: a field
    │   │                                   error when the schema reads it)
    │   ├── OptimizerUnavailable            adamw8bit without bitsandbytes
    │   ├── ObjectiveError                  a loss setting the model's noise schedule
    │   │                                   cannot train (stepped, next_sample on DDPM)
    │   ├── DeviceUnavailable               CUDA or MPS asked for but not here
    │   ├── OutputFolderError               in use by another trainer, not writable, or
    │   │                                   holding LoRA files aitk did not write
    │   ├── CheckpointError                 checkpoints exist but none validates, or
    │   │   │                               they were trained with another network
    │   │   └── CorruptCheckpoint           one checkpoint that does not validate (set
    │   │                                   aside, and the next older one is tried)
    │   ├── DistributedError                a data-parallel setup that cannot run (no
    │   │                                   NCCL, too few GPUs, a bad torchrun env)
    │   └── LaunchError                     a torchrun launch that cannot work (more GPUs
    │                                       than present, several machines, no address)
    └── Interrupted               exit 130  a stop asked for before training began
                                            (nothing new to save)

Mapped at the same boundaries, though not in the tree: an OSError for a full disk
(ENOSPC, EDQUOT; aitk_common.files.DiskFull) exits 1 with one line naming the folder
and the sizes; KeyboardInterrupt (and a stop at a step boundary, after the save) exits
130; any other exception is a bug: its traceback, then one line, exit 1.

The trainer's exit codes are a table in the README ("Trainer exit codes");
tests/aitk/test_errors.py holds it to this tree.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

# The answers a trainer command gives (argparse also exits 2 on bad usage, 0 on --help).
EXIT_OK = 0
EXIT_FAILED = 1  # training failed (also: `aitk audit` found an error)
EXIT_INPUT = 2  # the config, an argument or an input is unusable
EXIT_INTERRUPTED = 130  # stopped by Ctrl+C / SIGTERM / SIGHUP (after saving)
EXIT_FINDINGS = EXIT_FAILED  # `python -m aitk audit`: an error finding


class TrainerError(Exception):
    """A failure the trainer understands: one line (`str(exc)`: the message, then the
    hint), and `exit_code`."""

    exit_code = EXIT_FAILED
    show_traceback = False  # True: a bug, whose traceback helps whoever fixes it

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message}; {self.hint}" if self.hint else self.message


class NonFiniteLoss(TrainerError):
    """The loss became NaN/inf: training stops instead of hiding it."""

    def __init__(self, step: int, value: float) -> None:
        self.step = step
        self.value = value
        super().__init__(f"loss is {value} at step {step}; stopping. Lower the learning "
                         "rate, use fp32, or check the dataset; the last checkpoint is kept")


class PeerLost(TrainerError):
    """A collective failed because another rank is gone (gloo/NCCL's error chained)."""


class PromptEmbedsFileError(TrainerError):
    """A cached embeds file that cannot be read back; recompute it."""


class ContractError(TrainerError):
    """Code broke one of aitk's internal rules (an arch returned malformed data)."""

    show_traceback = True


class PromptEmbedsError(ContractError):
    """Embeds that break the container's rules (wrong rank, ragged batch, bad key)."""


class InputError(TrainerError):
    """The config, an argument or what they point at is unusable (exit 2)."""

    exit_code = EXIT_INPUT


class UsageError(InputError):
    """A bad command-line argument, or a path that is not what it should be."""


_PATH_PREFIX = re.compile(r"^((?:config|job|meta)(?:\.[\w-]+|\[\d+\])*|\(top level\)): ")


def split_problem(problem: str) -> tuple[str, str]:
    """"config.process[0].train.lr: too small" -> ("config.process[0].train.lr", "too
    small"); a problem about no one field has the path ""."""
    found = _PATH_PREFIX.match(problem)
    if found is None:
        return "", problem
    return found.group(1), problem[found.end():]


class ConfigError(InputError):
    """A config that cannot run. `problems` holds one line per problem; `records` the
    same as (field path, message) pairs ("" when a problem is about no one field), for
    callers that place the message next to the field (audits, a web form)."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(self.render())

    @property
    def records(self) -> list[tuple[str, str]]:
        return [split_problem(p) for p in self.problems]

    def render(self) -> str:
        if len(self.problems) == 1:
            return f"config error in {self.source}: {self.problems[0]}"
        lines = [f"config errors in {self.source}:"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)


class DatasetError(InputError):
    """A dataset folder the run cannot train on."""


class BadInputFile(DatasetError, OSError):
    """A dataset file that is not read: not a regular file, or too large. Also an
    OSError: the readers that skip unreadable files catch it as one."""


class UnreadableVideo(DatasetError):
    """A video file that cannot be used: not decodable, too long, or too short."""


class ModelError(InputError):
    """A model that cannot do what was asked (bad folder, missing part, unloaded TE)."""


class ModelLoadError(ModelError):
    """`load_model()` failed: the message names the path and what is missing."""


class ModelKwargsError(ModelLoadError):
    """`model.model_kwargs` does not fit the arch's typed knobs (aitk.models.description):
    one line per problem, naming the key and, for an unknown one, the valid keys."""

    def __init__(self, arch: str, problems: list[str]) -> None:
        self.arch = arch
        self.problems = problems
        super().__init__("; ".join(problems))


class ModelRegistryError(ModelError):
    """The registry cannot give the requested model class."""


class UnknownArchError(ModelRegistryError):
    def __init__(self, arch: str, known: Iterable[str], broken: Iterable[Any] = ()) -> None:
        """`broken`: the extensions that failed to import (registry.BrokenExtension)."""
        self.arch = arch
        self.known = sorted(known)
        listed = ", ".join(self.known) or "none"
        message = f"unknown model arch {arch!r}; known archs: {listed}"
        failed = [f"{b.name} ({b.error})" for b in broken]
        if failed:
            message += f"; extensions that failed to import: {'; '.join(failed)}"
        super().__init__(message + " (`python -m aitk models` lists them with their source)")


class AdapterError(InputError):
    """A bad network config, no matching layers, or an adapter file that does not fit."""


class AdapterKeyError(AdapterError):
    """A key that does not follow the public convention."""


class AdapterFileError(AdapterError):
    """Not a safetensors file."""


class PeftExportError(AdapterError):
    """A file that is not an aitk LoRA file."""


class LoraFileError(AdapterError):
    """Not a LoRA file aitk can read, or LoRAs that do not combine (one layout, one
    model's shapes)."""


class AttentionBackendError(InputError):
    """An unknown backend name, or one whose package is not installed."""


class PromptFlagError(InputError, ValueError):
    """A prompt flag that is unknown, or whose value does not parse."""


class QuantizeError(InputError):
    """An unknown qtype, or optimum-quanto missing."""


class OptimizerUnavailable(InputError):
    """The optimizer asked for needs a package that is not installed."""


class ObjectiveError(InputError):
    """A loss setting this model cannot train (aitk.run.objectives.check_objective)."""


class DeviceUnavailable(InputError):
    """The device asked for is not on this machine."""


class OutputFolderError(InputError):
    """The output folder cannot be used by this run."""


class CheckpointError(InputError):
    """The run's checkpoints cannot be resumed and must not be overwritten."""


class CorruptCheckpoint(CheckpointError):
    """One checkpoint folder that does not validate."""


class DistributedError(InputError):
    """A distributed setup that cannot run: no NCCL, too few GPUs, bad env."""


class LaunchError(InputError):
    """A distributed launch that cannot work."""


class Interrupted(TrainerError):
    """Stop requested before training started (nothing new to save)."""

    exit_code = EXIT_INTERRUPTED
