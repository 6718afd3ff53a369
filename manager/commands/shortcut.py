"""`manager shortcut [--desktop-dir DIR] [--remove]`: a desktop shortcut for this checkout.

Linux: a .desktop entry; macOS: a .command file; Windows: a .lnk made by
launchers/windows/create-shortcut.ps1. Each runs the checkout's launcher (update --auto,
then launch, logging to logs/launcher.log). The file name carries a hash of the checkout
path, so two checkouts get two shortcuts and writing again is idempotent.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import stat
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from aitk_common.files import atomic_write_text
from manager import errors, process
from manager.output import Result
from manager.paths import paths

LAUNCHERS = Path("launchers")
POSIX_LAUNCHER = LAUNCHERS / "aitk-launch.sh"
WINDOWS_LAUNCHER = LAUNCHERS / "windows" / "aitk.bat"
WINDOWS_MAKER = LAUNCHERS / "windows" / "create-shortcut.ps1"
ICON = LAUNCHERS / "aitk.svg"
SUFFIX = {"linux": ".desktop", "darwin": ".command", "windows": ".lnk"}


@dataclass(frozen=True)
class Options:
    desktop_dir: Path | None = None
    remove: bool = False


def platform_name(raw: str = sys.platform) -> str:
    if raw.startswith("win"):
        return "windows"
    return "darwin" if raw == "darwin" else "linux"


def shortcut_name(root: Path, platform: str) -> str:
    """'aitk-<folder>-<hash>' + suffix: readable, a valid desktop-file id, unique per path."""
    folder = re.sub(r"[^A-Za-z0-9_-]+", "-", root.name).strip("-")[:40] or "checkout"
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:8]
    return f"aitk-{folder}-{digest}{SUFFIX[platform]}"


# ---- .desktop rendering (Desktop Entry Specification 1.4) ----------------------------------

_EXEC_RESERVED = set(" \t\n\"'\\><~|&;$*?#()`")


def desktop_string(text: str) -> str:
    """Escape a value of type string: backslash and control characters."""
    out = text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")
    out = out.replace("\r", "\\r")
    return "\\s" + out[1:] if out.startswith(" ") else out


def desktop_exec_arg(arg: str) -> str:
    """Quote one Exec argument: reserved characters need double quotes, inside which
    `"`, `` ` ``, `$` and `\\` take a backslash; `%` is doubled (field codes). The result
    is then a string value, so its backslashes are escaped once more."""
    arg = arg.replace("%", "%%")
    if any(c in _EXEC_RESERVED for c in arg):
        arg = '"' + re.sub(r'(["`$\\])', r"\\\1", arg) + '"'
    return desktop_string(arg)


def render_desktop(template: str, root: Path) -> str:
    launcher = root / POSIX_LAUNCHER
    exec_line = " ".join(desktop_exec_arg(a) for a in ("/bin/sh", str(launcher)))
    values = {
        "@NAME@": desktop_string(f"aitk ({root.name})"),
        "@EXEC@": exec_line,
        "@ICON@": desktop_string(str(root / ICON)),
        "@ROOT_STRING@": desktop_string(str(root)),
    }
    for key, value in values.items():
        template = template.replace(key, value)
    return template


def render_command(template: str, root: Path) -> str:
    """The macOS .command file: the launcher's absolute path, shell-quoted."""
    text = template.replace("@LAUNCHER@", shlex.quote(str(root / POSIX_LAUNCHER)))
    return text.replace("@ROOT@", str(root).replace("\n", " "))


def windows_argv(root: Path, link: Path) -> list[str]:
    """How the .lnk is made: PowerShell runs the checked-in script with plain arguments
    (no string building, so any path works)."""
    return ["powershell.exe", "-NoProfile", "-NonInteractive", "-ExecutionPolicy", "Bypass",
            "-File", str(root / WINDOWS_MAKER), "-ShortcutPath", str(link),
            "-Target", str(root / WINDOWS_LAUNCHER), "-WorkingDirectory", str(root)]


# ---- where the desktop is -----------------------------------------------------------------

def xdg_desktop(environ: Mapping[str, str], home: Path, user_dirs: str | None) -> Path:
    """XDG_DESKTOP_DIR from user-dirs.dirs (`XDG_DESKTOP_DIR="$HOME/Desktop"`), else
    ~/Desktop."""
    for line in (user_dirs or "").splitlines():
        key, _, value = line.strip().partition("=")
        if key == "XDG_DESKTOP_DIR" and value:
            value = value.strip().strip('"').replace("$HOME", str(home))
            if value and Path(value).is_absolute() and Path(value) != home:
                return Path(value)
    return home / "Desktop"


def default_desktop(platform: str) -> Path:
    home = Path.home()
    if platform == "linux":
        config = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
        try:
            user_dirs = (config / "user-dirs.dirs").read_text(encoding="utf-8")
        except OSError:
            user_dirs = None
        return xdg_desktop(os.environ, home, user_dirs)
    if platform == "windows":
        done = process.run(["powershell.exe", "-NoProfile", "-NonInteractive", "-Command",
                            "[Environment]::GetFolderPath('Desktop')"], timeout=30)
        if done.ok and done.stdout.strip():  # OneDrive may have moved it
            return Path(done.stdout.strip())
    return home / "Desktop"


# ---- the command -------------------------------------------------------------------------

def run(options: Options) -> Result:
    root = paths().root.resolve()
    platform = platform_name()
    if options.desktop_dir is not None:
        desktop = options.desktop_dir.expanduser().absolute()
        if desktop.exists() and not desktop.is_dir():
            raise errors.UsageError(f"--desktop-dir {desktop} is not a folder")
    else:
        desktop = default_desktop(platform)
        if not desktop.is_dir() and not options.remove:
            raise errors.UsageError(f"no desktop folder at {desktop}",
                                    hint="choose one with --desktop-dir DIR")
    target = desktop / shortcut_name(root, platform)
    data: dict[str, Any] = {"platform": platform, "path": str(target),
                            "launcher": str(root / _launcher(platform))}
    try:
        if options.remove:
            existed = target.exists()
            target.unlink(missing_ok=True)
            return Result(data={**data, "action": "removed" if existed else "absent"})
        return Result(data={**data, "action": _write(root, platform, target)})
    except OSError as exc:  # a read-only or foreign folder
        raise errors.ManagerError(f"cannot {'remove' if options.remove else 'write'} "
                                  f"{target}: {exc.strerror or exc}",
                                  hint="choose a folder you can write to with --desktop-dir DIR"
                                  ) from exc


def _launcher(platform: str) -> Path:
    return WINDOWS_LAUNCHER if platform == "windows" else POSIX_LAUNCHER


def _write(root: Path, platform: str, target: Path) -> str:
    if platform == "windows":
        target.parent.mkdir(parents=True, exist_ok=True)
        done = process.run(windows_argv(root, target), timeout=60)
        if not done.ok:
            raise errors.ManagerError(f"creating {target} failed: {done.stderr.strip()}")
        return "written"
    template_name = "linux/aitk.desktop.in" if platform == "linux" else "macos/aitk.command.in"
    template = (root / LAUNCHERS / template_name).read_text(encoding="utf-8")
    render = render_desktop if platform == "linux" else render_command
    text = render(template, root)
    # Executable: GNOME and macOS only start launchers that carry the x bit.
    mode = 0o755
    try:
        current = target.read_text(encoding="utf-8")
        same = current == text and stat.S_IMODE(target.stat().st_mode) == mode
    except OSError:
        same = False
    if same:
        return "unchanged"
    atomic_write_text(target, text, mode=mode)
    return "written"


def render(console: Console, data: Mapping[str, Any]) -> None:
    verbs = {"written": "wrote", "unchanged": "already up to date:", "removed": "removed",
             "absent": "no shortcut to remove at"}
    console.print(f"{verbs[data['action']]} {data['path']}", markup=False, highlight=False)
    if data["action"] in ("written", "unchanged"):
        console.print(f"it runs {data['launcher']} (log: logs/launcher.log)", markup=False)
        if data["platform"] == "linux":
            console.print("on GNOME, right-click it once and choose 'Allow Launching'",
                          markup=False)
