"""The trainer's error tree (aitk/errors.py) is the one home of its exceptions and exit
codes, and the "Trainer exit codes" table in the docs (README.md or docs/*.md) is its
contract."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from aitk import errors

REPO = Path(__file__).resolve().parents[2]
AITK = REPO / "aitk"


def documented_codes() -> dict[int, str]:
    """The rows of the table under the "Trainer exit codes" heading, wherever the docs
    keep it."""
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = doc.read_text(encoding="utf-8") if doc.is_file() else ""
        heading = re.search(r"^(#+) Trainer exit codes\s*$", text, re.M)
        if heading is None:
            continue
        level = len(heading.group(1))
        rest = text[heading.end():]
        end = re.search(rf"^#{{1,{level}}} ", rest, re.M)
        section = rest[:end.start()] if end else rest
        return {int(m[1]): m[2] for m in re.finditer(r"^\| (\d+) \| (.+?) \|$", section, re.M)}
    raise AssertionError("no 'Trainer exit codes' heading in README.md or docs/*.md")


def tree() -> list[type[errors.TrainerError]]:
    return [v for v in vars(errors).values()
            if isinstance(v, type) and issubclass(v, errors.TrainerError)]


def test_every_error_exit_code_is_documented() -> None:
    documented = documented_codes()
    for cls in tree():
        assert cls.exit_code in documented, \
            f"{cls.__name__} exits {cls.exit_code}, not in the trainer exit-code table"


def test_every_documented_code_is_one_the_trainer_gives() -> None:
    given = {cls.exit_code for cls in tree()} | {
        errors.EXIT_OK, errors.EXIT_FAILED, errors.EXIT_INPUT, errors.EXIT_INTERRUPTED,
        errors.EXIT_FINDINGS}
    assert set(documented_codes()) == given


def test_the_tree_is_drawn_in_its_docstring() -> None:
    """Every class of the tree appears in the drawing, with its code on its branch."""
    drawing = errors.__doc__ or ""
    for cls in tree():
        assert re.search(rf"[─ ]{cls.__name__}\b", drawing), f"{cls.__name__} not drawn"
        line = re.search(rf"{cls.__name__}\s+exit (\d+)", drawing)
        if line:
            assert int(line.group(1)) == cls.exit_code, cls.__name__


def test_every_input_error_exits_2_and_every_bug_keeps_its_traceback() -> None:
    for cls in tree():
        if issubclass(cls, errors.InputError):
            assert cls.exit_code == errors.EXIT_INPUT and not cls.show_traceback
        if issubclass(cls, errors.ContractError):
            assert cls.show_traceback


def _exception_like(name: str) -> bool:
    return name in {"Exception", "BaseException"} or name.endswith(("Error", "Exception"))


def _base_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def test_aitk_defines_exceptions_only_in_its_error_tree() -> None:
    """Outside aitk/errors.py an exception class may only extend a class of the tree
    (aitk.models.registry's ModelRegistryError does): no second root, no stray base."""
    tree_names = {cls.__name__ for cls in tree()}
    stray = []
    for path in sorted(AITK.rglob("*.py")):
        if path == AITK / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [_base_name(b) for b in node.bases]
            if any(_exception_like(b) for b in bases):
                if not any(b in tree_names for b in bases):
                    stray.append(f"{path.relative_to(REPO)}: {node.name}({', '.join(bases)})")
                tree_names.add(node.name)  # a subclass of the tree extends it
    assert not stray, "exceptions outside aitk.errors' tree:\n" + "\n".join(stray)


def test_exit_codes_are_defined_only_in_the_error_tree() -> None:
    """No `exit_code = N` or `EXIT_... = N` anywhere else in aitk."""
    found = []
    for path in sorted(AITK.rglob("*.py")):
        if path == AITK / "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant | ast.Tuple):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                names += [e.id for t in node.targets if isinstance(t, ast.Tuple)
                          for e in t.elts if isinstance(e, ast.Name)]
                if any(n == "exit_code" or n.startswith("EXIT_") for n in names):
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, found


def test_a_trainer_error_is_its_message_then_its_hint() -> None:
    exc = errors.UsageError("out exists and is not empty", hint="pass --force to replace it")
    assert str(exc) == "out exists and is not empty; pass --force to replace it"
    assert exc.exit_code == 2


def test_a_bad_input_file_is_still_an_os_error_for_the_readers_that_skip_it() -> None:
    assert issubclass(errors.BadInputFile, OSError)
    assert str(errors.BadInputFile("not a regular file: x.png")) == "not a regular file: x.png"
