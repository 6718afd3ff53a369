"""What the suite's refusing guards share (tests/spawn_guard.py, tests/network_guard.py):
the test being run, the refusals seen in it, and the two pytest hooks that report a
test as failed when something it did was refused, even if the code under test caught
the refusal. Each guard module calls `add_hooks(globals(), guard)`."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest


class Guard:
    """Holds the test being run and the refusals seen in it."""

    def __init__(self) -> None:
        self.item: pytest.Item | None = None
        self.refused: list[str] = []


def add_hooks(namespace: dict[str, Any], guard: Guard) -> None:
    """Define the guard's pytest hooks in its plugin module (pytest reads them there)."""

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None
                                ) -> Generator[None, object, object]:
        guard.item, guard.refused = item, []
        try:
            return (yield)
        finally:
            guard.item = None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if guard.refused and not report.failed:
            # The code under test swallowed the refusal: the test still fails, saying why.
            report.outcome = "failed"
            report.longrepr = "\n".join(dict.fromkeys(guard.refused))
        guard.refused = []
        return report

    namespace["pytest_runtest_protocol"] = pytest_runtest_protocol
    namespace["pytest_runtest_makereport"] = pytest_runtest_makereport
