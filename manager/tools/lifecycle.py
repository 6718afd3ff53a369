"""What every provisioned tool shares: queries (system copy? trusted local copy?) apart
from the one action (install), and the settings read from the environment.

Lifecycle of one tool, as `resolve` and `install` walk it:
    system copy on PATH, new enough (and tool-specific checks)  -> used as it is
    local copy whose marker matches the pin and which runs      -> used
    otherwise: install = download (verified) -> extract (safe) in .aitk-staging/
               -> check the staged binary runs -> publish by rename -> marker in place
"""

from __future__ import annotations

import os
import platform as _platform
import re
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from packaging.version import InvalidVersion, Version

from manager import archive, process
from manager.errors import ManagerError
from manager.paths import Paths
from manager.tools.pins import Artefact, Platform, ToolPin

if TYPE_CHECKING:  # the downloader (httpx, rich) loads only when something is installed:
    import httpx  # asking which copy of a tool is used must stay cheap (a no-op sync)

    from manager import download

ALLOW_UNVERIFIED_ENV = "AITK_ALLOW_UNVERIFIED"
_ALIASES = {"mingit": "git"}


class ToolUnavailable(ManagerError):
    """A tool is missing and cannot be provisioned here (unsupported platform, refused
    unverified download, offline). A warning during sync; an error at the command that
    needs the tool."""


def current_platform(system: str | None = None, machine: str | None = None) -> Platform:
    """Normalise platform.system()/machine() to the pins' (os, arch) keys."""
    sys_name = (system or _platform.system()).lower()
    mach = (machine or _platform.machine()).lower()
    os_name = {"linux": "linux", "darwin": "macos", "windows": "windows"}.get(sys_name, sys_name)
    arch = {"x86_64": "x86_64", "amd64": "x86_64", "x64": "x86_64",
            "aarch64": "arm64", "arm64": "arm64", "armv8": "arm64"}.get(mach, mach)
    return os_name, arch


def platform_label(plat: Platform) -> str:
    return f"{plat[0]}-{plat[1]}"


@dataclass(frozen=True)
class Settings:
    """Mirrors and opt-ins, read once from the environment."""

    mirrors: Mapping[str, str] = field(default_factory=dict)  # tool -> base URL
    allow_unverified: frozenset[str] = frozenset()

    @classmethod
    def from_env(cls, env: Mapping[str, str], pins: Mapping[str, ToolPin]) -> Settings:
        mirrors = {p.tool: env[p.mirror_env].strip() for p in pins.values()
                   if env.get(p.mirror_env, "").strip()}
        raw = env.get(ALLOW_UNVERIFIED_ENV, "")
        allowed = {_ALIASES.get(n.strip().lower(), n.strip().lower())
                   for n in raw.split(",") if n.strip()}
        return cls(mirrors, frozenset(allowed))

    def url(self, pin: ToolPin, path: str) -> str:
        base = self.mirrors.get(pin.tool) or pin.base_url
        return f"{base.rstrip('/')}/{path}"


@dataclass
class Context:
    """What an install needs besides the tool: settings and the downloader's knobs."""

    settings: Settings
    client: httpx.Client | None = None
    retry: download.RetryPolicy | None = None
    reporter: download.Reporter | None = None


@dataclass(frozen=True)
class Found:
    """The answer to "which copy of this tool is used?" (also the `tools` report row)."""

    tool: str
    used: str | None  # "system" | "local" | None
    path: str | None
    version: str | None
    ok: bool
    verified: bool | None = None  # local copies: did the download match a checksum?
    detail: str = ""


_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str) -> str | None:
    """The first dotted version in a `--version` line (`v20.20.2`, `uv 0.13.9 (...)`,
    `git version 2.39.5`, `ffmpeg version n7.1-62-g...`)."""
    match = _VERSION.search(text)
    return match.group(0) if match else None


def meets(version: str | None, minimum: str) -> bool:
    if version is None:
        return False
    try:
        return Version(version) >= Version(minimum)
    except InvalidVersion:
        return False


Runner = Callable[..., process.Completed]


class Tool:
    """One provisioned tool. Subclasses say where it lives and how it is laid out."""

    exe_name = ""  # without ".exe"
    version_flag = "--version"

    def __init__(self, pin: ToolPin, *, runner: Runner = process.run,
                 which: Callable[..., str | None] = shutil.which) -> None:
        self.pin = pin
        self.runner = runner
        self.which = which

    @property
    def name(self) -> str:
        return self.pin.tool

    # -- layout (subclasses) ----------------------------------------------------------

    def target(self, paths: Paths) -> Path:
        raise NotImplementedError

    def local_exe(self, root: Path, plat: Platform) -> Path:
        raise NotImplementedError

    def bin_dirs(self, root: Path, plat: Platform) -> list[Path]:
        return [self.local_exe(root, plat).parent]

    def lib_dirs(self, root: Path, plat: Platform) -> list[Path]:
        return []

    def system_problem(self, exe: Path, plat: Platform) -> str | None:
        """A tool-specific reason to pass over a system copy (FFmpeg: no shared libs)."""
        return None

    def exe_file(self, plat: Platform) -> str:
        return self.exe_name + (".exe" if plat[0] == "windows" else "")

    # -- queries -----------------------------------------------------------------------

    def version_of(self, exe: Path) -> str | None:
        done = self.runner([str(exe), self.version_flag], timeout=30)
        return parse_version(done.stdout + "\n" + done.stderr) if done.ok else None

    def system(self, paths: Paths, plat: Platform, path_env: str | None = None) -> Found | None:
        """The copy on PATH, ignoring the checkout's own tool folders."""
        search = _path_without(path_env if path_env is not None else os.environ.get("PATH", ""),
                               _tool_dirs(paths))
        found = self.which(self.exe_file(plat), path=search)
        if not found:
            return None
        exe = Path(found)
        version = self.version_of(exe)
        if version is None:
            return Found(self.name, "system", found, None, False,
                         detail=f"{found} did not report a version")
        if not meets(version, self.pin.minimum):
            return Found(self.name, "system", found, version, False,
                         detail=f"system {self.name} {version} is older than {self.pin.minimum}")
        problem = self.system_problem(exe, plat)
        return Found(self.name, "system", found, version, problem is None, detail=problem or "")

    def local(self, paths: Paths, plat: Platform, *, probe: bool = True) -> Found | None:
        """The checkout's copy, trusted only with a marker matching the pin."""
        root = self.target(paths)
        exe = self.local_exe(root, plat)
        marker = archive.read_marker(root)
        if marker is None and not exe.exists():
            return None
        if not self.trusts(marker, plat):
            have = f" (it holds {marker.version})" if marker else ""
            return Found(self.name, "local", str(exe), marker.version if marker else None, False,
                         detail=f"{root.name}/ is not the pinned {self.name} "
                                f"{self.pin.version}{have}; it will be replaced")
        version = self.version_of(exe) if probe else marker.version
        if version is None:
            return Found(self.name, "local", str(exe), marker.version, False, marker.verified,
                         detail=f"{exe} does not run")
        return Found(self.name, "local", str(exe), version, True, marker.verified)

    def trusts(self, marker: archive.Marker | None, plat: Platform) -> bool:
        """Is a local copy with this marker the pinned one?"""
        art = self.pin.artefact(plat)
        return art is not None and archive.marker_matches(
            marker, self.name, self.pin.version, art.filename, art.sha256)

    def serves_packages(self, found: Found, paths: Paths, plat: Platform) -> bool:
        """Can the optional packages that need this tool use this copy? (FFmpeg: they
        load its shared libraries, which a static program does not have.)"""
        return found.ok

    def report_extra(self, found: Found, paths: Paths, plat: Platform) -> dict[str, object]:
        """Tool-specific fields for the `tools` report."""
        return {}

    def resolve(self, paths: Paths, plat: Platform, *, probe: bool = True) -> Found:
        """System copy when good enough, else a trusted local one, else why neither."""
        sys_found = self.system(paths, plat)
        if sys_found and sys_found.ok:
            return sys_found
        loc = self.local(paths, plat, probe=probe)
        if loc and loc.ok:
            return loc
        reasons = [
            sys_found.detail if sys_found else f"no {self.name} on PATH",
            loc.detail if loc else f"no local copy in {self.target(paths).name}/",
        ]
        art = self.pin.artefact(plat)
        if art is None:
            reasons.append(self.pin.unsupported.get(plat, f"no build pinned for "
                                                           f"{platform_label(plat)}"))
        elif art.sha256 is None and not self.pin.checksum_list:
            # True whether or not the opt-in is set already: nothing installs it until
            # a provision runs with the opt-in.
            reasons.append(f"the pinned build has no published checksum here; to install it "
                           f"unverified, run `python3 -m manager tools --provision` with "
                           f"{ALLOW_UNVERIFIED_ENV}={self.name}")
        return Found(self.name, None, None, None, False, detail="; ".join(reasons))

    # -- the action -------------------------------------------------------------------

    def expected_sha256(self, art: Artefact, ctx: Context) -> str | None:
        return art.sha256

    def refusal(self, plat: Platform, settings: Settings) -> ToolUnavailable | None:
        """Pure: why an install would not even be tried here, or None."""
        art = self.pin.artefact(plat)
        if art is None:
            return ToolUnavailable(f"{self.name}: " + self.pin.unsupported.get(
                plat, f"no build is pinned for {platform_label(plat)}"))
        verifiable = art.sha256 is not None or self.pin.checksum_list is not None
        if not verifiable and self.name not in settings.allow_unverified:
            return self._unverified()
        return None

    def _unverified(self) -> ToolUnavailable:
        return ToolUnavailable(
            f"{self.name} {self.pin.version}: no published checksum to verify the download "
            f"against ({self.pin.unverified_reason or 'none pinned'}); refusing an "
            f"unverified download",
            hint=f"install a system {self.name}, or accept the risk with "
                 f"{ALLOW_UNVERIFIED_ENV}={self.name}")

    def install(self, paths: Paths, plat: Platform, ctx: Context) -> Found:
        """Download, verify, extract, check, publish. Any failure leaves the previous
        copy and the checkout as they were."""
        from manager import download

        refused = self.refusal(plat, ctx.settings)
        if refused:
            raise refused
        art = self.pin.artefact(plat)
        assert art is not None  # refusal() covers the unsupported platforms
        url = ctx.settings.url(self.pin, art.path)
        digest = self.expected_sha256(art, ctx)
        if digest is None and self.name not in ctx.settings.allow_unverified:
            raise self._unverified()
        label = f"{self.name} {self.pin.version}"
        try:
            fetched = download.fetch(
                url, archive.staging_root(paths.root) / "downloads" / art.filename,
                sha256=digest, max_bytes=self.pin.max_download, client=ctx.client,
                retry=ctx.retry, reporter=ctx.reporter, label=label)
        except download.DownloadError as exc:
            exc.hint = (f"{exc.hint}; " if exc.hint else "") + (
                f"{self.pin.mirror_env} points {self.name} downloads at a mirror")
            raise
        marker = archive.Marker(self.name, self.pin.version, art.filename, url,
                                fetched.sha256, fetched.verified)
        try:
            with archive.staging(paths.root, self.name) as stage:
                unpacked = stage / "unpacked"
                archive.extract(fetched.path, unpacked, art.kind,
                                max_unpacked=self.pin.max_unpacked)
                self.place(unpacked, paths, plat, marker)
        finally:
            fetched.path.unlink(missing_ok=True)
        found = self.local(paths, plat)
        if found is None or not found.ok:
            raise ToolUnavailable(f"{label} was installed but is not usable: "
                                  f"{found.detail if found else 'missing'}")
        return found

    def place(self, unpacked: Path, paths: Paths, plat: Platform,
              marker: archive.Marker) -> None:
        """Default layout: the archive's root folder becomes the target folder."""
        root = archive.single_root(unpacked)
        self.check_runs(self.local_exe(root, plat))
        archive.write_marker(root, marker)
        archive.publish(root, self.target(paths))

    def check_runs(self, exe: Path) -> None:
        """Refuse to publish a copy whose binary does not run here (wrong arch, broken)."""
        if not exe.is_file():
            raise ToolUnavailable(f"{self.name}: the archive has no {exe.name} where expected")
        if self.version_of(exe) is None:
            raise ToolUnavailable(f"{self.name}: {exe.name} from the archive does not run here")


def _tool_dirs(paths: Paths) -> list[Path]:
    return [paths.uv_dir, paths.node_dir, paths.ffmpeg_dir, paths.mingit_dir]


def _path_without(path_env: str, folders: list[Path]) -> str:
    """PATH minus entries inside our own tool folders (so "system" means system)."""
    def inside(entry: str) -> bool:
        try:
            resolved = Path(entry).resolve()
        except OSError:
            return False
        return any(resolved == f.resolve() or f.resolve() in resolved.parents for f in folders)

    return os.pathsep.join(e for e in path_env.split(os.pathsep) if e and not inside(e))
