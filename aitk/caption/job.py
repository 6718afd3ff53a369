"""One captioning run: choose the files, load the model, caption each file and write
its caption at once, saying how far it got.

Progress: a line per file on stdout (`captioned N/M: NAME`, or `skipped N/M: NAME
(why)` for a file that cannot be read), and, when $AITK_STATUS_FILE is set, the status
file of aitk_common.status, written as the trainer writes it (aitk.run.status): phase
loading, then captioning with step/total_steps counting files, files/s and ETA, then the
final phase with the exit code, so the web UI's server watches a captioning job as it
watches a training job.

Stopping: the first SIGINT/SIGTERM/SIGHUP lets the current file finish (its caption
written), then the run ends with exit 130; a second stops at once. Either way no caption
is half-written (each is one atomic rename) and a run started again goes on with the
files still without a caption.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from PIL import Image, UnidentifiedImageError

from aitk.caption.media import load_picture
from aitk.caption.selection import Selection, scan, select
from aitk.caption.settings import CaptionSettings
from aitk.caption.writer import caption_text, write_caption
from aitk.errors import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    BadInputFile,
    DatasetError,
    TrainerError,
    UnreadableVideo,
)
from aitk.run.signals import StopFlag
from aitk.run.status import StatusFile
from aitk_common.files import DiskFull
from aitk_common.status import Phase, status_path

UNREADABLE = (OSError, UnidentifiedImageError, SyntaxError, ValueError,
              Image.DecompressionBombError, BadInputFile, UnreadableVideo)


class Captioner(Protocol):
    def caption(self, picture: Image.Image) -> str: ...


Load = Callable[[CaptionSettings, str], Captioner]


def load_vlm(settings: CaptionSettings, device: str) -> Captioner:
    from aitk.caption.vlm import Captioner as VLM

    return VLM(settings.model, settings.prompt, device, settings.max_new_tokens)


@dataclass(frozen=True)
class Outcome:
    total: int  # chosen to caption
    captioned: int  # written
    skipped: int  # unreadable, or no answer from the model
    kept: int  # had a caption, left as it was
    stopped: bool

    @property
    def exit_code(self) -> int:
        return EXIT_INTERRUPTED if self.stopped else EXIT_OK


def say_stdout(line: str) -> None:
    print(line, flush=True)


def describe(selection: Selection, settings: CaptionSettings) -> str:
    parts = [f"{len(selection.kept)} with a caption kept"] if selection.kept else []
    if selection.deferred:
        parts.append(f"{selection.deferred} left for later by --limit")
    extra = f" ({'; '.join(parts)})" if parts else ""
    return f"{len(selection.todo)} to caption in {settings.dataset}{extra}"


def check_writable(settings: CaptionSettings) -> None:
    """Before the model loads (minutes, gigabytes): a folder no caption can go into."""
    if not os.access(settings.dataset, os.W_OK | os.X_OK):
        raise DatasetError(f"dataset folder {settings.dataset} is not writable; captions "
                           "are written beside the pictures")


def run(settings: CaptionSettings, say: Callable[[str], None] = say_stdout,
        load: Load = load_vlm) -> Outcome:
    """Caption what `select` chooses. TrainerErrors rise (after the status file says
    why); the exit code of a run that got going is `Outcome.exit_code`."""
    status = StatusFile(status_path(None), name=f"caption: {settings.dataset}")
    status.phase(Phase.LOADING)
    try:
        outcome = _run(settings, say, load, status)
    except TrainerError as exc:
        status.finish(exc.exit_code, str(exc))
        raise
    except KeyboardInterrupt:
        status.finish(EXIT_INTERRUPTED, "stopped")
        raise
    except DiskFull as exc:
        status.finish(EXIT_FAILED, str(exc))
        raise TrainerError(str(exc)) from None
    except BaseException as exc:
        status.finish(EXIT_FAILED, f"{type(exc).__name__}: {exc}")
        raise
    status.status.message = (f"captioned {outcome.captioned} of {outcome.total}"
                             + (f", {outcome.skipped} skipped" if outcome.skipped else ""))
    status.finish(outcome.exit_code)
    return outcome


def _run(settings: CaptionSettings, say: Callable[[str], None], load: Load,
         status: StatusFile) -> Outcome:
    from aitk.caption.vlm import pick_device

    selection = select(scan(settings.dataset, settings.caption_suffix), settings.overwrite,
                       settings.limit)
    for f in selection.blocked:
        say(f"{f.caption}: not a file; left alone (its picture gets no caption)")
    say(describe(selection, settings))
    todo, kept = selection.todo, len(selection.kept)
    if not todo:
        say("nothing to caption" + ("; --overwrite replaces existing captions"
                                    if kept and not settings.overwrite else ""))
        return Outcome(0, 0, 0, kept, stopped=False)
    check_writable(settings)
    stop = StopFlag(say=lambda m: print(m, file=sys.stderr, flush=True),
                    notice="stopping after the current file (its caption is written)")
    with stop.installed():
        device = pick_device(settings.device)
        say(f"loading {settings.model} on {device}")
        captioner = load(settings, device)
        status.phase(Phase.CAPTIONING, step=0, total_steps=len(todo))
        started, captioned, skipped = time.monotonic(), 0, 0
        for n, f in enumerate(todo, start=1):
            if stop.requested:
                break
            try:
                picture = load_picture(f.path)
            except UNREADABLE as exc:
                line = f"skipped {n}/{len(todo)}: {f.path.name} (unreadable: {exc})"
                skipped += 1
            else:
                text = caption_text(captioner.caption(picture), settings.trigger)
                if text:
                    write_caption(f.caption, text)
                    captioned += 1
                    line = f"captioned {n}/{len(todo)}: {f.path.name}"
                else:
                    skipped += 1
                    line = f"skipped {n}/{len(todo)}: {f.path.name} (the model gave no text)"
            say(line)
            _progress(status, n, len(todo), time.monotonic() - started, line)
    return Outcome(len(todo), captioned, skipped, kept, stopped=stop.requested)


def _progress(status: StatusFile, done: int, total: int, elapsed: float, line: str) -> None:
    rate = done / elapsed if elapsed > 0 else None
    s = status.status
    s.message = line
    s.it_per_s = round(rate, 4) if rate else None
    s.eta_s = round((total - done) / rate, 1) if rate else None
    status.phase(Phase.CAPTIONING, step=done)
