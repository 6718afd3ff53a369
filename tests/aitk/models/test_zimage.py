"""The `zimage` arch on a tiny random Z-Image model built locally: load, train with LoRA,
preview, Ctrl+C and exact resume, the LoRA layout ComfyUI maps, interop with diffusers'
ZImagePipeline (`load_lora_weights` on the saved file gives the trainer's own preview),
Z-Image's reversed time, gradient checkpointing, quantization, the training adapter
(merged for training, taken out for previews), De-Turbo's parts from
`extras_name_or_path`, upstream's `zimage:turbo` tags and the offline hub error."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from aitk.adapters import AdapterNetwork
from aitk.errors import ModelLoadError
from aitk.models.zimage.arch import TURBO_ADAPTER
from aitk.models.zimage.model import ZImageModel, run_pipeline
from tests.aitk.models.arch_checks import (
    STEPS,
    amplified,
    assert_a_step_reaches_only_the_lora,
    assert_adapter_merged_for_training_and_out_of_previews,
    assert_checkpointing_keeps_the_lora_gradients,
    assert_ctrl_c_then_resume_matches,
    assert_hub_id_offline_is_one_line,
    assert_loaded_lora_reproduces,
    assert_lora_file,
    image_batch,
    load_tiny,
    run_to_the_end,
    tagged_process,
    tiny_model_folder,
    write_flow_job,
)
from tests.aitk.models.conftest import NetCfg
from tests.aitk.models.pipeline_checks import (
    arch_pipeline_render,
    float32_pipeline,
    interop_preview,
    trainer_preview,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

zimage_dir = tiny_model_folder(ZImageModel)

# ComfyUI loads Z-Image as its Lumina2 NextDiT; comfy/lora.py (model_lora_keys_unet,
# `Lumina2`) maps `diffusion_model.` + each diffusers name that comfy/utils.py
# z_image_to_diffusers lists onto NextDiT's own weights. Inside a main layer:
COMFY_LAYER_KEYS = {
    "attention.to_q": "attention.qkv (rows 0..dim)",
    "attention.to_k": "attention.qkv (rows dim..2 dim)",
    "attention.to_v": "attention.qkv (rows 2 dim..3 dim)",
    "attention.to_out.0": "attention.out",
    "feed_forward.w1": "feed_forward.w1",
    "feed_forward.w2": "feed_forward.w2",
    "feed_forward.w3": "feed_forward.w3",
    "adaLN_modulation.0": "adaLN_modulation.0",
}


def zimage_job(tmp: Path, model_dir: Path, name: str = "z", **overrides: Any) -> Path:
    return write_flow_job(tmp, name, "zimage", model_dir, "weighted", 2.0, **overrides)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, zimage_dir: Path) -> Path:
    return run_to_the_end(zimage_job(tmp_path_factory.mktemp("zimage-run"), zimage_dir))


def loaded_model(model_dir: Path, **cfg: Any) -> ZImageModel:
    return load_tiny(ZImageModel, model_dir, **cfg)


# ---- the job end to end, and the file it writes -------------------------------------------
def test_trains_previews_and_writes_the_layout_comfyui_maps(trained: Path, zimage_dir: Path):
    lora = trained / "z.safetensors"
    assert_lora_file(lora, "diffusion_model.layers.", "zimage")
    assert (trained / "samples" / f"{STEPS:09d}_0.png").is_file()
    modules = {k.removeprefix("diffusion_model.").rsplit(".lora_", 1)[0].removesuffix(".alpha")
               for k in load_file(lora)}
    # Every Linear of the tiny model's one main layer, and nothing else.
    assert modules == {f"layers.0.{name}" for name in COMFY_LAYER_KEYS}


def test_ctrl_c_then_resume_gives_the_uninterrupted_weights(tmp_path: Path, zimage_dir: Path,
                                                            trained: Path, monkeypatch):
    assert_ctrl_c_then_resume_matches(zimage_job(tmp_path, zimage_dir), trained, monkeypatch)


def test_diffusers_load_lora_weights_reproduces_the_trainer_preview(zimage_dir: Path,
                                                                     trained: Path,
                                                                     tmp_path: Path):
    from diffusers import ZImagePipeline

    lora = amplified(trained / "z.safetensors", tmp_path / "strong.safetensors")
    # guidance 2: the pipeline's zero-based CFG at scale 1 against the negative prompt.
    gen = interop_preview()
    ours, embeds = trainer_preview(loaded_model(zimage_dir), lora, gen)
    pipe = float32_pipeline(ZImagePipeline, zimage_dir)
    theirs = arch_pipeline_render(run_pipeline, pipe, gen, embeds[gen.prompt], embeds[""])
    assert_loaded_lora_reproduces(ours, pipe, lora, theirs)


# ---- what the arch's edges do ------------------------------------------------------------
def test_prompt_embeds_are_the_pipelines_real_tokens(zimage_dir: Path):
    from diffusers import ZImagePipeline

    model = loaded_model(zimage_dir)
    embeds = model.get_prompt_embeds(["a red circle", "a much longer prompt about a cat"])
    pipe = ZImagePipeline.from_pretrained(zimage_dir)
    theirs, _ = pipe.encode_prompt(["a red circle", "a much longer prompt about a cat"],
                                   do_classifier_free_guidance=False, max_sequence_length=64)
    lengths = [t.shape[0] for t in embeds.text_embeds]
    assert lengths[0] < lengths[1]  # each at its own length, no padding kept
    for ours, pipeline in zip(embeds.text_embeds, theirs, strict=True):
        assert torch.allclose(ours, pipeline, atol=1e-5)


def test_training_forward_is_the_pipelines_call_with_time_reversed(zimage_dir: Path):
    """Z-Image's time runs the other way (1 = clean) and its output is clean - noise:
    at aitk's t the transformer gets (1000 - t) / 1000 and the prediction is negated."""
    model = loaded_model(zimage_dir)
    latents = torch.randn(2, 4, 4, 6, generator=torch.Generator().manual_seed(2))
    embeds = model.get_prompt_embeds(["a red circle", "blue"])
    with torch.no_grad():
        ours = model.get_noise_prediction(latents, torch.tensor([250.0, 800.0]), embeds)
        raw = model.model(list(latents.unsqueeze(2).unbind(0)), torch.tensor([0.75, 0.2]),
                          list(embeds.text_embeds), return_dict=False)[0]
    assert torch.allclose(ours, -torch.stack(raw).squeeze(2), atol=1e-6)
    assert model.get_bucket_divisibility() == 16


def test_training_shift_is_the_schedulers_fixed_shift(zimage_dir: Path):
    from types import SimpleNamespace

    model = loaded_model(zimage_dir)
    model.configure_training(SimpleNamespace(timestep_type="shift"))
    shift = model.training_schedule.shift
    assert not shift.dynamic and shift.shift == 3.0
    assert float(shift.apply(torch.tensor([0.5]), 1024)) == pytest.approx(0.75)


def test_gradient_checkpointing_gives_the_same_lora_gradients(zimage_dir: Path):
    assert_checkpointing_keeps_the_lora_gradients(loaded_model(zimage_dir), image_batch)


def test_quantized_transformer_trains_only_the_lora(zimage_dir: Path):
    from aitk.models.quantize import is_quantized

    model = loaded_model(zimage_dir, quantize=True, qtype="qint8")
    assert is_quantized(model.model)
    assert not is_quantized(model.model.t_embedder)
    assert not is_quantized(model.model.all_final_layer)
    network = AdapterNetwork.attach(model, NetCfg())
    assert_a_step_reaches_only_the_lora(model, network, image_batch(model, 1))


# ---- the training adapter (Turbo) ----------------------------------------------------------
def write_adapter(model: ZImageModel, path: Path, prefix: str = "diffusion_model.") -> Path:
    """A de-distillation adapter shaped like upstream's: `diffusion_model.` + diffusers
    names, rank 2, no alpha (alpha = rank)."""
    gen = torch.Generator().manual_seed(9)
    weights = {}
    for name in ("layers.0.attention.to_k", "layers.0.feed_forward.w2"):
        layer = model.model.get_submodule(name)
        weights[f"{prefix}{name}.lora_A.weight"] = torch.randn(2, layer.in_features,
                                                               generator=gen) * 0.3
        weights[f"{prefix}{name}.lora_B.weight"] = torch.randn(layer.out_features, 2,
                                                               generator=gen) * 0.3
    save_file(weights, str(path))
    return path


def test_training_adapter_is_merged_for_training_and_out_of_the_previews(zimage_dir: Path,
                                                                         tmp_path: Path):
    plain = loaded_model(zimage_dir)
    adapter = write_adapter(plain, tmp_path / "adapter.safetensors")
    turbo = loaded_model(zimage_dir, assistant_lora_path=str(adapter))
    weights = load_file(adapter)
    name = "layers.0.attention.to_k"
    down = weights[f"diffusion_model.{name}.lora_A.weight"]
    up = weights[f"diffusion_model.{name}.lora_B.weight"]
    assert_adapter_merged_for_training_and_out_of_previews(plain, turbo, name, down, up)


def test_training_adapter_errors_are_one_line(zimage_dir: Path, tmp_path: Path, monkeypatch):
    import huggingface_hub.constants

    plain = loaded_model(zimage_dir)
    wrong = tmp_path / "wrong.safetensors"
    save_file({"diffusion_model.layers.0.nope.lora_A.weight": torch.zeros(2, 4),
               "diffusion_model.layers.0.nope.lora_B.weight": torch.zeros(4, 2)}, str(wrong))
    with pytest.raises(ModelLoadError, match="layers.0.nope is not a Linear layer"):
        loaded_model(zimage_dir, assistant_lora_path=str(wrong))
    with pytest.raises(ModelLoadError, match="does not exist"):
        loaded_model(zimage_dir, assistant_lora_path=str(tmp_path / "missing.safetensors"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    with pytest.raises(ModelLoadError) as info:
        loaded_model(zimage_dir, assistant_lora_path=TURBO_ADAPTER)
    line = str(info.value)
    assert "\n" not in line and "ostris/zimage_turbo_training_adapter" in line
    assert "assistant_lora_path" in line and "HF_HUB_OFFLINE" in line
    assert plain.model is not None


# ---- De-Turbo: the transformer alone, the rest from extras_name_or_path -----------------------
def test_a_transformer_only_folder_takes_its_other_parts_from_extras(zimage_dir: Path,
                                                                    tmp_path: Path):
    alone = tmp_path / "deturbo"
    alone.mkdir()
    shutil.copytree(zimage_dir / "transformer", alone / "transformer")
    with pytest.raises(ModelLoadError, match="lacks text_encoder/"):
        loaded_model(alone)
    model = loaded_model(alone, extras_name_or_path=str(zimage_dir))
    full = loaded_model(zimage_dir)
    embeds = full.get_prompt_embeds(["a red circle"])
    assert torch.equal(model.get_prompt_embeds(["a red circle"]).text_embeds[0],
                       embeds.text_embeds[0])
    # A full local folder is used whole, whatever extras_name_or_path says.
    assert loaded_model(zimage_dir, extras_name_or_path=str(alone)).parts_source() == str(
        zimage_dir)


# ---- upstream's tags -----------------------------------------------------------------------
def test_a_tag_picks_its_variants_defaults_where_the_job_is_silent(tmp_path: Path,
                                                                   zimage_dir: Path):
    turbo = tagged_process(tmp_path, zimage_dir, "zimage:turbo")
    assert turbo.model.arch == "zimage"
    assert turbo.model.name_or_path == "Tongyi-MAI/Z-Image-Turbo"
    assert turbo.model.assistant_lora_path == TURBO_ADAPTER
    assert (turbo.sample.guidance_scale, turbo.sample.sample_steps) == (1.0, 9)
    deturbo = tagged_process(tmp_path, zimage_dir, "zimage:deturbo")
    assert deturbo.model.extras_name_or_path == "Tongyi-MAI/Z-Image-Turbo"
    assert deturbo.model.assistant_lora_path is None
    # What the job says wins; a plain `zimage` (or an unknown tag) fills in nothing.
    mine = tagged_process(tmp_path, zimage_dir, "zimage:turbo", name_or_path=str(zimage_dir),
                      assistant_lora_path="mine.safetensors")
    assert mine.model.name_or_path == str(zimage_dir)
    assert mine.model.assistant_lora_path == "mine.safetensors"
    for arch in ("zimage", "zimage:nonsense"):
        plain = tagged_process(tmp_path, zimage_dir, arch, name_or_path=str(zimage_dir))
        assert plain.model.assistant_lora_path is None and plain.sample.sample_steps != 9


def test_hub_id_offline_is_one_line_exit_2(tmp_path: Path, zimage_dir: Path, hub_offline,
                                           capsys):
    hub_id = "Tongyi-MAI/Z-Image-Turbo"
    path = zimage_job(tmp_path, zimage_dir, model={"arch": "zimage", "name_or_path": hub_id})
    assert_hub_id_offline_is_one_line(path, hub_id, capsys,
                                      says=("hub id", "huggingface-cli download"))
