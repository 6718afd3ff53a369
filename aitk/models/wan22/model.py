"""Wan 2.2 14B: `wan22_14b` (text to video) and `wan22_14b_i2v` (image to video), two
experts on the Wan 2.1 code (aitk.models.wan21).

`name_or_path`: a diffusers folder or hub id (Wan-AI/Wan2.2-T2V-A14B-Diffusers,
Wan-AI/Wan2.2-I2V-A14B-Diffusers) with the Wan 2.1 parts plus

    transformer/     the high-noise expert: timesteps t >= boundary * 1000
    transformer_2/   the low-noise expert: t < boundary * 1000

with boundary 0.875 (t2v) or 0.9 (i2v), the split diffusers' WanPipeline makes with
`boundary_ratio`. The 2.2 i2v model has no CLIP image encoder: only the first-frame
condition channels.

Training (upstream's keys):
- `model.model_kwargs.train_high_noise` / `train_low_noise` (both true by default; at
  least one): which experts get a LoRA.
- `train.switch_boundary_every` (default 1): the trained experts take turns, this many
  micro-batches each, starting with the high-noise one; timesteps are drawn only in
  the active expert's range (the configured timestep distribution mapped linearly
  into it). The turn is a pure function of the micro-batch number
  (BaseModel.begin_micro_step), so a resumed run trains exactly as an uninterrupted one.
- Each timestep runs through the expert that owns it (the same rule as previews).

LoRA files: one per trained expert, named as upstream names them,
`NAME_high_noise.safetensors` (load it into ComfyUI's high-noise model loader /
diffusers' `transformer`) and `NAME_low_noise.safetensors` (low-noise loader /
`load_lora_weights(..., load_into_transformer_2=True)`), each in the Wan 2.1 layout
(`diffusion_model.` + original Wan names, with alpha). Step saves are
`NAME_000000250_high_noise.safetensors` etc. A combined file with upstream's
`diffusion_model.transformer_1.` / `transformer_2.` keys also loads.

low_vram: the idle expert waits on the CPU while the other works (training and
previews). With low_vram and gradient accumulation, keep `switch_boundary_every` a
multiple of the accumulation so one optimizer step never spans both experts.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from aitk.diffusion.flow_matching import FlowMatchSchedule, image_tokens
from aitk.diffusion.noise import NoiseSchedule, NoiseSettings
from aitk.errors import AdapterError
from aitk.models.wan21.lora_keys import from_wan_keys, to_wan_keys
from aitk.models.wan21.model import FirstFrameConditioned, Wan21Model, run_transformer
from aitk.models.wan21.tiny import WAN22_14B, WAN22_14B_I2V

HIGH, LOW = "transformer", "transformer_2"
EXPERTS = (HIGH, LOW)
BOUNDARY_T2V, BOUNDARY_I2V = 0.875, 0.9
FILE_SUFFIX = {HIGH: "_high_noise", LOW: "_low_noise"}
# How upstream marks each expert's keys in one combined file (split_multistage_loras off).
COMBINED_MARK = {HIGH: "transformer_1", LOW: "transformer_2"}
PUBLIC = "diffusion_model."


class WanExperts(nn.Module):
    """The two experts as one module, so one LoRA network spans both (its Linear paths
    start with `transformer.` or `transformer_2.`)."""

    def __init__(self, transformer: nn.Module, transformer_2: nn.Module) -> None:
        super().__init__()
        self.transformer = transformer
        self.transformer_2 = transformer_2

    @property
    def config(self) -> Any:
        return self.transformer.config

    def expert(self, name: str) -> nn.Module:
        return getattr(self, name)

    def enable_gradient_checkpointing(self) -> None:
        self.transformer.enable_gradient_checkpointing()
        self.transformer_2.enable_gradient_checkpointing()


def expert_for_micro_step(index: int, every: int, trainable: Sequence[str]) -> str:
    """Upstream's turn order: the first trainable expert (high before low) for `every`
    micro-batches, then the next, round and round."""
    return trainable[(index // max(1, every)) % len(trainable)]


def expert_for_timestep(t: torch.Tensor, boundary: float) -> torch.Tensor:
    """True where the high-noise expert owns t (t >= boundary * 1000, as WanPipeline)."""
    return t >= boundary * 1000.0


def expert_range(expert: str, boundary: float) -> tuple[float, float]:
    """The timesteps (on 0..1000) an expert owns."""
    edge = boundary * 1000.0
    return (edge, 1000.0) if expert == HIGH else (0.0, edge)


@dataclass
class ExpertSchedule:
    """Flow matching with timesteps drawn in the active expert's range; everything else
    is the wrapped schedule's. `expert` None: the whole range."""

    base: FlowMatchSchedule
    boundary: float
    expert: str | None = None

    @property
    def settings(self) -> NoiseSettings:
        return self.base.settings

    def sample_noise(self, clean: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return self.base.sample_noise(clean, generator)

    def sample_timesteps(self, clean: torch.Tensor, generator: torch.Generator
                         ) -> torch.Tensor:
        t = self.base.sample_timesteps(clean, generator)
        if self.expert is None:
            return t
        lo, hi = expert_range(self.expert, self.boundary)
        return lo + t / 1000.0 * (hi - lo)

    def add_noise(self, clean: torch.Tensor, noise: torch.Tensor,
                  timesteps: torch.Tensor) -> torch.Tensor:
        return self.base.add_noise(clean, noise, timesteps)

    def target(self, clean: torch.Tensor, noise: torch.Tensor,
               timesteps: torch.Tensor) -> torch.Tensor:
        return self.base.target(clean, noise, timesteps)

    def loss_weights(self, timesteps: torch.Tensor) -> torch.Tensor | None:
        return self.base.loss_weights(timesteps)

    def __getattr__(self, name: str) -> Any:
        # The base schedule's optional pieces (next_sample's table, predicted_clean,
        # timesteps_at) serve both experts alike.
        if name.startswith("_") or name == "base":
            raise AttributeError(name)
        return getattr(self.base, name)


class Wan22Model(Wan21Model):
    arch = "wan22_14b"
    tiny_variant = WAN22_14B
    denoiser_subfolders = EXPERTS  # get_model_to_train(): WanExperts, one attribute each
    # Until load_model reads model_kwargs, both experts (what an unloaded instance
    # answers: extraction converts and splits LoRA keys without loading).
    trainable: tuple[str, ...] = EXPERTS
    lora_block_prefixes = tuple(f"{e}.blocks." for e in EXPERTS)
    boundary: float = BOUNDARY_T2V
    switch_every = 1

    # ---- 1. load -------------------------------------------------------------------
    def recovery_adapter_prefix(self, subfolder: str) -> str:
        # Upstream fits one adapter to its combined model: `transformer_1.` (high
        # noise) and `transformer_2.` (low noise) + each expert's module names.
        return f"{COMBINED_MARK[subfolder]}."

    def load_transformers(self, name: str) -> nn.Module:
        # At least one is true: the knobs' own check (aitk.models.wan22.arch).
        kwargs = self.model_kwargs
        self.trainable = tuple(e for e, on in ((HIGH, kwargs.train_high_noise),
                                               (LOW, kwargs.train_low_noise)) if on)
        # The LoRA goes on the blocks of the trained experts only.
        self.lora_block_prefixes = tuple(f"{e}.blocks." for e in self.trainable)
        # With low_vram the low-noise expert starts on the CPU: two 14B experts never
        # sit on the GPU together.
        return WanExperts(self.load_transformer(name, HIGH),
                          self.load_transformer(name, LOW, self.idle_device))

    @property
    def transformers(self) -> list[nn.Module]:
        return [self.model.transformer, self.model.transformer_2]

    def _place(self, expert: str) -> nn.Module:
        """The expert, on the device; with low_vram the other one waits on the CPU."""
        module = self.model.expert(expert)
        if self.low_vram:
            self.model.expert(LOW if expert == HIGH else HIGH).to("cpu")
            module.to(self.device)
        return module

    # ---- 3. train step -------------------------------------------------------------
    def configure_training(self, train_config: Any) -> None:
        self.switch_every = int(getattr(train_config, "switch_boundary_every", 1) or 1)
        super().configure_training(train_config)

    def make_training_schedule(self, settings: NoiseSettings) -> NoiseSchedule:
        return ExpertSchedule(FlowMatchSchedule(settings, self.flow_shift(), image_tokens(2)),
                              self.boundary)

    def begin_micro_step(self, index: int) -> None:
        schedule = self.training_schedule
        assert isinstance(schedule, ExpertSchedule)
        schedule.expert = expert_for_micro_step(index, self.switch_every, self.trainable)

    def denoise(self, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor,
                image: torch.Tensor | None) -> torch.Tensor:
        """Each item through the expert that owns its timestep."""
        high = expert_for_timestep(t, self.boundary)
        if bool(high.all()) or not bool(high.any()):
            expert = self._place(HIGH if bool(high.all()) else LOW)
            return run_transformer(expert, x, t, context, image)
        out = None
        for expert, mask in ((HIGH, high), (LOW, ~high)):
            idx = mask.nonzero().flatten()
            pred = run_transformer(self._place(expert), x[idx], t[idx], context[idx],
                                   None if image is None else image[idx])
            if out is None:
                out = pred.new_zeros((x.shape[0], *pred.shape[1:]))
            out = out.index_put((idx,), pred)
        return out

    # ---- 4. previews ---------------------------------------------------------------
    def pipeline_transformers(self) -> dict[str, Any]:
        return {"transformer": self.model.transformer,
                "transformer_2": self.model.transformer_2, "boundary_ratio": self.boundary}

    @contextlib.contextmanager
    def preview_devices(self) -> Iterator[None]:
        hooks = []
        if self.low_vram:  # swap the experts in as the pipeline calls them
            for name in EXPERTS:
                hooks.append(self.model.expert(name).register_forward_pre_hook(
                    lambda _m, _a, name=name: self._place(name) and None))
        try:
            with super().preview_devices():
                yield
        finally:
            for hook in hooks:
                hook.remove()

    # ---- 5. saving -----------------------------------------------------------------
    def convert_lora_weights_before_save(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        """`transformer(_2).blocks...` -> upstream's combined names,
        `diffusion_model.transformer_1(_2).blocks...` (original Wan module names)."""
        out: dict[str, torch.Tensor] = {}
        for expert in EXPERTS:
            own = {k[len(expert) + 1:]: v for k, v in state_dict.items()
                   if k.startswith(expert + ".")}
            for key, value in to_wan_keys(own).items():
                out[f"{PUBLIC}{COMBINED_MARK[expert]}.{key[len(PUBLIC):]}"] = value
        return out

    def convert_lora_weights_before_load(self, state_dict: dict[str, torch.Tensor]
                                         ) -> dict[str, torch.Tensor]:
        per_expert: dict[str, dict[str, torch.Tensor]] = {e: {} for e in EXPERTS}
        for key, value in state_dict.items():
            expert, rest = self._expert_of_key(key)
            per_expert[expert][rest] = value
        return {f"{expert}.{k}": v for expert, sd in per_expert.items()
                for k, v in from_wan_keys(sd).items()}

    def _expert_of_key(self, key: str) -> tuple[str, str]:
        """(expert, the key without its expert mark). An unmarked key (one expert's
        file given alone) belongs to the one trained expert."""
        for expert, mark in COMBINED_MARK.items():
            for prefix in (PUBLIC, "transformer."):
                if key.startswith(f"{prefix}{mark}."):
                    return expert, prefix + key[len(prefix) + len(mark) + 1:]
        if len(self.trainable) == 1:
            return self.trainable[0], key
        raise AdapterError(f"LoRA key {key!r} names no expert; load the "
                           "NAME_high_noise/_low_noise pair through NAME.safetensors")

    def lora_file_suffixes(self) -> tuple[str, ...]:
        return tuple(FILE_SUFFIX[e] for e in self.trainable)

    def split_lora_file(self, state_dict: dict[str, torch.Tensor]
                        ) -> dict[str, dict[str, torch.Tensor]]:
        parts: dict[str, dict[str, torch.Tensor]] = {FILE_SUFFIX[e]: {} for e in self.trainable}
        for key, value in state_dict.items():
            expert, rest = self._expert_of_key(key)
            parts[FILE_SUFFIX[expert]][rest] = value
        return parts

    def join_lora_files(self, parts: dict[str, dict[str, torch.Tensor]]
                        ) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for expert in EXPERTS:
            for key, value in parts.get(FILE_SUFFIX[expert], {}).items():
                out[f"{PUBLIC}{COMBINED_MARK[expert]}.{key[len(PUBLIC):]}"] = value
        return out


class Wan22I2VModel(FirstFrameConditioned, Wan22Model):
    arch = "wan22_14b_i2v"
    tiny_variant = WAN22_14B_I2V
    boundary = BOUNDARY_I2V
