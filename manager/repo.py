"""The checkout as a git repository (GitPython): status, fetch, fast-forward only.

Local questions (branch, upstream, counts, dirty files) go through GitPython. The one
network operation, `fetch`, runs git through the manager's runner in its own process
group, with a timeout that kills git and its helpers, and an environment in which git
can never ask for credentials (see `network_env`).

Nothing here resets, cleans or checks out: the only operation that changes files is a
fast-forward merge, and git itself refuses it when it would overwrite local changes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import git

from aitk_common.urls import redact_urls
from manager import envvars, process
from manager.errors import DirtyTree, ManagerError, UpdateRefused

TIMEOUT_ENV = "AITK_GIT_TIMEOUT"  # seconds for network git operations
DEFAULT_TIMEOUT = 20.0
INCOMING_MAX = 20


@dataclass(frozen=True)
class RepoStatus:
    branch: str | None  # None when HEAD is detached
    commit: str | None
    upstream: str | None  # "origin/main"; None when the branch tracks nothing
    upstream_commit: str | None = None
    behind: int | None = None  # None when unknown (no upstream, or never fetched)
    ahead: int | None = None
    dirty_files: tuple[str, ...] = ()  # staged or unstaged changes to tracked files
    incoming: tuple[str, ...] = ()  # one line per incoming commit, at most 20
    remote_reached: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)
    remote: str | None = None  # the upstream's remote ("origin"); None for a local one
    fetch_error: str | None = None  # why the fetch failed, when it was tried and failed

    @property
    def dirty(self) -> bool:
        return bool(self.dirty_files)


def timeout_from_env(environ: Mapping[str, str] | None = None) -> float:
    return envvars.seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT, environ)


# --- pure helpers -------------------------------------------------------------------------


def network_env(timeout: float, base: Mapping[str, str],
                ssh_command: str | None = None) -> dict[str, str]:
    """Variables that make a network git command fail instead of prompting, and give up
    on a stalled transfer. `base` is the environment it extends (for GIT_CONFIG_COUNT and
    the user's own ssh command); `ssh_command` is the repo's core.sshCommand, if any."""
    seconds = str(max(1, int(timeout)))
    env = {
        "GIT_TERMINAL_PROMPT": "0",
        # Empty, not unset: git then skips core.askPass and SSH_ASKPASS too.
        "GIT_ASKPASS": "",
        "SSH_ASKPASS": "",
        "SSH_ASKPASS_REQUIRE": "never",
        "GCM_INTERACTIVE": "never",  # Git Credential Manager's GUI prompt
        "GIT_HTTP_LOW_SPEED_LIMIT": "1000",
        "GIT_HTTP_LOW_SPEED_TIME": seconds,
    }
    # `-c credential.helper=` for every git spawned under us, without touching argv.
    count = _int(base.get("GIT_CONFIG_COUNT"))
    env[f"GIT_CONFIG_KEY_{count}"] = "credential.helper"
    env[f"GIT_CONFIG_VALUE_{count}"] = ""
    env["GIT_CONFIG_COUNT"] = str(count + 1)
    batch = f"-o BatchMode=yes -o ConnectTimeout={seconds}"
    if base.get("GIT_SSH_COMMAND"):
        env["GIT_SSH_COMMAND"] = f"{base['GIT_SSH_COMMAND']} {batch}"
    elif not base.get("GIT_SSH"):  # a GIT_SSH program takes no options; leave it be
        env["GIT_SSH_COMMAND"] = f"{ssh_command or 'ssh'} {batch}"
    return env


def _int(raw: str | None) -> int:
    try:
        return max(0, int(raw or 0))
    except ValueError:
        return 0


def parse_porcelain(text: str) -> tuple[str, ...]:
    """Paths from `git status --porcelain=v1 -z --untracked-files=no`, in git's order.

    A rename or copy entry is followed by its source path, which we list too: both
    sides are local work."""
    fields = text.split("\0")
    out: list[str] = []
    i = 0
    while i < len(fields):
        entry = fields[i]
        i += 1
        if len(entry) < 4:
            continue
        code, path = entry[:2], entry[3:]
        out.append(path)
        if "R" in code or "C" in code:
            if i < len(fields) and fields[i]:
                out.append(fields[i])
            i += 1
    return tuple(out)


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


# --- the shell ----------------------------------------------------------------------------


def open_repo(root: Path) -> git.Repo:
    try:
        return git.Repo(root)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise ManagerError(f"{root} is not a git checkout",
                           hint="update and check need a `git clone` of the toolkit") from None
    except git.GitCommandNotFound:
        raise ManagerError("git was not found on PATH",
                           hint="install git (Windows: the manager's MinGit)") from None


def dirty_files(repo: git.Repo) -> tuple[str, ...]:
    # GIT_OPTIONAL_LOCKS=0: a read-only question must not write the index.
    with repo.git.custom_environment(GIT_OPTIONAL_LOCKS="0"):
        out = repo.git.status("--porcelain=v1", "-z", "--untracked-files=no",
                              "--ignore-submodules=none", strip_newline_in_stdout=False)
    return parse_porcelain(out)


def status(root: Path, fetch: bool = False, timeout: float = DEFAULT_TIMEOUT) -> RepoStatus:
    """Where the checkout stands. With fetch=True the upstream's remote is fetched first;
    a failure is recorded (remote_reached False, fetch_error, a note), never raised, so
    offline callers still get the last known counts."""
    repo = open_repo(root)
    notes: list[str] = []
    try:
        commit: str | None = repo.head.commit.hexsha
    except ValueError:  # an unborn branch
        commit = None
    detached = repo.head.is_detached
    branch = None if detached else repo.active_branch.name
    tracking = None if detached else repo.active_branch.tracking_branch()
    upstream = tracking.name if tracking is not None else None
    remote = tracking.remote_name if tracking is not None else None
    if remote == ".":
        remote = None  # tracks a local branch: nothing to fetch
    if detached:
        notes.append(f"HEAD is detached at {commit[:10] if commit else '?'}")
    elif upstream is None:
        notes.append(f"branch {branch!r} tracks no upstream branch")

    reached = False
    fetch_error = None
    if fetch and remote:
        fetch_error = fetch_remote(repo, remote, timeout)
        reached = fetch_error is None
        if fetch_error:
            notes.append(f"remote {remote!r} was not reached: {fetch_error}")
    elif fetch and upstream and remote is None:
        reached = True  # a local upstream is always "reached"

    upstream_commit = behind = ahead = None
    incoming: tuple[str, ...] = ()
    if upstream and commit:
        try:
            upstream_commit = repo.commit(upstream).hexsha
        except (git.BadName, ValueError):
            notes.append(f"{upstream} is not known locally yet (never fetched)")
        if upstream_commit:
            counts = repo.git.rev_list("--left-right", "--count", f"{commit}...{upstream_commit}")
            ahead, behind = (int(n) for n in counts.split())
            incoming = tuple(
                f"{c.hexsha[:10]} {c.summary}"
                for c in repo.iter_commits(f"{commit}..{upstream_commit}",
                                           max_count=INCOMING_MAX)
            )
            if fetch and remote and not reached:
                notes.append(f"counts are as of the last fetch of {remote!r}")
    return RepoStatus(
        branch=branch,
        commit=commit,
        upstream=upstream,
        upstream_commit=upstream_commit,
        behind=behind,
        ahead=ahead,
        dirty_files=dirty_files(repo),
        incoming=incoming,
        remote_reached=reached,
        notes=tuple(notes),
        remote=remote,
        fetch_error=fetch_error,
    )


def fetch_remote(repo: git.Repo, remote: str, timeout: float) -> str | None:
    """Fetch one remote; return None on success, else one line saying why not."""
    try:
        ssh_command = repo.config_reader().get_value("core", "sshCommand", default=None)
    except Exception:  # an unreadable config is git's to report, in the fetch below
        ssh_command = None
    env = process.clean_env(network_env(timeout, os.environ,
                                        str(ssh_command) if ssh_command else None))
    # The same git GitPython uses (GIT_PYTHON_GIT_EXECUTABLE may point at a private copy).
    program = git.Git.GIT_PYTHON_GIT_EXECUTABLE or "git"
    done = process.run([program, "fetch", "--quiet", remote],
                       env=env, cwd=Path(repo.working_tree_dir or "."), timeout=timeout,
                       own_group=True)
    if done.timed_out:
        return f"git fetch gave no answer within {timeout:g} s"
    if not done.ok:
        # git names the URL it could not reach, with any token in its query.
        return redact_urls(last_line(done.stderr)) or f"git fetch exited with {done.returncode}"
    return None


def in_the_way(root: Path, commit: str, target: str) -> tuple[str, ...]:
    """Paths of files the user did not commit that moving from `commit` to `target`
    would overwrite or remove. git refuses for plain untracked files but treats ignored
    ones (outputs, logs) as expendable, so both are checked here, before git runs."""
    repo = open_repo(root)

    def changed(kind: str) -> list[str]:
        out = repo.git.diff("--name-only", "-z", "--no-renames", f"--diff-filter={kind}",
                            commit, target, strip_newline_in_stdout=False)
        return [p for p in out.split("\0") if p]

    return collisions(root, changed("A"), removed=set(changed("D")))


def collisions(root: Path, added: Iterable[str], removed: set[str] | None = None
               ) -> tuple[str, ...]:
    """Of the paths a commit adds, those where something already is on disk: the path
    itself (a file, a link, a folder) or a parent that is not a real folder (unless
    that parent is a tracked file the same commit removes)."""
    found: dict[str, None] = {}
    gone = removed or set()
    for rel in added:
        parts = rel.split("/")
        for depth in range(1, len(parts)):
            name = "/".join(parts[:depth])
            parent = root.joinpath(*parts[:depth])
            if name in gone:
                continue
            if parent.is_symlink() or (parent.exists() and not parent.is_dir()):
                found[name] = None
                break
        else:
            if os.path.lexists(root.joinpath(*parts)):
                found[rel] = None
    return tuple(found)


def fast_forward(root: Path, target: str) -> None:
    """Move the current branch to `target` only if that is a fast-forward. git refuses
    (and changes nothing) when the merge would overwrite local changes or untracked
    files; that refusal becomes DirtyTree, any other failure UpdateRefused."""
    repo = open_repo(root)
    try:
        repo.git.merge("--ff-only", "--no-edit", target)
    except git.GitCommandError as exc:
        detail = str(exc.stderr or "").strip().strip("'").strip()
        overwritten = _overwritten_paths(detail)
        if overwritten or "would be overwritten" in detail:
            raise DirtyTree(
                "git refused the fast-forward: it would overwrite local changes in "
                + (", ".join(overwritten) or "the working tree"),
                hint="commit or stash them (`git stash`), or move the untracked files, "
                     "then run the update again",
            ) from None
        raise UpdateRefused(f"git refused the fast-forward: {last_line(detail)}",
                            hint="run `git status` to see why") from None


def _overwritten_paths(detail: str) -> list[str]:
    """The file list git prints between 'would be overwritten by merge:' and 'Please'."""
    out: list[str] = []
    collecting = False
    for line in detail.splitlines():
        text = line.strip()
        if "would be overwritten" in text:
            collecting = True
            continue
        if collecting:
            if not text or text.startswith(("Please", "Aborting", "error:")):
                collecting = False
                continue
            out.append(text)
    return out
