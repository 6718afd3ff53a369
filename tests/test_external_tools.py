"""A test that needs an absent external program skips with its reason (issue 14)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.external_tools import PROVIDERS, require_tool, skip_reason

REPO = Path(__file__).resolve().parent.parent


def test_require_tool_skips_with_the_package_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y desktop-file-utils"):
        require_tool("desktop-file-validate")


def test_require_tool_returns_the_program(monkeypatch, tmp_path):
    program = tmp_path / "shellcheck"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert require_tool("shellcheck") == str(program)


def path_without(names: set[str], farm: Path) -> str:
    """A PATH holding every program of ours except `names` (links in one folder)."""
    farm.mkdir()
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        try:
            entries = list(Path(folder).iterdir())
        except OSError:
            continue
        for entry in entries:
            link = farm / entry.name
            if entry.name not in names and not link.exists() and os.access(entry, os.X_OK):
                link.symlink_to(entry)
    return str(farm)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the tests run on Linux")
def test_tests_needing_absent_tools_skip_instead_of_failing(tmp_path):
    env = {**os.environ, "PATH": path_without(set(PROVIDERS), tmp_path / "bin")}
    selected = ["tests/manager/health/test_install_sh.py::test_shellcheck_clean",
                "tests/manager/health/test_install_sh.py"
                "::test_rendered_command_file_is_shellcheck_clean",
                "tests/manager/health/test_shortcut.py::test_desktop_file_validates"]
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p",
                           "no:cacheprovider", *selected], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "5 skipped" in done.stdout, done.stdout
    for name in ("shellcheck", "desktop-file-validate"):
        assert skip_reason(name) in done.stdout
