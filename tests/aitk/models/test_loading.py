"""aitk.models.loading: the one folder-or-hub loader every built-in arch goes through. Each
way a source can be wrong is one ModelLoadError line that names the arch loading it (so
flux_kontext, which loads like flux, says flux_kontext), the part and what to do."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from aitk.errors import ModelLoadError
from aitk.models.flux_kontext.model import FluxKontextModel
from aitk.models.loading import check_source, freeze, load_part, load_part_config

PARTS = ("transformer", "text_encoder", "vae")


class Loads:
    """A part class whose from_pretrained records its call or raises `error`."""

    calls: list[tuple[Any, dict[str, Any]]] = []
    error: Exception | None = None

    @classmethod
    def from_pretrained(cls, path: Any, **kwargs: Any) -> str:
        if cls.error is not None:
            raise cls.error
        cls.calls.append((path, kwargs))
        return "part"


@pytest.fixture(autouse=True)
def _reset_loads() -> None:
    Loads.calls, Loads.error = [], None


def folder(root: Path, parts: tuple[str, ...]) -> Path:
    for part in parts:
        (root / part).mkdir(parents=True)
    return root


# ---- check_source: before any weights load --------------------------------------------
def test_a_complete_folder_and_a_hub_id_pass(tmp_path: Path) -> None:
    check_source(str(folder(tmp_path / "m", PARTS)), "demo", PARTS)
    check_source("org/name", "demo", PARTS)


def test_a_folder_lacking_parts_names_every_missing_one(tmp_path: Path) -> None:
    root = folder(tmp_path / "m", ("transformer",))
    with pytest.raises(ModelLoadError) as info:
        check_source(str(root), "demo", PARTS)
    assert str(info.value) == (f"demo model folder {root} lacks text_encoder/, vae/ (a "
                               "diffusers demo folder has transformer/, text_encoder/, vae/)")


@pytest.mark.parametrize("name", ["nowhere", "./nowhere", "a/b/c", "~/nowhere-at-all"])
def test_a_path_that_is_not_there_and_not_a_hub_id_does_not_exist(tmp_path: Path,
                                                                  monkeypatch, name) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ModelLoadError) as info:
        check_source(name, "demo", PARTS)
    message = str(info.value)
    assert message.startswith(f"demo model folder {Path(name).expanduser()} "), message
    assert "does not exist" in message
    assert "neither a diffusers model folder nor a hub id" in message


def test_a_single_file_is_refused_with_the_arch_hint(tmp_path: Path) -> None:
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"^demo model .*model\.safetensors is a single "
                       "file; point model.name_or_path at a diffusers demo folder or a hub "
                       r"id \(e\.g\. org/demo\)$"):
        check_source(str(weights), "demo", PARTS, single_file_hint="e.g. org/demo")
    # A file named inside a hub repo is one file too, though it is not here.
    with pytest.raises(ModelLoadError, match="is a single file"):
        check_source("org/repo/one.safetensors", "demo", PARTS)


# ---- load_part: one part ------------------------------------------------------------------
def test_load_part_reads_a_subfolder_or_the_hub_with_the_kwargs(tmp_path: Path) -> None:
    root = folder(tmp_path / "m", PARTS)
    assert load_part(Loads, str(root), "vae", "demo", torch_dtype="f32") == "part"
    assert load_part(Loads, "org/name", "vae", "demo", variant="fp16") == "part"
    assert Loads.calls == [(root / "vae", {"torch_dtype": "f32"}),
                           ("org/name", {"subfolder": "vae", "variant": "fp16"})]


def test_load_part_errors_name_the_arch_the_source_and_the_part(tmp_path: Path) -> None:
    root = folder(tmp_path / "m", ("transformer",))
    with pytest.raises(ModelLoadError, match=f"^demo model folder {root} lacks vae/"):
        load_part(Loads, str(root), "vae", "demo")
    Loads.error = OSError("no file named\ndiffusion_pytorch_model.fp16.safetensors")
    with pytest.raises(ModelLoadError) as info:
        load_part(Loads, str(root), "transformer", "demo")
    assert str(info.value) == (f"cannot load the demo model folder {root} (transformer/): "
                               "no file named diffusion_pytorch_model.fp16.safetensors; "
                               "check the folder")
    with pytest.raises(ModelLoadError) as info:
        load_part(Loads, "org/name", "transformer", "demo")
    message = str(info.value)
    assert message.startswith("cannot load the demo model from hub id 'org/name' "
                              "(transformer/): no file named")
    assert all(hint in message for hint in ("huggingface-cli download", "HF_HUB_OFFLINE",
                                            "HF_TOKEN", "HF_HOME"))
    weights = tmp_path / "one.safetensors"
    weights.write_bytes(b"")
    with pytest.raises(ModelLoadError, match="is a single file"):
        load_part(Loads, str(weights), "transformer", "demo")


def test_load_part_config_reads_only_the_config_with_the_same_checks(tmp_path: Path) -> None:
    class Configs:
        calls: list[tuple[Any, Any]] = []

        @classmethod
        def load_config(cls, path: Any, subfolder: str | None = None) -> dict[str, Any]:
            cls.calls.append((path, subfolder))
            return {"_class_name": "Demo"}

    root = folder(tmp_path / "m", ("scheduler",))
    assert load_part_config(Configs, str(root), "scheduler", "demo") == {"_class_name": "Demo"}
    assert load_part_config(Configs, "org/name", "scheduler", "demo")["_class_name"] == "Demo"
    assert Configs.calls == [(root / "scheduler", None), ("org/name", "scheduler")]
    with pytest.raises(ModelLoadError, match="^demo model folder .* lacks vae/"):
        load_part_config(Configs, str(root), "vae", "demo")


def test_freeze_turns_off_gradients_and_training_mode() -> None:
    import torch

    a, b = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    freeze(a, b)
    assert not any(p.requires_grad for m in (a, b) for p in m.parameters())
    assert not a.training and not b.training


# ---- the arch that loads is the arch the message names ------------------------------------
def kontext_cfg(name_or_path: str) -> SimpleNamespace:
    return SimpleNamespace(arch="flux_kontext", name_or_path=name_or_path, quantize=False,
                           quantize_te=False, qtype="qfloat8", qtype_te="qfloat8",
                           model_kwargs={}, low_vram=False, assistant_lora_path=None)


def test_flux_kontext_load_errors_name_flux_kontext(tmp_path: Path, hub_offline) -> None:
    partial = folder(tmp_path / "partial", ("transformer",))
    for source, start in ((str(partial), "flux_kontext model folder"),
                          (str(tmp_path / "nowhere"), "flux_kontext model folder")):
        with pytest.raises(ModelLoadError) as info:
            FluxKontextModel(kontext_cfg(source)).load_model()
        assert str(info.value).startswith(start), str(info.value)
        assert "Flux " not in str(info.value)

    with pytest.raises(ModelLoadError) as info:
        FluxKontextModel(kontext_cfg("black-forest-labs/FLUX.1-Kontext-dev")).load_model()
    message = str(info.value)
    assert message.startswith("cannot load the flux_kontext model from hub id "
                              "'black-forest-labs/FLUX.1-Kontext-dev'"), message
    assert "Flux " not in message and "\n" not in message
