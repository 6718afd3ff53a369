"""The `ideogram4` arch on a tiny random Ideogram 4 model built locally: load, train with
LoRA, preview, Ctrl+C and exact resume, the LoRA file layout (upstream ai-toolkit's:
`diffusion_model.` + Ideogram's names, q / k / v fused, alpha folded in) and interop with
diffusers' Ideogram4Pipeline (`load_lora_weights` on the saved file renders the
trainer's own preview, the pipeline encoding the prompt itself), the time conversion at
the arch's edge (aitk's sigma and noise - clean against Ideogram's 0 = noise time and
clean - noise velocity: the prediction is what the pipeline's own scheduler step uses),
the pipeline-exact prompt features, gradient checkpointing, quantization, the
unconditional transformer kept out of training and the offline hub error.

ComfyUI: no Ideogram 4 LoRA mapping is known (none found in ComfyUI's lora key code),
so there is no ComfyUI key table to check here; the written layout is upstream's, the
one diffusers converts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from aitk.adapters import AdapterNetwork
from aitk.models.base import GenerateImageConfig
from aitk.models.ideogram4 import lora_keys
from aitk.models.ideogram4.model import Ideogram4Model, start_noise
from tests.aitk.models.arch_checks import (
    ALPHA,
    STEPS,
    amplified,
    assert_a_step_reaches_only_the_lora,
    assert_checkpointing_keeps_the_lora_gradients,
    assert_ctrl_c_then_resume_matches,
    assert_hub_id_offline_is_one_line,
    assert_loaded_lora_reproduces,
    image_array,
    image_batch,
    load_tiny,
    run_to_the_end,
    tiny_model_folder,
    train_cfg,
    write_flow_job,
)
from tests.aitk.models.conftest import NetCfg
from tests.aitk.models.pipeline_checks import (
    float32_pipeline,
    interop_preview,
    trainer_preview,
)

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

ideogram4_dir = tiny_model_folder(Ideogram4Model)

# Inside a block, the LoRA file's (Ideogram's) modules and the diffusers ones each feeds
# after diffusers' conversion (_convert_non_diffusers_ideogram4_lora_to_diffusers).
FILE_MODULES = {
    "attention.qkv": ("attention.to_q", "attention.to_k", "attention.to_v"),
    "attention.o": ("attention.to_out.0",),
    "feed_forward.w1": ("feed_forward.w1",),
    "feed_forward.w2": ("feed_forward.w2",),
    "feed_forward.w3": ("feed_forward.w3",),
    "adaln_modulation": ("adaln_modulation",),
}
SEQUENCE = 64  # the stock pipeline's text region in these tests (prompts are shorter)


def ideogram4_job(tmp: Path, model_dir: Path, name: str = "i", **overrides: Any) -> Path:
    return write_flow_job(tmp, name, "ideogram4", model_dir, "linear", 2.0, **overrides)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, ideogram4_dir: Path) -> Path:
    return run_to_the_end(ideogram4_job(tmp_path_factory.mktemp("ideogram4-run"),
                                        ideogram4_dir))


def loaded_model(model_dir: Path, **cfg: Any) -> Ideogram4Model:
    return load_tiny(Ideogram4Model, model_dir, **cfg)


def stock_pipeline(model_dir: Path) -> Any:
    from diffusers import Ideogram4Pipeline

    return float32_pipeline(Ideogram4Pipeline, model_dir)


# ---- the job end to end, and the file it writes -------------------------------------------
def test_trains_previews_and_writes_upstreams_layout(trained: Path):
    from diffusers.loaders.lora_conversion_utils import (
        _convert_non_diffusers_ideogram4_lora_to_diffusers,
    )

    weights = load_file(trained / "i.safetensors")
    assert (trained / "samples" / f"{STEPS:09d}_0.png").is_file()
    assert all(k.startswith("diffusion_model.layers.0.") and k.endswith(
        (".lora_A.weight", ".lora_B.weight")) for k in weights)  # no `.alpha`
    modules = {k.removeprefix("diffusion_model.layers.0.").rsplit(".lora_", 1)[0]
               for k in weights}
    assert modules == set(FILE_MODULES)
    # q / k / v as one fused LoRA of three times the rank (4), the others at rank 4.
    assert weights["diffusion_model.layers.0.attention.qkv.lora_A.weight"].shape[0] == 12
    assert weights["diffusion_model.layers.0.attention.o.lora_A.weight"].shape[0] == 4
    converted = _convert_non_diffusers_ideogram4_lora_to_diffusers(dict(weights))
    assert {k.removeprefix("transformer.layers.0.").rsplit(".lora_", 1)[0]
            for k in converted} == {m for ms in FILE_MODULES.values() for m in ms}


def lora_delta(weights: dict[str, torch.Tensor], module: str) -> torch.Tensor:
    down, up = weights[f"{module}.lora_A.weight"], weights[f"{module}.lora_B.weight"]
    alpha = weights.get(f"{module}.alpha")
    scale = 1.0 if alpha is None else float(alpha) / down.shape[0]
    return up @ down * scale


def test_fused_qkv_with_alpha_folded_is_each_projections_exact_delta():
    """rank 4, alpha 8: what diffusers' conversion gives to_q / to_k / to_v (and o) of
    the written file is exactly each trained LoRA's delta (scale alpha / rank), and
    reading the file back gives the trained rank-4 adapters."""
    gen = torch.Generator().manual_seed(0)
    internal = {}
    for name in ("to_q", "to_k", "to_v", "to_out.0"):
        module = f"layers.0.attention.{name}"
        internal[f"{module}.lora_A.weight"] = torch.randn(4, 6, generator=gen)
        internal[f"{module}.lora_B.weight"] = torch.randn(6, 4, generator=gen)
        internal[f"{module}.alpha"] = torch.tensor(float(ALPHA))
    from diffusers.loaders.lora_conversion_utils import (
        _convert_non_diffusers_ideogram4_lora_to_diffusers,
    )

    written = lora_keys.to_file(internal)
    assert not any(k.endswith(".alpha") for k in written)
    theirs = _convert_non_diffusers_ideogram4_lora_to_diffusers(dict(written))
    back = lora_keys.from_file(written)
    for name in ("to_q", "to_k", "to_v", "to_out.0"):
        module = f"layers.0.attention.{name}"
        want = lora_delta(internal, module)
        assert torch.allclose(lora_delta(theirs, f"transformer.{module}"), want, atol=1e-5)
        assert back[f"{module}.lora_A.weight"].shape == (4, 6)
        assert torch.allclose(lora_delta(back, module), want, atol=1e-5)


def test_a_partly_trained_qkv_is_written_with_zeros_and_read_back_as_trained():
    """A LoRA on to_q alone (network_kwargs picking layers): the fused file carries
    zero members for k and v, which reading back drops, so a resume finds the adapter
    it saved."""
    gen = torch.Generator().manual_seed(2)
    internal = {"layers.0.attention.to_q.lora_A.weight": torch.randn(4, 6, generator=gen),
                "layers.0.attention.to_q.lora_B.weight": torch.randn(6, 4, generator=gen),
                "layers.0.attention.to_q.alpha": torch.tensor(4.0)}
    written = lora_keys.to_file(internal)
    assert written["diffusion_model.layers.0.attention.qkv.lora_B.weight"].shape == (18, 12)
    back = lora_keys.from_file(written)
    assert set(back) == set(internal)
    assert all(torch.equal(back[k], v) for k, v in internal.items())


def test_upstreams_shared_down_qkv_reads_back():
    """Upstream ai-toolkit's own files: one down of rank r shared by q, k and v (its
    fused Linear), an up of 3 x out rows and `.alpha`: each projection gets the shared
    down and its third of the up, at the file's alpha."""
    gen = torch.Generator().manual_seed(1)
    down, up = torch.randn(4, 6, generator=gen), torch.randn(18, 4, generator=gen)
    file = {"diffusion_model.layers.0.attention.qkv.lora_A.weight": down,
            "diffusion_model.layers.0.attention.qkv.lora_B.weight": up,
            "diffusion_model.layers.0.attention.qkv.alpha": torch.tensor(2.0),
            "diffusion_model.layers.0.attention.o.lora_A.weight": torch.randn(4, 6),
            "diffusion_model.layers.0.attention.o.lora_B.weight": torch.randn(6, 4)}
    back = lora_keys.from_file(file)
    for i, name in enumerate(("to_q", "to_k", "to_v")):
        module = f"layers.0.attention.{name}"
        assert torch.equal(back[f"{module}.lora_A.weight"], down)
        assert torch.equal(back[f"{module}.lora_B.weight"], up[6 * i:6 * (i + 1)])
        assert float(back[f"{module}.alpha"]) == 2.0
    assert float(back["layers.0.attention.to_out.0.alpha"]) == 4.0  # no key: alpha = rank


def test_ctrl_c_then_resume_gives_the_uninterrupted_weights(tmp_path: Path,
                                                            ideogram4_dir: Path,
                                                            trained: Path, monkeypatch):
    assert_ctrl_c_then_resume_matches(ideogram4_job(tmp_path, ideogram4_dir), trained,
                                      monkeypatch)


def test_diffusers_load_lora_weights_reproduces_the_trainer_preview(ideogram4_dir: Path,
                                                                     trained: Path,
                                                                     tmp_path: Path):
    """The stock pipeline, encoding the prompt itself and left-padding it to 64 tokens,
    after `load_lora_weights` of the trainer's file, renders the trainer's preview (made
    from the trainer's embeds, the text encoder not consulted)."""
    lora = amplified(trained / "i.safetensors", tmp_path / "strong.safetensors")
    gen = interop_preview()
    ours, _ = trainer_preview(loaded_model(ideogram4_dir), lora, gen, cached_text=True)
    pipe = stock_pipeline(ideogram4_dir)

    def theirs() -> np.ndarray:
        noise = start_noise(pipe, gen, torch.Generator().manual_seed(gen.seed))
        return image_array(pipe(gen.prompt, height=32, width=32, num_inference_steps=3,
                                guidance_scale=2.0, guidance_schedule=None,
                                max_sequence_length=SEQUENCE, latents=noise).images[0])

    assert_loaded_lora_reproduces(ours, pipe, lora, theirs)


# ---- what the arch's edges do ------------------------------------------------------------
def test_prompt_embeds_are_the_pipelines_text_features(ideogram4_dir: Path):
    model = loaded_model(ideogram4_dir)
    prompts = ["a red circle", "a much longer prompt about a cat"]
    embeds = model.get_prompt_embeds(prompts)
    pipe = stock_pipeline(ideogram4_dir)
    features, _, _, indicator = pipe.encode_prompt(prompts, 2, 2, SEQUENCE,
                                                   torch.device("cpu"))
    lengths = [t.shape[0] for t in embeds.text_embeds]
    assert lengths[0] < lengths[1]  # each at its own length, no padding kept
    for i, ours in enumerate(embeds.text_embeds):
        text = indicator[i, :SEQUENCE] == 3  # LLM_TOKEN_INDICATOR: the real tokens
        assert int(text.sum()) == lengths[i]
        assert torch.allclose(ours, features[i, :SEQUENCE][text], atol=1e-5)
    assert model.text_encoder.visual is None  # text to image: no vision tower
    # model_kwargs.max_text_length (upstream's knob): longer prompts are cut there.
    short = loaded_model(ideogram4_dir, model_kwargs={"max_text_length": 10})
    [cut] = short.get_prompt_embeds(prompts[1:]).text_embeds
    assert torch.allclose(cut, embeds.text_embeds[1][:10], atol=1e-5)


def test_prediction_is_what_the_pipelines_scheduler_step_uses(ideogram4_dir: Path,
                                                             monkeypatch):
    """The time conversion, held to the pipeline itself: at its first step (guidance 1,
    the conditional velocity alone) the pipeline hands `scheduler.step` the model
    output -v at its timestep t (sigma x 1000, model time 1 - sigma); aitk's
    prediction on the same latents and t is that output (noise - clean)."""
    model = loaded_model(ideogram4_dir)
    pipe = stock_pipeline(ideogram4_dir)
    seen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
    step = pipe.scheduler.step

    def watched(output: torch.Tensor, t: torch.Tensor, sample: torch.Tensor, **kw: Any):
        seen.append((output.clone(), t.clone(), sample.clone()))
        return step(output, t, sample, **kw)

    monkeypatch.setattr(pipe.scheduler, "step", watched)
    noise = torch.randn(1, 4, 16, generator=torch.Generator().manual_seed(4))
    pipe("a red circle", height=32, width=32, num_inference_steps=2, guidance_scale=1.0,
         guidance_schedule=None, max_sequence_length=SEQUENCE, latents=noise,
         output_type="latent")
    output, t, sample = seen[0]
    assert 0 < float(t) < 1000 and float(t) > float(seen[1][1])  # sigma-scaled, falling
    latents = sample.reshape(1, 2, 2, 16).permute(0, 3, 1, 2)  # (B, 128-like, gh, gw)
    with torch.no_grad():
        ours = model.get_noise_prediction(latents, t.reshape(1),
                                          model.get_prompt_embeds(["a red circle"]))
    assert torch.allclose(ours.permute(0, 2, 3, 1).reshape(1, 4, 16), output, atol=1e-5)
    assert model.get_bucket_divisibility() == 16


def test_training_shift_is_upstreams_fixed_shift_of_one(ideogram4_dir: Path):
    """Upstream trains Ideogram 4 with a scheduler of shift 1, no dynamic shift (the
    pipeline samples on its own logit-normal sigmas): `shift` timesteps are unshifted."""
    model = loaded_model(ideogram4_dir)
    model.configure_training(train_cfg(timestep_type="shift"))
    shift = model.training_schedule.shift
    assert shift.shift == 1.0 and not shift.dynamic


def test_latents_round_trip_through_the_pipelines_decode(ideogram4_dir: Path):
    """encode_images is the inverse of the pipeline's latent decode (BatchNorm
    denormalisation, Ideogram's patch order): decoding our latents as the pipeline does
    gives our decode."""
    model = loaded_model(ideogram4_dir)
    pipe = stock_pipeline(ideogram4_dir)
    pixels = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(3)) * 2 - 1
    latents = model.encode_images(pixels)
    tokens = latents.permute(0, 2, 3, 1).reshape(1, 4, 16)
    mean = pipe.vae.bn.running_mean.view(1, 1, -1)
    std = torch.sqrt(pipe.vae.bn.running_var + pipe.vae.config.batch_norm_eps).view(1, 1, -1)
    z = (tokens * std + mean).view(1, 2, 2, 2, 2, 4).permute(0, 5, 1, 3, 2, 4)
    z = z.reshape(1, 4, 4, 4)
    with torch.no_grad():
        direct = pipe.vae.encode(pixels).latent_dist.mode()
        assert torch.allclose(z, direct, atol=1e-5)
        assert torch.allclose(model.decode_latents(latents), pipe.vae.decode(z).sample,
                              atol=1e-5)


def test_gradient_checkpointing_gives_the_same_lora_gradients(ideogram4_dir: Path):
    assert_checkpointing_keeps_the_lora_gradients(loaded_model(ideogram4_dir), image_batch)


def test_quantized_transformers_train_only_the_lora(ideogram4_dir: Path):
    from aitk.models.quantize import is_quantized

    model = loaded_model(ideogram4_dir, quantize=True, qtype="qint8", quantize_te=True,
                         qtype_te="qint8")
    assert is_quantized(model.text_encoder.language_model.layers)
    for transformer in (model.model, model.unconditional_transformer):
        assert is_quantized(transformer.layers)
        for kept in (transformer.input_proj, transformer.llm_cond_proj,
                     transformer.final_layer):
            assert not is_quantized(kept)
    network = AdapterNetwork.attach(model, NetCfg())
    assert_a_step_reaches_only_the_lora(model, network, image_batch(model, 1))


def test_the_unconditional_transformer_is_only_for_guidance(ideogram4_dir: Path,
                                                           monkeypatch):
    """The LoRA attaches to `transformer` only; the unconditional transformer stays
    frozen, idle (BaseModel's idle placement: the CPU under low_vram) and runs in
    previews, where guidance blends it in."""
    placed: dict[str, list[Any]] = {}
    place = Ideogram4Model.place_loaded

    def spy(self: Ideogram4Model, working: Any, idle: Any = ()) -> None:
        placed.update(working=list(working), idle=list(idle))
        place(self, placed["working"], placed["idle"])

    monkeypatch.setattr(Ideogram4Model, "place_loaded", spy)
    model = loaded_model(ideogram4_dir, low_vram=True)
    uncond = model.unconditional_transformer
    assert uncond is not model.model
    assert [m is uncond for m in placed["idle"]].count(True) == 1
    assert [m is model.model for m in placed["working"]] == [True]
    assert next(uncond.parameters()).device == model.idle_device == torch.device("cpu")
    before = {k: v.clone() for k, v in uncond.state_dict().items()}
    network = AdapterNetwork.attach(model, NetCfg())
    assert not any("lora" in n for n, _ in uncond.named_parameters())
    assert not any(p.requires_grad for p in uncond.parameters())
    assert_a_step_reaches_only_the_lora(model, network, image_batch(model, 1))
    assert all(torch.equal(v, before[k]) for k, v in uncond.state_dict().items())
    gen = dict(prompt="a red circle", width=32, height=32, sample_steps=2, seed=2)
    cond_only, guided = (image_array(model.generate_images(
        [GenerateImageConfig(**gen, guidance_scale=g)])[0]) for g in (1.0, 3.0))
    assert np.abs(cond_only - guided).max() > 4 / 255


def test_hub_id_offline_is_one_line_exit_2(tmp_path: Path, ideogram4_dir: Path,
                                           hub_offline, capsys):
    hub_id = "ideogram-ai/ideogram-v4"
    path = ideogram4_job(tmp_path, ideogram4_dir,
                         model={"arch": "ideogram4", "name_or_path": hub_id})
    assert_hub_id_offline_is_one_line(path, hub_id, capsys)
