"""The `krea2` arch on a tiny random Krea 2 model built locally: load, train with LoRA,
preview, Ctrl+C and exact resume, the LoRA layout ComfyUI maps (Krea's own module names,
alpha folded in), interop with diffusers' Krea2Pipeline (`load_lora_weights` on the
saved file gives the trainer's own preview), the pipeline-exact prompt states, gradient
checkpointing, quantization, the Turbo training adapter (merged for training, taken out
for previews), upstream's `krea2:turbo` tag, the refused edit mode and the offline hub
error."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from aitk.adapters import AdapterNetwork
from aitk.errors import ModelKwargsError, ModelLoadError
from aitk.models.krea2 import lora_keys
from aitk.models.krea2.arch import TURBO_ADAPTER
from aitk.models.krea2.model import Krea2Model, run_pipeline
from tests.aitk.models.arch_checks import (
    ALPHA,
    STEPS,
    amplified,
    assert_a_step_reaches_only_the_lora,
    assert_adapter_merged_for_training_and_out_of_previews,
    assert_checkpointing_keeps_the_lora_gradients,
    assert_ctrl_c_then_resume_matches,
    assert_hub_id_offline_is_one_line,
    assert_loaded_lora_reproduces,
    image_batch,
    load_tiny,
    model_cfg,
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

krea2_dir = tiny_model_folder(Krea2Model)

# ComfyUI runs Krea 2 from Krea's own checkpoint, whose weights are named
# `diffusion_model.blocks.N.attn.wq.weight` and so on; comfy/lora.py model_lora_keys_unet
# maps every `diffusion_model.<module>` of a LoRA file onto the model's
# `diffusion_model.<module>.weight` (its generic rule), with lora_A/lora_B and alpha =
# rank when the file has no `.alpha`. Inside a transformer block, diffusers' module ->
# Krea's (the names of diffusers' own single-file converter for Krea 2 checkpoints):
COMFY_BLOCK_KEYS = {
    "attn.to_q": "attn.wq",
    "attn.to_k": "attn.wk",
    "attn.to_v": "attn.wv",
    "attn.to_out.0": "attn.wo",
    "attn.to_gate": "attn.gate",
    "ff.gate": "mlp.gate",
    "ff.up": "mlp.up",
    "ff.down": "mlp.down",
}


def krea2_job(tmp: Path, model_dir: Path, name: str = "k", **overrides: Any) -> Path:
    return write_flow_job(tmp, name, "krea2", model_dir, "shift", 2.0, **overrides)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, krea2_dir: Path) -> Path:
    return run_to_the_end(krea2_job(tmp_path_factory.mktemp("krea2-run"), krea2_dir))


def loaded_model(model_dir: Path, **cfg: Any) -> Krea2Model:
    return load_tiny(Krea2Model, model_dir, **cfg)


# ---- the job end to end, and the file it writes -------------------------------------------
def test_trains_previews_and_writes_the_layout_comfyui_maps(trained: Path, krea2_dir: Path):
    from diffusers import Krea2Transformer2DModel
    from diffusers.loaders.single_file_utils import (
        convert_krea2_transformer_checkpoint_to_diffusers,
    )

    weights = load_file(trained / "k.safetensors")
    assert (trained / "samples" / f"{STEPS:09d}_0.png").is_file()
    assert all(k.startswith("diffusion_model.") and k.endswith((".lora_A.weight",
                                                                 ".lora_B.weight"))
               for k in weights)  # no `.alpha`: diffusers' Krea 2 loader refuses it
    modules = {k.removeprefix("diffusion_model.").rsplit(".lora_", 1)[0] for k in weights}
    # Every Linear of the tiny model's one transformer block, in Krea's names.
    assert modules == {f"blocks.0.{name}" for name in COMFY_BLOCK_KEYS.values()}
    # Each is a weight of Krea's checkpoint: diffusers' converter of those checkpoints
    # takes `<module>.weight` to the Linear the LoRA trained.
    transformer = Krea2Transformer2DModel.from_pretrained(krea2_dir / "transformer")
    ours = dict(transformer.named_parameters())
    for diffusers_name, krea_name in COMFY_BLOCK_KEYS.items():
        converted = convert_krea2_transformer_checkpoint_to_diffusers(
            {f"blocks.0.{krea_name}.weight": torch.zeros(1)})
        assert list(converted) == [f"transformer_blocks.0.{diffusers_name}.weight"]
        assert f"transformer_blocks.0.{diffusers_name}.weight" in ours


def test_alpha_is_folded_into_the_up_weights(trained: Path):
    """rank 4, alpha 8: the file's up weights carry the factor 2 that loaders assuming
    alpha = rank (diffusers, ComfyUI without `.alpha`) then apply as trained; read back,
    each module gets alpha = rank and the same delta."""
    internal = {"m.lora_A.weight": torch.randn(4, 6), "m.lora_B.weight": torch.randn(5, 4),
                "m.alpha": torch.tensor(float(ALPHA))}
    written = lora_keys.to_file({k.replace("m.", "transformer_blocks.0.attn.to_q."): v
                                 for k, v in internal.items()})
    up = written["diffusion_model.blocks.0.attn.wq.lora_B.weight"]
    assert torch.allclose(up, internal["m.lora_B.weight"] * ALPHA / 4)
    back = lora_keys.from_file(written)
    assert float(back["transformer_blocks.0.attn.to_q.alpha"]) == 4.0
    assert torch.equal(back["transformer_blocks.0.attn.to_q.lora_B.weight"], up)


def test_ctrl_c_then_resume_gives_the_uninterrupted_weights(tmp_path: Path, krea2_dir: Path,
                                                            trained: Path, monkeypatch):
    assert_ctrl_c_then_resume_matches(krea2_job(tmp_path, krea2_dir), trained, monkeypatch)


def test_diffusers_load_lora_weights_reproduces_the_trainer_preview(krea2_dir: Path,
                                                                     trained: Path,
                                                                     tmp_path: Path):
    from diffusers import Krea2Pipeline

    lora = amplified(trained / "k.safetensors", tmp_path / "strong.safetensors")
    # guidance 2: the pipeline's zero-based CFG at scale 1 against the negative prompt.
    gen = interop_preview()
    ours, embeds = trainer_preview(loaded_model(krea2_dir), lora, gen)
    pipe = float32_pipeline(Krea2Pipeline, krea2_dir)
    theirs = arch_pipeline_render(run_pipeline, pipe, gen, embeds[gen.prompt], embeds[""])
    assert_loaded_lora_reproduces(ours, pipe, lora, theirs)


# ---- what the arch's edges do ------------------------------------------------------------
def test_prompt_embeds_are_the_pipelines_tapped_states(krea2_dir: Path):
    from diffusers import Krea2Pipeline

    model = loaded_model(krea2_dir)
    prompts = ["a red circle", "a much longer prompt about a cat"]
    embeds = model.get_prompt_embeds(prompts)
    pipe = Krea2Pipeline.from_pretrained(krea2_dir)
    states, mask = pipe.get_text_hidden_states(prompts, max_sequence_length=512,
                                               device=torch.device("cpu"))
    assert states.shape[2] == 3  # the tiny pipeline taps 3 layers
    lengths = [t.shape[0] for t in embeds.text_embeds]
    assert lengths[0] < lengths[1]  # each at its own length, no padding kept
    for i, ours in enumerate(embeds.text_embeds):
        assert torch.allclose(ours, states[i][mask[i]].flatten(1), atol=1e-5)
    assert model.text_encoder.visual is None  # text to image: no vision tower


def test_training_forward_is_the_transformers_call_on_the_pipelines_packing(krea2_dir: Path):
    """aitk's time is Krea 2's (t = 1 noise, velocity noise - clean): the transformer
    gets t / 1000 and the latents packed and position-id'd as Krea2Pipeline does."""
    from diffusers import Krea2Pipeline

    model = loaded_model(krea2_dir)
    latents = torch.randn(2, 4, 4, 6, generator=torch.Generator().manual_seed(2))
    embeds = model.get_prompt_embeds(["a red circle", "blue"])
    context, mask = embeds.pad("text_embeds")
    pipe = Krea2Pipeline.from_pretrained(krea2_dir)
    packed = pipe._pack_latents(latents, 2, 4, 4, 6)
    with torch.no_grad():
        ours = model.get_noise_prediction(latents, torch.tensor([250.0, 800.0]), embeds)
        raw = model.model(hidden_states=packed,
                          encoder_hidden_states=context.view(2, -1, 3, 32),
                          timestep=torch.tensor([0.25, 0.8]),
                          position_ids=pipe.prepare_position_ids(context.shape[1], 2, 3,
                                                                 torch.device("cpu")),
                          encoder_attention_mask=mask, return_dict=False)[0]
    assert torch.allclose(pipe._pack_latents(ours, 2, 4, 4, 6), raw, atol=1e-6)
    assert model.get_bucket_divisibility() == 16


def test_training_shift_is_the_schedulers_dynamic_exponential_one(krea2_dir: Path):
    from types import SimpleNamespace

    model = loaded_model(krea2_dir)
    model.configure_training(SimpleNamespace(timestep_type="shift"))
    shift = model.training_schedule.shift
    assert shift.dynamic and shift.exponential
    assert (shift.base_seq_len, shift.max_seq_len) == (256, 6400)
    assert (shift.base_shift, shift.max_shift) == (0.5, 1.15)


def test_turbo_previews_use_the_pipelines_distilled_schedule(krea2_dir: Path,
                                                             tmp_path: Path):
    turbo_dir = tmp_path / "turbo"
    shutil.copytree(krea2_dir, turbo_dir)
    index = turbo_dir / "model_index.json"
    index.write_text(json.dumps({**json.loads(index.read_text()), "is_distilled": True}))
    turbo = loaded_model(turbo_dir)
    assert turbo.is_distilled and not loaded_model(krea2_dir).is_distilled
    assert turbo.get_generation_pipeline().config.is_distilled


def test_gradient_checkpointing_gives_the_same_lora_gradients(krea2_dir: Path):
    assert_checkpointing_keeps_the_lora_gradients(loaded_model(krea2_dir), image_batch)


def test_quantized_transformer_trains_only_the_lora(krea2_dir: Path):
    from aitk.models.quantize import is_quantized

    model = loaded_model(krea2_dir, quantize=True, qtype="qint8")
    assert is_quantized(model.model.transformer_blocks)
    for kept in (model.model.img_in, model.model.time_embed, model.model.final_layer,
                 model.model.text_fusion.projector):
        assert not is_quantized(kept)
    network = AdapterNetwork.attach(model, NetCfg())
    assert_a_step_reaches_only_the_lora(model, network, image_batch(model, 1))


# ---- the training adapter (Turbo) ----------------------------------------------------------
def write_adapter(model: Krea2Model, path: Path) -> Path:
    """A de-distillation adapter shaped like upstream's: `diffusion_model.` + Krea's
    names (a block's layer and a text-fusion one), rank 2, no alpha (alpha = rank)."""
    gen = torch.Generator().manual_seed(9)
    weights = {}
    for krea, diffusers_name in (("blocks.0.attn.wk", "transformer_blocks.0.attn.to_k"),
                                 ("txtfusion.refiner_blocks.0.mlp.down",
                                  "text_fusion.refiner_blocks.0.ff.down")):
        layer = model.model.get_submodule(diffusers_name)
        weights[f"diffusion_model.{krea}.lora_A.weight"] = torch.randn(
            2, layer.in_features, generator=gen) * 0.3
        weights[f"diffusion_model.{krea}.lora_B.weight"] = torch.randn(
            layer.out_features, 2, generator=gen) * 0.3
    save_file(weights, str(path))
    return path


def test_training_adapter_is_merged_for_training_and_out_of_the_previews(krea2_dir: Path,
                                                                         tmp_path: Path):
    plain = loaded_model(krea2_dir)
    adapter = write_adapter(plain, tmp_path / "adapter.safetensors")
    turbo = loaded_model(krea2_dir, assistant_lora_path=str(adapter))
    weights = load_file(adapter)
    down = weights["diffusion_model.blocks.0.attn.wk.lora_A.weight"]
    up = weights["diffusion_model.blocks.0.attn.wk.lora_B.weight"]
    assert_adapter_merged_for_training_and_out_of_previews(
        plain, turbo, "transformer_blocks.0.attn.to_k", down, up)


def test_training_adapter_offline_is_one_line(krea2_dir: Path, tmp_path: Path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    with pytest.raises(ModelLoadError) as info:
        loaded_model(krea2_dir, assistant_lora_path=TURBO_ADAPTER)
    line = str(info.value)
    assert "\n" not in line and "ostris/krea2_turbo_training_adapter" in line


# ---- upstream's tags and knobs -------------------------------------------------------------
def tagged_job(tmp_path: Path, krea2_dir: Path, arch: str, **model: Any) -> Any:
    return tagged_process(tmp_path, krea2_dir, arch, **model)


def test_the_turbo_tag_fills_in_its_adapter_and_sampling(tmp_path: Path, krea2_dir: Path):
    turbo = tagged_process(tmp_path, krea2_dir, "krea2:turbo")
    assert turbo.model.arch == "krea2"
    assert turbo.model.name_or_path == "krea/Krea-2-Turbo"
    assert turbo.model.assistant_lora_path == TURBO_ADAPTER
    assert (turbo.sample.guidance_scale, turbo.sample.sample_steps) == (1.0, 9)
    raw = tagged_process(tmp_path, krea2_dir, "krea2:raw")
    assert raw.model.name_or_path == "krea/Krea-2-Raw"
    assert raw.model.assistant_lora_path is None


def test_upstream_edit_mode_is_refused_in_one_line(krea2_dir: Path):
    with pytest.raises(ModelKwargsError) as info:
        Krea2Model(model_cfg("krea2", krea2_dir, model_kwargs={"edit": True}))
    assert "edit training is not supported" in str(info.value)
    Krea2Model(model_cfg("krea2", krea2_dir, model_kwargs={"edit": False}))


def test_hub_id_offline_is_one_line_exit_2(tmp_path: Path, krea2_dir: Path, hub_offline,
                                           capsys):
    hub_id = "krea/Krea-2-Raw"
    path = krea2_job(tmp_path, krea2_dir, model={"arch": "krea2", "name_or_path": hub_id})
    assert_hub_id_offline_is_one_line(path, hub_id, capsys)


def test_a_single_krea_checkpoint_file_is_one_line(tmp_path: Path):
    """Upstream also loads Krea's own `raw.safetensors`; aitk takes the diffusers layout
    and says so before reading any weights."""
    single = tmp_path / "raw.safetensors"
    save_file({"first.weight": torch.zeros(2, 2)}, str(single))
    with pytest.raises(ModelLoadError, match="is a single file") as info:
        loaded_model(single)
    assert "\n" not in str(info.value)
