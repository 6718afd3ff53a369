"""A web UI job's states and what each one allows: the one copy of these names.

The server stores the state in its database, decides from here whether a request may do
what it asks (a start of a running job is refused), and sends each job's allowed actions
to the page, which draws its buttons from them and holds no list of states.

    created   made, never run              start, queue, edit, delete, delete outputs
    queued    waits for the running job    stop (leave the queue), delete
    running   its trainer process lives    stop, save now, sample now
    stopping  asked to save and exit       (nothing: the save is under way)
    finished  the trainer ended with 0     run again, queue, edit, delete, delete outputs
    stopped   saved and exited (130)       resume, queue, edit, delete, delete outputs
    failed    ended any other way          resume, queue, edit, delete, delete outputs
Every state allows a copy (the page's "run again under a new name").
"""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    CREATED = "created"
    QUEUED = "queued"
    RUNNING = "running"
    STOPPING = "stopping"
    FINISHED = "finished"
    STOPPED = "stopped"
    FAILED = "failed"

    def __str__(self) -> str:  # the name as stored and sent, on every Python
        return self.value


class Action(str, Enum):
    START = "start"  # the first run
    RESUME = "resume"  # from the last checkpoint (the trainer finds it)
    RERUN = "rerun"  # a finished job, again
    QUEUE = "queue"
    STOP = "stop"
    EDIT = "edit"
    DELETE = "delete"
    DELETE_OUTPUTS = "delete_outputs"
    SAVE_NOW = "save_now"  # at the next step boundary (aitk_common.requests)
    SAMPLE_NOW = "sample_now"
    COPY = "copy"  # a new job from this one's config, under a new name

    def __str__(self) -> str:
        return self.value


# The states whose trainer process lives: only a live process makes a job one of these.
ACTIVE = frozenset({JobState.RUNNING, JobState.STOPPING})
# How a run can end (the trainer's status file names its end with the same words).
ENDED = frozenset({JobState.FINISHED, JobState.STOPPED, JobState.FAILED})
# Every action that runs the trainer (the server has one start for all three).
STARTS = frozenset({Action.START, Action.RESUME, Action.RERUN})

_AFTER_A_RUN = frozenset({Action.QUEUE, Action.EDIT, Action.DELETE, Action.DELETE_OUTPUTS})
ALLOWED: dict[JobState, frozenset[Action]] = {
    JobState.CREATED: frozenset({Action.START, *_AFTER_A_RUN, Action.COPY}),
    JobState.QUEUED: frozenset({Action.STOP, Action.DELETE, Action.COPY}),
    JobState.RUNNING: frozenset({Action.STOP, Action.SAVE_NOW, Action.SAMPLE_NOW,
                                 Action.COPY}),
    JobState.STOPPING: frozenset({Action.COPY}),
    JobState.FINISHED: frozenset({Action.RERUN, *_AFTER_A_RUN, Action.COPY}),
    JobState.STOPPED: frozenset({Action.RESUME, *_AFTER_A_RUN, Action.COPY}),
    JobState.FAILED: frozenset({Action.RESUME, *_AFTER_A_RUN, Action.COPY}),
}
# Where a start may come from: every state that allows one of STARTS.
STARTABLE = frozenset(s for s, actions in ALLOWED.items() if actions & STARTS)


def state(value: str) -> JobState:
    """The state a stored name stands for (ValueError for a name that is none)."""
    return JobState(value)


def allows(current: str, action: Action) -> bool:
    return action in ALLOWED[state(current)]


def actions(current: str) -> list[str]:
    """What the page may offer for a job in this state, in a stable order."""
    allowed = ALLOWED[state(current)]
    return [a.value for a in Action if a in allowed]


def is_active(current: str) -> bool:
    return state(current) in ACTIVE
