"""Fixtures for doctor, launch, shortcut and install.sh: a temporary checkout (AITK_ROOT)
with a real venv holding stand-in torch packages, a state file and a git repository, and
healthy stand-ins for the contracts other parts of the manager fill in."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

import pytest

from manager import migrations
from manager.paths import Paths
from tests.manager.conftest import ManagerCli

REPO = Path(__file__).resolve().parents[3]
STACK = {"torch": "2.13.0+cpu", "torchvision": "0.28.0+cpu", "torchaudio": "2.11.0+cpu"}
HOSTILE = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_DEFAULT_ENV",
           "AITK_BOOTSTRAP_DROPPED")


def base_python() -> str:
    """The interpreter the test venv was made from (a venv's python cannot nest cleanly)."""
    return getattr(sys, "_base_executable", None) or sys.executable


@pytest.fixture(scope="session")
def venv_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real venv (no pip: fast) reused by copying; stand-ins are added per test."""
    venv = tmp_path_factory.mktemp("template") / ".venv"
    subprocess.run([base_python(), "-m", "venv", "--without-pip", str(venv)], check=True)
    return venv


def site_packages(venv: Path) -> Path:
    version = sysconfig.get_python_version()
    return venv / "lib" / f"python{version}" / "site-packages"


def write_package(venv: Path, name: str, body: str) -> None:
    package = site_packages(venv) / name
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(body, encoding="utf-8")


class Checkout:
    """The temporary checkout a test runs against."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def venv(self) -> Path:
        return Paths(self.root).venv

    @property
    def python(self) -> Path:
        return Paths(self.root).venv_python

    def package(self, name: str, body: str) -> None:
        write_package(self.venv, name, body)

    def stack(self, **versions: str) -> None:
        for name, version in {**STACK, **versions}.items():
            self.package(name, f"__version__ = {version!r}\n")

    def state(self, **fields: object) -> None:
        # A healthy install has applied every migration this code ships.
        applied = [m.id for m in migrations.available()]
        data = {"version": 1, "cpu_requested": True, "backend": "cpu",
                "migrations": applied, **fields}
        (self.venv / "aitk_manager_state.json").write_text(json.dumps(data), encoding="utf-8")

    def git(self, *args: str) -> str:
        done = subprocess.run(["git", *args], cwd=self.root, check=True, capture_output=True,
                              text=True)
        return done.stdout


def make_checkout(root: Path, template: Path) -> Checkout:
    root.mkdir(parents=True)
    checkout = Checkout(root)
    shutil.copytree(template, checkout.venv, symlinks=True)
    checkout.stack()
    checkout.state()
    (root / "run.py").write_text("print('stand-in trainer')\n", encoding="utf-8")
    (root / ".gitignore").write_text("/.venv/\n/logs/\n", encoding="utf-8")
    checkout.git("init", "-q", "-b", "main")
    checkout.git("-c", "user.name=t", "-c", "user.email=t@example.invalid", "add", "-A")
    checkout.git("-c", "user.name=t", "-c", "user.email=t@example.invalid",
                 "commit", "-qm", "initial")
    return checkout


@pytest.fixture
def checkout(tmp_path: Path, venv_template: Path, monkeypatch: pytest.MonkeyPatch) -> Checkout:
    made = make_checkout(tmp_path / "aitk", venv_template)
    monkeypatch.setenv("AITK_ROOT", str(made.root))
    for name in HOSTILE:
        monkeypatch.delenv(name, raising=False)
    return made


@pytest.fixture
def healthy(checkout: Checkout, monkeypatch: pytest.MonkeyPatch) -> Checkout:
    """Stand-ins for the contracts of the other parts, all reporting a healthy CPU box."""
    import spec as spec_module
    from manager import detect, envstatus, repo, tools
    from manager.health import checkout as checkout_health

    def make_spec(detection: dict, *, cpu: bool = False) -> spec_module.Spec:
        wheel = spec_module.Wheel
        return spec_module.Spec(
            backend="cpu", flavour="cpu", torch_index_url=None,
            torch=wheel("torch", "2.13.0", "cpu", True, "torch"),
            companions=(wheel("torchvision", "0.28.0", "cpu", False, "torchvision"),
                        wheel("torchaudio", "2.11.0", "cpu", False, "torchaudio")),
            requirements_file="requirements.txt")

    tools_report = [{"tool": n, "used": "local", "version": "1.0", "path": f"/x/{n}",
                     "minimum": "1.0", "ok": True} for n in ("uv", "node", "ffmpeg", "git")]
    monkeypatch.setattr(detect, "probe", lambda: detect.Detection("linux", "x86_64", "3.11"))
    monkeypatch.setattr(spec_module, "make_spec", make_spec)
    monkeypatch.setattr(envstatus, "quick_status", lambda paths, cpu=None:
                        envstatus.SyncStatus(True))
    monkeypatch.setattr(tools, "report_tools", lambda paths: tools_report)
    monkeypatch.setattr(checkout_health, "free_bytes", lambda path: 500 * 1024**3)
    from manager import ui_build
    from manager.health import webui

    monkeypatch.setattr(ui_build, "state_line", lambda facts: (True, "built, up to date"))
    monkeypatch.setattr(webui, "port_free", lambda host, port: True)
    if not _repo_status_implemented():
        monkeypatch.setattr(repo, "status", git_status_stand_in)
    return checkout


def _repo_status_implemented() -> bool:
    from manager import repo

    try:
        repo.status(REPO)
    except NotImplementedError:
        return False
    except Exception:  # noqa: BLE001 - implemented; this checkout's state does not matter
        return True
    return True


def git_status_stand_in(root: Path, fetch: bool = False, timeout: float = 20.0):
    """Until manager.repo.status exists (issue 6): the same answers from git itself."""
    from manager.repo import RepoStatus

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              timeout=timeout).stdout.rstrip("\n")

    branch = git("symbolic-ref", "--short", "-q", "HEAD") or None
    dirty = tuple(line[3:] for line in git("status", "--porcelain", "-uno").splitlines())
    return RepoStatus(branch=branch, commit=git("rev-parse", "HEAD") or None, upstream=None,
                      dirty_files=dirty)


@pytest.fixture
def run_cli(manager_cli: ManagerCli) -> Callable[..., tuple[int, str, str]]:
    """Run `python3 -m manager ARGS` in this process: (exit code, stdout, stderr)."""
    def run(*args: str) -> tuple[int, str, str]:
        done = manager_cli(*args)
        return done.returncode, done.stdout, done.stderr

    return run


@pytest.fixture
def doctor_json(run_cli: Callable[..., tuple[int, str, str]]) -> Callable[[], tuple[int, dict]]:
    def run() -> tuple[int, dict[str, dict]]:
        code, out, _ = run_cli("doctor", "--json")
        document = json.loads(out)
        return code, {c["id"]: c for c in document["data"]["checks"]}

    return run
