"""The manager's error tree. Only cli.py catches these.

    ManagerError                 exit 1   something failed; `hint` says how to fix it
    ├── UsageError               exit 2   bad flags or arguments
    ├── UnsupportedMachine       exit 3   spec.py refuses this machine (driver, --cpu)
    ├── LockTimeout              exit 4   another manager run holds the lock
    ├── StateError               exit 5   the state file is corrupt or from the future
    ├── DirtyTree                exit 6   update would touch local changes
    └── UpdateRefused            exit 7   diverged, detached, no upstream, job running

`check` also uses exit 10 (update available) and 11 (sync due); see README.
"""

from __future__ import annotations


class ManagerError(Exception):
    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UsageError(ManagerError):
    exit_code = 2


class UnsupportedMachine(ManagerError):
    exit_code = 3


class LockTimeout(ManagerError):
    exit_code = 4


class StateError(ManagerError):
    exit_code = 5


class DirtyTree(ManagerError):
    exit_code = 6


class UpdateRefused(ManagerError):
    exit_code = 7


# Exit codes that are not errors but answers (used by `check`).
EXIT_OK = 0
EXIT_UPDATE_AVAILABLE = 10
EXIT_SYNC_DUE = 11
EXIT_INTERRUPTED = 130
