"""The `qwen_image_edit` and `qwen_image_edit_plus` archs on tiny random models built
locally: load, train an edit LoRA on control pairs, preview with ctrl_img, Ctrl+C and
exact resume, interop with diffusers' QwenImageEditPipeline / QwenImageEditPlusPipeline
(`load_lora_weights` on the saved file gives the trainer's own preview), the text
encoder seeing the control image as diffusers' pipelines show it, and edit_plus with two
references.

The pipelines encode a preview's control image at about 1 MP (their
`calculate_dimensions(1024 * 1024, ...)`); these tests shrink that to 64 x 64 pixels in
both pipeline modules (the trainer's previews and diffusers' runs alike), so a preview
takes a fraction of a second instead of ~10 s of tiny-VAE work.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from PIL import Image

from aitk.adapters import AdapterNetwork
from aitk.cli.run import main as cli_main
from aitk.config.loading import REPO_ROOT
from aitk.data.batch import DataBatch
from aitk.data.controls import load_sample_controls
from aitk.models.base import GenerateImageConfig
from aitk.models.qwen_image.model import run_pipeline
from aitk.models.qwen_image_edit.model import QwenImageEditModel, QwenImageEditPlusModel
from aitk.models.qwen_image_edit.vision import VisionTextInputs, resized
from tests.aitk.models.arch_checks import (
    STEPS,
    amplified,
    assert_checkpointing_keeps_the_lora_gradients,
    assert_ctrl_c_then_resume_matches,
    assert_hub_id_offline_is_one_line,
    assert_loaded_lora_reproduces,
    assert_lora_file,
    image_array,
    load_tiny,
    run_to_the_end,
    tiny_model_folder,
    write_edit_job,
)
from tests.aitk.models.conftest import NetCfg
from tests.aitk.models.pipeline_checks import (
    arch_pipeline_render,
)

pytestmark = pytest.mark.slow

DATA = REPO_ROOT / "datasets" / "example_edit"
CTRL = DATA / "control" / "circle_to_red.png"
CTRL_2 = DATA / "control_2" / "circle_to_red.png"
SMALL_AREA = 64 * 64

edit_dir = tiny_model_folder(QwenImageEditModel)
plus_dir = tiny_model_folder(QwenImageEditPlusModel)


@pytest.fixture(scope="module", autouse=True)
def small_pipeline_controls():
    """The pipelines' control images at SMALL_AREA instead of 1 MP (module docstring)."""
    from diffusers.pipelines.qwenimage import (
        pipeline_qwenimage_edit as edit,
    )
    from diffusers.pipelines.qwenimage import (
        pipeline_qwenimage_edit_plus as plus,
    )

    def dims(target_area: float, ratio: float) -> tuple[int, int]:
        width = math.sqrt(min(target_area, SMALL_AREA) * ratio)
        return round(width / 32) * 32, round(width / ratio / 32) * 32

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(edit, "calculate_dimensions", lambda a, r: (*dims(a, r), None))
        mp.setattr(plus, "calculate_dimensions", dims)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # see conftest.one_torch_thread; restored for later modules
        yield
        torch.set_num_threads(threads)


def edit_job(tmp: Path, model_dir: Path, name: str = "e", **overrides: Any) -> Path:
    return write_edit_job(
        tmp, name, "qwen_image_edit", model_dir,
        pairs=[{"folder_path": str(DATA), "control_path": str(DATA / "control"),
                "resolution": [32], "caption_dropout_rate": 0.3}],
        samples=[{"prompt": "make the circle red", "ctrl_img": str(CTRL)}],
        guidance_scale=1.0, **overrides)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, edit_dir: Path) -> Path:
    return run_to_the_end(edit_job(tmp_path_factory.mktemp("edit-run"), edit_dir))


def loaded(model_dir: Path, cls=QwenImageEditModel, **kwargs) -> QwenImageEditModel:
    return load_tiny(cls, model_dir, **kwargs)


def test_load_keeps_the_vision_tower_and_reads_the_processor(edit_dir: Path):
    model = loaded(edit_dir)
    assert model.text_encoder.model.visual is not None
    assert model.processor.image_processor.size["longest_edge"] == 112 * 112
    assert model.get_bucket_divisibility() == 32


def test_trains_an_edit_lora_and_previews_with_ctrl_img(trained: Path):
    assert_lora_file(trained / "e.safetensors", "diffusion_model.transformer_blocks.",
                     "qwen_image_edit")
    sample = trained / "samples" / f"{STEPS:09d}_0.png"
    assert Image.open(sample).size == (32, 32)


def test_ctrl_c_then_resume_gives_the_uninterrupted_weights(tmp_path: Path, edit_dir: Path,
                                                            trained: Path, monkeypatch):
    path = edit_job(tmp_path, edit_dir, sample={"sample_every": 100, "samples": [
        {"prompt": "make the circle red", "ctrl_img": str(CTRL)}]})
    assert_ctrl_c_then_resume_matches(path, trained, monkeypatch, argv=("--name", "e"))


def test_the_prediction_is_the_noisy_part_and_reads_the_control(edit_dir: Path):
    model = loaded(edit_dir)
    ctrl = torch.rand(1, 3, 32, 32)
    latents = model.encode_images(torch.rand(1, 3, 32, 32) * 2 - 1)
    embeds = model.get_prompt_embeds(["make it red"], control_images=[ctrl])

    def predict(control: torch.Tensor) -> torch.Tensor:
        batch = DataBatch(captions=["x"], latents=latents, prompt_embeds=embeds,
                          control_tensor=control, control_tensor_list=[control])
        packed = model.condition_noisy_latents(latents, batch)
        assert packed.shape == (1, 2 * 2 * 2, 16)  # 4 noisy + 4 control tokens
        with torch.no_grad():
            return model.get_noise_prediction(packed, torch.tensor([500.0]), embeds,
                                              batch=batch)

    first = predict(ctrl)
    assert first.shape == latents.shape
    assert not torch.allclose(first, predict(1 - ctrl))


def test_text_embeddings_match_the_pipelines_encode_prompt(edit_dir: Path, plus_dir: Path):
    """The trainer's prompt embeds (edit template, control image through the vision
    tower, system tokens dropped) equal diffusers' own encode_prompt given the same
    inputs (its processor: ours, as transformers' needs torchvision)."""
    from diffusers import QwenImageEditPipeline, QwenImageEditPlusPipeline

    controls = load_sample_controls([str(CTRL), str(CTRL_2)])
    for cls, pipe_cls, folder, count in (
            (QwenImageEditModel, QwenImageEditPipeline, edit_dir, 1),
            (QwenImageEditPlusModel, QwenImageEditPlusPipeline, plus_dir, 2)):
        model = loaded(folder, cls)
        ours = model.get_prompt_embeds(["make the circle red"],
                                       control_images=controls[:count]).text_embeds[0]
        pipe = pipe_cls.from_pretrained(folder, processor=None, dtype=torch.float32)
        pipe.processor = VisionTextInputs(pipe.tokenizer, model.processor.image_processor)
        pipe.prompt_template_encode_start_idx = model.template_drop  # 64 for the real one
        images = [resized(Image.open(p).convert("RGB"), model.condition_area)
                  for p in (CTRL, CTRL_2)[:count]]
        theirs, _ = pipe.encode_prompt("make the circle red",
                                       image=images[0] if count == 1 else images,
                                       device=torch.device("cpu"))
        assert ours.shape == theirs[0].shape and ours.shape[0] > 16  # image tokens kept
        assert torch.allclose(ours, theirs[0], atol=1e-5)


def interop(model_dir: Path, lora: Path, cls, pipe_cls, gen: GenerateImageConfig,
            image) -> None:
    model = loaded(model_dir, cls)
    AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=8.0)).load_file(lora)
    ours = image_array(model.generate_images([gen])[0])
    controls = load_sample_controls(gen.ctrl_imgs)
    cond = model.get_prompt_embeds([gen.prompt], control_images=controls)
    uncond = model.get_prompt_embeds([gen.negative_prompt], control_images=controls)

    pipe = pipe_cls.from_pretrained(model_dir, text_encoder=None, tokenizer=None,
                                    processor=None, dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    theirs = arch_pipeline_render(run_pipeline, pipe, gen, cond, uncond, image=image)
    assert_loaded_lora_reproduces(ours, pipe, lora, theirs)


def test_diffusers_edit_pipeline_with_the_lora_reproduces_the_trainer_preview(
        edit_dir: Path, trained: Path, tmp_path: Path):
    from diffusers import QwenImageEditPipeline

    lora = amplified(trained / "e.safetensors", tmp_path / "strong.safetensors")
    gen = GenerateImageConfig(prompt="make the circle red", width=32, height=32,
                              sample_steps=3, seed=5, guidance_scale=1.0,
                              ctrl_img=str(CTRL), ctrl_imgs=[str(CTRL)])
    interop(edit_dir, lora, QwenImageEditModel, QwenImageEditPipeline, gen,
            Image.open(CTRL).convert("RGB"))


def test_edit_plus_trains_with_two_references_and_matches_its_pipeline(plus_dir: Path,
                                                                      tmp_path: Path):
    from diffusers import QwenImageEditPlusPipeline

    path = edit_job(tmp_path, plus_dir, name="p",
                    model={"arch": "qwen_image_edit_plus", "name_or_path": str(plus_dir),
                           "model_kwargs": {"match_target_res": True}},
                    datasets=[{"folder_path": str(DATA),
                               "control_path": [str(DATA / "control"),
                                                str(DATA / "control_2")],
                               "resolution": [32]}],
                    sample={"sample_every": STEPS, "width": 32, "height": 32,
                            "sample_steps": 2, "format": "png", "guidance_scale": 1.0,
                            "samples": [{"prompt": "make the circle red",
                                         "ctrl_img_1": str(CTRL), "ctrl_img_2": str(CTRL_2)}]})
    assert cli_main([str(path)]) == 0
    out = tmp_path / "out" / "p"
    assert (out / "samples" / f"{STEPS:09d}_0.png").exists()

    model = loaded(plus_dir, QwenImageEditPlusModel, model_kwargs={"match_target_res": True})
    ctrl = [torch.rand(2, 3, 32, 32), torch.rand(2, 3, 32, 32)]
    latents = model.encode_images(torch.rand(2, 3, 32, 32) * 2 - 1)
    batch = DataBatch(captions=["a", "b"], latents=latents, control_tensor=ctrl[0],
                      control_tensor_list=ctrl,
                      prompt_embeds=model.get_prompt_embeds(["a", "b"], control_images=ctrl))
    assert model.condition_noisy_latents(latents, batch).shape[1] == 3 * 4  # 1 + 2 refs

    gen = GenerateImageConfig(prompt="make the circle red", width=32, height=32,
                              sample_steps=3, seed=5, guidance_scale=1.0,
                              ctrl_img=str(CTRL), ctrl_imgs=[str(CTRL), str(CTRL_2)])
    lora = amplified(out / "p.safetensors", tmp_path / "strong.safetensors")
    interop(plus_dir, lora, QwenImageEditPlusModel, QwenImageEditPlusPipeline, gen,
            [Image.open(CTRL).convert("RGB"), Image.open(CTRL_2).convert("RGB")])


def test_a_preview_without_ctrl_img_is_a_clear_error(edit_dir: Path):
    from aitk.errors import ModelError

    model = loaded(edit_dir)
    with pytest.raises(ModelError, match="ctrl_img"):
        model.generate_images([GenerateImageConfig(prompt="x", width=32, height=32)])


def test_gradient_checkpointing_gives_the_same_lora_gradients_with_controls(edit_dir: Path):
    def control_batch(model: QwenImageEditModel) -> DataBatch:
        ctrl = torch.rand(2, 3, 32, 32)
        return DataBatch(captions=["a", "b"], control_tensor=ctrl, control_tensor_list=[ctrl],
                         latents=model.encode_images(torch.rand(2, 3, 32, 32) * 2 - 1),
                         prompt_embeds=model.get_prompt_embeds(["a", "b"],
                                                               control_images=[ctrl]))

    assert_checkpointing_keeps_the_lora_gradients(loaded(edit_dir), control_batch, reached=any)


def test_quantize_te_leaves_the_vision_tower_in_float(edit_dir: Path):
    from aitk.models.quantize import is_quantized

    model = loaded(edit_dir, quantize_te=True, qtype_te="qint8")
    assert is_quantized(model.text_encoder.model.language_model)
    assert not is_quantized(model.text_encoder.model.visual)
    embeds = model.get_prompt_embeds(["x"], control_images=[torch.rand(1, 3, 32, 32)])
    assert torch.isfinite(embeds.text_embeds[0]).all()


def test_hub_id_offline_is_one_line_exit_2(tmp_path: Path, edit_dir: Path, hub_offline,
                                           capsys):
    path = edit_job(tmp_path, edit_dir, model={"arch": "qwen_image_edit",
                                               "name_or_path": "Qwen/Qwen-Image-Edit"})
    assert_hub_id_offline_is_one_line(path, "Qwen/Qwen-Image-Edit", capsys, says=())
