"""aitk/files.py: a folder is published whole or not at all."""

from __future__ import annotations

import pytest

from aitk.files import staged_dir


def test_staged_dir_replaces_a_folder_only_when_complete(tmp_path):
    target = tmp_path / "model"
    with staged_dir(target) as tmp:
        (tmp / "a.txt").write_text("one")
    assert (target / "a.txt").read_text() == "one"

    with pytest.raises(RuntimeError):
        with staged_dir(target) as tmp:
            (tmp / "a.txt").write_text("two")
            raise RuntimeError("crash while building")
    assert (target / "a.txt").read_text() == "one"  # the old folder is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no debris

    with staged_dir(target) as tmp:
        (tmp / "b.txt").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
