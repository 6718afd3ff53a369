"""Which files get a caption (aitk.caption.selection): the pure decision, and the scan
that gives it its facts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aitk.caption.selection import CaptionState, MediaFile, caption_state, scan, select
from aitk.errors import DatasetError


def media(name: str, state: CaptionState) -> MediaFile:
    path = Path(name)
    return MediaFile(path, path.with_suffix(".txt"), state)


FILES = [media("a.png", CaptionState.MISSING), media("b.png", CaptionState.PRESENT),
         media("c.png", CaptionState.EMPTY), media("d.png", CaptionState.BLOCKED),
         media("e.png", CaptionState.MISSING)]


def names(files: tuple[MediaFile, ...]) -> list[str]:
    return [f.path.name for f in files]


def test_only_files_without_a_caption_are_chosen_and_the_captioned_are_kept() -> None:
    chosen = select(FILES, overwrite=False)
    assert names(chosen.todo) == ["a.png", "c.png", "e.png"]
    assert names(chosen.kept) == ["b.png"]
    assert names(chosen.blocked) == ["d.png"] and chosen.deferred == 0


def test_overwrite_chooses_the_captioned_too_but_never_a_path_that_is_not_a_file() -> None:
    chosen = select(FILES, overwrite=True)
    assert names(chosen.todo) == ["a.png", "b.png", "c.png", "e.png"]
    assert chosen.kept == () and names(chosen.blocked) == ["d.png"]


def test_limit_takes_the_first_in_name_order_and_counts_the_rest() -> None:
    chosen = select(FILES, overwrite=False, limit=2)
    assert names(chosen.todo) == ["a.png", "c.png"] and chosen.deferred == 1


def test_scan_reads_each_caption_state(tmp_path: Path) -> None:
    for name in ("a.png", "b.jpg", "c.webp", "d.mp4", "e.png", "f.png", "notes.md"):
        (tmp_path / name).write_bytes(b"x")
    (tmp_path / "b.txt").write_text("a caption")
    (tmp_path / "c.txt").write_text("")
    (tmp_path / "e.txt").mkdir()
    os.symlink(tmp_path / "b.txt", tmp_path / "f.txt")
    (tmp_path / "g.png").mkdir()  # a folder named like a picture is no picture
    states = {f.path.name: f.state for f in scan(tmp_path)}
    assert states == {"a.png": CaptionState.MISSING, "b.jpg": CaptionState.PRESENT,
                      "c.webp": CaptionState.EMPTY, "d.mp4": CaptionState.MISSING,
                      "e.png": CaptionState.BLOCKED, "f.png": CaptionState.PRESENT}
    assert caption_state(tmp_path / "nothing.txt") is CaptionState.MISSING


def test_scan_uses_the_caption_extension(tmp_path: Path) -> None:
    (tmp_path / "a.png").write_bytes(b"x")
    (tmp_path / "a.txt").write_text("not this one")
    [found] = scan(tmp_path, ".caption")
    assert found.caption == tmp_path / "a.caption" and found.state is CaptionState.MISSING


@pytest.mark.parametrize("case", ["missing", "file", "empty"])
def test_a_folder_that_is_not_a_dataset_is_a_dataset_error(tmp_path: Path, case: str) -> None:
    target = tmp_path / "x"
    if case == "file":
        target.write_text("")
    elif case == "empty":
        target.mkdir()
        (target / "readme.txt").write_text("no pictures")
    with pytest.raises(DatasetError, match=str(target)):
        scan(target)
