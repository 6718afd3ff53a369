"""`run.py` with pauses at known points, for the Ctrl+C tests (test_job_signals.py).

A real process receiving real signals, but it waits at a chosen point until the test's
signal has arrived, so where the signal lands never depends on how fast the machine is:

    AITK_TEST_MARKERS      folder; `<point>` is created there when the run pauses
    AITK_TEST_PAUSE_CALL   pause in the Nth loss computation (a micro-step, mid-step)
                           until one signal has arrived  -> marker `step`
    AITK_TEST_PAUSE_SAVE   "1": after the first signal, pause inside the checkpoint
                           save, after its first file, until a second signal has
                           arrived                        -> marker `save`
    AITK_TEST_PAUSE_RANK   under torchrun: only this rank pauses (the marker holds its
                           pid, the process to signal)

Usage: python tests/aitk/paused_run.py CONFIG (same arguments as run.py).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aitk.cli.run import main  # noqa: E402
from aitk.run import checkpoint, signals, train  # noqa: E402

MARKERS = Path(os.environ["AITK_TEST_MARKERS"])
PAUSE_CALL = int(os.environ.get("AITK_TEST_PAUSE_CALL", "0"))
PAUSE_SAVE = os.environ.get("AITK_TEST_PAUSE_SAVE") == "1"
if os.environ.get("AITK_TEST_PAUSE_RANK", os.environ.get("RANK", "0")) != \
        os.environ.get("RANK", "0"):
    PAUSE_CALL, PAUSE_SAVE = 0, False
received: list[int] = []


def pause(point: str, signals: int) -> None:
    """Announce `point`, then wait until `signals` signals have arrived. The signal
    handler runs during the sleep; a second Ctrl+C raises out of here, as it would out
    of any code the run happens to be in."""
    (MARKERS / point).write_text(str(os.getpid()))
    deadline = time.monotonic() + 600  # only a broken test waits this long
    while len(received) < signals:
        if time.monotonic() > deadline:
            raise SystemExit(f"paused_run: no signal at {point!r}")
        time.sleep(0.005)


_handle = signals.StopFlag.handle


def handle(self: signals.StopFlag, signum: int, frame: object) -> None:
    received.append(signum)
    _handle(self, signum, frame)


_compute_loss = train.compute_loss
calls = 0


def compute_loss(*args, **kwargs):
    global calls
    calls += 1
    loss = _compute_loss(*args, **kwargs)
    if calls == PAUSE_CALL:
        pause("step", 1)  # the forward has run; backward and optimizer step still to do
    return loss


_write_synced = checkpoint._write_synced
written = 0  # files of the save after the first signal


def write_synced(path: Path, data: bytes) -> None:
    global written
    _write_synced(path, data)
    if PAUSE_SAVE and received:  # the save that the first signal asked for
        written += 1
        if written == 1:
            pause("save", 2)


signals.StopFlag.handle = handle
train.compute_loss = compute_loss
checkpoint._write_synced = write_synced

if __name__ == "__main__":
    sys.exit(main())
