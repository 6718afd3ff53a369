"""The trainer's file helpers: a folder is published whole or not at all (aitk_common.files);
file hashes run on Python 3.10."""

from __future__ import annotations

import pytest

from aitk_common.files import staged_dir


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


def test_file_hashes_need_no_python_311_hashlib(tmp_path, monkeypatch):
    """Python 3.10 has no hashlib.file_digest: the trainer's file hashes must not use it."""
    import hashlib

    from aitk.data.cache import file_digest
    from aitk.models.identity import file_sha256

    data = bytes(range(256)) * 5000  # > 1 MiB: more than one chunk
    path = tmp_path / "weights.bin"
    path.write_bytes(data)
    monkeypatch.delattr(hashlib, "file_digest", raising=False)
    expected = hashlib.sha256(data).hexdigest()
    assert file_sha256(path) == expected
    assert file_digest(path) == expected
