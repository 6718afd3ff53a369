"""The exit-code table in docs/manager.md is the contract; errors.py must agree with it."""

from __future__ import annotations

import re
from pathlib import Path

from manager import errors

README = Path(__file__).resolve().parents[2] / "docs" / "manager.md"


def readme_codes() -> dict[int, str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    return {int(m[1]): m[2] for m in re.finditer(r"^\| (\d+) \| (.+?) \|$", section, re.M)}


def error_classes() -> list[type[errors.ManagerError]]:
    found = [errors.ManagerError]
    for value in vars(errors).values():
        if isinstance(value, type) and issubclass(value, errors.ManagerError):
            found.append(value)
    return found


def test_every_error_exit_code_is_documented() -> None:
    documented = readme_codes()
    for cls in error_classes():
        assert cls.exit_code in documented, f"{cls.__name__} exits {cls.exit_code}, not in README"


def test_answer_codes_are_documented() -> None:
    documented = readme_codes()
    for code in (errors.EXIT_OK, errors.EXIT_UPDATE_AVAILABLE, errors.EXIT_SYNC_DUE,
                 errors.EXIT_INTERRUPTED):
        assert code in documented


def test_error_codes_are_distinct() -> None:
    codes = [cls.exit_code for cls in error_classes() if cls is not errors.ManagerError]
    assert len(codes) == len(set(codes))
