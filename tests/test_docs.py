"""README.md and docs/*.md are promises. Every command they show is a real command with
real flags, every repository file and link they name exists, every test they cite as
holding a promise exists, and the README fits a screen or two.

The commands are read from the pages themselves (shell blocks and inline code), so a
page cannot gain a command this file does not check.
"""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from manager.cli import app

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 200

# Command prefixes -> the program that answers them.
MANAGER = ("python3 -m manager", "python -m manager")
TRAINER_RUN = ("python run.py", ".venv/bin/python run.py")
TRAINER_MODULE = ("python -m aitk", ".venv/bin/python -m aitk")
# Repository paths a page may name; anything else (config/my_lora.yaml, datasets/mine)
# is the reader's own file.
REPO_PATH = re.compile(r"(?<![\w/.-])((?:config/examples|bench|tests|aitk|aitk_common|"
                       r"aitk_server|manager|docs|\.ci|launchers|datasets/example\w*)"
                       r"(?:/[\w.-]+)*/?)")


def page_id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def read(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def shell_lines(text: str) -> list[str]:
    """Each command of the ```sh blocks (comments dropped, `a && b` split) and each inline
    code span that starts like a command."""
    found = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        # An indented line (or one after a trailing backslash) continues the command.
        block = re.sub(r"\\?\n[ \t]+(?=\S)", " ", block)
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                found.extend(part.strip() for part in line.split("&&"))
    prefixes = MANAGER + TRAINER_RUN + TRAINER_MODULE + ("./install.sh",)
    for span in re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S)):
        if span.startswith(prefixes):
            found.append(span.strip())
    return found


def flags(words: list[str]) -> set[str]:
    return {m for w in words for m in re.findall(r"(?<![\w-])--[a-z][\w-]*", w)}


@functools.cache
def manager_verbs() -> dict[str, set[str]]:
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    return {name: {o for p in cmd.params for o in getattr(p, "opts", ())
                   if o.startswith("--")} | {"--help"}
            for name, cmd in commands.items()}


@functools.cache
def help_flags(*argv: str) -> set[str]:
    done = subprocess.run([sys.executable, *argv, "--help"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(argv)} --help: {done.stderr}"
    return flags(done.stdout.split()) | {"--help"}


def check_command(command: str) -> list[str]:
    """Problems with one documented command ([] when it is real)."""
    try:
        words = shlex.split(command.replace("[", " ").replace("]", " ").replace("|", " "))
    except ValueError:
        return [f"cannot parse {command!r}"]
    text = " ".join(words)
    if text.startswith(MANAGER):
        rest = words[3:]
        verbs = manager_verbs()
        if not rest or rest[0].startswith("-"):
            return [] if flags(rest) <= {"--help", "--version"} else [f"{command}: flags"]
        verb = rest[0]
        if not re.fullmatch(r"[a-z][a-z-]*", verb):  # `python3 -m manager ...`, `COMMAND`
            return []
        if verb not in verbs:
            return [f"{command}: no manager verb {verb!r}"]
        if verb == "test":  # the rest goes to pytest
            return [] if flags(rest[1:2]) <= verbs[verb] or not rest[1:] else []
        allowed = verbs[verb] | (help_flags("run.py") if verb == "launch" else set())
        unknown = flags(rest[1:]) - allowed
        return [f"{command}: {verb} has no {', '.join(sorted(unknown))}"] if unknown else []
    if text.startswith(TRAINER_RUN):
        unknown = flags(words) - help_flags("run.py")
        return [f"{command}: run.py has no {', '.join(sorted(unknown))}"] if unknown else []
    if text.startswith(TRAINER_MODULE):
        module = words[words.index("-m") + 1]
        if module != "aitk":  # python -m aitk.models.prx_pixel.peft_adapter ...
            path = ROOT / module.replace(".", "/")
            exists = path.with_suffix(".py").is_file() or (path / "__main__.py").is_file()
            return [] if exists else [f"{command}: no module {module}"]
        rest = words[words.index("aitk") + 1:]
        sub = [w for w in rest[:2] if re.fullmatch(r"[a-z][a-z-]*", w)]
        if not sub:
            return [f"{command}: no subcommand"]
        if sub[0] == "run":
            allowed = help_flags("run.py")
        else:
            allowed = help_flags("-m", "aitk", *sub[:2] if sub[0] == "audit" else sub[:1])
        unknown = flags(rest) - allowed
        return [f"{command}: has no {', '.join(sorted(unknown))}"] if unknown else []
    if text.startswith("./install.sh"):
        unknown = flags(words) - manager_verbs()["install"]
        return [f"{command}: install has no {', '.join(sorted(unknown))}"] if unknown else []
    return []


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_command_is_real(page):
    problems = [p for c in shell_lines(read(page)) for p in check_command(c)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_repository_path_exists(page):
    text = read(page)
    # A path that runs into a placeholder (`test_<arch>.py`, `*_tiny_cpu.yaml`) is a pattern.
    named = {m.group(1) for m in REPO_PATH.finditer(text)
             if text[m.end():m.end() + 1] not in ("<", "*")}
    missing = sorted(m for m in named if not (ROOT / m.rstrip("/.")).exists())
    assert not missing, f"{page_id(page)} names files that do not exist: {missing}"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(h) for h in re.findall(r"^#+ (.+)$", read(page), re.M)}


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_link_leads_somewhere(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", read(page)):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(target)
    assert not broken, f"{page_id(page)}: {broken}"


@functools.cache
def known_tests() -> set[str]:
    names = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        names |= set(re.findall(r"^\s*(?:async )?def (test_\w+)", path.read_text(), re.M))
    return names


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_cited_test_exists(page):
    cited = set(re.findall(r"(?<![\w/])(test_\w+)(?![\w/]*\.py)", read(page)))
    missing = sorted(cited - known_tests())
    assert not missing, f"{page_id(page)} cites tests that do not exist: {missing}"


def test_the_readme_fits_on_a_screen_or_two():
    lines = read(ROOT / "README.md").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines"


def test_the_readme_quick_start_is_two_commands_ending_with_the_test_command():
    block = re.search(r"## Quick start.*?```sh\n(.*?)```", read(ROOT / "README.md"), re.S)
    assert block is not None
    lines = [ln for ln in block.group(1).splitlines() if ln.strip()]
    assert len(lines) == 2 and lines[1].split(" #")[0].strip() == "python3 -m manager test"
    # .ci/run runs the same test command.
    assert "python3 -m manager test" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("command, problem", [
    ("python3 -m manager sync --nope", "sync has no --nope"),
    ("python3 -m manager frobnicate", "no manager verb"),
    (".venv/bin/python run.py x.yml --nope", "run.py has no --nope"),
])
def test_the_command_check_catches_a_wrong_command(command, problem):
    assert any(problem in p for p in check_command(command))


def test_the_upstream_keys_table_is_the_codes():
    """docs/upstream-keys.md's table is aitk.config.upstream_dropped's reasons, row for row
    (the code owns them; the page shows them)."""
    from aitk.config import upstream_dropped

    text = read(ROOT / "docs" / "upstream-keys.md")
    found = re.search(r"<!-- upstream-keys table:[^>]*-->\n(.*?)<!-- end of the "
                      r"upstream-keys table -->", text, re.S)
    assert found is not None, "docs/upstream-keys.md lost its table markers"
    expected = upstream_dropped.markdown_table()
    assert found.group(1) == expected, (
        "docs/upstream-keys.md disagrees with aitk/config/upstream_dropped.py; its table "
        f"should read:\n{expected}")


def test_the_readmes_web_ui_bundle_size_holds():
    """README: "under 50 KB of script (under 20 KB gzipped), three npm packages". The
    bundle is what `sync` builds (ui/dist/app.js), so this runs after an install."""
    import gzip
    import json

    text = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert "under 50 KB of script (under 20 KB gzipped), three npm packages" in text
    package = json.loads((ROOT / "ui" / "package.json").read_text(encoding="utf-8"))
    assert len(package["dependencies"]) + len(package["devDependencies"]) == 3
    bundle = ROOT / "ui" / "dist" / "app.js"
    if not bundle.is_file():
        pytest.skip("ui/dist/app.js is not built here (python3 -m manager sync builds it)")
    data = bundle.read_bytes()
    assert len(data) < 50_000 and len(gzip.compress(data)) < 20_000, len(data)
