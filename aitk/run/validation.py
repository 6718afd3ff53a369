"""`train.validation_config` (upstream's): a loss on held-out images, comparable across
steps and runs.

    validation_config:
      validation_items: [{image_path: held_out/a.jpg, prompt: "[trigger] a photo"}]
      resolution: 512              # each image at its bucket for this resolution
      validate_every_n_steps: 10   # and at step 0 and the last step
      validation_sigmas: [1.0, 0.75, 0.5, 0.25]

Each image is encoded once, at the start, with its prompt (`[trigger]` replaced, as in
sample prompts) and its own noise, drawn from a generator keyed by VALIDATION_SEED and
the image file's content, never by the step or the training seed: every validation of
every run that holds the same images scores the same inputs. At each noise level s
(timestep s * 1000 for flow matching, round(s * N) for DDPM) the prediction of the
published weights (the EMA's when it is on), in eval mode and without gradients, is
scored by mse against the schedule's target; the validation loss is the mean over
images and levels. Nothing here draws from the training generators.

Each validation is one entry of the loss log, `{"step": N, "val_loss": x, "time": t}`,
beside the training entries `{"step", "loss", "lr", "time"}`; the status file carries
`val_loss`, `best_val_step` and `best_val_loss`, and the end of the run names the step
with the lowest validation loss. A validation image that is missing or unreadable is
reported once and left out, as upstream.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from aitk.data.buckets import bucket_for
from aitk.data.dataset import BadInputFile, Item, image_size, load_pixels
from aitk.models.base import BaseModel
from aitk.models.prompt_embeds import AdvancedPromptEmbeds
from aitk.run.objectives import evaluating
from aitk.run.sampling import sample_prompt
from aitk_common.files import sha256_file

VALIDATION_SEED = 42  # upstream's; with each image's content digest


@dataclass(frozen=True)
class Held:
    """One validation image, encoded: clean latents, its noise, its prompt's embeds."""

    path: Path
    latents: torch.Tensor  # (1, C, [f,] h, w) on the CPU
    noise: torch.Tensor
    embeds: AdvancedPromptEmbeds


def image_noise(digest: str, like: torch.Tensor) -> torch.Tensor:
    """The image's own noise: from (VALIDATION_SEED, its content), nothing else."""
    words = [VALIDATION_SEED, *np.frombuffer(bytes.fromhex(digest[:32]), np.uint32)]
    state = np.random.SeedSequence([int(w) for w in words]).generate_state(2, np.uint32)
    generator = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
    return torch.randn(like.shape, generator=generator)


def validation_prompts(cfg: Any, trigger: str | None) -> list[str]:
    return [sample_prompt(v.prompt, trigger) for v in cfg.validation_items]


def hold_out(model: BaseModel, cfg: Any, trigger: str | None,
             prompt_embeds: Mapping[str, AdvancedPromptEmbeds],
             say: Callable[[str], None]) -> list[Held]:
    """Encode the validation images (the prompts' embeds were made before the text
    encoder could be unloaded: aitk.run.caches.Inputs.prompt_embeds)."""
    held = []
    for v, prompt in zip(cfg.validation_items, validation_prompts(cfg, trigger),
                         strict=True):
        path = Path(v.image_path).expanduser()
        try:
            size = image_size(path)
            digest = sha256_file(path)
        except (OSError, BadInputFile, ValueError, SyntaxError) as exc:
            say(f"validation image {path} is missing or unreadable "
                f"({exc.__class__.__name__}); left out")
            continue
        except Exception as exc:  # PIL's errors for a file that is not an image
            say(f"validation image {path} is unreadable ({exc.__class__.__name__}); "
                "left out")
            continue
        bucket = bucket_for(*size, cfg.resolution, model.get_bucket_divisibility())
        if bucket is None:
            say(f"validation image {path} is smaller than one bucket cell; left out")
            continue
        item = Item(path, prompt, size, bucket, frames=(0,) if model.is_video else None)
        with torch.no_grad():
            latents = model.encode_images(load_pixels(item)[None].to(model.device))
        latents = latents.detach().float().cpu()
        held.append(Held(path, latents, image_noise(digest, latents),
                         prompt_embeds[prompt].detach().to("cpu")))
    return held


def validation_loss(model: BaseModel, held: Sequence[Held], sigmas: Sequence[float]
                    ) -> float:
    """The mean mse over images and noise levels, each image a batch of its levels."""
    schedule = model.training_schedule
    levels = torch.tensor([float(s) for s in sigmas])
    timesteps = schedule.timesteps_at(levels).to(model.device)
    losses = []
    with torch.no_grad(), evaluating(model.get_model_to_train()):
        for h in held:
            n = len(levels)
            clean = h.latents.to(model.device, model.dtype).expand(n, *h.latents.shape[1:])
            noise = h.noise.to(model.device, model.dtype).expand(n, *h.noise.shape[1:])
            noisy = model.add_noise(clean, noise, timesteps)
            embeds = h.embeds.to(model.device, model.dtype).expand_to_batch(n)
            pred = model.get_noise_prediction(noisy, timesteps, embeds)
            target = schedule.target(clean, noise, timesteps)
            losses.append(torch.nn.functional.mse_loss(pred.float(), target.float()))
    return float(torch.stack(losses).mean())


def history(log_path: Path | None, upto_step: int) -> list[tuple[int, float]]:
    """(step, val_loss) entries of an earlier start of this run, for the best so far."""
    if log_path is None or not log_path.is_file():
        return []
    out = []
    for line in log_path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
            if "val_loss" in entry and int(entry["step"]) <= upto_step:
                out.append((int(entry["step"]), float(entry["val_loss"])))
        except (ValueError, KeyError, TypeError):
            continue
    return out


class Validation:
    """The loop's `validate(step)` on rank 0; `best` is (step, loss) or None."""

    def __init__(self, model: BaseModel, held: Sequence[Held], sigmas: Sequence[float],
                 published: Callable[[], Any], record: Callable[[dict[str, Any]], None],
                 status: Any, say: Callable[[str], None],
                 earlier: Sequence[tuple[int, float]] = ()) -> None:
        self.model, self.held, self.sigmas = model, list(held), list(sigmas)
        self.published, self.record, self.status, self.say = published, record, status, say
        self.best: tuple[int, float] | None = min(earlier, key=lambda e: e[1], default=None)

    def __call__(self, step: int) -> float | None:
        if not self.held:
            return None
        with self.published():
            loss = validation_loss(self.model, self.held, self.sigmas)
        if self.best is None or loss < self.best[1]:
            self.best = (step, loss)
        self.record({"step": step, "val_loss": loss, "time": round(time.time(), 6)})
        self.status.validated(loss, *self.best)
        self.say(f"validation loss {loss:.5f} at step {step} (lowest: {self.best[1]:.5f} "
                 f"at step {self.best[0]})")
        return loss

    def summary(self) -> str | None:
        if self.best is None:
            return None
        return f"lowest validation loss {self.best[1]:.5f} at step {self.best[0]}"
