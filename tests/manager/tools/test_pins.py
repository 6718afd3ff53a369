"""The pins table: every platform maps to the right artefact; no moving URLs; every
artefact either has a digest, a vendor list, or a stated reason and an opt-in."""

from __future__ import annotations

import re

import pytest

from manager.tools.lifecycle import Settings, current_platform
from manager.tools.pins import (
    LINUX_ARM64,
    LINUX_X64,
    MACOS_ARM64,
    MACOS_X64,
    PINS,
    PLATFORMS,
    WINDOWS_ARM64,
    WINDOWS_X64,
)


@pytest.mark.parametrize(("system", "machine", "plat"), [
    ("Linux", "x86_64", LINUX_X64), ("Linux", "aarch64", LINUX_ARM64),
    ("Darwin", "arm64", MACOS_ARM64), ("Darwin", "x86_64", MACOS_X64),
    ("Windows", "AMD64", WINDOWS_X64), ("Windows", "ARM64", WINDOWS_ARM64),
])
def test_current_platform_normalises(system, machine, plat):
    assert current_platform(system, machine) == plat


EXPECTED = {
    LINUX_X64: {"uv": "manylinux_2_17_x86_64", "node": "node-v22.12.0-linux-x64.tar.xz",
                "ffmpeg": "manylinux_2_28_x86_64",
                "ffmpeg-shared": "-linux64-gpl-shared-", "git": None},
    LINUX_ARM64: {"uv": "manylinux_2_17_aarch64", "node": "node-v22.12.0-linux-arm64.tar.xz",
                  "ffmpeg": "manylinux_2_28_aarch64",
                  "ffmpeg-shared": "-linuxarm64-gpl-shared-", "git": None},
    MACOS_ARM64: {"uv": "macosx_11_0_arm64", "node": "node-v22.12.0-darwin-arm64.tar.gz",
                  "ffmpeg": "macosx_12_0_arm64", "ffmpeg-shared": None, "git": None},
    MACOS_X64: {"uv": "macosx_10_12_x86_64", "node": "node-v22.12.0-darwin-x64.tar.gz",
                "ffmpeg": "macosx_10_13_x86_64", "ffmpeg-shared": None, "git": None},
    WINDOWS_X64: {"uv": "win_amd64", "node": "node-v22.12.0-win-x64.zip",
                  "ffmpeg": "-win_amd64.whl", "ffmpeg-shared": "-win64-gpl-shared-",
                  "git": "MinGit-2.47.1.2-64-bit.zip"},
    WINDOWS_ARM64: {"uv": "win_arm64", "node": "node-v22.12.0-win-arm64.zip",
                    "ffmpeg": "-win_arm64.whl", "ffmpeg-shared": "-winarm64-gpl-shared-",
                    "git": "MinGit-2.47.1.2-64-bit.zip"},
}


@pytest.mark.parametrize("plat", PLATFORMS)
def test_platform_table_maps_to_the_right_artefacts(plat):
    for tool, expected in EXPECTED[plat].items():
        art = PINS[tool].artefact(plat)
        if expected is None:
            assert art is None and PINS[tool].unsupported[plat]
        else:
            assert art is not None and expected in art.filename, (tool, plat)


def test_every_artefact_is_pinned_and_verifiable_or_says_why():
    for pin in PINS.values():
        assert "latest" not in pin.base_url
        for art in pin.artefacts.values():
            assert "latest" not in art.path
            if art.kind == "wheel":  # <package>-<version>-...: one release of the package
                assert re.fullmatch(r"\d+(\.\d+)+", art.filename.split("-")[1]), art.path
            else:
                assert pin.version.split(".")[0] in art.path
            if art.sha256 is not None:
                assert re.fullmatch(r"[0-9a-f]{64}", art.sha256)
            elif pin.checksum_list is None:
                assert pin.unverified_reason, pin.tool
        assert set(pin.artefacts).isdisjoint(pin.unsupported)


def test_uv_wheels_carry_the_index_digests():
    # Every uv artefact comes from PyPI with its published digest and size.
    for art in PINS["uv"].artefacts.values():
        assert art.kind == "wheel" and art.sha256 and art.size
        assert art.filename.startswith("uv-0.13.9-py3-none-")


def test_settings_from_environment():
    env = {"AITK_NODE_MIRROR": "http://127.0.0.1:1/dist/",
           "AITK_ALLOW_UNVERIFIED": "ffmpeg, MinGit"}
    settings = Settings.from_env(env, PINS)
    assert settings.mirrors == {"node": "http://127.0.0.1:1/dist/"}
    assert settings.allow_unverified == {"ffmpeg", "git"}
    node = PINS["node"]
    assert settings.url(node, "v1/x.tar.xz") == "http://127.0.0.1:1/dist/v1/x.tar.xz"
    assert Settings().url(node, "v1/x") == "https://nodejs.org/dist/v1/x"
