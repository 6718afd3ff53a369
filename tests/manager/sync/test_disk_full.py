"""A full disk during the torch install names the disk, not the package index (issue 21).

uv's and pip's own words for ENOSPC, captured from real runs on a 30 MiB tmpfs (uv 0.13.9,
pip 24), read like a download or index problem ("Failed to download `torch`"); with the
PyTorch index unreachable the sync used to add that the configured indexes lack the build.
The end-to-end case runs the real sync with a stand-in uv that answers the torch install
with uv's captured output and hands every other call to the real uv.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from manager import disk
from tests.manager.sync.conftest import Checkout, find_uv, make_spec

UV_CACHE_FULL = """\
Using Python 3.11.7 environment at: {venv}
Resolved 1 package in 87ms
Downloading torch (38.1MiB)
error: Failed to download `torch==2.13.0+cpu`
  cause: Failed to extract archive: torch-2.13.0+cpu-py3-none-any.whl
  cause: I/O operation failed during extraction
  cause: failed to write to file `{cache}/.tmpbxjYDY/torch/lib/libtorch.so`: No space left on device (os error 28)
"""  # noqa: E501 - captured output, kept whole
UV_VENV_FULL = """\
error: Failed to install: torch-2.13.0+cpu-py3-none-any.whl (torch==2.13.0+cpu)
  cause: Failed to copy to `{venv}/lib/python3.11/site-packages/torch/lib/libtorch.so`
  cause: failed to copy file from {cache}/archive-v0/C64U/torch/lib/libtorch.so to {venv}/lib/python3.11/site-packages/torch/lib/.tmpDTznwW: No space left on device (os error 28)
"""  # noqa: E501 - captured output, kept whole
PIP_FULL = """\
Processing ./torch-2.13.0+cpu-py3-none-any.whl
Installing collected packages: torch
ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device
"""
CLOSED = "http://127.0.0.1:9/simple"  # nothing listens on the discard port


def test_enospc_is_recognised_in_each_installers_words() -> None:
    for text in (UV_CACHE_FULL, UV_VENV_FULL, PIP_FULL,
                 "OSError: [WinError 112] There is not enough space on the disk",
                 "error: failed to write: Disk quota exceeded (os error 122)"):
        assert disk.out_of_space(text)
    assert not disk.out_of_space("error: Failed to download `torch`: connection refused")


def test_the_folder_the_installer_names_is_the_one_reported(tmp_path: Path) -> None:
    cache, venv = tmp_path / "cache", tmp_path / "venv"
    cache.mkdir()
    venv.mkdir()
    text = UV_CACHE_FULL.format(venv=venv, cache=cache)
    where = disk.full_disk(text, {".venv": venv, "the uv cache": cache})
    assert where.folder == cache and where.role == "the uv cache"
    text = UV_VENV_FULL.format(venv=venv, cache=cache)
    assert disk.full_disk(text, {"the uv cache": cache, ".venv": venv}).role == ".venv"
    # pip names no file: the candidate with the least free space is the one.
    assert disk.full_disk(PIP_FULL, {".venv": venv}).folder == venv


def _stand_in_uv(folder: Path, real_uv: str, output: str) -> None:
    """uv, except that installing torch fails the way a full disk makes it fail."""
    folder.mkdir()
    reply = folder / "torch-install.txt"
    reply.write_text(output)
    (folder / "uv").write_text(f"""#!/bin/sh
case " $* " in
    *" pip install "*torch==2.13.0+cpu*) cat '{reply}' >&2; exit 2 ;;
esac
exec '{real_uv}' "$@"
""")
    (folder / "uv").chmod(0o755)


@pytest.mark.skipif(os.name == "nt", reason="the stand-in uv is a sh script")
@pytest.mark.parametrize("index", ["reachable", "unreachable"])
def test_a_full_disk_during_the_torch_install_names_the_disk(uv_checkout: Checkout,
                                                             tmp_dir: Path, index: str) -> None:
    checkout = uv_checkout
    changes = {"torch_index_url": CLOSED} if index == "unreachable" else {}
    checkout.write_spec(make_spec(checkout.world, companions=(), accelerators=(), **changes))
    cache = Path(checkout.env["UV_CACHE_DIR"])
    cache.mkdir(parents=True, exist_ok=True)
    _stand_in_uv(tmp_dir / "full-disk-uv", shutil.which("uv", path=checkout.env["PATH"])
                 or find_uv(), UV_CACHE_FULL.format(venv=checkout.venv, cache=cache))
    checkout.env["PATH"] = f"{tmp_dir / 'full-disk-uv'}{os.pathsep}{checkout.env['PATH']}"

    done = checkout.manager("sync", "--json")

    assert done.returncode == 1, done.stderr
    error = json.loads(done.stdout)["error"]
    assert error["message"].startswith("installing torch==2.13.0+cpu failed: "
                                       f"not enough disk space in {cache} (")
    assert "MiB free" in error["message"] and "the uv cache" in error["message"]
    assert "could not be reached" not in error["message"] + error["hint"]
    assert "index" not in error["message"]
    assert "free some space" in error["hint"] and "UV_CACHE_DIR" in error["hint"]
    assert f"not enough disk space in {cache}" in done.stderr  # people see it too
