"""Job configs in the shapes the upstream AI Toolkit's examples and its web UI write,
built here as data (one per upstream example kind), so the tests can write them to disk
and run them through `run.py --check` exactly as a user would.

`CORPUS[name] = (config, expected)`: expected is "runs" (validates whenever its arch is
built in), or the start of the single line it must stop with.
"""

from __future__ import annotations

import copy
from typing import Any

DATASET = "/path/to/images/folder"  # replaced by a real fixture folder in the tests


def _sample(**extra: Any) -> dict[str, Any]:
    base = {"sampler": "flowmatch", "sample_every": 250, "width": 1024, "height": 1024,
            "prompts": ["[trigger] holding a sign that says 'I LOVE PROMPTS!'",
                        "woman with red hair, playing chess at the park, [trigger]"],
            "neg": "", "seed": 42, "walk_seed": True, "guidance_scale": 4,
            "sample_steps": 20, "sample_start_step": 0}
    base.update(extra)
    return base


def _trainer(model: dict[str, Any], *, network: dict[str, Any] | None = None,
             train: dict[str, Any] | None = None, sample: dict[str, Any] | None = None,
             dataset: dict[str, Any] | None = None, kind: str = "sd_trainer",
             **process: Any) -> dict[str, Any]:
    proc: dict[str, Any] = {
        "type": kind, "training_folder": "output", "device": "cuda:0",
        "trigger_word": "p3r5on",
        "network": network if network is not None else
        {"type": "lora", "linear": 16, "linear_alpha": 16},
        "save": {"dtype": "float16", "save_every": 250, "max_step_saves_to_keep": 4,
                 "push_to_hub": False},
        "datasets": [{"folder_path": DATASET, "caption_ext": "txt",
                      "caption_dropout_rate": 0.05, "shuffle_tokens": False,
                      "cache_latents_to_disk": True, "resolution": [512, 768, 1024],
                      **(dataset or {})}],
        "train": {"batch_size": 1, "steps": 2000, "gradient_accumulation_steps": 1,
                  "train_unet": True, "train_text_encoder": False,
                  "gradient_checkpointing": True, "noise_scheduler": "flowmatch",
                  "optimizer": "adamw8bit", "lr": 1e-4,
                  "ema_config": {"use_ema": False, "ema_decay": 0.99}, "dtype": "bf16",
                  **(train or {})},
        "model": model,
        "sample": sample if sample is not None else _sample(),
        **process,
    }
    if network is False:  # a full fine-tune has no network section
        del proc["network"]
    return {"job": "extension", "config": {"name": "my_first_lora_v1", "process": [proc]},
            "meta": {"name": "[name]", "version": "1.0"}}


def _ui_job(arch: str, name_or_path: str, kind: str = "diffusion_trainer",
            slider: dict[str, Any] | None = None, **model: Any) -> dict[str, Any]:
    """What the upstream web UI writes for a new job (its defaults; a concept slider
    adds its `slider` section)."""
    proc = {
        "type": kind, "training_folder": "output",
        "sqlite_db_path": "./aitk_db.db", "device": "cuda", "trigger_word": None,
        "performance_log_every": 10,
        "network": {"type": "lora", "linear": 32, "linear_alpha": 32, "conv": 16,
                    "conv_alpha": 16, "lokr_full_rank": True, "lokr_factor": -1,
                    "network_kwargs": {"ignore_if_contains": []}},
        "save": {"dtype": "bf16", "save_every": 250, "max_step_saves_to_keep": 4,
                 "save_format": "diffusers", "push_to_hub": False},
        "datasets": [{"folder_path": DATASET, "mask_path": None, "mask_min_value": 0.1,
                      "default_caption": "", "caption_ext": "txt",
                      "caption_dropout_rate": 0.05, "cache_latents_to_disk": False,
                      "is_reg": False, "network_weight": 1, "resolution": [512, 768, 1024],
                      "controls": [], "shrink_video_to_frames": True, "num_frames": 1,
                      "flip_x": False, "flip_y": False, "num_repeats": 1,
                      "control_path_1": None, "control_path_2": None,
                      "control_path_3": None}],
        "train": {"batch_size": 1, "bypass_guidance_embedding": False, "steps": 3000,
                  "gradient_accumulation": 1, "train_unet": True,
                  "train_text_encoder": False, "gradient_checkpointing": True,
                  "noise_scheduler": "flowmatch", "optimizer": "adamw8bit",
                  "timestep_type": "sigmoid", "content_or_style": "balanced",
                  "optimizer_params": {"weight_decay": 1e-4}, "unload_text_encoder": False,
                  "cache_text_embeddings": False, "lr": 0.0001,
                  "ema_config": {"use_ema": False, "ema_decay": 0.99},
                  "skip_first_sample": False, "force_first_sample": False,
                  "disable_sampling": False, "dtype": "bf16",
                  "diff_output_preservation": False,
                  "diff_output_preservation_multiplier": 1.0,
                  "diff_output_preservation_class": "person", "switch_boundary_every": 1,
                  "loss_type": "mse"},
        "logging": {"log_every": 1, "use_ui_logger": True},
        "model": {"name_or_path": name_or_path, "quantize": True, "qtype": "qfloat8",
                  "quantize_te": True, "qtype_te": "qfloat8", "arch": arch,
                  "low_vram": False, "model_kwargs": {}, "compile": False,
                  "layer_offloading": True, "layer_offloading_transformer_percent": 1.0,
                  "layer_offloading_text_encoder_percent": 1.0, **model},
        "sample": {"sampler": "flowmatch", "sample_every": 250, "sample_start_step": 0,
                   "width": 1024, "height": 1024,
                   "samples": [{"prompt": "a photo of a cat", "ctrl_img_1": None,
                                "ctrl_img_2": None, "ctrl_img_3": None}],
                   "neg": "", "seed": 42, "walk_seed": True, "guidance_scale": 4,
                   "sample_steps": 25, "num_frames": 1, "fps": 1},
    }
    if slider is not None:
        proc["slider"] = slider
    return {"job": "extension", "config": {"name": "ui_job_v1", "process": [proc]},
            "meta": {"name": "[name]", "version": "1.0"}}


def _ui_ddpm_job(arch: str, name_or_path: str, **sample: Any) -> dict[str, Any]:
    """The web UI's job for a DDPM arch: its per-arch defaults (options.tsx) switch the
    noise scheduler and sampler to ddpm, the guidance to 6 and quantization off."""
    job = _ui_job(arch, name_or_path, quantize=False, quantize_te=False)
    proc = job["config"]["process"][0]
    proc["train"]["noise_scheduler"] = "ddpm"
    proc["sample"].update({"sampler": "ddpm", "guidance_scale": 6, **sample})
    return job


def _ui_choice(arch: str, name_or_path: str, *, model: dict[str, Any] | None = None,
               train: dict[str, Any] | None = None,
               sample: dict[str, Any] | None = None) -> dict[str, Any]:
    """`_ui_job` after picking a model in the web UI's list: the choice's defaults
    (upstream's ui/src/app/jobs/new/options.tsx) over the new job's."""
    config = _ui_job(arch, name_or_path, **(model or {}))
    proc = config["config"]["process"][0]
    proc["train"].update(train or {})
    proc["sample"].update(sample or {})
    return config


def _ui_video(config: dict[str, Any], **sections: dict[str, Any]) -> dict[str, Any]:
    """A UI job with a video arch's form defaults merged in (`datasets` into the first
    dataset): what upstream's options.tsx switches on when the arch is picked."""
    proc = config["config"]["process"][0]
    for section, values in sections.items():
        (proc["datasets"][0] if section == "datasets" else proc[section]).update(values)
    return config


def _refused(job: str, process: list[dict[str, Any]], **config: Any) -> dict[str, Any]:
    return {"job": job, "config": {"name": "other", "process": process, **config}}


RUNS = "runs"
ARCH = "arch {arch!r} is not supported yet; supported: "

CORPUS: dict[str, tuple[dict[str, Any], str]] = {
    "flux": (_trainer({"name_or_path": "black-forest-labs/FLUX.1-dev", "is_flux": True,
                       "quantize": True}), RUNS),
    "flux_schnell": (_trainer(
        {"name_or_path": "black-forest-labs/FLUX.1-schnell",
         "assistant_lora_path": "ostris/FLUX.1-schnell-training-adapter", "is_flux": True,
         "quantize": True}, sample=_sample(guidance_scale=1, sample_steps=4)), RUNS),
    "flex1": (_trainer({"name_or_path": "ostris/Flex.1-alpha", "arch": "flex1",
                        "quantize": True, "quantize_kwargs": {"exclude": ["*time_text_embed*"]}},
                       train={"bypass_guidance_embedding": True}), RUNS),
    "sd35": (_trainer({"name_or_path": "stabilityai/stable-diffusion-3.5-large",
                       "is_v3": True, "quantize": True}), RUNS),
    "chroma": (_trainer({"arch": "chroma", "name_or_path": "lodestones/Chroma1-Base",
                         "quantize": True}), RUNS),
    "qwen_image": (_trainer({"arch": "qwen_image", "name_or_path": "Qwen/Qwen-Image",
                             "quantize": True, "qtype": "qfloat8", "low_vram": True},
                            train={"cache_text_embeddings": True}), RUNS),
    "qwen_image_edit": (_trainer(
        {"arch": "qwen_image_edit", "name_or_path": "Qwen/Qwen-Image-Edit",
         "quantize": True}, dataset={"control_path": "/path/to/control"},
        sample=_sample(samples=[{"prompt": "make it red", "ctrl_img": "/c/1.jpg"}]),
        train={"timestep_type": "weighted"}), RUNS),
    "qwen_image_edit_plus": (_trainer(
        {"arch": "qwen_image_edit_plus", "name_or_path": "Qwen/Qwen-Image-Edit-2509",
         "quantize": True}, kind="diffusion_trainer",
        dataset={"control_path": ["/c/a", "/c/b"]},
        sample=_sample(samples=[{"prompt": "combine", "ctrl_img_1": "/c/1.jpg",
                                 "ctrl_img_2": "/c/2.jpg"}])), RUNS),
    "wan21": (_trainer({"arch": "wan21", "name_or_path": "Wan-AI/Wan2.1-T2V-1.3B-Diffusers",
                        "quantize_te": True}, dataset={"num_frames": 33},
                       sample=_sample(num_frames=40, fps=15, network_multiplier=1.0)), RUNS),
    "wan22": (_trainer({"arch": "wan22_14b:t2v", "name_or_path": "ai-toolkit/Wan2.2-T2V",
                        "quantize": True, "low_vram": True,
                        "model_kwargs": {"train_high_noise": True, "train_low_noise": True}},
                       train={"switch_boundary_every": 10}), RUNS),
    # The model sections of upstream's 24/32 GB examples (config/examples/
    # train_lora_qwen_image_24gb.yaml, ..._qwen_image_edit_32gb.yaml,
    # ..._qwen_image_edit_2509_32gb.yaml, train_lora_wan22_14b_24gb.yaml): 3- and 4-bit
    # weights with an accuracy recovery adapter after the bar.
    "qwen_image_24gb": (_trainer(
        {"name_or_path": "Qwen/Qwen-Image", "arch": "qwen_image", "quantize": True,
         "qtype": "uint3|ostris/accuracy_recovery_adapters/qwen_image_torchao_uint3"
                  ".safetensors", "quantize_te": True, "qtype_te": "qfloat8",
         "low_vram": True}, train={"cache_text_embeddings": True}), RUNS),
    "qwen_image_edit_32gb": (_trainer(
        {"name_or_path": "Qwen/Qwen-Image-Edit", "arch": "qwen_image_edit",
         "quantize": True, "qtype": "uint3|qwen_image_edit_torchao_uint3.safetensors",
         "quantize_te": True, "qtype_te": "qfloat8", "low_vram": True},
        dataset={"control_path": "/path/to/control"},
        sample=_sample(samples=[{"prompt": "make it red", "ctrl_img": "/c/1.jpg"}])), RUNS),
    "qwen_image_edit_2509_32gb": (_trainer(
        {"name_or_path": "Qwen/Qwen-Image-Edit-2509", "arch": "qwen_image_edit_plus",
         "quantize": True, "qtype": "uint3|ostris/accuracy_recovery_adapters/"
                                    "qwen_image_edit_2509_torchao_uint3.safetensors",
         "quantize_te": True, "qtype_te": "qfloat8", "low_vram": True},
        kind="diffusion_trainer", dataset={"control_path": ["/c/a", "/c/b"]},
        sample=_sample(samples=[{"prompt": "combine", "ctrl_img_1": "/c/1.jpg",
                                 "ctrl_img_2": "/c/2.jpg"}])), RUNS),
    "wan22_14b_24gb": (_trainer(
        {"name_or_path": "ai-toolkit/Wan2.2-T2V-A14B-Diffusers-bf16", "arch": "wan22_14b",
         "quantize": True, "qtype": "uint4|ostris/accuracy_recovery_adapters/"
                                    "wan22_14b_t2i_torchao_uint4.safetensors",
         "quantize_te": True, "qtype_te": "qfloat8", "low_vram": True,
         "model_kwargs": {"train_high_noise": True, "train_low_noise": True}},
        dataset={"num_frames": 1}, train={"switch_boundary_every": 10}), RUNS),
    "lumina": (_trainer({"name_or_path": "Alpha-VLLM/Lumina-Image-2.0", "is_lumina2": True},
                        train={"timestep_type": "lumina2_shift"}), RUNS),
    "hidream": (_trainer({"arch": "hidream", "name_or_path": "HiDream-ai/HiDream-I1-Full",
                          "extras_name_or_path": "HiDream-ai/HiDream-I1-Full",
                          "model_kwargs": {"llama_model_path": "meta-llama/Llama-3.1-8B"}},
                         network={"type": "lora", "linear": 32, "linear_alpha": 32,
                                  "network_kwargs": {"ignore_if_contains": ["ff_i.experts"]}}),
                RUNS),
    "flex2": (_trainer({"arch": "flex2", "name_or_path": "ostris/Flex.2-preview",
                        "model_kwargs": {"invert_inpaint_mask_chance": 0.5}},
                       train={"timestep_type": "shift"}), RUNS),
    "sd15_legacy": (_trainer({"name_or_path": "runwayml/stable-diffusion-v1-5",
                              "is_v_pred": False}, train={"noise_scheduler": "ddpm"},
                             sample=_sample(sampler="ddpm", width=512, height=512)), RUNS),
    "sd2": (_trainer({"name_or_path": "stabilityai/stable-diffusion-2-1", "is_v2": True,
                      "is_v_pred": True}, train={"noise_scheduler": "ddpm"},
                     sample=_sample(sampler="ddpm", width=768, height=768)), RUNS),
    "sdxl": (_trainer({"name_or_path": "stabilityai/stable-diffusion-xl-base-1.0",
                       "is_xl": True}, train={"noise_scheduler": "ddpm"},
                      sample=_sample(sampler="ddpm")), RUNS),
    "full_fine_tune": (_trainer({"name_or_path": "ostris/Flex.1-alpha", "is_flux": True},
                                network=False, train={"lr": 1e-5}), RUNS),
    "flex_redux": (_trainer({"name_or_path": "ostris/Flex.1-alpha", "is_flux": True},
                            network=False, adapter={"type": "redux", "train": True}),
                   "config.process[0].adapter: this process trains an adapter (redux) "
                   "instead of the model, which aitk does not do"),
    "extract": (_refused("extract", [{"type": "locon", "filename": "[name]_64_32.safetensors",
                                      "mode": "fixed", "linear": 64, "conv": 32}],
                         base_model="/m/base.safetensors", extract_model="/m/x.safetensors",
                         output_folder="/out", is_v2=False, dtype="fp16", device="cpu"),
                # a single file says nothing of its arch, and no flag is set: SD 1.x
                RUNS),
    "generate": (_refused("generate", [{
        "type": "to_folder", "output_folder": "/out", "device": "cuda:0",
        "generate": {"prompts": ["a cat --n dog"], "width": 512, "seed": -1, "ext": ".png"},
        "model": {"name_or_path": "runwayml/stable-diffusion-v1-5", "is_v2": False,
                  "is_xl": False, "dtype": "bf16"}}]), RUNS),
    "mod": (_refused("mod", [{"type": "rescale_lora", "input_path": "/in.safetensors",
                              "output_path": "/out.safetensors", "current_weight": 6,
                              "target_weight": 1.0, "replace_meta": True,
                              "scale_target": "up_down", "save_dtype": "fp16",
                              "is_xl": False, "is_v2": False}]), RUNS),
    "merge": (_refused("merge", [{"type": "merge_loras", "output_path": "/out/m.safetensors",
                                  "loras": [{"path": "/a.safetensors", "strength": 0.5},
                                            {"path": "/b.safetensors", "weight": 0.5}]}]),
              RUNS),
    "slider": (_refused("train", [{
        "type": "slider", "network": {"type": "lierla", "linear": 8, "linear_alpha": 4},
        "train": {"noise_scheduler": "ddpm", "steps": 500, "lr": 2e-4,
                  "max_denoising_steps": 40, "min_snr_gamma": 5.0},
        "model": {"name_or_path": "runwayml/stable-diffusion-v1-5", "is_v2": False},
        "logging": {"log_every": 10},
        "slider": {"resolutions": [[512, 512]], "batch_full_slide": True, "targets": [
            {"target_class": "", "positive": "happy", "negative": "sad",
             "shuffle": True}]}}], training_folder="/out", device="cuda:0"), RUNS),
    "train_vae": (_refused("train", [{"type": "vae"}], training_folder="/out"),
                  "config.process[0].type: process type 'vae' (VAE training) is not "
                  "supported by aitk"),
    "ui_concept_slider": (_ui_job("flex1", "ostris/Flex.1-alpha", kind="concept_slider",
                                  slider={"guidance_strength": 3.0, "anchor_strength": 1.0,
                                          "positive_prompt": "person who is happy",
                                          "negative_prompt": "person who is sad",
                                          "target_class": "person", "anchor_class": ""}),
                          RUNS),
    "ui_flex1": (_ui_job("flex1", "ostris/Flex.1-alpha"), RUNS),
    "ui_hidream": (_ui_choice("hidream", "HiDream-ai/HiDream-I1-Full",
                              train={"lr": 0.0002, "timestep_type": "shift"}), RUNS),
    "ui_lumina2": (_ui_choice("lumina2", "Alpha-VLLM/Lumina-Image-2.0",
                              model={"quantize": False}), RUNS),
    "ui_qwen_image": (_ui_job("qwen_image", "Qwen/Qwen-Image"), RUNS),
    "ui_flux2_klein": (_ui_job("flux2_klein_4b", "black-forest-labs/FLUX.2-klein-base-4B"),
                       RUNS),
    "ui_sdxl": (_ui_ddpm_job("sdxl", "stabilityai/stable-diffusion-xl-base-1.0"), RUNS),
    "ui_sd15": (_ui_ddpm_job("sd15", "stable-diffusion-v1-5/stable-diffusion-v1-5",
                             width=512, height=512), RUNS),
    "ui_flux2": (_ui_choice(
        "flux2", "black-forest-labs/FLUX.2-dev",
        model={"low_vram": True, "model_kwargs": {"match_target_res": False}},
        train={"timestep_type": "weighted"}), RUNS),
    "ui_zimage_turbo": (_ui_choice(
        "zimage:turbo", "Tongyi-MAI/Z-Image-Turbo",
        model={"low_vram": True, "assistant_lora_path": "ostris/zimage_turbo_training_adapter/"
               "zimage_turbo_training_adapter_v2.safetensors"},
        train={"timestep_type": "weighted"},
        sample={"guidance_scale": 1, "sample_steps": 9}), RUNS),
    "ui_zimage_deturbo": (_ui_choice(
        "zimage:deturbo", "ostris/Z-Image-De-Turbo",
        model={"low_vram": True, "extras_name_or_path": "Tongyi-MAI/Z-Image-Turbo"},
        train={"timestep_type": "weighted"},
        sample={"guidance_scale": 3, "sample_steps": 25}), RUNS),
    "ui_krea2": (_ui_choice("krea2", "krea/Krea-2-Raw", model={"low_vram": True},
                            train={"timestep_type": "linear"}), RUNS),
    "ui_krea2_turbo": (_ui_choice(
        "krea2:turbo", "krea/Krea-2-Turbo",
        model={"low_vram": True, "assistant_lora_path": "ostris/krea2_turbo_training_adapter/"
               "krea2_turbo_training_adapter_v1.safetensors"},
        train={"timestep_type": "linear"},
        sample={"guidance_scale": 1, "sample_steps": 9}), RUNS),
    "ui_wan22": (_ui_job("wan22_14b:t2v", "ai-toolkit/Wan2.2-T2V-A14B-Diffusers-bf16"),
                 RUNS),
    # options.tsx `wan22_5b`: 121 frames at 24 fps, `weighted` timesteps, do_i2v on.
    "ui_wan22_5b": (_ui_video(_ui_job("wan22_5b", "Wan-AI/Wan2.2-TI2V-5B-Diffusers",
                                      low_vram=True),
                              sample={"num_frames": 121, "fps": 24, "width": 768,
                                      "height": 768},
                              train={"timestep_type": "weighted"},
                              datasets={"do_i2v": True, "fps": 24}), RUNS),
    # options.tsx `ltx2`: 121 frames at 24 fps, audio on (aitk trains the clips' sound).
    "ui_ltx2": (_ui_video(_ui_job("ltx2", "Lightricks/LTX-2", low_vram=True),
                          sample={"num_frames": 121, "fps": 24, "width": 768, "height": 768},
                          train={"timestep_type": "weighted", "audio_loss_multiplier": 1.0},
                          datasets={"do_i2v": False, "do_audio": True, "fps": 24,
                                    "auto_frame_count": False}), RUNS),
}


def corpus_entry(name: str, dataset: str) -> tuple[dict[str, Any], str]:
    config, expected = CORPUS[name]
    config = copy.deepcopy(config)
    for proc in config["config"].get("process", []):
        for ds in proc.get("datasets") or []:
            if ds.get("folder_path") == DATASET:
                ds["folder_path"] = dataset
    return config, expected
