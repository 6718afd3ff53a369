"""Hermetic rig for the sync engine: tiny wheels built here, a PEP 503 index on
127.0.0.1, a local git repository, and a temporary checkout (AITK_ROOT) in which the
real manager runs the real uv or pip.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from manager.paths import Paths
from spec import Optional_, Spec, Wheel
from tests.manager.manager_copy import copy_manager

REPO = Path(__file__).resolve().parents[3]
TORCH = "2.13.0+cpu"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that takes this rig's world (every checkout fixture does) runs the real
    manager and uv or pip against the loopback index: the slow tier (docs/testing.md)."""
    here = Path(__file__).parent
    for item in items:
        if "world" in getattr(item, "fixturenames", ()) and item.path.is_relative_to(here):
            item.add_marker(pytest.mark.slow)


# ---- wheels ----------------------------------------------------------------------------


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
    return "sha256=" + digest.decode()


def build_wheel(out: Path, name: str, version: str, files: dict[str, str] | None = None,
                requires: tuple[str, ...] = ()) -> Path:
    """A minimal pure-Python wheel: METADATA, WHEEL, RECORD written by hand."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = files or {f"{dist}/__init__.py": f"__version__ = {version!r}\n"}
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    contents = {**files, f"{info}/METADATA": meta,
                f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: aitk-tests\n"
                                 "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{dist}-{version}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(path, "w") as zf:
        for arc, text in contents.items():
            data = text.encode()
            zf.writestr(arc, data)
            record.append(f"{arc},{_record_hash(data)},{len(data)}")
        record.append(f"{info}/RECORD,,")
        zf.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


_LOG = ("import os as _os\n_p = _os.environ.get('AITK_TEST_IMPORT_LOG')\n"
        "if _p:\n    open(_p, 'a').write(__name__ + '\\n')\n")


def _needs_torch(module: str) -> str:
    # Mimics a companion built against another torch: it refuses to import.
    return (f"import torch\nif torch.__version__ != {TORCH!r}:\n"
            f"    raise ImportError('{module} needs torch {TORCH}, found ' + torch.__version__)\n")


def _project_page(folder: Path, wheels: list[Path], files_url: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    links = "".join(
        f'<a href="{files_url}/{w.name}#sha256={hashlib.sha256(w.read_bytes()).hexdigest()}">'
        f"{w.name}</a><br>\n" for w in wheels)
    (folder / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")


# ---- the index server ------------------------------------------------------------------


class _Handler(http.server.SimpleHTTPRequestHandler):
    slow: set[str] = set()  # file names delayed on their next request (to kill a sync)

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        name = self.path.rsplit("/", 1)[-1]
        if name in self.slow:
            self.slow.discard(name)
            time.sleep(20)
        try:
            super().do_GET()
        except (BrokenPipeError, ConnectionResetError):
            pass


@dataclasses.dataclass
class Index:
    root: Path
    url: str

    @property
    def pytorch(self) -> str:
        return f"{self.url}/pytorch/simple"

    @property
    def pypi(self) -> str:
        return f"{self.url}/pypi/simple"

    def add(self, tree: str, wheel: Path) -> None:
        files = self.root / "files"
        files.mkdir(exist_ok=True)
        shutil.copy2(wheel, files / wheel.name)
        project = wheel.name.split("-", 1)[0].replace("_", "-").lower()
        folder = self.root / tree / "simple" / project
        existing = [files / p.split('"')[0].split("#")[0].rsplit("/", 1)[-1]
                    for p in (folder / "index.html").read_text().split('href="')[1:]
                    ] if (folder / "index.html").exists() else []
        _project_page(folder, sorted({*existing, files / wheel.name}), f"{self.url}/files")


def _serve(root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_Handler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def make_git_repo(where: Path) -> tuple[Path, list[str]]:
    """A local git repository of `gitpkg` 0.1.0 with two commits that differ in VALUE;
    an in-tree build backend, so nothing is downloaded to build it."""
    repo = where / "gitpkg"
    (repo / "gitpkg").mkdir(parents=True)
    (repo / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n'
        '[project]\nname = "gitpkg"\nversion = "0.1.0"\n')
    (repo / "backend.py").write_text(_BACKEND)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    git = functools.partial(subprocess.run, cwd=repo, env=env, check=True, capture_output=True,
                            text=True)
    git(["git", "init", "-q", "-b", "main"])
    revs = []
    for value in (1, 2):
        (repo / "gitpkg" / "__init__.py").write_text(f"VALUE = {value}\n")
        git(["git", "add", "-A"])
        git(["git", "commit", "-q", "-m", f"value {value}"])
        revs.append(git(["git", "rev-parse", "HEAD"]).stdout.strip())
    return repo, revs


_BACKEND = '''
import base64, hashlib, os, zipfile
NAME, VERSION = "gitpkg", "0.1.0"
INFO = f"{NAME}-{VERSION}.dist-info"
META = f"Metadata-Version: 2.1\\nName: {NAME}\\nVersion: {VERSION}\\n"
WHEEL = "Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"

def get_requires_for_build_wheel(config_settings=None):
    return []

def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    os.makedirs(os.path.join(metadata_directory, INFO))
    for name, text in (("METADATA", META), ("WHEEL", WHEEL)):
        with open(os.path.join(metadata_directory, INFO, name), "w") as fh:
            fh.write(text)
    return INFO

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    with open(os.path.join(NAME, "__init__.py")) as fh:
        files = {f"{NAME}/__init__.py": fh.read(), f"{INFO}/METADATA": META,
                 f"{INFO}/WHEEL": WHEEL}
    fname = f"{NAME}-{VERSION}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(os.path.join(wheel_directory, fname), "w") as zf:
        for arc, text in files.items():
            data = text.encode()
            zf.writestr(arc, data)
            h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{arc},sha256={h},{len(data)}")
        zf.writestr(f"{INFO}/RECORD", "\\n".join(record + [f"{INFO}/RECORD,,"]) + "\\n")
    return fname
'''


@dataclasses.dataclass
class World:
    index: Index
    wheels: Path
    git_repo: Path
    git_revs: list[str]


@pytest.fixture(scope="session")
def scratch() -> Iterator[Path]:
    """Our own temporary tree: pytest's shared /tmp/pytest-of-<user> is rotated by any
    other pytest session on the machine, which would delete a venv under a running test."""
    folder = Path(tempfile.mkdtemp(prefix="aitk-sync-tests-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def tmp_dir(scratch: Path, request: pytest.FixtureRequest) -> Path:
    return Path(tempfile.mkdtemp(prefix=request.node.name[:40] + "-", dir=scratch))


@pytest.fixture(scope="session")
def world(scratch: Path) -> Iterator[World]:
    base = scratch / "world"
    base.mkdir()
    root = base / "www"
    root.mkdir()
    server, url = _serve(root)
    index = Index(root, url)
    wh = base / "wheels"
    stack = {
        "torch": build_wheel(wh, "torch", TORCH, {
            "torch/__init__.py": _LOG + f"__version__ = {TORCH!r}\n"}),
        "torchvision": build_wheel(wh, "torchvision", "0.28.0+cpu", {
            "torchvision/__init__.py": _LOG + _needs_torch("torchvision")
            + "__version__ = '0.28.0+cpu'\n"}, requires=(f"torch=={TORCH}",)),
        # A companion that installs but can never import (built for another torch).
        "torchaudio": build_wheel(wh, "torchaudio", "2.11.0+bad", {
            "torchaudio/__init__.py": "raise ImportError('undefined symbol: _ZN3c10')\n"}),
    }
    for wheel in stack.values():
        index.add("pytorch", wheel)
    pypi = [
        build_wheel(wh, "torch", "2.14.0", {"torch/__init__.py": "__version__ = '2.14.0'\n"}),
        # The same version without the local tag (PyPI's CUDA build): a fallback that
        # asked for 2.13.0 instead of exactly 2.13.0+cpu would take it.
        build_wheel(wh, "torch", "2.13.0", {"torch/__init__.py": "__version__ = '2.13.0'\n"}),
        build_wheel(wh, "demo-req", "1.0", requires=("torch",)),
        build_wheel(wh, "demo-extra", "1.0"),
        build_wheel(wh, "needs-newer-torch", "1.0", requires=("torch>=2.14",)),
        build_wheel(wh, "accel-good", "1.0", requires=(f"torch=={TORCH}",)),
        build_wheel(wh, "accel-broken-dep", "1.0"),
        build_wheel(wh, "accel-broken", "1.0", {
            # A multi-line message, as torchcodec's: one line in the state, all on stderr.
            "accel_broken/__init__.py": "raise ImportError('no kernel image for this GPU\\n"
                                        "  rebuild it for sm_120')\n"},
            requires=("accel-broken-dep",)),
        build_wheel(wh, "accel-uninstallable", "1.0", requires=("does-not-exist-anywhere",)),
        build_wheel(wh, "slowpkg", "1.0"),
        # A stand-in test runner for `manager test`: exits with the code given last.
        build_wheel(wh, "pytest", "0.0.1", {
            "pytest/__init__.py": "",
            "pytest/__main__.py": "import sys\nprint('stand-in pytest', sys.argv[1:])\n"
                                  "sys.exit(int(sys.argv[-1]) if sys.argv[1:] else 0)\n"}),
        # Loads a shared library at import, as torchcodec loads FFmpeg's.
        build_wheel(wh, "accel-needs-lib", "1.0", {
            "accel_needs_lib/__init__.py": "import ctypes\nctypes.CDLL('libaitkprobe.so')\n"}),
        build_wheel(wh, "demo-dep", "1.0"),
        build_wheel(wh, "demo-dep", "2.0"),
        # Upgrades a trainer dependency, then fails to import: the rollback must undo both.
        build_wheel(wh, "accel-bumps", "1.0", {
            "accel_bumps/__init__.py": "raise ImportError('no kernel image for this GPU')\n"},
            requires=("demo-dep>=2",)),
    ]
    for wheel in pypi:
        index.add("pypi", wheel)
    repo, revs = make_git_repo(base)
    yield World(index, wh, repo, revs)
    server.shutdown()


def make_spec(world: World, **changes: object) -> Spec:
    spec = Spec(
        backend="cpu", flavour="cpu", torch_index_url=world.index.pytorch,
        torch=Wheel("torch", "2.13.0", "cpu", True, "torch"),
        companions=(Wheel("torchvision", "0.28.0", "cpu", False, "torchvision"),
                    Wheel("torchaudio", "2.11.0", "bad", False, "torchaudio")),
        requirements_file="requirements.txt",
        accelerators=(
            Optional_("accel-good", "accel-good==1.0", "accel_good"),
            Optional_("accel-broken", "accel-broken==1.0", "accel_broken"),
            Optional_("accel-uninstallable", "accel-uninstallable==1.0", "accel_uninstallable"),
            Optional_("accel-nowheel", "accel-nowheel==1.0", "accel_nowheel",
                      available=False, reason="no wheel for CPU builds"),
        ),
        python=">=3.10",
    )
    return dataclasses.replace(spec, **changes)


# ---- the checkout ----------------------------------------------------------------------


@dataclasses.dataclass
class Checkout:
    root: Path
    env: dict[str, str]
    world: World

    @property
    def venv(self) -> Path:
        return Paths(self.root).venv

    @property
    def python(self) -> Path:
        return Paths(self.root).venv_python

    @property
    def state_file(self) -> Path:
        return self.venv / "aitk_manager_state.json"

    def state(self) -> dict:
        return json.loads(self.state_file.read_text())

    def write_spec(self, spec: Spec) -> None:
        (self.root / "spec.json").write_text(json.dumps(dataclasses.asdict(spec)))

    def requirements(self, *lines: str) -> None:
        (self.root / "requirements.txt").write_text("\n".join(lines) + "\n")

    def manager(self, *args: str, timeout: float = 240, **popen: object
                ) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "manager", *args], cwd=self.root,
                              env=self.env, capture_output=True, text=True, timeout=timeout)

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen([sys.executable, "-m", "manager", *args], cwd=self.root,
                                env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True, preexec_fn=_default_sigint)

    def installed(self) -> dict[str, str]:
        sp = next((self.venv / "lib").glob("python3*/site-packages"))
        out = {}
        for info in sp.glob("*.dist-info"):
            name, version = info.name[: -len(".dist-info")].split("-", 1)
            out[name.lower().replace("_", "-")] = version
        return out

    def run_python(self, code: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in self.env.items() if k != "AITK_TEST_IMPORT_LOG"}
        return subprocess.run([str(self.python), "-c", code], env=env, capture_output=True,
                              text=True, timeout=60)


def _default_sigint() -> None:
    # A background job inherits SIGINT ignored, and Python then never raises
    # KeyboardInterrupt; restore the default so a test can press "Ctrl+C".
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def find_uv() -> str:
    found = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if not Path(found).exists():
        pytest.skip("uv is not installed in the test environment (requirements-test.txt)")
    return found


@pytest.fixture(scope="session")
def uv_dir(scratch: Path) -> Path:
    folder = scratch / "uvbin"
    folder.mkdir()
    (folder / "uv").symlink_to(find_uv())
    return folder


@pytest.fixture(scope="session")
def caches(scratch: Path) -> Path:
    return scratch / "caches"


def _base_env(root: Path, world: World, caches: Path, installer: str, uv_dir: Path
              ) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("PIP_", "UV_", "AITK_", "VIRTUAL_ENV", "CONDA", "PYTHON"))}
    path = keep.get("PATH", "/usr/bin:/bin")
    path = os.pathsep.join(p for p in path.split(os.pathsep)
                           if not (Path(p) / "uv").exists())  # no system uv unless given
    return {
        **keep,
        "PATH": f"{uv_dir}{os.pathsep}{path}" if installer == "uv" else path,
        "PIP_CONFIG_FILE": os.devnull,  # never the machine's /etc/xdg/pip
        "PIP_INDEX_URL": world.index.pypi,
        "PIP_CACHE_DIR": str(caches / "pip"),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "UV_CACHE_DIR": str(caches / "uv"),
        "UV_NO_CONFIG": "1",
        "UV_PYTHON_DOWNLOADS": "never",
        "AITK_ROOT": str(root),
        "AITK_SPEC_FILE": str(root / "spec.json"),
        "AITK_NO_BOOTSTRAP": "1",
        "AITK_SKIP_TOOLS": "1",
        "AITK_INSTALLER": installer,
        "AITK_LOCK_TIMEOUT": "120",
        "AITK_TEST_IMPORT_LOG": str(root / "imports.log"),
        "PYTHONDONTWRITEBYTECODE": "1",
        "NO_COLOR": "1",
        # Variables that break installs; the manager must drop them for every child.
        "PIP_TARGET": str(root / "pip-target"),
        "PIP_USER": "1",
        "PIP_REQUIRE_VIRTUALENV": "0",
        "VIRTUAL_ENV": str(root / "another-venv"),
    }


def new_checkout(tmp_dir: Path, world: World, caches: Path, uv_dir: Path,
                 installer: str = "uv") -> Checkout:
    root = tmp_dir / "checkout"
    root.mkdir()
    copy_manager(root)
    (root / "dgx_requirements.txt").write_text("demo-req==1.0\n")
    checkout = Checkout(root, _base_env(root, world, caches, installer, uv_dir), world)
    checkout.requirements("demo-req==1.0",
                          git_requirement(world, 0))
    checkout.write_spec(make_spec(world))
    return checkout


@pytest.fixture(params=["uv", "pip"])
def checkout(request: pytest.FixtureRequest, tmp_dir: Path, world: World, caches: Path,
             uv_dir: Path) -> Checkout:
    return new_checkout(tmp_dir, world, caches, uv_dir, installer=request.param)


@pytest.fixture
def uv_checkout(tmp_dir: Path, world: World, caches: Path, uv_dir: Path) -> Checkout:
    return new_checkout(tmp_dir, world, caches, uv_dir, installer="uv")


@pytest.fixture
def pip_checkout(tmp_dir: Path, world: World, caches: Path, uv_dir: Path) -> Checkout:
    return new_checkout(tmp_dir, world, caches, uv_dir, installer="pip")


def git_requirement(world: World, which: int) -> str:
    # file://localhost/...: pip before 23.3 rejects a git+file URL with an empty host.
    return f"gitpkg @ git+file://localhost{world.git_repo}@{world.git_revs[which]}"
