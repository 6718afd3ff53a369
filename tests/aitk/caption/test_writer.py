"""The caption text and its write (aitk.caption.writer)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from aitk.caption.writer import caption_text, clean, write_caption


@pytest.mark.parametrize(("answer", "trigger", "expected"), [
    ("A red fox\n in the snow. ", None, "A red fox in the snow."),
    ('"A red fox."', None, "A red fox."),
    ("A red\x00 fox\x1b.", None, "A red fox."),
    ("A red fox.", "ohwx", "ohwx, A red fox."),
    ("ohwx sitting in snow.", "ohwx", "ohwx sitting in snow."),
    ("ohwxyz sitting in snow.", "ohwx", "ohwx, ohwxyz sitting in snow."),
    ("", "ohwx", "ohwx"),
    ("  ", None, ""),
])
def test_caption_text_is_one_clean_line_with_the_trigger_in_front(
        answer: str, trigger: str | None, expected: str) -> None:
    assert caption_text(answer, trigger) == expected


def test_clean_keeps_inner_quotes() -> None:
    assert clean('a sign saying "open"') == 'a sign saying "open"'


def test_the_write_replaces_the_file_in_one_rename_and_leaves_no_temp(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("old")
    write_caption(path, "new")
    assert path.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_a_caption_that_is_a_link_is_replaced_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "shared.txt"
    target.write_text("shared caption")
    os.symlink(target, tmp_path / "a.txt")
    write_caption(tmp_path / "a.txt", "own caption")
    assert not (tmp_path / "a.txt").is_symlink()
    assert (tmp_path / "a.txt").read_text() == "own caption"
    assert target.read_text() == "shared caption"
