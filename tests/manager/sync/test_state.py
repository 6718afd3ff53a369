"""State: atomic, versioned, loud on corruption; read_state keeps a bad file aside."""

from __future__ import annotations

from pathlib import Path

import pytest

from manager.errors import StateError
from manager.paths import Paths
from manager.state import State, load_state, read_state, save_state


def test_round_trip_and_missing(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    assert load_state(paths) == State()
    state = State(backend="cpu", installer="uv", spec_fingerprint="f", requirements_hash="h",
                  requirement_files={"requirements.txt": "ab"}, venv_fingerprint="v",
                  python={"version": "3.11.2", "machine": "x86_64"},
                  torch={"name": "torch", "version": "2.13.0+cpu", "status": "ok"},
                  git_pins={"a": "1"}, migrations=["0001"],
                  companions={"torchvision": {"status": "ok", "version": "0.28.0+cpu"}},
                  optional={"triton": {"status": "unavailable", "detail": "no GPU"}},
                  tools={"uv": {"status": "ok", "version": "0.13.9", "path": None}},
                  cpu_requested=True, verified_at=1764400000.5)
    save_state(paths, state)
    assert load_state(paths) == state
    assert [p.name for p in paths.venv.iterdir()] == ["aitk_manager_state.json"]  # no temp


@pytest.mark.parametrize("raw", [
    "{not json", "[]", '{"version": 99}',
    # valid JSON of the wrong shape: the plan would crash on it instead of re-verifying
    '{"version": 1, "companions": []}', '{"version": 1, "optional": {"x": "ok"}}',
    '{"version": 1, "migrations": "001"}', '{"version": 1, "venv_fingerprint": 3}',
    '{"version": true}',
    # issue 14: nested 2,000 deep (RecursionError in json), an integer past Python's
    # digit limit (ValueError), bytes that are not UTF-8 (UnicodeDecodeError)
    "[" * 2000 + "]" * 2000, '{"version": 1, "verified_at": ' + "9" * 5000 + "}",
    "\udcff",
])
def test_bad_files_raise_and_are_kept_aside(tmp_path: Path, raw: str) -> None:
    paths = Paths(tmp_path)
    paths.venv.mkdir()
    paths.state_file.write_bytes(raw.encode("utf-8", "surrogateescape"))
    with pytest.raises(StateError):
        load_state(paths)
    looked = read_state(paths, keep_backup=False)
    assert looked.problem and looked.backup is None and paths.state_file.exists()
    kept = read_state(paths, keep_backup=True)
    assert kept.state == State() and kept.backup is not None
    assert kept.backup.read_bytes() == raw.encode("utf-8", "surrogateescape")
    assert not paths.state_file.exists()


def test_a_state_that_cannot_be_read_at_all_is_set_aside(tmp_path: Path) -> None:
    """A folder where the file belongs (EISDIR): unreadable, so it is set aside too."""
    paths = Paths(tmp_path)
    paths.state_file.mkdir(parents=True)
    kept = read_state(paths, keep_backup=True)
    assert kept.problem and kept.backup is not None and kept.backup.is_dir()
    assert not paths.state_file.exists()
