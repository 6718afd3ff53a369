"""Experiment trackers beside `loss_log.jsonl` (which always stays): Weights & Biases with
`logging.use_wandb`, TensorBoard event files with upstream's `log_dir`.

- wandb: `project_name` (ai-toolkit) and `run_name` (the job's name) as upstream; the
  run's config is the job config. Without an API key (`WANDB_API_KEY` or a `wandb
  login` netrc entry) the run is offline, written under the output folder for a later
  `wandb sync`; `WANDB_MODE` set by the user wins. One line says where the run is.
- TensorBoard: event files in `<log_dir>/<name>_<YYYYmmdd-HHMMSS>/`, as upstream's
  SummaryWriter folder, through tensorboardX (torch's writer needs the whole
  tensorboard package).

Each logs what the loss log does, by the same names: `loss` and `lr` per logged step,
`val_loss` per validation. Both packages are optional: a missing one is one warning line
and the run goes on without it; so is a tracker that fails while the run goes on.
"""

from __future__ import annotations

import importlib
import netrc
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

WANDB_HOST = "api.wandb.ai"


class Tracker(Protocol):
    name: str

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        ...

    def close(self) -> None:
        ...


def _optional(module: str) -> Any | None:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def wandb_mode(env: Mapping[str, str] | None = None) -> str:
    """The user's `WANDB_MODE`, else online with an API key and offline without one."""
    env = os.environ if env is None else env
    if env.get("WANDB_MODE"):
        return env["WANDB_MODE"]
    if env.get("WANDB_API_KEY"):
        return "online"
    try:
        found = netrc.netrc(env.get("NETRC") or None).authenticators(WANDB_HOST)
    except (OSError, netrc.NetrcParseError):
        found = None
    return "online" if found else "offline"


class WandbTracker:
    name = "wandb"

    def __init__(self, wandb: Any, project: str, run_name: str, config: Mapping[str, Any],
                 folder: Path, say: Callable[[str], None]) -> None:
        mode = wandb_mode()
        if mode == "offline":
            # wandb's own analytics read the process-wide mode, not the run's: without
            # this an offline run still posts metrics to wandb's server (api.forge...).
            os.environ["WANDB_MODE"] = "offline"
        folder.mkdir(parents=True, exist_ok=True)
        # silent: wandb's own banner and summary would bury the trainer's console
        settings = wandb.Settings(silent=True) if hasattr(wandb, "Settings") else None
        self.run = wandb.init(project=project, name=run_name, config=dict(config),
                              dir=str(folder), mode=mode, settings=settings)
        if mode == "offline":
            where = Path(self.run.dir).parent  # the run folder (`files/` is inside it)
            say(f"wandb: offline run in {where}; upload it with `wandb sync {where}`")
        else:
            say(f"wandb: {getattr(self.run, 'url', None) or project}")

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        self.run.log(dict(values), step=step)

    def close(self) -> None:
        self.run.finish()


class TensorBoardTracker:
    name = "TensorBoard"

    def __init__(self, writer_class: Any, folder: Path, say: Callable[[str], None]) -> None:
        self.writer = writer_class(logdir=str(folder))
        say(f"TensorBoard: event files in {folder}")

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class Trackers:
    """Every tracker the config switches on; `scalars` feeds them all."""

    def __init__(self, members: list[Tracker], warn: Callable[[str], None]) -> None:
        self.members = members
        self.warn = warn

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        for tracker in list(self.members):
            try:
                tracker.scalars(step, values)
            except Exception as exc:  # noqa: BLE001 - a tracker never stops training
                self.members.remove(tracker)
                self.warn(f"{tracker.name} failed ({exc.__class__.__name__}: {exc}); the "
                          "run goes on without it (loss_log.jsonl has every step)")

    def close(self) -> None:
        for tracker in self.members:
            try:
                tracker.close()
            except Exception as exc:  # noqa: BLE001
                self.warn(f"{tracker.name} did not close cleanly ({exc})")
        self.members = []


NONE = Trackers([], lambda message: None)


def open_trackers(logging: Any, log_dir: str | None, name: str, out_dir: Path,
                  config: Mapping[str, Any], say: Callable[[str], None],
                  warn: Callable[[str], None]) -> Trackers:
    """The trackers of a process's `logging` section and `log_dir` (rank 0 only).
    `say`: an information line; `warn`: a warning line."""
    members: list[Tracker] = []
    if logging.use_wandb:
        wandb = _optional("wandb")
        if wandb is None:
            warn("logging.use_wandb: the wandb package is not installed; this run is not "
                 "tracked in Weights & Biases (loss_log.jsonl still has every step)")
        else:
            try:
                members.append(WandbTracker(wandb, logging.project_name,
                                            logging.run_name or name, config, out_dir, say))
            except Exception as exc:  # noqa: BLE001 - e.g. online without a network
                warn(f"logging.use_wandb: wandb did not start ({exc.__class__.__name__}: "
                     f"{exc}); set WANDB_MODE=offline to track the run offline")
    if log_dir:
        writer = getattr(_optional("tensorboardX"), "SummaryWriter", None)
        if writer is None:
            warn("log_dir: the tensorboardX package is not installed; no TensorBoard "
                 "event files for this run")
        else:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            folder = Path(log_dir).expanduser() / f"{name}_{stamp}"
            members.append(TensorBoardTracker(writer, folder, say))
    return Trackers(members, warn)
