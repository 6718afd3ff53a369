"""What aitk does with each upstream key its schema does not declare, and why, as data.

Every key in aitk.config.upstream_keys.SECTIONS that a schema class of its section does not
declare is in exactly one table here, with a one-line reason:

- `DERIVED`: read before validation into what aitk does read (aitk.config.upstream);
- `QUIET`: accepted silently (logs, speed, memory, bookkeeping: never the trained weights);
- `INSTEAD`: warned about, set away from upstream's default, with what aitk does instead;
- `DROPPED`: warned about, set away from upstream's default, with why aitk does not act.

`tests/aitk/test_upstream_keys.py` holds the completeness (no key without a reason, no
reason for a key aitk now reads) and `tests/test_docs.py` holds docs/upstream-keys.md to
`markdown_table()`. Stdlib only: `run.py --check` reads it.
"""

from __future__ import annotations

Key = tuple[str, str]


def _each(section: str, keys: str, reason: str) -> dict[Key, str]:
    """One reason shared by several keys of a section (names separated by spaces)."""
    return {(section, key): reason for key in keys.split()}


# Reasons several keys share.
_REFINER = "aitk trains and previews without an SDXL refiner model"
_LORM = "LoRM (the model rebuilt from low-rank modules) is an upstream experiment aitk does " \
    "not run; it trains LoRA, LoKr, DoRA or full weights"
_NOISE = "one of upstream's experimental noise changes; aitk draws plain Gaussian noise " \
    "(with train.noise_offset)"
_ADAPTER = "feeds an adapter (IP-adapter, T2I, control) that aitk does not train"
_CLIP = "CLIP-vision images for an IP-adapter, which aitk does not train"
_SD_LOADER = "an option of upstream's SD-era model loader; aitk loads each arch from its " \
    "own files (aitk/models/<arch>)"
_ASSIST = "an adapter-assisted training pass (T2I or ControlNet assist), which aitk does not run"
_CFG_TRAIN = "CFG during training (a negative pass in the loss); aitk trains the " \
    "conditional prediction only (do_guidance_loss aside)"
_FEATURES = "a loss through a separate feature-extractor model, which aitk does not load"
_EXTRACT = "aitk extracts from the whole model's difference (its arch's layout)"
_LATER = "not implemented yet:"

DERIVED: dict[Key, str] = {
    ("config", "training_folder"): "each process's training_folder unless it sets its own",
    ("config", "device"): "each process's device unless it sets its own",
    ("config", "training_seed"): "seeds each process whose train.seed is not set",
    ("process", "training_seed"): "seeds the run when train.seed is not set",
    ("generate", "device"): "each process's device unless it sets its own",
}

QUIET: dict[Key, str] = {
    ("process", "name"): "upstream's display name of a process; the job's config.name "
    "names the outputs",
    ("process", "performance_log_every"): "upstream's timing printout; speed only",
    ("process", "torch_profiler"): "a profiler trace; speed only",
    ("process", "sqlite_db_path"): "upstream's web UI database; aitk's web UI reads the loss "
    "log",
    ("process", "meta"): "metadata only; it changes no weights",
    ("model", "split_model_other_module_param_count_scale"): "tunes split_model_over_gpus, "
    "which is warned about by itself",
    **_each("model", "is_v2 is_xl is_v3 is_flux is_lumina2 is_pixart is_pixart_sigma "
            "is_auraflow is_ssd is_vega", "read into model.arch (the first flag set wins)"),
    ("model", "dtype"): "the load dtype; aitk loads each part in its arch's dtype and trains "
    "in train.dtype",
    **_each("train", "xformers sdp attention_backend", "an attention kernel: speed and "
            "memory only (aitk uses PyTorch's scaled-dot-product attention)"),
    ("train", "max_loss_debug"): "an upstream debugging aid; it changes no weights",
    ("train", "show_turbo_outputs"): "upstream's turbo debugging previews; no weights",
    ("train", "content_or_style_reg"): "upstream reads it from content_or_style, so its "
    "own value never reaches training",
    **_each("datasets", "num_workers prefetch_factor cache_latents_num_workers",
            "data-loader workers: speed only"),
    ("datasets", "debug"): "upstream's dataset debugging output; no weights",
    ("datasets", "fast_image_size"): "a faster image-size read: speed only",
    ("datasets", "load_image_when_caching_latents"): "speed and memory of latent caching "
    "only",
    ("datasets", "cache_tensors_to_disk"): "upstream's pixel-tensor cache for video and "
    "audio: speed only",
    **_each("logging", "log_every verbose", "aitk logs every step's loss "
            "(loss_log.jsonl); console detail only"),
    ("logging", "use_ui_logger"): "upstream's web UI database; aitk's web UI reads the loss "
    "log",
    ("extract", "is_v2"): "read into the extract job's arch",
    **_each("extract", "log_dir", "logging only; an extract job logs nothing to TensorBoard"),
    ("extract.process", "disable_cp"): "aitk makes no CP decomposition to disable",
    ("mod", "device"): "rescaling runs on the CPU; speed only",
    ("mod", "log_dir"): "logging only; a mod job logs nothing to TensorBoard",
    **_each("mod.process", "is_xl is_v2", "metadata only: the LoRA's keys tell its layout"),
    ("merge", "dtype"): "the merge works in float32 and writes save_dtype; the working "
    "dtype changes only memory",
    ("merge", "is_v2"): "metadata only: the LoRAs' keys tell their layout",
    ("merge", "log_dir"): "logging only; a merge job logs nothing to TensorBoard",
    ("generate", "log_dir"): "logging only; a generate job logs nothing to TensorBoard",
    ("generate.generate", "compile"): "torch.compile: speed only",
    ("slider", "low_ram"): "memory only",
}

INSTEAD: dict[Key, str] = {
    ("model", "split_model_over_gpus"): "aitk keeps the model whole on each GPU; to fit "
    "it use model.layer_offloading or quantize (`run.py --check` forecasts the peak), or "
    "`--gpus N` to train data-parallel",
    ("model", "auto_memory"): "aitk does not size offloading by itself; set "
    "model.layer_offloading with layer_offloading_transformer_percent (`run.py --check` "
    "forecasts the peak and suggests a share)",
    ("model", "vae_device"): "aitk runs the VAE on the training device; model.low_vram "
    "keeps it on the CPU between uses",
    ("model", "te_device"): "aitk runs the text encoders on the training device; "
    "model.low_vram keeps them on the CPU between uses and train.cache_text_embeddings "
    "frees them after caching",
    ("network", "layer_offloading"): "aitk keeps the adapter on the device; "
    "model.layer_offloading offloads the frozen blocks",
}

DROPPED: dict[Key, str] = {
    # ---- process --------------------------------------------------------------------
    ("process", "first_sample"): "a separate config for the step-0 previews; aitk previews "
    "step 0 with `sample` (train.skip_first_sample turns it off)",
    ("process", "guidance"): "the settings of upstream's guidance-pair training, which aitk "
    "does not run",
    ("process", "embedding"): "trains a textual-inversion embedding beside the network; "
    "aitk trains the network only",
    ("process", "adapter"): "trains an adapter beside the network; aitk trains the "
    "network only",
    ("process", "decorator"): "trains a decorator beside the network; aitk trains the "
    "network only",
    **_each("process", "do_lorm lorm_extract_mode lorm_extract_mode_param", _LORM),
    ("process", "reg_datasets"): "older upstream's regularization list, which upstream no "
    "longer reads; add a dataset with is_reg: true",
    ("process", "ema_config"): "older upstream's place for it; set train.ema_config, which "
    "aitk acts on",
    ("process", "slider"): "the settings of a slider process; this process type trains no "
    "slider (use type: concept_slider)",
    ("config", "is_v2"): "a job-level flag of upstream's extract, merge and slider jobs; "
    "a LoRA job reads model.arch (or model.is_v2)",
    # ---- network --------------------------------------------------------------------
    ("network", "lorm"): _LORM,
    ("network", "transformer_only"): "aitk's LoRA targets come from the arch's layout; "
    "network_kwargs.only_if_contains / ignore_if_contains change them",
    ("network", "lokr_full_rank"): "aitk's LoKr (peft) factors by lokr_factor and the "
    "rank; upstream's full-rank switch has no counterpart there",
    ("network", "old_lokr_format"): "aitk writes the one LoKr layout upstream writes today",
    ("network", "split_multistage_loras"): "aitk writes a Wan 2.2 14B LoRA per expert "
    "always (upstream's default)",
    ("network", "normalize"): "an upstream experiment that rescales the LoRA's weights; "
    "aitk keeps the trained weights as they are",
    ("network", "all_layers"): "full-weight difference modules for norms and other layers; "
    "aitk adapts Linear and Conv layers only",
    # ---- sample ---------------------------------------------------------------------
    ("sample", "guidance_rescale"): "the CFG rescale of SD-era pipelines; aitk's previews "
    "use plain CFG",
    ("sample", "adapter_conditioning_scale"): _ADAPTER,
    ("sample", "refiner_start_at"): _REFINER,
    ("sample", "extra_values"): _ADAPTER,
    **_each("sample", "do_cfg_norm", "a CFG normalisation of upstream's Qwen edit previews; "
            "aitk's previews use plain CFG"),
    **_each("sample.samples", "do_cfg_norm", "a CFG normalisation of upstream's Qwen edit "
            "previews; aitk's previews use plain CFG"),
    ("sample.samples", "ctrl_idx"): "the slot a prompt's control image fills; aitk fills "
    "ctrl_img, ctrl_img_1..3 by name",
    # ---- train ----------------------------------------------------------------------
    **_each("train", "refiner_lr train_refiner", _REFINER),
    ("train", "embedding_lr"): "the rate of a textual-inversion embedding, which aitk does "
    "not train",
    ("train", "adapter_lr"): "the rate of an adapter, which aitk does not train",
    ("train", "train_turbo"): "upstream's turbo (few-step) distillation, which aitk does not "
    "run",
    ("train", "learnable_snr_gos"): "an upstream experiment that learns a loss weighting "
    "per timestep",
    ("train", "force_first_sample"): "previews at a resume's first step; aitk previews on "
    "the sample_every cadence",
    ("train", "weight_jitter"): "an upstream experiment that jitters the weights each step",
    **_each("train", "merge_network_on_save merge_network_on_save_strength",
            "aitk saves the LoRA itself; `job: merge` merges it into a model"),
    ("train", "start_step"): "aitk's step count comes from its checkpoint (resume), never "
    "from the config",
    ("train", "free_u"): "FreeU, an SD-era UNet sampling trick; aitk's archs run unchanged",
    **_each("train", "adapter_assist_name_or_path adapter_assist_type match_adapter_assist "
            "match_adapter_chance", _ASSIST),
    **_each("train", "noise_multiplier target_noise_multiplier random_noise_multiplier "
            "do_signal_correction_noise do_batch_noise_correction batch_noise_correction_"
            "scale do_signal_amplification signal_amplification_strength signal_correction_"
            "noise_scale random_noise_shift optimal_noise_pairing_samples "
            "force_consistent_noise blended_blur_noise dynamic_noise_offset", _NOISE),
    **_each("train", "img_multiplier noisy_latent_multiplier latent_multiplier",
            "an upstream experiment that scales the images or latents; aitk uses the "
            "arch's VAE scaling"),
    **_each("train", "negative_prompt max_negative_prompts", _CFG_TRAIN),
    **_each("train", "do_cfg do_random_cfg max_cfg_scale cfg_rescale", _CFG_TRAIN),
    ("train", "num_train_timesteps"): "aitk uses the length of each arch's own schedule",
    ("train", "adaptive_scaling_factor"): "an upstream experiment that adapts the VAE "
    "scale to each image; aitk uses the arch's",
    ("train", "match_noise_norm"): "an upstream experiment that matches the prediction's "
    "norm to the noise's",
    **_each("train", "short_and_long_captions short_and_long_captions_encoder_split",
            "needs upstream's JSON captions with short and long forms; aitk reads one "
            "caption per image"),
    ("train", "single_item_batching"): "runs a batch one item at a time (memory); "
    "train.gradient_accumulation does that over batches",
    ("train", "loss_target"): "aitk's loss target is each arch's prediction target (noise, "
    "v or flow)",
    **_each("train", "standardize_images standardize_latents", "an upstream experiment "
            "that standardises inputs to the model's statistics"),
    **_each("train", "correct_pred_norm correct_pred_norm_multiplier", "an upstream "
            "experiment that corrects the prediction's norm drift"),
    **_each("train", "t0_loss_target t0_velocity_equiv_weight", "an upstream experiment: "
            "the loss on the predicted clean image"),
    **_each("train", "do_fft_loss do_fft_velocity_equiv_weight", "an upstream experiment: "
            "an extra frequency-domain loss"),
    ("train", "pred_scaler"): "an upstream experiment that scales the prediction",
    ("train", "prompt_saturation_chance"): "an upstream experiment that repeats the prompt",
    ("train", "do_prior_divergence"): "an upstream experiment: a negative loss on the "
    "prior's prediction",
    **_each("train", "target_norm_std target_norm_std_value", "an upstream experiment: an "
            "extra loss on the prediction's standard deviation"),
    **_each("train", "linear_timesteps linear_timesteps2", "upstream's older timestep "
            "weightings; train.timestep_type picks aitk's"),
    **_each("train", "do_paramiter_swapping paramiter_swapping_factor", "trains a random "
            "share of the parameters at a time (memory); aitk trains them all"),
    **_each("train", "latent_feature_extractor_path latent_feature_loss_weight "
            "diffusion_feature_extractor_path diffusion_feature_extractor_weight",
            _FEATURES),
    **_each("train", "do_differential_guidance differential_guidance_scale", "an upstream "
            "experiment that pushes the target past the prediction"),
    ("train", "do_blank_stabilization"): "an upstream experiment that zeroes blank-prompt "
    "predictions; blank_prompt_preservation is read",
    # ---- model ----------------------------------------------------------------------
    ("model", "use_flux_cfg"): "upstream's CFG for Flux training; aitk trains Flux with its "
    "guidance embedding",
    **_each("model", "vae_path unet_path experimental_xl unet_sample_size "
            "latent_space_version use_text_encoder_1 use_text_encoder_2", _SD_LOADER),
    **_each("model", "refiner_name_or_path refiner_start_at", _REFINER),
    ("model", "inference_lora_path"): "a LoRA upstream applies only for previews; aitk "
    "previews the trained adapter",
    ("model", "unconditional_lora_path"): "a LoRA for the negative CFG pass, an upstream "
    "experiment",
    **_each("model", "text_encoder_bits quantize_kwargs", "aitk's quantization is "
            "model.quantize_te with qtype_te"),
    **_each("model", "vae_dtype te_dtype", "aitk loads the VAE and text encoders in each "
            "arch's dtype"),
    ("model", "te_name_or_path"): "aitk loads the text encoders from the model folder (or "
    "model.extras_name_or_path)",
    ("model", "model_paths"): "aitk finds each part in the arch's own file layout",
    ("model", "in_context"): "upstream's in-context (side by side) edit training, which aitk "
    "does not run",
    # ---- datasets -------------------------------------------------------------------
    ("datasets", "type"): "aitk's datasets are image and video folders with captions",
    ("datasets", "dataset_path"): "upstream's JSON or folder dataset; aitk reads "
    "folder_path",
    **_each("datasets", "buckets bucket_tolerance", "aitk always buckets by aspect ratio at "
            "the arch's size multiple"),
    **_each("datasets", "control_from_same_folder num_controls_from_same_folder controls",
            "control images come from control_path only"),
    ("datasets", "control_transparent_color"): "aitk drops a control image's alpha channel "
    "and keeps the colours under it",
    ("datasets", "inpaint_path"): "inpainting training, which aitk does not run",
    ("datasets", "full_size_control_images"): "full-size control images for IP-adapters; "
    "aitk fits controls to the image's bucket",
    ("datasets", "unconditional_path"): "paired unconditional images for upstream's "
    "guidance training, which aitk does not run",
    ("datasets", "poi"): "refused by upstream itself (deprecated)",
    ("datasets", "use_short_captions"): "needs upstream's JSON captions; aitk reads one "
    "caption file per image",
    **_each("datasets", "cache_clip_vision_to_disk clip_image_path clip_image_from_same_folder "
            "clip_image_augmentations clip_image_shuffle_augmentations", _CLIP),
    ("datasets", "standardize_images"): "an upstream experiment that standardises the "
    "images to the model's statistics",
    **_each("datasets", "augmentations shuffle_augmentations", "albumentations pipelines; "
            "aitk's augments list is read (aitk.data.augment)"),
    ("datasets", "caption_type"): "upstream's legacy name, read as caption_ext there; set "
    "caption_ext",
    ("datasets", "guidance_type"): "upstream's guidance training, which aitk does not run",
    ("datasets", "extra_values"): _ADAPTER,
    ("datasets", "replay_transforms"): "aitk always gives an image's controls its flips "
    "and bucket crop (upstream's default)",
    ("datasets", "do_i2v"): "image-to-video training on a model that does both; aitk's i2v "
    "archs are their own arch ids",
    # ---- the other job kinds --------------------------------------------------------
    **_each("slider", "prompt_file prompt_tensors", "upstream's prompt files for sliders; "
            "aitk reads the targets' prompts"),
    **_each("slider", "use_adapter adapter_img_dir", _ADAPTER),
    **_each("extract", "extract_unet extract_text_encoder", _EXTRACT),
    **_each("extract.process", "extract_unet extract_text_encoder", _EXTRACT),
    ("extract.process", "use_sparse_bias"): "a sparse bias beside the LoRA, which aitk does "
    "not extract",
    ("extract.process", "sparsity"): "the sparse bias's share; aitk extracts none",
    **_each("generate.generate", "prompt_2 neg_2", "second SDXL prompts; aitk sends the one "
            "prompt to every text encoder"),
    ("generate.generate", "guidance_rescale"): "the CFG rescale of SD-era pipelines; aitk "
    "uses plain CFG",
}

TABLES: dict[str, dict[Key, str]] = {
    "read as": DERIVED, "quiet": QUIET, "warned: instead": INSTEAD, "warned": DROPPED}


def reason(section: str, key: str) -> str | None:
    """Why aitk does not act on an upstream key, None for one that is not dropped."""
    return DROPPED.get((section, key))


def markdown_table() -> str:
    """docs/upstream-keys.md's table, from the tables above (one row per key)."""
    rows = ["| key | aitk | why |", "|---|---|---|"]
    for what, table in TABLES.items():
        for (section, key), why in sorted(table.items()):
            rows.append(f"| `{section}.{key}` | {what} | {why.replace('|', '/')} |")
    return "\n".join(rows) + "\n"
