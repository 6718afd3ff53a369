"""The upstream AI Toolkit's job format, as data: every key its config classes read,
with upstream's default, the job and process types it has, and its model archs.

aitk accepts every key listed here. A key aitk's schema (aitk.config.schema) also
declares acts; any other listed key is dropped, and warned about once, by name, with its
reason (aitk.config.upstream_dropped), only when its value would change what upstream
does (it differs from upstream's default). Keys in `QUIET` never change the trained
weights (logging, the UI's database, worker counts, compile flags) and are accepted
silently. Anything in neither the schema nor these tables is a misspelling: an error
with a suggestion.

Read from upstream's `toolkit/config_modules.py`, `jobs/process/Base*Process.py`,
`jobs/*Job.py`, `extensions_built_in/` and the web UI's job defaults; stdlib only, so
`run.py --check` stays light.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from aitk.config import upstream_dropped


class _Varies:
    """A default computed from other keys (e.g. `unet_lr` = `lr`): any set value counts."""

    def __repr__(self) -> str:
        return "VARIES"


VARIES: Any = _Varies()
_OFF = (None, False, 0, 0.0, "", [], {})

# ---- sections: key -> upstream default --------------------------------------------------
# Section names are the config paths with list indices dropped ("datasets", "sample.samples").
SECTIONS: dict[str, dict[str, Any]] = {
    "job": {"job": "extension", "config": None, "meta": None},
    "config": {
        "name": None, "process": None, "device": "cpu", "training_folder": None,
        "log_dir": None, "training_seed": None, "is_v2": False,
    },
    "process": {
        "type": None, "name": VARIES, "training_folder": None, "log_dir": None,
        "training_seed": None, "performance_log_every": 0, "device": None,
        "trigger_word": None, "network": None, "train": None, "model": None, "save": None,
        "sample": None, "first_sample": None, "logging": None, "guidance": None,
        "datasets": None, "embedding": None, "decorator": None, "adapter": None,
        "do_lorm": False, "lorm_extract_mode": "ratio", "lorm_extract_mode_param": 0.25,
        "torch_profiler": False, "sqlite_db_path": "./aitk_db.db", "slider": None,
        "meta": None, "reg_datasets": None, "ema_config": None,  # older upstream
    },
    "network": {
        "type": "lora", "rank": None, "linear": None, "conv": None, "alpha": 1.0,
        "linear_alpha": VARIES, "conv_alpha": VARIES, "dropout": None,
        "network_kwargs": {}, "lorm": None, "transformer_only": True,
        "lokr_full_rank": True, "lokr_factor": -1, "old_lokr_format": False,
        "split_multistage_loras": True, "layer_offloading": False, "normalize": False,
        "pretrained_lora_path": None, "all_layers": False,
    },
    "save": {
        "save_every": 1000, "dtype": "float16", "max_step_saves_to_keep": 5,
        "save_format": "safetensors", "push_to_hub": False, "hf_repo_id": None,
        "hf_private": False,
    },
    "logging": {
        "log_every": 100, "verbose": False, "use_wandb": False, "use_ui_logger": False,
        "project_name": "ai-toolkit", "run_name": None,
    },
    "sample": {
        "sampler": "ddpm", "sample_every": 100, "sample_start_step": 0, "width": 512,
        "height": 512, "neg": False, "seed": 0, "walk_seed": False, "guidance_scale": 7,
        "sample_steps": 20, "network_multiplier": 1, "guidance_rescale": 0.0,
        "format": "jpg", "adapter_conditioning_scale": 1.0, "refiner_start_at": 0.5,
        "extra_values": [], "num_frames": 1, "fps": 16, "prompts": [], "samples": VARIES,
        "do_cfg_norm": False,
    },
    "sample.samples": {
        "prompt": None, "width": VARIES, "height": VARIES, "neg": VARIES, "seed": None,
        "guidance_scale": VARIES, "sample_steps": VARIES, "fps": VARIES,
        "num_frames": VARIES, "ctrl_img": None, "ctrl_idx": 0, "ctrl_img_1": None,
        "ctrl_img_2": None, "ctrl_img_3": None, "network_multiplier": VARIES,
        "do_cfg_norm": False,
    },
    "train": {
        "noise_scheduler": "ddpm", "content_or_style": "balanced",
        "content_or_style_reg": "balanced", "steps": 1000,
        "lr": 1e-6, "unet_lr": VARIES, "text_encoder_lr": VARIES, "refiner_lr": VARIES,
        "embedding_lr": VARIES, "adapter_lr": VARIES, "optimizer": "adamw",
        "optimizer_params": {}, "lr_scheduler": "constant", "lr_scheduler_params": {},
        "min_denoising_steps": 0, "max_denoising_steps": 999, "batch_size": 1,
        "dtype": "fp32", "xformers": False, "sdp": False, "attention_backend": "native",
        "train_unet": True, "train_text_encoder": False, "train_refiner": True,
        "train_turbo": False, "show_turbo_outputs": False, "min_snr_gamma": None,
        "snr_gamma": None, "learnable_snr_gos": False, "noise_offset": 0.0,
        "skip_first_sample": False, "force_first_sample": False,
        "gradient_checkpointing": True, "weight_jitter": 0.0,
        "merge_network_on_save": False, "merge_network_on_save_strength": 1.0,
        "max_grad_norm": 1.0, "start_step": None, "free_u": False,
        "adapter_assist_name_or_path": None, "adapter_assist_type": "t2i",
        "noise_multiplier": 1.0, "target_noise_multiplier": 1.0,
        "random_noise_multiplier": 0.0, "do_signal_correction_noise": False,
        "do_batch_noise_correction": False, "batch_noise_correction_scale": 0.1,
        "do_signal_amplification": False, "signal_amplification_strength": 0.5,
        "signal_correction_noise_scale": 1.0, "random_noise_shift": 0.0,
        "img_multiplier": 1.0, "noisy_latent_multiplier": 1.0, "latent_multiplier": 1.0,
        "negative_prompt": None, "max_negative_prompts": 1, "reg_weight": 1.0,
        "num_train_timesteps": 1000, "adaptive_scaling_factor": False,
        "prompt_dropout_prob": 0.0, "match_noise_norm": False,
        "gradient_accumulation_steps": 1, "gradient_accumulation": 1,
        "short_and_long_captions": False, "short_and_long_captions_encoder_split": False,
        "single_item_batching": False, "match_adapter_assist": False,
        "match_adapter_chance": 0.0, "loss_target": "noise", "inverted_mask_prior": False,
        "inverted_mask_prior_multiplier": 0.5, "diff_output_preservation": False,
        "diff_output_preservation_multiplier": 1.0, "diff_output_preservation_class": "",
        "blank_prompt_preservation": False, "blank_prompt_preservation_multiplier": 1.0,
        "standardize_images": False, "standardize_latents": False,
        "dynamic_noise_offset": False, "do_cfg": False, "do_random_cfg": False,
        "cfg_scale": 1.0, "max_cfg_scale": VARIES, "cfg_rescale": None,
        "correct_pred_norm": False, "correct_pred_norm_multiplier": 1.0,
        "loss_type": "mse", "t0_loss_target": False, "t0_velocity_equiv_weight": False,
        "do_fft_loss": False, "do_fft_velocity_equiv_weight": False, "pred_scaler": 1.0,
        "prompt_saturation_chance": 0.0, "do_prior_divergence": False,
        "ema_config": None, "target_norm_std": None, "target_norm_std_value": 1.0,
        "timestep_type": "sigmoid", "next_sample_timesteps": 8,
        "linear_timesteps": False, "linear_timesteps2": False, "disable_sampling": False,
        "unload_text_encoder": False, "cache_text_embeddings": False,
        "do_paramiter_swapping": False, "paramiter_swapping_factor": 0.1,
        "bypass_guidance_embedding": False, "latent_feature_extractor_path": None,
        "latent_feature_loss_weight": 1.0, "diffusion_feature_extractor_path": None,
        "diffusion_feature_extractor_weight": VARIES, "optimal_noise_pairing_samples": 1,
        "force_consistent_noise": False, "blended_blur_noise": False,
        "do_guidance_loss": False, "guidance_loss_target": 3.0,
        "do_guidance_loss_cfg_zero": False, "guidance_loss_schedule": "constant",
        "unconditional_prompt": "", "do_differential_guidance": False,
        "differential_guidance_scale": 3.0, "switch_boundary_every": 1,
        "do_blank_stabilization": False, "audio_loss_multiplier": 1.0,
        "max_loss_debug": False, "max_loss": None, "validation_config": None,
    },
    "train.ema_config": {
        "use_ema": False, "ema_decay": 0.999, "use_feedback": False,
        "param_multiplier": 1.0,
    },
    "model": {
        "name_or_path": None, "arch": None, "is_v2": False, "is_xl": False,
        "is_pixart": False, "is_pixart_sigma": False, "is_auraflow": False, "is_v3": False,
        "is_flux": False, "is_lumina2": False, "use_flux_cfg": False, "is_ssd": False,
        "is_vega": False, "is_v_pred": False, "dtype": "float16", "vae_path": None,
        "refiner_name_or_path": None, "refiner_start_at": 0.5, "lora_path": None,
        "assistant_lora_path": None, "inference_lora_path": None,
        "unconditional_lora_path": None, "latent_space_version": None,
        "use_text_encoder_1": True, "use_text_encoder_2": True, "experimental_xl": False,
        "text_encoder_bits": 16, "unet_path": None, "unet_sample_size": None,
        "vae_device": None, "vae_dtype": VARIES, "te_device": None, "te_dtype": VARIES,
        "quantize": False, "quantize_te": VARIES, "qtype": "qfloat8",
        "qtype_te": "qfloat8", "low_vram": False, "attn_masking": False,
        "ignore_if_contains": None, "only_if_contains": None, "quantize_kwargs": {},
        "split_model_over_gpus": False, "split_model_other_module_param_count_scale": 0.3,
        "te_name_or_path": None, "auto_memory": False, "layer_offloading": False,
        "layer_offloading_transformer_percent": 1.0,
        "layer_offloading_text_encoder_percent": 1.0, "extras_name_or_path": None,
        "accuracy_recovery_adapter": None, "compile": False, "block_compile": False,
        "compile_mode": "default", "compile_fullgraph": False, "compile_dynamic": True,
        "cache_size_limit": None, "model_kwargs": {}, "model_paths": {},
        "in_context": False,
    },
    "datasets": {
        "batch_size": None, "type": "image", "folder_path": None, "dataset_path": None,
        "default_caption": None, "trigger_word": None, "diff_output_preservation": False,
        "diff_output_preservation_class": "", "random_triggers": [],
        "random_triggers_max": 1, "caption_ext": ".txt", "random_scale": False,
        "random_crop": False, "resolution": 512, "scale": 1.0, "buckets": True,
        "bucket_tolerance": 64, "is_reg": False, "prior_reg": False,
        "shuffle_tokens": False, "keep_tokens": 0, "flip_x": False, "flip_y": False,
        "augments": [], "control_path": None, "control_from_same_folder": False,
        "num_controls_from_same_folder": 1, "control_path_1": None, "control_path_2": None,
        "control_path_3": None, "control_transparent_color": [0, 0, 0],
        "inpaint_path": None, "full_size_control_images": True, "alpha_mask": False,
        "mask_path": None, "unconditional_path": None, "invert_mask": False,
        "mask_min_value": 0.0, "poi": None, "use_short_captions": False,
        "num_repeats": 1, "cache_latents": False, "cache_latents_to_disk": False,
        "cache_tensors_to_disk": False, "cache_clip_vision_to_disk": False,
        "cache_text_embeddings": False, "load_image_when_caching_latents": False,
        "standardize_images": False, "augmentations": None,
        "shuffle_augmentations": False, "caption_type": None, "guidance_type": "targeted",
        "clip_image_path": None, "clip_image_from_same_folder": False,
        "clip_image_augmentations": None, "clip_image_shuffle_augmentations": False,
        "replacements": [], "loss_multiplier": 1.0, "num_workers": 2,
        "prefetch_factor": 2, "cache_latents_num_workers": VARIES, "extra_values": [],
        "square_crop": False, "replay_transforms": True, "num_frames": 1,
        "shrink_video_to_frames": True, "fps": 24, "auto_frame_count": False,
        "trim_auto_frame_count_tail": True, "debug": False, "controls": [],
        "fast_image_size": False, "do_i2v": False, "do_audio": False,
        "audio_preserve_pitch": False, "audio_normalize": False, "network_weight": 1.0,
        "token_dropout_rate": 0.0, "caption_dropout_rate": 0.0,
    },
}

# The other job kinds (aitk.config.kinds), from upstream's jobs/*Job.py and
# jobs/process/*.py.
SECTIONS.update({
    "concept_slider": {"guidance_strength": 3.0, "anchor_strength": 1.0,
                       "positive_prompt": "", "negative_prompt": "", "target_class": "",
                       "anchor_class": None},
    "slider": {"targets": [], "anchors": [], "resolutions": [[512, 512]],
               "prompt_file": None, "prompt_tensors": None, "batch_full_slide": True,
               "use_adapter": None, "adapter_img_dir": None, "low_ram": False},
    "slider.targets": {"target_class": "", "positive": "", "negative": "",
                       "multiplier": 1.0, "weight": 1.0, "shuffle": False},
    "slider.anchors": {"prompt": "", "neg_prompt": "", "multiplier": 1.0},
    "extract": {"name": None, "process": None, "base_model": None, "extract_model": None,
                "output_folder": None, "is_v2": False, "dtype": "fp16", "device": "cpu",
                "extract_unet": True, "extract_text_encoder": True, "arch": None,
                "log_dir": None},
    "extract.process": {"type": None, "filename": None, "output_path": None,
                        "dtype": VARIES, "mode": "fixed", "linear": VARIES, "conv": VARIES,
                        "use_sparse_bias": False, "sparsity": 0.98, "disable_cp": False,
                        "extract_unet": True, "extract_text_encoder": True},
    "mod": {"name": None, "process": None, "device": "cpu", "log_dir": None},
    "mod.process": {"type": None, "input_path": None, "output_path": None,
                    "replace_meta": False, "scale_target": "up_down", "save_dtype": "fp16",
                    "current_weight": None, "target_weight": None, "is_xl": False,
                    "is_v2": False},
    "merge": {"name": None, "process": None, "device": "cpu", "dtype": "fp16",
              "is_v2": False, "log_dir": None},
    "merge.process": {},
    "merge.loras": {},
    "generate": {"name": None, "process": None, "device": "cpu", "log_dir": None},
    "generate.process": {"type": None, "output_folder": None, "device": None,
                         "generate": None, "model": None, "dtype": "float16"},
    "generate.generate": {
        "sampler": "ddpm", "width": 512, "height": 512, "size_list": None, "neg": "",
        "seed": -1, "guidance_scale": 7, "sample_steps": 20, "prompt_2": None,
        "neg_2": None, "prompts": None, "guidance_rescale": 0.0, "compile": False,
        "ext": "png", "prompt_file": False, "num_repeats": 1, "random_prompts": False,
        "max_random_per_prompt": 1, "max_images": 10000, "shuffle": False},
})

# What aitk does with each key its schema does not declare, with the reason (quiet,
# warned with what it does instead, warned and dropped): aitk.config.upstream_dropped.
QUIET, INSTEAD, DROPPED = upstream_dropped.QUIET, upstream_dropped.INSTEAD, \
    upstream_dropped.DROPPED

# A dict-valued key that does nothing unless its switch is on (`ema_config.use_ema`;
# older upstream put it in the process section, which aitk does not read).
SWITCHED: dict[tuple[str, str], str] = {("process", "ema_config"): "use_ema"}

# A setting that only matters while a sibling is on: (section, key) -> (sibling, the
# sibling's values that mean "off"); only read for keys the schema does not declare.
DEPENDS: dict[tuple[str, str], tuple[str, tuple[Any, ...]]] = {
    **{("train", k): (on, _OFF) for k, on in (
        ("correct_pred_norm_multiplier", "correct_pred_norm"),
        ("differential_guidance_scale", "do_differential_guidance"),
        ("paramiter_swapping_factor", "do_paramiter_swapping"),
        ("signal_amplification_strength", "do_signal_amplification"),
        ("signal_correction_noise_scale", "do_signal_correction_noise"),
        ("batch_noise_correction_scale", "do_batch_noise_correction"),
        ("target_norm_std_value", "target_norm_std"),
        ("merge_network_on_save_strength", "merge_network_on_save"),
        ("adapter_assist_type", "adapter_assist_name_or_path"),
        ("match_adapter_chance", "adapter_assist_name_or_path"),
        ("latent_feature_loss_weight", "latent_feature_extractor_path"),
        ("diffusion_feature_extractor_weight", "diffusion_feature_extractor_path"),
    )},
    ("model", "refiner_start_at"): ("refiner_name_or_path", _OFF),
    ("datasets", "num_controls_from_same_folder"): ("control_from_same_folder", _OFF),
}


def section_of(path: str) -> str:
    """"config.process[0].datasets[1]" -> "datasets": the section name for a path."""
    parts = [p.split("[")[0] for p in path.split(".")] if path else []
    if parts[:2] == ["config", "process"]:
        rest = parts[2:]
        return ".".join(rest) if rest else "process"
    return parts[0] if parts else "job"


def is_upstream_key(section: str, key: str) -> bool:
    return key in SECTIONS.get(section, {})


def changes_behaviour(section: str, key: str, value: Any,
                      siblings: Mapping[str, Any] | None = None) -> bool:
    """Whether an upstream-only key, set to `value` next to `siblings` (the rest of its
    section), would make upstream do something other than its default (so aitk ignoring
    it is worth a warning)."""
    if (section, key) in QUIET:
        return False
    depends = DEPENDS.get((section, key))
    if depends is not None:
        sibling, off = depends
        current = (siblings or {}).get(sibling)
        if any(_same(current, o) if o is not None else current is None for o in off):
            return False
    switch = SWITCHED.get((section, key))
    if switch is not None:
        return isinstance(value, Mapping) and bool(value.get(switch))
    default = SECTIONS.get(section, {}).get(key)
    if default is VARIES or default is None:
        return value not in _OFF
    return not _same(value, default)


def warning(section: str, key: str) -> str:
    """What a dropped key's warning says after its path: what aitk does instead, or why it
    does not act on the key."""
    instead = INSTEAD.get((section, key))
    if instead is not None:
        return instead
    why = upstream_dropped.reason(section, key) or "no reason recorded"  # a test holds all
    return f"valid upstream but not acted on by aitk: {why}"


def _same(value: Any, default: Any) -> bool:
    if isinstance(value, bool) or isinstance(default, bool):
        return value is default or (not value and not default)
    if isinstance(value, int | float) and isinstance(default, int | float):
        return math.isclose(float(value), float(default))
    if isinstance(default, str) and isinstance(value, str):
        return value.lstrip(".") == default.lstrip(".")  # caption_ext: "txt" == ".txt"
    return value == default


# ---- job and process types -------------------------------------------------------------
# aitk.config.kinds has the job kinds aitk runs (all of upstream's); these are the process
# types upstream runs beyond them, named in the one-line refusal.
OTHER_PROCESS_TYPES = {
    "ultimate_slider_trainer": "slider training",
    "image_reference_slider_trainer": "slider training",
    "textual_inversion_trainer": "textual inversion", "concept_replacer": "concept replacing",
    "reference_generator": "generation", "pure_lora_generator": "generation",
    "batch_img2img": "generation", "dataset_tools": "dataset tools",
    "sync_from_collection": "dataset tools", "super_tagger": "captioning",
    "vae": "VAE training", "esrgan": "ESRGAN training", "slider_old": "slider training",
    "lora_hack": "LoRA training", "rescale_sd": "SD rescale training",
    "reference": "reference training",
}
# What a process without `network` trains instead of the denoiser, when it says so.
OTHER_TRAINED = {"adapter": "an adapter ({type})", "embedding": "a textual-inversion "
                 "embedding", "decorator": "a decorator"}


# ---- model archs -----------------------------------------------------------------------
# Every arch id upstream registers. The facts of the ones aitk trains (size multiple,
# flags, aliases, schedules) live in their own folders (aitk.models.catalog); this list
# only tells "not supported yet" apart from a misspelling.
UPSTREAM_ARCHS: frozenset[str] = frozenset({
    "sd1", "sd2", "sdxl", "ssd", "vega", "sd3", "pixart", "pixart_sigma", "auraflow",
    "flux", "flex2", "flux_kontext", "chroma", "chroma_radiance", "zeta_chroma", "lumina2",
    "hidream", "hidream_e1", "hidream_o1", "wan21", "wan21_i2v", "wan22_14b",
    "wan22_14b_i2v", "omnigen2", "cogview4", "f-lite", "anima", "zimage", "zimage_l2p",
    "ernie_image", "ideogram4", "krea2", "mageflow", "mageflow_edit", "boogu_image",
    "boogu_image_edit", "nucleus_image", "prx_pixel", "example", "flux2_klein_4b",
    "flux2_klein_9b", "qwen_image", "qwen_image_edit", "qwen_image_edit_plus", "wan22_5b",
    "flux2", "ltx2", "ltx2.3", "ltx2.5", "minimax_h3", "minimax_h3_ref2va", "ace_step_15",
    "ace_step_15_xl",
})
ARCH_ALIASES = {"flex1": "flux", "sd15": "sd1"}
# Upstream's order: the first flag set wins; no flag means SD 1.x.
ARCH_FLAGS = (("is_v2", "sd2"), ("is_v3", "sd3"), ("is_xl", "sdxl"), ("is_pixart", "pixart"),
              ("is_pixart_sigma", "pixart_sigma"), ("is_auraflow", "auraflow"),
              ("is_flux", "flux"), ("is_lumina2", "lumina2"), ("is_vega", "vega"),
              ("is_ssd", "ssd"))
DEFAULT_ARCH = "sd1"


def derive_arch(model: Mapping[str, Any]) -> str:
    """`model.arch` as upstream reads it: an `arch:tag` suffix dropped, `flex1` is flux,
    and without `arch` the first `is_*` flag set (SD 1.x when none is)."""
    arch = model.get("arch")
    if isinstance(arch, str) and arch:
        base = arch.split(":", 1)[0]
        return ARCH_ALIASES.get(base, base)
    for flag, name in ARCH_FLAGS:
        if model.get(flag):
            return name
    return DEFAULT_ARCH


def arch_tag(model: Mapping[str, Any]) -> str | None:
    """The `:tag` of `model.arch` (`zimage:turbo` -> `turbo`), None without one. Upstream's
    trainer drops it; its web UI picks a variant's defaults by it (see tag_defaults)."""
    arch = model.get("arch")
    if isinstance(arch, str) and ":" in arch:
        return arch.split(":", 1)[1] or None
    return None
