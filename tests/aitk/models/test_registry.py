from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from aitk.cli.models import main as models_main
from aitk.models.example.model import ExampleModel
from aitk.models.registry import REPO_ROOT, UnknownArchError, discover, get_model_class

GOOD_MODEL = '''
from aitk.models.base import BaseModel


class TinyModel(BaseModel):
    arch = "{arch}"
'''


def write_extension(root: Path, name: str, init: str, files: dict[str, str] | None = None
                    ) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text(textwrap.dedent(init))
    for rel, text in (files or {}).items():
        (folder / rel).write_text(textwrap.dedent(text))
    return folder


@pytest.fixture
def ext_root(tmp_path: Path) -> Path:
    root = tmp_path / "extensions"
    # A working extension that uses a relative import, as real ones do.
    write_extension(root, "good_ext", """
        from .tiny import TinyModel

        AI_TOOLKIT_MODELS = [TinyModel]
        """, {"tiny.py": GOOD_MODEL.format(arch="tiny")})
    write_extension(root, "broken_ext", """
        import this_package_does_not_exist_anywhere
        AI_TOOLKIT_MODELS = []
        """)
    write_extension(root, "dup_ext", """
        from aitk.models.base import BaseModel

        class Imposter(BaseModel):
            arch = "example"

        AI_TOOLKIT_MODELS = [Imposter, "not a class"]
        """)
    (root / "not_a_package").mkdir()  # no __init__.py: ignored
    return root


def test_builtin_example_is_registered() -> None:
    assert get_model_class("example") is ExampleModel


def test_unknown_arch_lists_known_archs() -> None:
    with pytest.raises(UnknownArchError) as info:
        get_model_class("flux_dev_typo")
    message = str(info.value)
    assert "'flux_dev_typo'" in message and "example" in message
    assert "example" in info.value.known


def test_extensions_are_discovered_and_failures_isolated(ext_root: Path) -> None:
    registry = discover([ext_root], include_repo_extensions=False)
    # every built-in arch (read without importing) plus the good extension's
    from aitk.models import catalog

    assert set(registry.models) == catalog.builtin_archs() | {"tiny"}
    assert registry.get("example") is ExampleModel  # the built-in wins the duplicate
    assert "good_ext" in registry.models["tiny"].source
    assert registry.get("tiny").__name__ == "TinyModel"

    [broken] = registry.broken
    assert broken.name == "broken_ext"
    assert "ModuleNotFoundError" in broken.error
    assert "this_package_does_not_exist_anywhere" in broken.error
    warnings = "\n".join(registry.warnings)
    assert "arch 'example' (Imposter) is already registered by built-in" in warnings
    assert "'not a class' is not a BaseModel subclass" in warnings


def test_get_model_class_reports_problems(ext_root: Path) -> None:
    lines: list[str] = []
    assert get_model_class("tiny", [ext_root], report=lines.append).arch == "tiny"
    assert any(line.startswith("extension broken_ext failed to import") for line in lines)
    assert any("already registered" in line for line in lines)


def test_unknown_arch_mentions_broken_extensions(ext_root: Path) -> None:
    registry = discover([ext_root], include_repo_extensions=False)
    with pytest.raises(UnknownArchError, match="broken_ext .*ModuleNotFoundError"):
        registry.get("maybe_in_the_broken_one")


def test_cli_models_json(ext_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert models_main(["--json", "--extensions-dir", str(ext_root)]) == 0
    data = json.loads(capsys.readouterr().out)
    archs = {m["arch"]: m for m in data["models"]}
    assert archs["example"]["source"] == "built-in"
    assert archs["example"]["class"] == "aitk.models.example.model.ExampleModel"
    assert "good_ext" in archs["tiny"]["source"]
    assert [b["name"] for b in data["broken_extensions"]] == ["broken_ext"]


def test_cli_models_table_reports_broken(ext_root: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert models_main(["--extensions-dir", str(ext_root)]) == 0
    out, err = capsys.readouterr()
    assert "example" in out and "tiny" in out
    [line] = [x for x in err.splitlines() if "broken_ext" in x]  # one line, never folded
    assert line.startswith("broken extension broken_ext (")
    assert line.endswith("this_package_does_not_exist_anywhere'")


def test_cli_models_bad_flag_exits_2() -> None:
    assert models_main(["--no-such-flag"]) == 2


def test_python_m_aitk_models_lists_example() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-m", "aitk", "models", "--json"], cwd=REPO_ROOT,
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    [example] = [m for m in data["models"] if m["arch"] == "example"]
    assert (example["class"], example["source"]) == (
        "aitk.models.example.model.ExampleModel", "built-in")
    assert example["size_multiple"] == 8 and example["summary"]  # its description


def test_builtin_descriptions_name_real_classes() -> None:
    """Each description's "module:Class" is a BaseModel of that arch; an alias is an
    entry for the same class, its source saying whose alias it is."""
    from aitk.models import catalog
    from aitk.models.base import BaseModel

    models = discover(include_repo_extensions=False).models
    for desc in catalog.descriptions():
        entry = models[desc.name]
        assert issubclass(entry.cls, BaseModel) and entry.cls.arch == desc.name
        assert entry.class_path == desc.model_class.replace(":", ".")
        assert entry.description is desc and entry.cls.describe() is desc
        for alias in desc.aliases:
            assert models[alias].cls is entry.cls
            assert models[alias].source == f"built-in alias of {desc.name}"
