"""Fake driver tools on PATH for the detection/spec tests (see conftest.fake_machine).

A fake tool is a small /bin/sh script that answers exactly the argument lists it was
given (printing captured-looking output with shell builtins only, so PATH can hold
nothing but the fakes) and fails like the real tool on anything else.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
NVIDIA_QUERY = ("--query-gpu=index,name,memory.total,compute_cap,driver_version "
                "--format=csv,noheader,nounits")
NVIDIA_QUERY_OLD = ("--query-gpu=index,name,memory.total,driver_version "
                    "--format=csv,noheader,nounits")
NVIDIA_FAILED = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                 "driver. Make sure that the latest NVIDIA driver is installed and running.\n")


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_bytes().decode("utf-8")  # keep CRLF (Windows captures)


@dataclass(frozen=True)
class Answer:
    stdout: str = ""
    rc: int = 0
    stderr: str = ""


@dataclass(frozen=True)
class FakeMachine:
    """Platform facts plus the driver tools this machine has."""

    os: str = "Linux"
    arch: str = "x86_64"
    release: str = "6.8.0-49-generic"
    python: str = "3.11.7"
    tools: Mapping[str, Mapping[str, Answer]] = field(default_factory=dict)
    rocm_version: str | None = None  # written to <rocm>/.info/version beside the tools


def nvidia_smi(csv: str, banner: str, *, crlf: bool = False) -> dict[str, Answer]:
    """A working nvidia-smi: the query we use, and the plain banner."""
    if crlf:
        csv = csv.replace("\n", "\r\n")
    return {NVIDIA_QUERY: Answer(csv), "": Answer(fixture_text(f"nvidia-smi/{banner}"))}


def write_fake(path: Path, answers: Mapping[str, Answer]) -> None:
    lines = ["#!/bin/sh", 'case "$*" in']
    for args, answer in answers.items():
        lines.append(f"  {shlex.quote(args)})")
        if answer.stdout:
            lines.append(f"    printf '%s' {shlex.quote(answer.stdout)}")
        if answer.stderr:
            lines.append(f"    printf '%s' {shlex.quote(answer.stderr)} >&2")
        lines.append(f"    exit {answer.rc};;")
    unknown = shlex.quote(f"{path.name}: unknown arguments: ")
    lines += ["  *)", f"    printf '%s%s\\n' {unknown} \"$*\" >&2", "    exit 2;;", "esac", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    path.chmod(0o755)


def install_machine(root: Path, machine: FakeMachine) -> dict[str, str]:
    """Write the fakes under root and return the environment that makes probe see them."""
    bin_dir = root / "bin"
    rocm_bin = root / "rocm" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    rocm_bin.mkdir(parents=True, exist_ok=True)
    for name, answers in machine.tools.items():
        write_fake((rocm_bin if name.startswith("rocm") else bin_dir) / name, answers)
    if machine.rocm_version:
        info = root / "rocm" / ".info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "version").write_text(machine.rocm_version + "\n")
    return {
        "PATH": f"{bin_dir}:{rocm_bin}",
        "AITK_HOST_OS": machine.os,
        "AITK_HOST_ARCH": machine.arch,
        "AITK_HOST_RELEASE": machine.release,
        "AITK_HOST_PYTHON": machine.python,
    }
