"""Hardware detection: probe this machine -> Detection (plain data).

Two halves:
- pure parsers over captured text (nvidia-smi CSV and banner, rocminfo, rocm-smi,
  sysctl), tested against fixtures shaped like real drivers' output;
- `probe`, a thin shell that finds the tools on PATH, runs each once through
  `manager.process.run` with a timeout, and feeds the parsers. It never raises: what
  went wrong ends up in the Detection (a failed nvidia-smi is reported as failed, with
  its message, never silently as "no GPU").

Platform facts (OS, architecture, Python, kernel/macOS release) come from a `Host`,
read from `platform` unless the AITK_HOST_* variables override them. The overrides
exist so tests and support can replay another machine; any override in force is
written into the Detection's notes, so a report can never pass for the real thing.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from manager import process

TOOL_TIMEOUT_S = 20.0  # a wedged driver can make nvidia-smi hang; never wait forever
NVIDIA_FIELDS = "index,name,memory.total,compute_cap,driver_version"
# Drivers older than ~510 do not know the compute_cap field; ask again without it.
NVIDIA_FIELDS_OLD = "index,name,memory.total,driver_version"
# On WSL2 the Windows driver's tools live here and are often not on PATH.
WSL_NVIDIA_SMI = "/usr/lib/wsl/lib/nvidia-smi"
# Grace-based NVIDIA systems (DGX Spark = GB10, GH200, GB200/GB300 superchips).
GRACE_GPU = re.compile(r"\b(GB10|GH200|GB200|GB300)\b", re.IGNORECASE)
HOST_OVERRIDES = ("AITK_HOST_OS", "AITK_HOST_ARCH", "AITK_HOST_PYTHON", "AITK_HOST_RELEASE")


@dataclass(frozen=True)
class NvidiaGpu:
    index: int
    name: str
    memory_mib: int | None  # None where the driver prints [N/A] (unified memory, GB10)
    compute_capability: str | None  # "12.0"; None where [N/A]
    driver_version: str | None = None


@dataclass(frozen=True)
class Detection:
    os: str  # "linux" | "darwin" | "windows"
    arch: str  # "x86_64" | "aarch64" | "arm64" (macOS keeps arm64)
    python: str  # "3.11.7"
    wsl: bool = False
    nvidia: dict[str, Any] = field(default_factory=dict)
    rocm: dict[str, Any] = field(default_factory=dict)
    apple: dict[str, Any] = field(default_factory=dict)
    dgx: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    os_release: str = ""  # kernel release on Linux/Windows, product version on macOS

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["notes"] = list(self.notes)
        return data


# ---- platform facts -------------------------------------------------------------------


@dataclass(frozen=True)
class Host:
    """The raw platform facts detection starts from."""

    system: str  # platform.system(): "Linux", "Darwin", "Windows"
    machine: str  # platform.machine(): "x86_64", "AMD64", "arm64", "aarch64"
    python: str
    release: str  # kernel release (Linux), macOS product version (Darwin)
    overridden: tuple[str, ...] = ()

    @classmethod
    def current(cls, env: Mapping[str, str]) -> Host:
        system = platform.system()
        release = platform.mac_ver()[0] if system == "Darwin" else platform.release()
        facts = {
            "AITK_HOST_OS": system,
            "AITK_HOST_ARCH": platform.machine(),
            "AITK_HOST_PYTHON": platform.python_version(),
            "AITK_HOST_RELEASE": release,
        }
        overridden = tuple(f"{k}={env[k]}" for k in HOST_OVERRIDES if env.get(k))
        facts.update({k: env[k] for k in HOST_OVERRIDES if env.get(k)})
        return cls(facts["AITK_HOST_OS"], facts["AITK_HOST_ARCH"], facts["AITK_HOST_PYTHON"],
                   facts["AITK_HOST_RELEASE"], overridden)


def normalise_os(system: str) -> str:
    s = system.strip().lower()
    if s.startswith(("win", "cygwin", "msys", "mingw")):
        return "windows"
    if s in ("darwin", "macos", "mac", "osx"):
        return "darwin"
    return s or "unknown"


def normalise_arch(machine: str, os_name: str) -> str:
    """amd64 -> x86_64 everywhere; arm64 -> aarch64 off macOS (macOS says arm64)."""
    m = machine.strip().lower()
    if m in ("amd64", "x64", "x86-64", "em64t"):
        return "x86_64"
    if m in ("arm64", "aarch64", "armv8", "armv8l", "arm64e"):
        return "arm64" if os_name == "darwin" else "aarch64"
    return m or "unknown"


def wsl_kind(os_name: str, release: str, env: Mapping[str, str]) -> int:
    """0: not WSL; 1: WSL1 (no GPU access); 2: WSL2."""
    if os_name != "linux":
        return 0
    rel = release.lower()
    if "microsoft" not in rel and "wsl" not in rel:
        return 2 if env.get("WSL_INTEROP") else 0
    return 2 if ("wsl2" in rel or "microsoft-standard" in rel) else 1


# ---- pure parsers ---------------------------------------------------------------------


def _na(value: str) -> bool:
    v = value.strip()
    return not v or (v.startswith("[") and v.endswith("]")) or v.upper() in ("N/A", "NA")


def parse_nvidia_csv(text: str, with_cc: bool = True) -> tuple[list[NvidiaGpu], list[str]]:
    """Parse `--query-gpu=index,name,memory.total[,compute_cap],driver_version
    --format=csv,noheader,nounits`.

    nvidia-smi quotes nothing and a name may contain a comma, so the fixed fields are
    taken from both ends and the name is whatever lies between. Returns the GPUs and
    one problem line per row that could not be read.
    """
    gpus: list[NvidiaGpu] = []
    problems: list[str] = []
    tail = 3 if with_cc else 2  # fields after the name
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 2 + tail:
            problems.append(f"unreadable nvidia-smi row: {line!r}")
            continue
        head, name_parts, rest = parts[0], parts[1:-tail], parts[-tail:]
        memory, driver = rest[0], rest[-1]
        cc = rest[1] if with_cc else "[N/A]"
        try:
            index = int(head)
        except ValueError:
            problems.append(f"unreadable nvidia-smi row: {line!r}")
            continue
        mem: int | None = None
        if not _na(memory):
            try:
                mem = int(float(memory.split()[0]))
            except ValueError:
                problems.append(f"unreadable memory {memory!r} for GPU {index}")
        cap = None if _na(cc) or not re.fullmatch(r"\d+\.\d+", cc) else cc
        gpus.append(NvidiaGpu(index, ", ".join(name_parts), mem, cap,
                              None if _na(driver) else driver))
    return gpus, problems


_CUDA_BANNER = re.compile(r"CUDA\s+(?:UMD\s+)?Version\s*:\s*(\d+\.\d+)", re.IGNORECASE)
_DRIVER_BANNER = re.compile(r"Driver\s+Version\s*:\s*(\d+(?:\.\d+)+)", re.IGNORECASE)


def parse_nvidia_banner(text: str) -> dict[str, str | None]:
    """The highest CUDA version the driver supports, from plain `nvidia-smi` output.

    Older drivers print `CUDA Version: 12.8`, newer ones `CUDA UMD Version: 13.1`; the
    Windows layout is the same line with different padding.
    """
    cuda = _CUDA_BANNER.search(text)
    driver = _DRIVER_BANNER.search(text)
    return {
        "cuda_version": cuda.group(1) if cuda else None,
        "driver_version": driver.group(1) if driver else None,
    }


def parse_rocminfo(text: str) -> list[dict[str, str]]:
    """GPU agents from `rocminfo`: gfx target and marketing name. CPU agents are skipped."""
    agents: list[dict[str, str]] = []
    for block in re.split(r"^\*+\s*\n\s*Agent \d+\s*\n\*+\s*$", text, flags=re.MULTILINE)[1:]:
        fields: dict[str, str] = {}
        for line in block.splitlines():
            m = re.match(r"^\s*([A-Za-z][A-Za-z ]*?):\s*(.*?)\s*$", line)
            if m and m.group(1) not in fields:  # first occurrence: nested ISA names follow
                fields[m.group(1)] = m.group(2)
        if fields.get("Device Type", "").upper() != "GPU":
            continue
        gfx = fields.get("Name", "")
        if not gfx.startswith("gfx"):
            continue
        agents.append({"gfx": gfx, "name": fields.get("Marketing Name") or gfx})
    return agents


def parse_rocm_smi_products(text: str) -> list[dict[str, str]]:
    """GPUs from `rocm-smi --showproductname` (`GPU[0] : GFX Version: gfx942` lines)."""
    cards: dict[int, dict[str, str]] = {}
    for line in text.splitlines():
        m = re.match(r"^\s*GPU\[(\d+)\]\s*:\s*([^:]+?)\s*:\s*(.*?)\s*$", line)
        if m:
            cards.setdefault(int(m.group(1)), {})[m.group(2)] = m.group(3)
    out = []
    for _, card in sorted(cards.items()):
        gfx = card.get("GFX Version", "")
        if gfx.startswith("gfx"):
            out.append({"gfx": gfx, "name": card.get("Card Series") or gfx})
    return out


def parse_rocm_version(text: str) -> str | None:
    """`/opt/rocm/.info/version` says e.g. `7.1.0-38`; keep the release part."""
    m = re.search(r"(\d+\.\d+(?:\.\d+)?)", text)
    return m.group(1) if m else None


def first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


# ---- the shell ------------------------------------------------------------------------


def _which(name: str, env: Mapping[str, str]) -> str | None:
    return shutil.which(name, path=env.get("PATH", ""))


def _failure(done: process.Completed, tool: str) -> str:
    if done.timed_out:
        return f"{tool} did not answer within {TOOL_TIMEOUT_S:.0f} s"
    text = first_line(done.stdout) or first_line(done.stderr)
    return f"{tool} exited with code {done.returncode}" + (f": {text}" if text else "")


def _run(argv: list[str], env: Mapping[str, str]) -> process.Completed:
    return process.run(argv, env=process.clean_env(base=env), timeout=TOOL_TIMEOUT_S)


def probe_nvidia(env: Mapping[str, str], wsl: int) -> tuple[dict[str, Any], list[str]]:
    notes: list[str] = []
    smi = _which("nvidia-smi", env)
    if smi is None and wsl == 2 and Path(WSL_NVIDIA_SMI).exists():
        smi = WSL_NVIDIA_SMI
    info: dict[str, Any] = {"found": smi is not None, "ok": False, "path": smi, "error": None,
                            "driver_version": None, "cuda_version": None, "gpus": []}
    if smi is None:
        return info, notes
    with_cc = True
    done = _run([smi, f"--query-gpu={NVIDIA_FIELDS}", "--format=csv,noheader,nounits"], env)
    if not done.ok and "compute_cap" in (done.stdout + done.stderr):
        with_cc = False
        notes.append("this NVIDIA driver cannot report compute capability (too old)")
        done = _run([smi, f"--query-gpu={NVIDIA_FIELDS_OLD}", "--format=csv,noheader,nounits"],
                    env)
    if not done.ok:
        info["error"] = _failure(done, "nvidia-smi")
        return info, notes
    gpus, problems = parse_nvidia_csv(done.stdout, with_cc=with_cc)
    notes.extend(problems)
    if not gpus:
        info["error"] = "nvidia-smi answered but listed no GPU"
        return info, notes
    info["gpus"] = [asdict(g) for g in gpus]
    info["driver_version"] = next((g.driver_version for g in gpus if g.driver_version), None)
    banner = _run([smi], env)
    if banner.ok:
        parsed = parse_nvidia_banner(banner.stdout)
        info["cuda_version"] = parsed["cuda_version"]
        info["driver_version"] = info["driver_version"] or parsed["driver_version"]
    if info["cuda_version"] is None:
        notes.append("could not read the driver's CUDA version from the nvidia-smi banner")
    info["ok"] = True
    return info, notes


def _rocm_version(tool: str, env: Mapping[str, str]) -> str | None:
    # The runtime has answered; its release is written in the install's .info/version.
    roots = [Path(tool).resolve().parent.parent]
    if env.get("ROCM_PATH"):
        roots.append(Path(env["ROCM_PATH"]))
    for root in roots:
        try:
            return parse_rocm_version((root / ".info" / "version").read_text())
        except OSError:
            continue
    return None


def probe_rocm(env: Mapping[str, str]) -> dict[str, Any]:
    info: dict[str, Any] = {"found": False, "ok": False, "tool": None, "error": None,
                            "version": None, "gpus": []}
    for name, args, parse in (("rocminfo", [], parse_rocminfo),
                              ("rocm-smi", ["--showproductname"], parse_rocm_smi_products)):
        tool = _which(name, env)
        if tool is None:
            continue
        info.update(found=True, tool=tool)
        done = _run([tool, *args], env)
        if not done.ok:
            info["error"] = _failure(done, name)
            continue
        gpus = parse(done.stdout)
        if not gpus:
            info["error"] = f"{name} answered but listed no AMD GPU"
            continue
        info.update(ok=True, error=None, gpus=gpus, version=_rocm_version(tool, env))
        break
    return info


def probe_apple(env: Mapping[str, str], arch: str) -> dict[str, Any]:
    info: dict[str, Any] = {"silicon": arch == "arm64", "chip": None, "rosetta": False,
                            "mps": False}
    sysctl = _which("sysctl", env)
    if sysctl:
        chip = _run([sysctl, "-n", "machdep.cpu.brand_string"], env)
        if chip.ok:
            info["chip"] = first_line(chip.stdout) or None
        # An x86_64 Python on Apple silicon runs under Rosetta and reports x86_64.
        translated = _run([sysctl, "-n", "sysctl.proc_translated"], env)
        info["rosetta"] = translated.ok and first_line(translated.stdout) == "1"
    if info["rosetta"] or (info["chip"] or "").startswith("Apple"):
        info["silicon"] = True
    info["mps"] = info["silicon"] and arch == "arm64"
    return info


def grace_platform(os_name: str, arch: str, gpu_names: list[str]) -> str | None:
    """GB10 / GH200 / GB200 / GB300 on aarch64 Linux; any other aarch64 + NVIDIA is not."""
    if os_name != "linux" or arch != "aarch64":
        return None
    for name in gpu_names:
        m = GRACE_GPU.search(name)
        if m:
            return m.group(1).upper()
    return None


def probe(env: Mapping[str, str] | None = None) -> Detection:
    """Detect this machine. Never raises: failures are reported inside the Detection."""
    env = dict(os.environ if env is None else env)
    notes: list[str] = []
    try:
        host = Host.current(env)
    except Exception as exc:  # noqa: BLE001 - platform calls are best effort
        host = Host("unknown", "unknown", platform.python_version(), "")
        notes.append(f"could not read platform facts: {exc}")
    if host.overridden:
        notes.append("platform facts overridden (testing/support): " + ", ".join(host.overridden))
    os_name = normalise_os(host.system)
    arch = normalise_arch(host.machine, os_name)
    wsl = wsl_kind(os_name, host.release, env)
    if wsl == 1:
        notes.append("WSL1 has no GPU access; use WSL2 for CUDA")
    nvidia: dict[str, Any] = {}
    rocm: dict[str, Any] = {}
    apple: dict[str, Any] = {}
    try:
        if os_name != "darwin":
            nvidia, nv_notes = probe_nvidia(env, wsl)
            notes.extend(nv_notes)
            if nvidia.get("error"):
                notes.append(f"NVIDIA: {nvidia['error']}")
        if os_name == "linux" and not nvidia.get("ok"):
            rocm = probe_rocm(env)
            if rocm.get("error") and not rocm.get("ok"):
                notes.append(f"ROCm: {rocm['error']}")
        if os_name == "darwin":
            apple = probe_apple(env, arch)
            if apple.get("rosetta"):
                notes.append("this Python runs under Rosetta (x86_64); use an arm64 Python "
                             "to get MPS")
    except Exception as exc:  # noqa: BLE001 - detection must never fail
        notes.append(f"detection error: {type(exc).__name__}: {exc}")
    names = [g["name"] for g in nvidia.get("gpus", [])] if nvidia.get("ok") else []
    grace = grace_platform(os_name, arch, names)
    dgx = {"is_dgx": grace is not None, "platform": grace}
    return Detection(os=os_name, arch=arch, python=host.python, wsl=wsl == 2, nvidia=nvidia,
                     rocm=rocm, apple=apple, dgx=dgx, notes=tuple(notes),
                     os_release=host.release)
