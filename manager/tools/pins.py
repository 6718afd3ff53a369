"""The pinned tools: one version each, one artefact per platform, and its checksum.

Rules for this table (see README "Local tools"):
- no "latest" URLs: every artefact names one release;
- a sha256 here was copied from the vendor's published list or the package index,
  never computed from a download of unknown provenance and never guessed;
- where no such checksum could be had, `sha256` is None and `unverified_reason` says
  why; such a download is refused unless the user opts in (AITK_ALLOW_UNVERIFIED);
- Node.js needs no digest here: its installer fetches the vendor's SHASUMS256.txt
  from the same place as the archive and verifies against that (`checksum_list`).

Each URL is `<base>/<path>`; the base can be redirected with the tool's mirror
variable, which must keep the vendor's layout below it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# (os, arch) with os in {"linux", "macos", "windows"} and arch in {"x86_64", "arm64"}.
Platform = tuple[str, str]

LINUX_X64: Platform = ("linux", "x86_64")
LINUX_ARM64: Platform = ("linux", "arm64")
MACOS_ARM64: Platform = ("macos", "arm64")
MACOS_X64: Platform = ("macos", "x86_64")
WINDOWS_X64: Platform = ("windows", "x86_64")
WINDOWS_ARM64: Platform = ("windows", "arm64")
PLATFORMS: tuple[Platform, ...] = (
    LINUX_X64, LINUX_ARM64, MACOS_ARM64, MACOS_X64, WINDOWS_X64, WINDOWS_ARM64,
)

MIB = 1 << 20


@dataclass(frozen=True)
class Artefact:
    path: str  # below the tool's base URL; its last part is the file name
    kind: str  # "tar.gz" | "tar.xz" | "zip" | "wheel"
    sha256: str | None = None
    size: int | None = None  # as published by the index, when it publishes one

    @property
    def filename(self) -> str:
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class ToolPin:
    tool: str
    version: str
    minimum: str  # the oldest system copy we accept
    base_url: str
    mirror_env: str
    artefacts: Mapping[Platform, Artefact]
    checksum_source: str  # where the digests come from, for people and `tools --json`
    checksum_list: str | None = None  # vendor list fetched beside the archive (Node)
    unverified_reason: str | None = None  # why there is no digest, when there is none
    max_download: int = 256 * MIB
    max_unpacked: int = 1024 * MIB
    unsupported: Mapping[Platform, str] = field(default_factory=dict)

    def artefact(self, platform: Platform) -> Artefact | None:
        return self.artefacts.get(platform)


# uv: the PyPI wheels carry the binary (uv-<v>.data/scripts/uv). Digests and sizes are
# the ones PyPI's simple index publishes for each file (cross-checked on 2026-11-29
# against a `pip download` of the Linux x86_64 wheel).
UV = ToolPin(
    tool="uv",
    version="0.13.9",
    minimum="0.6.0",
    base_url="https://files.pythonhosted.org/packages",
    mirror_env="AITK_UV_MIRROR",
    checksum_source="PyPI simple index (sha256 per file)",
    max_download=64 * MIB,
    max_unpacked=256 * MIB,
    artefacts={
        LINUX_X64: Artefact(
            "3d/aa/26d64642d808de4a652579ef950d7cd2d37f080a8babf9c67c6b75fc4c3f/"
            "uv-0.13.9-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
            "wheel", "d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19",
            17606939),
        LINUX_ARM64: Artefact(
            "57/15/94b6cd62ac3ff6550288328e8035288875197cbc183f51554b266a69877b/"
            "uv-0.13.9-py3-none-manylinux_2_17_aarch64.manylinux2014_aarch64"
            ".musllinux_1_1_aarch64.whl",
            "wheel", "5435c5ce14a56431208ca0996416d310f1598e8c2c8ba707688985a16bb82dbe",
            18026789),
        MACOS_ARM64: Artefact(
            "f3/a7/a8d7b074798c7fb3b26b37584b8fe2e29df2ccdc24ce7902caab2a53edbf/"
            "uv-0.13.9-py3-none-macosx_11_0_arm64.whl",
            "wheel", "66c512266d633bef48384a1f53003f41f2a8e7b36fe6e7fbfd3e0fd52d96fa63",
            14660755),
        MACOS_X64: Artefact(
            "1e/db/08e9ef4879bd667e6d7b4705e594e5bd3e4585f10fc63cb16b9fa2fac63e/"
            "uv-0.13.9-py3-none-macosx_10_12_x86_64.whl",
            "wheel", "c16ed11e013557536b3e60065f1b912f6407bd6518e041b961e23ef9e6b4fbf5",
            17529974),
        WINDOWS_X64: Artefact(
            "dd/ef/ceeabf3631117f7354787d9fb1ffe943899e59ed4b887a696ed547e47e76/"
            "uv-0.13.9-py3-none-win_amd64.whl",
            "wheel", "6a44b2ed8111d2f60d2b92627c5dccda3f7ed7570b18ce115e569cd68c28246b",
            15662317),
        WINDOWS_ARM64: Artefact(
            "da/d1/d97a5db1f27e077e4d6329223f6b3f719c02c97e4092043f13e628558d05/"
            "uv-0.13.9-py3-none-win_arm64.whl",
            "wheel", "eeb92051c2123b9730c46b04cc843cfa4bc7d7b0aec56df431a2215ef4cb0273",
            15841844),
    },
)

# Node.js LTS from the official distribution; verified against the SHASUMS256.txt
# published in the same release folder (fetched at download time, same base URL).
NODE = ToolPin(
    tool="node",
    version="22.12.0",
    minimum="20.0.0",
    base_url="https://nodejs.org/dist",
    mirror_env="AITK_NODE_MIRROR",
    checksum_source="vendor list v<version>/SHASUMS256.txt, fetched beside the archive",
    checksum_list="v22.12.0/SHASUMS256.txt",
    max_download=128 * MIB,
    max_unpacked=512 * MIB,
    artefacts={
        LINUX_X64: Artefact("v22.12.0/node-v22.12.0-linux-x64.tar.xz", "tar.xz"),
        LINUX_ARM64: Artefact("v22.12.0/node-v22.12.0-linux-arm64.tar.xz", "tar.xz"),
        MACOS_ARM64: Artefact("v22.12.0/node-v22.12.0-darwin-arm64.tar.gz", "tar.gz"),
        MACOS_X64: Artefact("v22.12.0/node-v22.12.0-darwin-x64.tar.gz", "tar.gz"),
        WINDOWS_X64: Artefact("v22.12.0/node-v22.12.0-win-x64.zip", "zip"),
        WINDOWS_ARM64: Artefact("v22.12.0/node-v22.12.0-win-arm64.zip", "zip"),
    },
)

# FFmpeg (the program only, statically linked: no libavcodec & co.) from imageio-ffmpeg
# 0.8.1's PyPI wheels, imageio_ffmpeg/binaries/ffmpeg-<os>-<arch>-v<ver>[.exe]; the
# binaries are BtbN builds (Linux, Windows) and osxexperts/evermeet builds (macOS).
# Digests and sizes are the ones PyPI's simple index publishes for each file (read on
# 2026-12-01 from https://pypi.org/simple/imageio-ffmpeg/; the Linux x86_64, macOS arm64
# and Windows x64 wheels were downloaded by pip, which checks them against the index).
FFMPEG = ToolPin(
    tool="ffmpeg",
    version="9.0",
    minimum="6.0",
    base_url="https://files.pythonhosted.org/packages",
    mirror_env="AITK_FFMPEG_MIRROR",
    checksum_source="PyPI simple index (sha256 per file) of imageio-ffmpeg 0.8.1",
    max_download=128 * MIB,
    max_unpacked=512 * MIB,
    artefacts={
        LINUX_X64: Artefact(
            "de/0f/49292fbef69ee10ebcf97bb741602521caafcc6966d5fa1a2b868cc15655/"
            "imageio_ffmpeg-0.8.1-py3-none-manylinux_2_28_x86_64.whl",
            "wheel", "050d6850601c3b3890bd2b28306f3b842b3daea390a561101174375a1c460bda",
            67998402),
        LINUX_ARM64: Artefact(
            "53/02/e139e53a71f33f728cb2ce6c1124edc29e4c008427923f01a4d37f9a1867/"
            "imageio_ffmpeg-0.8.1-py3-none-manylinux_2_28_aarch64.whl",
            "wheel", "fad3176f859b25869e60a8ed79957d4e3ed74a97a95e5f0cdcb91455f6c6d00e",
            60956631),
        MACOS_ARM64: Artefact(
            "2b/47/9f9b654f853598bae0850fa22bba168103e45d31b5a2a893ed474f28d54a/"
            "imageio_ffmpeg-0.8.1-py3-none-macosx_12_0_arm64.whl",
            "wheel", "5636d691e36e5274b13fe38182b1f627b2e35dcecc63944012c2470f9484fc45",
            22625474),
        MACOS_X64: Artefact(
            "da/24/2c3a7c69453bfb8374ddbbb5007346bad4a4247bc86882f3521cd615f929/"
            "imageio_ffmpeg-0.8.1-py3-none-macosx_10_13_x86_64.whl",
            "wheel", "9538a10e598257263b5de1a1c1b86e7603417bc219245b1e279b452e5e48cc20",
            26974382),
        WINDOWS_X64: Artefact(
            "82/0c/a1d49f3dd2688bd750b4986f8e271ad11f8e729a896070ea25f587b44da8/"
            "imageio_ffmpeg-0.8.1-py3-none-win_amd64.whl",
            "wheel", "f27ca4cb85e2d4946deedbce1a81245dfd942a2bcf94b53676fb3956aa95bf1b",
            38893483),
        WINDOWS_ARM64: Artefact(
            "ee/39/ab95a2afd202772a69aab1fa5015f13b038f289c8617242cc5eebd0ec0e1/"
            "imageio_ffmpeg-0.8.1-py3-none-win_arm64.whl",
            "wheel", "0b7079e63dc34f97e43db5a5b7b9efb85edc1c6623313e0a4a17ebc7c2ce7a51",
            37499681),
    },
)

_BTBN_UNVERIFIED = (
    "the vendor (BtbN FFmpeg-Builds) publishes checksums.sha256 only inside its GitHub "
    "release, which could not be reached when this pin was made"
)

# FFmpeg 7.1 with shared libraries (bin/, lib/), one dated build (not "latest"): what
# torchcodec loads. Opt-in only (AITK_ALLOW_UNVERIFIED=ffmpeg), as it has no digest; the
# vendor prunes old dated builds: keep a copy on a mirror (AITK_FFMPEG_SHARED_MIRROR).
# Its table key is its own, so it has its own mirror; the tool it installs is "ffmpeg".
FFMPEG_SHARED = ToolPin(
    tool="ffmpeg-shared",
    version="7.1",
    minimum="6.0",
    base_url="https://github.com/BtbN/FFmpeg-Builds/releases/download/autobuild-2024-12-31-13-02",
    mirror_env="AITK_FFMPEG_SHARED_MIRROR",
    checksum_source="none pinned",
    unverified_reason=_BTBN_UNVERIFIED,
    max_download=256 * MIB,
    max_unpacked=1024 * MIB,
    artefacts={
        LINUX_X64: Artefact("ffmpeg-n7.1-62-gb168ed9b14-linux64-gpl-shared-7.1.tar.xz", "tar.xz"),
        LINUX_ARM64: Artefact(
            "ffmpeg-n7.1-62-gb168ed9b14-linuxarm64-gpl-shared-7.1.tar.xz", "tar.xz"),
        WINDOWS_X64: Artefact("ffmpeg-n7.1-62-gb168ed9b14-win64-gpl-shared-7.1.zip", "zip"),
        WINDOWS_ARM64: Artefact("ffmpeg-n7.1-62-gb168ed9b14-winarm64-gpl-shared-7.1.zip", "zip"),
    },
    unsupported={
        MACOS_ARM64: "no vendor shared build for macOS; install one (e.g. `brew install ffmpeg`)",
        MACOS_X64: "no vendor shared build for macOS; install one (e.g. `brew install ffmpeg`)",
    },
)

# MinGit (Windows only, when no git is found). The x64 build also serves Windows on Arm,
# which runs x64 programs under emulation.
MINGIT = ToolPin(
    tool="git",
    version="2.47.1.2",
    minimum="2.25.0",
    base_url="https://github.com/git-for-windows/git/releases/download/v2.47.1.windows.2",
    mirror_env="AITK_MINGIT_MIRROR",
    checksum_source="none pinned",
    unverified_reason=(
        "Git for Windows publishes SHA-256 sums in its GitHub release notes, which could "
        "not be reached when this pin was made"
    ),
    max_download=128 * MIB,
    max_unpacked=512 * MIB,
    artefacts={
        WINDOWS_X64: Artefact("MinGit-2.47.1.2-64-bit.zip", "zip"),
        WINDOWS_ARM64: Artefact("MinGit-2.47.1.2-64-bit.zip", "zip"),
    },
    unsupported={
        plat: "git is not provisioned outside Windows; install it with the system's "
              "package manager"
        for plat in (LINUX_X64, LINUX_ARM64, MACOS_ARM64, MACOS_X64)
    },
)

PINS: Mapping[str, ToolPin] = {
    pin.tool: pin for pin in (UV, NODE, FFMPEG, FFMPEG_SHARED, MINGIT)}
