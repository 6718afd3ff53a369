"""The built-in archs and their descriptions, read without torch (aitk.models.catalog):
lookups by name and alias, the helpers the schema and preflight call, the one-line
registration, and agreement with upstream's derivation tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aitk.config import upstream_keys
from aitk.errors import UnknownArchError
from aitk.models import builtin, catalog, registry

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_static_builtin_archs_match_the_registry():
    found = registry.discover(include_repo_extensions=False)
    assert catalog.builtin_archs() == set(found.models)


def test_extension_packages_are_seen(tmp_path):
    assert not catalog.has_extensions(tmp_path)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "__init__.py").write_text("")
    assert catalog.has_extensions(tmp_path)


def test_catalog_answers_without_importing_torch() -> None:
    """Listing, describing and checking archs imports no torch, diffusers or transformers
    (in a fresh interpreter: this one has them loaded already)."""
    script = """
import json, sys
from aitk.models import catalog
out = {
    "archs": sorted(catalog.builtin_archs()),
    "names": [d.name for d in catalog.descriptions()],
    "flex1": catalog.description("flex1").name,
    "kwargs": catalog.validate_model_kwargs("flux", {"max_seq_len": 3}),
    "schedulers": list(catalog.noise_schedulers("sdxl")),
    "multiple": catalog.size_multiple("qwen_image"),
    "heavy": sorted(m for m in ("torch", "diffusers", "transformers") if m in sys.modules),
}
print(json.dumps(out))
"""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["heavy"] == []
    assert "example" in out["archs"] and "flex1" in out["archs"]
    assert out["flex1"] == "flux" and out["multiple"] == 32
    assert out["schedulers"][0] == "ddpm"
    assert out["kwargs"] == ["model.model_kwargs.max_seq_len: not a knob of arch flux; its "
                             "model_kwargs: max_sequence_length"]


def test_each_folder_is_registered_by_one_line() -> None:
    """The arch folders are exactly those listed in builtin.ARCH_FOLDERS, each with an
    arch.py; every description's class lives in its own folder."""
    models = REPO_ROOT / "aitk" / "models"
    folders = {p.parent.name for p in models.glob("*/arch.py")}
    assert folders == set(builtin.ARCH_FOLDERS)
    assert len(builtin.ARCH_FOLDERS) == len(set(builtin.ARCH_FOLDERS))
    for folder in builtin.ARCH_FOLDERS:
        module = __import__(f"aitk.models.{folder}.arch", fromlist=["DESCRIPTIONS"])
        for desc in module.DESCRIPTIONS:
            assert desc.model_class.startswith(f"aitk.models.{folder}."), desc.name


def test_names_and_aliases_resolve_and_are_unique() -> None:
    names = [n for d in catalog.descriptions() for n in d.names]
    assert len(names) == len(set(names)) and set(names) == catalog.builtin_archs()
    assert catalog.description("flex1") is catalog.description("flux")
    assert list(catalog.builtin_descriptions()) == [d.name for d in catalog.descriptions()]
    with pytest.raises(UnknownArchError, match="unknown model arch 'fluxx'; known archs: "):
        catalog.description("fluxx")


def test_validate_model_kwargs_names_the_key_and_the_valid_ones() -> None:
    assert catalog.validate_model_kwargs("flux", {"max_sequence_length": 256}) == []
    assert catalog.validate_model_kwargs("flux", None) == []
    assert catalog.validate_model_kwargs("qwen_image", {"match_target_res": True}) == [
        "model.model_kwargs.match_target_res: not a knob of arch qwen_image; its "
        "model_kwargs: none"]
    assert catalog.validate_model_kwargs("flux2_klein_4b", {"shift_steps": 0}) == [
        "model.model_kwargs.shift_steps: Input should be greater than or equal to 1"]
    assert catalog.validate_model_kwargs(
        "wan22_14b", {"train_high_noise": False, "train_low_noise": False}) == [
        "model.model_kwargs: train_high_noise and train_low_noise are both false; train at "
        "least one expert"]
    with pytest.raises(UnknownArchError):
        catalog.validate_model_kwargs("not_an_arch", {})


def test_upstreams_own_form_values_pass() -> None:
    """What upstream's job form writes into model_kwargs for these archs is accepted."""
    assert catalog.validate_model_kwargs("flux2_klein_9b", {"match_target_res": False}) == []
    assert catalog.validate_model_kwargs("flux2_klein_9b", {"match_target_res": True})
    assert catalog.validate_model_kwargs("qwen_image_edit_plus",
                                         {"match_target_res": False}) == []
    assert catalog.validate_model_kwargs(
        "wan22_14b_i2v", {"train_high_noise": True, "train_low_noise": True}) == []


def test_noise_schedulers_and_size_multiples() -> None:
    for desc in catalog.descriptions():
        names = catalog.noise_schedulers(desc.name)
        assert names[0] == desc.schedule.kind
        if desc.schedule.kind == "flowmatch":
            assert names == ("flowmatch",)
        else:  # upstream's SDXL form writes ddpm; its example comments euler_a, lms
            assert {"ddpm", "euler_a", "lms"} <= set(names) and "flowmatch" not in names
    assert catalog.size_multiple("sdxl") == 32
    assert catalog.size_multiple("flux2_klein") == 16
    with pytest.raises(UnknownArchError):
        catalog.size_multiple("nope")


def test_flags_and_aliases_agree_with_upstreams_derivation() -> None:
    """upstream_keys derives `model.arch` from upstream's `is_*` flags and aliases; each
    built-in arch's description names the same ones (until that table reads these)."""
    for flag, arch in upstream_keys.ARCH_FLAGS:
        if arch in catalog.builtin_archs():
            assert flag in catalog.description(arch).upstream_flags, (flag, arch)
    for desc in catalog.descriptions():
        for flag in desc.upstream_flags:
            assert (flag, desc.name) in upstream_keys.ARCH_FLAGS
        for alias in desc.aliases:
            assert upstream_keys.ARCH_ALIASES[alias] == desc.name
    for alias, arch in upstream_keys.ARCH_ALIASES.items():
        if arch in catalog.builtin_archs():
            assert alias in catalog.description(arch).aliases
