"""What a job's state really is, from what the database says, whether its process is
alive, how it ended and the trainer's status file. Pure: the runner gathers the facts.

The rule that matters: a job is `running` (or `stopping`) only while its process is
alive. A process that is gone ends the job with the trainer's own final status when it
wrote one, else as `failed` with the reason (killed by a signal, crashed), so a crash or
a killed server never leaves a job "running". One exception: a stop the user asked for
that arrived before the trainer could handle it (right after a start) killed it with
that very signal; the job is `stopped`, as asked.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from aitk_common.jobstates import JobState
from aitk_common.status import Status

# How a process the stop signal ended reports it: POSIX -SIGTERM / -SIGINT (or a shell's
# 128+N), Windows STATUS_CONTROL_C_EXIT for a CTRL_BREAK the child did not handle.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_STOP_CODES = frozenset({*(-s for s in _STOP_SIGNALS), *(128 + s for s in _STOP_SIGNALS),
                         0xC000013A})


@dataclass(frozen=True)
class Ended:
    state: JobState
    exit_code: int | None
    error: str | None


def signal_name(returncode: int) -> str:
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def ended(pid: int, returncode: int | None, status: Status | None,
          stop_requested: bool = False) -> Ended:
    """The end of a job whose process `pid` is gone. `returncode` is known only for a
    child of this server (Popen); a job adopted after a restart has only its status.
    `stop_requested`: the job was `stopping` (the user asked it to stop)."""
    if status is not None and status.pid == pid and status.phase.final:
        return Ended(JobState(status.phase.value), status.exit_code, status.error)
    code = 128 - returncode if returncode is not None and returncode < 0 else returncode
    if stop_requested and returncode in _STOP_CODES:
        return Ended(JobState.STOPPED, code, None)
    if returncode is not None and returncode < 0:
        return Ended(JobState.FAILED, code,
                     f"the trainer was killed by {signal_name(returncode)} "
                     "(start it again to resume from its last checkpoint)")
    if returncode is not None:
        state = {0: JobState.FINISHED, 130: JobState.STOPPED}.get(returncode,
                                                                  JobState.FAILED)
        return Ended(state, returncode, None if state != JobState.FAILED else
                     f"the trainer exited with code {returncode}; see its log")
    return Ended(JobState.FAILED, None, "the trainer process ended without reporting how "
                 "(killed, or crashed while the server was down); start it again to "
                 "resume from its last checkpoint")
