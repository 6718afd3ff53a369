"""The checkout guard (tests/checkout_guard.py): what counts as touching the checkout's
own folders, and a real pytest session in which a module that writes there fails."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.checkout_guard import changes, snapshot

REPO = Path(__file__).resolve().parents[1]


def test_created_changed_and_removed_files_and_folders_are_seen(tmp_path: Path):
    (tmp_path / "output" / "job").mkdir(parents=True)
    (tmp_path / "output" / "job" / "lora.safetensors").write_bytes(b"weights")
    (tmp_path / "datasets").mkdir()  # not watched
    before = snapshot(tmp_path)
    assert changes(before, snapshot(tmp_path)) == []

    (tmp_path / "output" / "job" / "lora.safetensors").write_bytes(b"other weights")
    (tmp_path / "cache").mkdir()
    (tmp_path / "logs").write_text("a file where a folder goes")
    (tmp_path / ".aitk-ui").mkdir()
    (tmp_path / ".aitk-ui" / "link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "datasets" / "new.png").write_bytes(b"png")
    assert changes(before, snapshot(tmp_path)) == [
        "created .aitk-ui", "created .aitk-ui/link", "created cache", "created logs",
        "changed output/job/lora.safetensors"]

    after = snapshot(tmp_path)
    (tmp_path / "output" / "job" / "lora.safetensors").unlink()
    assert changes(after, snapshot(tmp_path)) == ["removed output/job/lora.safetensors"]


TESTS = {
    "test_writes.py": """
from pathlib import Path

def test_reads_only():
    pass

def test_writes_the_checkouts_output():
    Path("output").mkdir()
    Path("output", "result.txt").write_text("mine")
""",
    "test_clean.py": """
def test_uses_tmp_path(tmp_path):
    (tmp_path / "output").mkdir()
""",
}


def test_a_module_that_writes_into_the_checkouts_output_fails(tmp_path: Path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # this folder is the checkout
    for name, text in TESTS.items():
        (tmp_path / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.checkout_guard",
                           "-p", "no:cacheprovider", "-rA", "test_clean.py", "test_writes.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "3 passed, 1 error" in out, out
    assert "ERROR test_writes.py::test_writes_the_checkouts_output" in out
    assert "test_writes.py touched the checkout's own output, cache, .aitk-ui, logs" in out
    assert "created output\n  created output/result.txt" in out
    assert "test_clean.py" not in out.split("short test summary info")[1].replace(
        "PASSED test_clean.py::test_uses_tmp_path", "")
