"""External programs some tests drive for real (shellcheck, desktop-file-validate, ...).

A test that needs one calls `require_tool`: when the program is absent it skips with the
reason and the package that provides it, instead of failing on a machine that lacks it.
CI (.ci/run) installs them, so there they run.
"""

from __future__ import annotations

import shutil

import pytest

# program -> the Debian package that provides it (what .ci/run installs)
PROVIDERS = {
    "shellcheck": "shellcheck",
    "desktop-file-validate": "desktop-file-utils",
    "chromium": "chromium",
}


def skip_reason(name: str) -> str:
    package = PROVIDERS.get(name, name)
    return f"{name} is not installed (apt-get install -y {package}; .ci/run installs it)"


def require_tool(name: str) -> str:
    """The program's path, or skip the calling test saying what is missing."""
    found = shutil.which(name)
    if not found:
        pytest.skip(skip_reason(name))
    return found
