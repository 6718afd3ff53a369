"""The user's index configuration, read as pip does and handed to uv."""

from __future__ import annotations

import os
from pathlib import Path

from manager.indexes import IndexConfig, read_config, torch_index_override, uv_args


def test_pip_files_then_environment(tmp_path: Path) -> None:
    system = tmp_path / "system.conf"
    system.write_text("[global]\nindex-url = https://mirror/simple\n"
                      "extra-index-url = https://a/simple\n  https://b/simple\n"
                      "constraint = /etc/c.txt\n")
    user = tmp_path / "user.conf"
    user.write_text("[install]\nfind_links = /opt/wheels\n")  # pip's spelling too
    env = {"PIP_EXTRA_INDEX_URL": "https://c/simple"}
    config = read_config(env, files=[system, user])
    assert config == IndexConfig(index_url="https://mirror/simple",
                                 extra_index_urls=("https://c/simple",),
                                 find_links=("/opt/wheels",), constraints=("/etc/c.txt",))


def test_devnull_config_file_means_no_files() -> None:
    env = {"PIP_CONFIG_FILE": os.devnull, "PIP_FIND_LINKS": "/w1 /w2", "PIP_NO_INDEX": "1"}
    config = read_config(env)
    assert config.find_links == ("/w1", "/w2") and config.no_index
    assert config.index_url is None and config.constraints == ()


def test_uv_gets_pip_settings_unless_configured_itself() -> None:
    config = IndexConfig(index_url="https://m/simple", extra_index_urls=("https://e/simple",),
                         find_links=("/w",), constraints=("/c.txt",))
    args = uv_args(config, {})
    assert args == ["--default-index", "https://m/simple", "--index", "https://e/simple",
                    "--find-links", "/w", "--constraints", "/c.txt",
                    "--index-strategy", "unsafe-best-match"]
    own = uv_args(config, {"UV_DEFAULT_INDEX": "x", "UV_INDEX": "y", "UV_FIND_LINKS": "z",
                           "UV_CONSTRAINT": "c", "UV_INDEX_STRATEGY": "first-index"})
    assert own == []


def test_torch_index_override() -> None:
    assert torch_index_override({}) == (False, None)
    assert torch_index_override({"AITK_TORCH_INDEX_URL": "pypi"}) == (True, None)
    assert torch_index_override({"AITK_TORCH_INDEX_URL": "https://m/whl/cpu/"}) == (
        True, "https://m/whl/cpu")
