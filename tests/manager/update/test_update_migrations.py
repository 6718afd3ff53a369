"""Migrations: order, once only, failure then retry; and the shipped migration."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from manager import migrations
from manager.migrations import Migration, MigrationFailed
from manager.migrations import m001_gradient_accumulation_key as m001
from manager.paths import Paths
from manager.state import State, load_state, save_state


def recording(log: list[str], name: str, fail: list[bool] | None = None):
    def run(root: Path) -> None:
        if fail and fail[0]:
            raise OSError(f"{name} cannot write")
        log.append(name)
    return run


def test_pending_migrations_run_in_order_once(tmp_path: Path) -> None:
    log: list[str] = []
    available = [Migration(i, f"step {i}", recording(log, i)) for i in ("001_a", "002_b", "003_c")]
    p = Paths(tmp_path)
    state = State()

    def record(mid: str) -> None:  # the sync's recorder: state on disk after each success
        state.migrations.append(mid)
        save_state(p, state)

    assert migrations.pending([], available) == ["001_a", "002_b", "003_c"]
    assert migrations.run_pending(tmp_path, ["002_b"], record, available) == ["001_a", "003_c"]
    assert log == ["001_a", "003_c"]

    applied = load_state(p).migrations
    assert migrations.run_pending(tmp_path, applied + ["002_b"], record, available) == []
    assert log == ["001_a", "003_c"]  # never twice


def test_a_failing_migration_stops_is_not_recorded_and_is_retried(tmp_path: Path) -> None:
    log: list[str] = []
    broken = [True]
    available = [Migration("001_a", "a", recording(log, "001_a")),
                 Migration("002_b", "b", recording(log, "002_b", broken)),
                 Migration("003_c", "c", recording(log, "003_c"))]
    applied: list[str] = []

    with pytest.raises(MigrationFailed) as failure:
        migrations.run_pending(tmp_path, applied, applied.append, available)
    assert failure.value.migration_id == "002_b"
    assert "002_b" in failure.value.message and "cannot write" in failure.value.message
    assert failure.value.exit_code == 1
    assert applied == ["001_a"]  # what ran before the failure is recorded; nothing after
    assert log == ["001_a"]

    broken[0] = False  # the user fixed the cause
    assert migrations.run_pending(tmp_path, applied, applied.append, available) == [
        "002_b", "003_c"]
    assert applied == ["001_a", "002_b", "003_c"]


def test_shipped_migrations_are_discovered_in_order_with_ids_and_descriptions() -> None:
    found = migrations.available()
    assert found, "ship at least one migration"
    assert [m.id for m in found] == sorted(m.id for m in found)
    assert len({m.id for m in found}) == len(found)
    assert all(m.description and "\n" not in m.description for m in found)
    assert found[0].id == m001.ID
    assert migrations.describe([m001.ID]) == {m001.ID: m001.DESCRIPTION}


LEGACY = """job: extension
config:
  name: my_lora   # keep this comment
  process:
    - type: sd_trainer
      train:
        batch_size: 1
        gradient_accumulation_steps: 4
"""


def test_convert_renames_only_the_legacy_key() -> None:
    out = m001.convert(LEGACY)
    assert out == LEGACY.replace("gradient_accumulation_steps: 4", "gradient_accumulation: 4")
    assert m001.convert(out) is None  # idempotent
    assert m001.convert('train:\n  "gradient_accumulation_steps": 2\n') == (
        'train:\n  "gradient_accumulation": 2\n')
    both = "train:\n  gradient_accumulation: 2\n  gradient_accumulation_steps: 4\n"
    assert m001.convert(both) is None  # ambiguous: the trainer's validation reports it
    assert m001.convert("note: gradient_accumulation_steps: in a value\n") is None


def _repo(root: Path) -> None:
    env = {**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@x"}
    for args in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "init"]):
        subprocess.run(["git", *args], cwd=root, env=env, check=True, capture_output=True)


def test_m001_converts_user_configs_with_a_backup_and_leaves_tracked_ones(tmp_path: Path) -> None:
    config = tmp_path / "config"
    (config / "examples").mkdir(parents=True)
    tracked = config / "committed.yaml"
    tracked.write_text(LEGACY)
    example = config / "examples" / "train.yaml"
    example.write_text(LEGACY)
    _repo(tmp_path)  # both of the above are tracked
    mine = config / "my_lora.yml"
    mine.write_text(LEGACY)
    mine.chmod(0o640)
    other = config / "notes.txt"
    other.write_text("gradient_accumulation_steps: 1\n")

    m001.run(tmp_path)

    assert mine.read_text() == m001.convert(LEGACY)
    assert (mine.stat().st_mode & 0o777) == 0o640
    backup = m001.backup_path(mine)
    assert backup.read_text() == LEGACY
    assert tracked.read_text() == LEGACY and example.read_text() == LEGACY
    assert other.read_text() == "gradient_accumulation_steps: 1\n"

    m001.run(tmp_path)  # idempotent: nothing changes, the backup keeps the original
    assert mine.read_text() == m001.convert(LEGACY)
    assert backup.read_text() == LEGACY
    assert sorted(p.name for p in config.iterdir()) == [
        "committed.yaml", "examples", "my_lora.yml", backup.name, "notes.txt"]


def test_m001_without_a_config_folder_or_git_is_a_no_op(tmp_path: Path) -> None:
    m001.run(tmp_path)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "job.yaml").write_text(LEGACY)
    m001.run(tmp_path)  # not a git checkout: every file is the user's
    assert (tmp_path / "config" / "job.yaml").read_text() == m001.convert(LEGACY)


# ---- issue 14: only keys are renamed; a symlinked config stays a symlink -----------------

IN_A_STRING = """\
config:
  process:
    - train:
        gradient_accumulation_steps: 4
      sample:
        prompts:
          - |
            gradient_accumulation_steps: 4 is what I wrote in this prompt
          - "gradient_accumulation_steps: quoted, and
            gradient_accumulation_steps: on a second line"
"""


def test_convert_never_edits_text_inside_a_string_value() -> None:
    out = m001.convert(IN_A_STRING)
    assert out is not None
    assert out.count("gradient_accumulation_steps") == 3  # the three inside strings
    assert "        gradient_accumulation: 4\n" in out
    assert m001.convert("train: {gradient_accumulation_steps: 2}\n") == (
        "train: {gradient_accumulation: 2}\n")
    assert m001.convert("not: [valid yaml\n  gradient_accumulation_steps: 1\n") is None


def test_a_symlinked_config_is_written_through_and_stays_a_link(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (tmp_path / "mine").mkdir()
    real = tmp_path / "mine" / "job.yaml"
    real.write_text(LEGACY)
    link = config / "job.yaml"
    link.symlink_to(Path("..") / "mine" / "job.yaml")

    notes = m001.run(tmp_path)

    assert link.is_symlink() and link.resolve() == real.resolve()
    assert real.read_text() == m001.convert(LEGACY)
    assert m001.backup_path(link).read_text() == LEGACY
    assert not notes


def test_a_config_linked_from_outside_the_checkout_is_skipped_with_a_note(tmp_path: Path
                                                                          ) -> None:
    root = tmp_path / "checkout"
    (root / "config").mkdir(parents=True)
    outside = tmp_path / "elsewhere.yaml"
    outside.write_text(LEGACY)
    link = root / "config" / "job.yaml"
    link.symlink_to(outside)

    notes = m001.run(root)

    assert link.is_symlink() and outside.read_text() == LEGACY
    assert notes and "job.yaml" in notes[0] and "outside" in notes[0]


def test_run_pending_reports_a_migrations_notes(tmp_path: Path) -> None:
    said: list[str] = []
    done = migrations.run_pending(
        tmp_path, [], lambda _id: None,
        [migrations.Migration("001_x", "x", lambda root: ["left config/a.yaml alone"])],
        report=said.append)
    assert done == ["001_x"] and said == ["migration 001_x: left config/a.yaml alone"]


# ---- issue 21: a backup is the user's file like any other --------------------------------


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o600])
def test_m001_backup_has_the_configs_own_mode(tmp_path: Path, mode: int) -> None:
    """The backup follows the umask like every file the user owns (it was always 0600,
    mkstemp's mode), and is never readable by more people than the config it copies."""
    config = tmp_path / "config"
    config.mkdir()
    mine = config / "job.yaml"
    mine.write_text(LEGACY)
    mine.chmod(mode)
    old = os.umask(0o022)
    try:
        m001.run(tmp_path)
    finally:
        os.umask(old)
    assert (m001.backup_path(mine).stat().st_mode & 0o777) == mode
    assert (mine.stat().st_mode & 0o777) == mode
