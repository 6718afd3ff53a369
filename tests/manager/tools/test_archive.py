"""Safe extraction, atomic publish and markers."""

from __future__ import annotations

import os

import pytest

from manager import archive
from tests.manager.tools.builders import Entry, exe, make_tar, make_zip, tree

GOOD = [
    Entry("pkg", kind="dir", mode=0o755),
    exe("pkg/bin/tool", "tool 1.0"),
    Entry("pkg/lib/libx.so.1", b"\x7fELF"),
    Entry("pkg/lib/libx.so", kind="symlink", target="libx.so.1"),
    Entry("pkg/bin/tool-lib", kind="symlink", target="../lib/libx.so.1"),
]

BAD = {
    "dotdot": [exe("pkg/bin/tool", "x"), Entry("pkg/../../evil", b"boom")],
    "absolute": [exe("pkg/bin/tool", "x"), Entry("/tmp/aitk-evil", b"boom")],
    "escaping symlink": [exe("pkg/bin/tool", "x"),
                         Entry("pkg/escape", kind="symlink", target="../../outside")],
    "absolute symlink": [Entry("pkg/etc", kind="symlink", target="/etc")],
    "device": [Entry("pkg/dev", kind="device")],
    # Each link's text stays inside; followed, `esc` is the folder above the target.
    "chained symlinks": [Entry("pkg", kind="dir", mode=0o755),
                         Entry("pkg/self", kind="symlink", target="."),
                         Entry("pkg/esc", kind="symlink", target="self/../.."),
                         Entry("pkg/esc/evil", b"boom")],
}


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("kind", ["tar.gz", "tar.xz"])
def test_tar_extracts_with_in_tree_links(tmp_path, kind):
    src = write(tmp_path, "a." + kind, make_tar(GOOD, kind.split(".")[1]))
    archive.extract(src, tmp_path / "out", kind, max_unpacked=1 << 20)
    root = archive.single_root(tmp_path / "out")
    assert root.name == "pkg"
    assert os.access(root / "bin/tool", os.X_OK)
    assert (root / "lib/libx.so").resolve() == (root / "lib/libx.so.1").resolve()


def test_zip_keeps_exec_bits(tmp_path):
    src = write(tmp_path, "a.zip", make_zip([exe("pkg/bin/tool", "tool 1.0"),
                                             Entry("pkg/readme", b"hi")]))
    archive.extract(src, tmp_path / "out", "zip", max_unpacked=1 << 20)
    assert os.access(tmp_path / "out/pkg/bin/tool", os.X_OK)
    assert not os.access(tmp_path / "out/pkg/readme", os.X_OK)


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("kind", ["tar.gz", "zip"])
def test_unsafe_members_are_refused_before_anything_is_written(tmp_path, case, kind):
    entries = BAD[case]
    if kind == "zip" and case == "absolute":
        entries = [Entry("/tmp/aitk-evil", b"boom")]
    data = make_tar(entries, "gz") if kind == "tar.gz" else make_zip(entries)
    src = write(tmp_path, "bad." + kind, data)
    out = tmp_path / "stage" / "out"
    with pytest.raises(archive.UnsafeArchive):
        archive.extract(src, out, kind, max_unpacked=1 << 20)
    assert tree(out) == {}
    assert not (tmp_path / "evil").exists() and not os.path.exists("/tmp/aitk-evil")


def test_unpacked_size_ceiling(tmp_path):
    src = write(tmp_path, "big.tar.gz", make_tar([Entry("pkg/zeros", bytes(100_000))], "gz"))
    with pytest.raises(archive.UnsafeArchive, match="unpacks to more"):
        archive.extract(src, tmp_path / "out", "tar.gz", max_unpacked=50_000)


@pytest.mark.parametrize("kind", ["tar.gz", "tar.xz", "zip"])
def test_a_corrupt_archive_is_one_clear_error(tmp_path, kind):
    good = make_zip(GOOD[:2]) if kind == "zip" else make_tar(GOOD[:2], kind.split(".")[1])
    src = write(tmp_path, "cut." + kind, good[: len(good) // 2])
    with pytest.raises(archive.UnsafeArchive, match="is not a valid"):
        archive.extract(src, tmp_path / "out", kind, max_unpacked=1 << 20)


@pytest.mark.parametrize(("name", "bad"), [
    ("a/b", False), ("a/../b", True), ("../a", True), ("/a", True), ("C:/a", True),
    ("a\\..\\b", True), ("", True),
])
def test_unsafe_name(name, bad):
    assert (archive.unsafe_name(name) is not None) is bad


@pytest.mark.parametrize(("name", "target", "bad"), [
    ("a/b", "c", False), ("a/b", "../c", False), ("a/b", "../../c", True),
    ("a/b", "/etc", True), ("a", "./x/../../y", True),
])
def test_unsafe_link(name, target, bad):
    assert (archive.unsafe_link(name, target) is not None) is bad


def test_publish_replaces_old_copy_only_after_the_new_one_is_in(tmp_path):
    target = tmp_path / ".tool"
    target.mkdir()
    (target / "old").write_text("old")
    staged = archive.staging_root(tmp_path) / "x"
    staged.mkdir(parents=True)
    (staged / "new").write_text("new")
    archive.publish(staged, target)
    assert tree(target) == {"new": tree(target)["new"]}
    assert list(archive.staging_root(tmp_path).iterdir()) == []


def test_failed_publish_puts_the_old_copy_back(tmp_path):
    target = tmp_path / ".tool"
    target.mkdir()
    (target / "old").write_text("old")
    before = tree(target)
    with pytest.raises(OSError):
        archive.publish(tmp_path / "does-not-exist", target)
    assert tree(target) == before


def test_recover_after_a_crash_between_the_renames(tmp_path):
    target = tmp_path / ".tool"
    aside = archive.staging_root(tmp_path) / ".tool.old-abc"
    aside.mkdir(parents=True)
    (aside / "old").write_text("old")
    archive.recover(target)
    assert (target / "old").read_text() == "old"


def test_marker_roundtrip_and_matching(tmp_path):
    m = archive.Marker("node", "22.12.0", "node.tar.xz", "http://x/node.tar.xz", "ab" * 32, True)
    archive.write_marker(tmp_path, m)
    read = archive.read_marker(tmp_path)
    assert read == m
    assert archive.marker_matches(read, "node", "22.12.0", "node.tar.xz", None)
    assert archive.marker_matches(read, "node", "22.12.0", "node.tar.xz", "AB" * 32)
    assert not archive.marker_matches(read, "node", "20.0.0", "node.tar.xz", None)
    assert not archive.marker_matches(read, "node", "22.12.0", "node.tar.xz", "cd" * 32)
    assert not archive.marker_matches(None, "node", "22.12.0", "node.tar.xz", None)
    (tmp_path / archive.MARKER_NAME).write_text("{not json")
    assert archive.read_marker(tmp_path) is None


@pytest.mark.parametrize("members, bad", [
    ([("node/bin/npm", "../lib/npm/cli.js"), ("node/lib/npm/cli.js", None)], None),
    ([("pkg/self", "."), ("pkg/up", "self/..")], None),  # the archive root: still inside
    ([("pkg/self", "."), ("pkg/esc", "self/../.."), ("pkg/esc/evil", None)], "pkg/esc"),
    ([("a", "b"), ("b", "a"), ("a/x", None)], "a"),  # a loop is refused, not followed
])
def test_link_escape_follows_chains(members, bad):
    assert archive.link_escape(members) == bad
