"""Upstream AI Toolkit's example configs for the other job kinds, as data: the keys and
values of `config/examples/extract.example.yml`, `generate.example.yaml`,
`mod_lora_scale.yaml`, `train_slider.example.yml`, `train_full_fine_tune_flex.yaml`,
`train_full_fine_tune_lumina.yaml`, `train_flex_redux.yaml` (their comments dropped)
and the concept slider upstream's web UI writes. `localized(name, paths)` swaps what
points at the user's machine (model paths, devices, dataset and output folders) and
nothing else.
"""

from __future__ import annotations

import copy
from typing import Any

from tests.aitk.upstream_corpus import _ui_job

META = {"name": "[name]", "version": "1.0"}
PROMPTS_10 = [
    "woman with red hair, playing chess at the park, bomb going off in the background",
    "a woman holding a coffee cup, in a beanie, sitting at a cafe",
    "a horse is a DJ at a night club, fish eye lens, smoke machine, lazer lights, holding "
    "a martini",
    "a man showing off his cool new t shirt at the beach, a shark is jumping out of the "
    "water in the background",
    "a bear building a log cabin in the snow covered mountains",
    "woman playing the guitar, on stage, singing a song, laser lights, punk rocker",
    "hipster man with a beard, building a chair, in a wood shop",
    "photo of a man, white background, medium shot, modeling clothing, studio lighting, "
    "white backdrop",
    "a man holding a sign that says, 'this is a sign'",
    "a bulldog, in a post apocalyptic world, with a shotgun, in a leather jacket, in a "
    "desert, with a motorcycle",
]

EXTRACT = {"job": "extract", "config": {
    "name": "name_of_your_model", "base_model": "/path/to/base/model.safetensors",
    "extract_model": "/path/to/model/to/extract/trained.safetensors",
    "output_folder": "/path/to/output/folder", "is_v2": False, "dtype": "fp16",
    "device": "cpu",
    "process": [
        {"type": "locon", "filename": "[name]_64_32.safetensors", "dtype": "fp16",
         "mode": "fixed", "linear": 64, "conv": 32},
        {"type": "locon", "output_path": "/absolute/path/for/this/output.safetensors",
         "mode": "ratio", "linear": 0.2, "conv": 0.2},
        {"type": "locon", "filename": "[name]_ratio_02.safetensors", "mode": "quantile",
         "linear": 0.5, "conv": 0.5},
        {"type": "lora", "filename": "[name]_4.safetensors", "mode": "fixed", "linear": 4},
        {"type": "lora", "filename": "[name]_q05.safetensors", "mode": "quantile",
         "linear": 0.5}]},
    "meta": {"name": "[name]", "description": "A short description of your model",
             "trigger_words": ["put", "trigger", "words", "here"], "version": "0.1",
             "creator": {"name": "Your Name", "email": "your@email.com",
                         "website": "https://yourwebsite.com"},
             "any": "All meta data above is arbitrary, it can be whatever you want."}}

GENERATE = {"job": "generate", "config": {"name": "generate", "process": [{
    "type": "to_folder", "output_folder": "output/gen", "device": "cuda:0",
    "generate": {"sampler": "ddpm", "width": 1024, "height": 1024,
                 "neg": "cartoon, fake, drawing, illustration, cgi, animated, anime",
                 "seed": -1, "guidance_scale": 7, "sample_steps": 20, "ext": ".png",
                 "prompt_file": False,
                 "prompts": ["photo of batman", "photo of superman", "photo of spiderman",
                             "photo of a superhero --n batman superman spiderman"]},
    "model": {"name_or_path": "/mnt/Models/stable-diffusion/models/stable-diffusion/Ostris/"
                              "Ostris_Real_v1.safetensors",
              "is_v2": False, "is_v_pred": False, "is_xl": False, "dtype": "bf16"}}]}}

MOD = {"job": "mod", "config": {"name": "name_of_your_model_v1", "process": [{
    "type": "rescale_lora", "input_path": "/path/to/lora/lora.safetensors",
    "output_path": "/path/to/lora/output_lora_v1.safetensors", "replace_meta": True,
    "scale_target": "up_down", "save_dtype": "fp16", "current_weight": 6.0,
    "target_weight": 1.0, "is_xl": False, "is_v2": False}]},
    "meta": {"name": "[name]", "description": "A short description of your lora",
             "trigger_words": ["put", "trigger", "words", "here"], "version": "0.1",
             "creator": {"name": "Your Name", "email": "your@email.com",
                         "website": "https://yourwebsite.com"},
             "any": "All meta data above is arbitrary, it can be whatever you want."}}

_SLIDER_PROMPTS = [
    f"{p} --m {m}" for p in ("a woman in a coffee shop, black hat, blonde hair, blue jacket",)
    for m in (-5, -3, 3, 5)] + [
    "a golden retriever sitting on a leather couch, --m -5",
    "a golden retriever sitting on a leather couch --m -3",
    "a golden retriever sitting on a leather couch --m 3",
    "a golden retriever sitting on a leather couch --m 5"] + [
    f"a man with a beard and red flannel shirt, wearing vr goggles, walking into traffic "
    f"--m {m}" for m in (-5, -3, 3, 5)]

SLIDER = {"job": "train", "config": {
    "name": "detail_slider_v1", "training_folder": "output/LoRA", "device": "cuda:0",
    "log_dir": "output/.tensorboard",
    "process": [{
        "type": "slider",
        "network": {"type": "lierla", "linear": 8, "linear_alpha": 4},
        "train": {"noise_scheduler": "ddpm", "steps": 500, "lr": 2e-4,
                  "gradient_checkpointing": True, "train_unet": True,
                  "train_text_encoder": False, "min_snr_gamma": 5.0, "optimizer": "adamw",
                  "lr_scheduler": "constant", "max_denoising_steps": 40, "batch_size": 1,
                  "dtype": "bf16", "noise_offset": 0.0},
        "model": {"name_or_path": "runwayml/stable-diffusion-v1-5", "is_v2": False,
                  "is_v_pred": False, "is_xl": False},
        "save": {"dtype": "float16", "save_every": 50, "max_step_saves_to_keep": 2},
        "sample": {"sampler": "ddpm", "sample_every": 20, "width": 512, "height": 512,
                   "prompts": _SLIDER_PROMPTS,
                   "neg": "cartoon, fake, drawing, illustration, cgi, animated, anime, "
                          "monochrome",
                   "seed": 42, "walk_seed": False, "guidance_scale": 7, "sample_steps": 20,
                   "network_multiplier": 1.0},
        "logging": {"log_every": 10, "use_wandb": False, "verbose": False},
        "slider": {"resolutions": [[512, 512]], "batch_full_slide": True, "targets": [{
            "target_class": "",
            "positive": "high detail, 8k, intricate, detailed, high resolution, high res, "
                        "high quality",
            "negative": "blurry, boring, fuzzy, low detail, low resolution, low res, low "
                        "quality",
            "weight": 1.0, "shuffle": True}]}}]},
    "meta": {"name": "[name]"}}


def _full_fine_tune(name: str, train: dict[str, Any], model: dict[str, Any],
                    prompts: list[str], **process: Any) -> dict[str, Any]:
    return {"job": "extension", "config": {"name": name, "process": [{
        "type": "sd_trainer", "training_folder": "output", "device": "cuda:0",
        "save": {"dtype": "bf16", "save_every": 250, "max_step_saves_to_keep": 2,
                 "save_format": "diffusers"},
        "datasets": [{"folder_path": "/path/to/images/folder", "caption_ext": "txt",
                      "caption_dropout_rate": 0.05, "shuffle_tokens": False,
                      "resolution": [512, 768, 1024]}],
        "train": {"batch_size": 1, "steps": 2000, "gradient_accumulation": 1,
                  "train_unet": True, "train_text_encoder": False,
                  "gradient_checkpointing": True, "noise_scheduler": "flowmatch",
                  "optimizer": "adafactor", "lr": 3e-5, "dtype": "bf16", **train},
        "model": model,
        "sample": {"sampler": "flowmatch", "sample_every": 250, "sample_start_step": 0,
                   "width": 1024, "height": 1024, "prompts": prompts, "neg": "",
                   "seed": 42, "walk_seed": True, "guidance_scale": 4, "sample_steps": 25},
        **process}]}, "meta": dict(META)}


FULL_FINE_TUNE_FLEX = _full_fine_tune(
    "my_first_flex_finetune_v1",
    {"bypass_guidance_embedding": True, "timestep_type": "sigmoid",
     "ema_config": {"use_ema": True, "ema_decay": 0.99}},
    {"name_or_path": "ostris/Flex.1-alpha", "is_flux": True, "quantize_te": True,
     "only_if_contains": ["transformer.transformer_blocks.",
                          "transformer.single_transformer_blocks."]},
    PROMPTS_10)

_LUMINA_PROMPTS = [*PROMPTS_10[:7], (
    "photo of a cat that is half black and half orange tabby, split down the middle. The "
    "cat has on a blue tophat. They are holding a martini glass with a pink ball of yarn "
    "in it with green knitting needles sticking out, in one paw. In the other paw, they "
    "are holding a DVD case for a movie titled, \"This is a test\" that has a golden robot "
    "on it. In the background is a busy night club with a giant mushroom man dancing with "
    "a bear."), *PROMPTS_10[8:]]
FULL_FINE_TUNE_LUMINA = _full_fine_tune(
    "my_first_lumina_finetune_v1", {"timestep_type": "lumina2_shift"},
    {"name_or_path": "Alpha-VLLM/Lumina-Image-2.0", "is_lumina2": True,
     "quantize_te": True}, _LUMINA_PROMPTS)

FLEX_REDUX = _full_fine_tune(
    "my_first_flex_redux_finetune_v1",
    {"batch_size": 3, "gradient_accumulation": 2, "unload_text_encoder": True,
     "loss_type": "mse", "steps": 4000000, "content_or_style": "balanced",
     "timestep_type": "flux_shift", "optimizer": "adamw8bit", "lr": 1e-4,
     "bypass_guidance_embedding": True, "ema_config": {"use_ema": True, "ema_decay": 0.99}},
    {"name_or_path": "ostris/Flex.1-alpha", "is_flux": True, "quantize": True,
     "text_encoder_bits": 8},
    [*PROMPTS_10[:5], "", "", "", "", ""],
    adapter={"type": "redux",
             "name_or_path": "/local/path/to/redux_adapter_to_finetune.safetensors",
             "image_encoder_path": "google/siglip2-so400m-patch16-512",
             "image_encoder_arch": "siglip2",
             "test_img_path": [f"/path/to/x_{i:02d}.jpg" for i in range(1, 11)],
             "clip_layer": "last_hidden_state", "train": True})
_redux = FLEX_REDUX["config"]["process"][0]
_redux["save"] = {"dtype": "bf16", "save_every": 250, "max_step_saves_to_keep": 4}
_redux["datasets"][0] = {"folder_path": "/path/to/images/folder",
                         "clip_image_path": "/path/to/control/images/folder",
                         "caption_ext": "txt", "caption_dropout_rate": 0.05,
                         "resolution": [512, 768, 1024]}
_redux["sample"]["network_multiplier"] = 1.0

UI_CONCEPT_SLIDER = _ui_job(
    "flex1", "ostris/Flex.1-alpha", kind="concept_slider",
    slider={"guidance_strength": 3.0, "anchor_strength": 1.0,
            "positive_prompt": "person who is happy", "negative_prompt": "person who is sad",
            "target_class": "person", "anchor_class": ""})

EXAMPLES: dict[str, dict[str, Any]] = {
    "extract": EXTRACT, "generate": GENERATE, "mod_lora_scale": MOD,
    "train_slider": SLIDER, "full_fine_tune_flex": FULL_FINE_TUNE_FLEX,
    "full_fine_tune_lumina": FULL_FINE_TUNE_LUMINA, "flex_redux": FLEX_REDUX,
    "ui_concept_slider": UI_CONCEPT_SLIDER,
}


def localized(name: str, paths: dict[str, str]) -> dict[str, Any]:
    """The example with what points at the user's machine swapped for `paths`:
    model (model, base, tuned), device, dataset, out (outputs), lora (an input LoRA)."""
    config = copy.deepcopy(EXAMPLES[name])
    section = config["config"]
    if "base_model" in section:  # extract
        section.update(base_model=paths["base"], extract_model=paths["tuned"],
                       output_folder=paths["out"], device=paths["device"])
    if "training_folder" in section:
        section.update(training_folder=paths["out"], device=paths["device"])
    for proc in section["process"]:
        if proc.get("output_path", "").startswith("/absolute/"):
            proc["output_path"] = f"{paths['out']}/absolute_output.safetensors"
        if proc.get("type") == "rescale_lora":
            proc.update(input_path=paths["lora"],
                        output_path=f"{paths['out']}/output_lora_v1.safetensors")
        if "model" in proc:
            proc["model"]["name_or_path"] = paths["model"]
        if "device" in proc:
            proc["device"] = paths["device"]
        if "output_folder" in proc:
            proc["output_folder"] = paths["out"]
        if "training_folder" in proc:
            proc["training_folder"] = paths["out"]
        for ds in proc.get("datasets", []):
            ds["folder_path"] = paths["dataset"]
    return config
