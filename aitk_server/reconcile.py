"""What a job's state really is, from what the database says, whether its process is
alive, how it ended and the trainer's status file. Pure: the runner gathers the facts.

The rule that matters: a job is `running` (or `stopping`) only while its process is
alive. A process that is gone ends the job with the trainer's own final status when it
wrote one, else as `failed` with the reason (killed by a signal, crashed), so a crash or
a killed server never leaves a job "running".
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

ACTIVE = frozenset({"running", "stopping"})
FINAL = {"finished": "finished", "stopped": "stopped", "failed": "failed"}


@dataclass(frozen=True)
class Ended:
    state: str
    exit_code: int | None
    error: str | None


def signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def ended(pid: int, returncode: int | None, status: dict[str, Any] | None) -> Ended:
    """The end of a job whose process `pid` is gone. `returncode` is known only for a
    child of this server (Popen); a job adopted after a restart has only its status."""
    ours = status is not None and status.get("pid") == pid
    if ours and status and status.get("phase") in FINAL:
        code = status.get("exit_code")
        return Ended(FINAL[status["phase"]], code, status.get("error"))
    if returncode is not None and returncode < 0:
        return Ended("failed", 128 - returncode,
                     f"the trainer was killed by {signal_name(returncode)} "
                     "(start it again to resume from its last checkpoint)")
    if returncode is not None:
        state = {0: "finished", 130: "stopped"}.get(returncode, "failed")
        return Ended(state, returncode, None if state != "failed" else
                     f"the trainer exited with code {returncode}; see its log")
    return Ended("failed", None, "the trainer process ended without reporting how "
                 "(killed, or crashed while the server was down); start it again to "
                 "resume from its last checkpoint")
