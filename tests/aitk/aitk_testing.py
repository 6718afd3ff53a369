"""Helpers shared by the trainer tests (imported as `aitk_testing`; conftest.py puts this
folder on sys.path). `TinyModel` is a stand-in BaseModel with a few hundred parameters
and a trivial additive adapter, so loop, cache and sampling tests run in milliseconds;
the end-to-end tests use the real `example` arch.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from PIL import Image
from torch import nn

from aitk.models.base import BaseModel, GenerateImageConfig
from aitk.models.prompt_embeds import AdvancedPromptEmbeds

REPO = Path(__file__).resolve().parents[2]


class TinyTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj_in = nn.Conv2d(4, 8, 1)
        self.time = nn.Linear(1, 8)
        self.text = nn.Linear(8, 8)
        self.proj_out = nn.Conv2d(8, 4, 1)
        self.adapter_delta: torch.Tensor | None = None

    def forward(self, x: torch.Tensor, t: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        h = self.proj_in(x) + self.time(t[:, None] / 1000)[..., None, None]
        h = h + self.text(ctx.mean(1))[..., None, None]
        out = self.proj_out(torch.nn.functional.silu(h))
        if self.adapter_delta is not None:
            out = out + self.adapter_delta.view(1, -1, 1, 1)
        return out


class TinyModel(BaseModel):
    arch = "tiny"

    def load_model(self) -> None:
        gen = torch.Generator().manual_seed(0)
        self.model = TinyTransformer()
        for p in self.model.parameters():
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
            p.requires_grad_(False)
        self.text_encoder = nn.Embedding(256, 8)
        with torch.no_grad():
            self.text_encoder.weight.copy_(torch.randn(256, 8, generator=gen))
        self.vae = nn.Identity()
        self.encode_calls = 0
        self.nan = False

    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        self.encode_calls += 1
        pooled = torch.nn.functional.avg_pool2d(images, 4)
        return torch.cat([pooled, pooled.mean(1, keepdim=True)], dim=1)

    def decode_latents(self, latents: torch.Tensor) -> torch.Tensor:
        return latents[:, :3]

    def get_prompt_embeds(self, prompts: list[str], control_images=None) -> AdvancedPromptEmbeds:
        if self.text_encoder is None:
            raise RuntimeError("text encoder unloaded")
        ids = [torch.tensor([0, *prompt.encode()[:32]]) for prompt in prompts]
        return AdvancedPromptEmbeds(text_embeds=[self.text_encoder(i) for i in ids])

    def get_noise_prediction(self, latent_model_input, timestep, text_embeddings, batch=None,
                             **kwargs):
        ctx, _mask = text_embeddings.pad("text_embeds")
        out = self.model(latent_model_input, timestep, ctx)
        return out * float("nan") if self.nan else out

    def get_generation_pipeline(self):
        return "pipeline"

    def generate_single_image(self, pipeline, gen_config: GenerateImageConfig,
                              conditional_embeds, unconditional_embeds, generator):
        x = torch.randn(1, 4, gen_config.height // 4, gen_config.width // 4,
                        generator=generator)
        for i in range(gen_config.sample_steps):
            t = torch.full((1,), 1000.0 * (1 - i / gen_config.sample_steps))
            x = x - self.get_noise_prediction(x, t, conditional_embeds) / gen_config.sample_steps
        arr = ((x[0, :3].clamp(-1, 1) + 1) * 127.5).byte().permute(1, 2, 0).numpy()
        return Image.fromarray(arr).resize((gen_config.width, gen_config.height))

    def get_bucket_divisibility(self) -> int:
        return 8

    def identity(self) -> str:
        return "tiny-model-v1"


class TinyAdapter:
    """The network interface the trainer uses, over one additive bias."""

    def __init__(self, model: TinyModel) -> None:
        self.delta = nn.Parameter(torch.zeros(4))
        self.model = model.model
        model.model.adapter_delta = self.delta

    @contextlib.contextmanager
    def disabled(self):
        """The base model alone inside the block (AdapterNetwork.disabled's contract)."""
        self.model.adapter_delta = None
        try:
            yield
        finally:
            self.model.adapter_delta = self.delta

    def trainable_parameters(self):
        return [self.delta]

    def state_dict(self):
        return {"delta": self.delta.detach().clone()}

    def load_state_dict(self, sd):
        with torch.no_grad():
            self.delta.copy_(sd["delta"])


def model_settings(**kw):
    base = dict(arch="tiny", name_or_path="tiny", quantize=False, quantize_te=False,
                qtype="qfloat8", qtype_te="qfloat8", model_kwargs={})
    base.update(kw)
    return SimpleNamespace(**base)


def write_image(path: Path, size=(64, 48), color=(200, 30, 30), caption: str | None = None):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)
    if caption is not None:
        path.with_suffix(".txt").write_text(caption)
    return path


def run_py(*args: str, cwd: Path = REPO, env: dict | None = None, timeout: float = 600,
           ) -> subprocess.CompletedProcess:
    """The real entry point in a child process, as a user would run it."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([sys.executable, str(REPO / "run.py"), *args], cwd=cwd,
                          env=full_env, capture_output=True, text=True, timeout=timeout)


def job_config(name: str, training_folder: Path, model_dir: Path, *, steps: int = 6,
               **process_overrides) -> dict:
    """A small job on the example arch and the repo's example dataset."""
    process = {
        "type": "sd_trainer",
        "training_folder": str(training_folder),
        "device": "cpu",
        "trigger_word": "p1xel",
        "network": {"type": "lora", "linear": 4, "linear_alpha": 4},
        "save": {"dtype": "float32", "save_every": 3, "max_step_saves_to_keep": 1},
        "datasets": [{"folder_path": str(REPO / "datasets" / "example"),
                      "resolution": [32], "cache_latents_to_disk": True}],
        "train": {"batch_size": 2, "steps": steps, "lr": 2e-3, "optimizer": "adamw",
                  "gradient_checkpointing": False, "cache_text_embeddings": True,
                  "seed": 7},
        "model": {"arch": "example", "name_or_path": str(model_dir)},
        "sample": {"sample_every": 3, "width": 32, "height": 32, "sample_steps": 3,
                   "prompts": ["[trigger] a red circle", "a green square"],
                   "walk_seed": True, "seed": 1, "format": "png"},
    }
    for section, values in process_overrides.items():
        if isinstance(values, dict) and isinstance(process.get(section), dict):
            process[section] = {**process[section], **values}
        else:
            process[section] = values
    return {"job": "extension", "config": {"name": name, "process": [process]},
            "meta": {"name": "[name]", "version": "1.0"}}


def scratch_checkout(folder: Path) -> Path:
    """`folder` laid out like the checkout for the shipped example configs: their
    relative paths (datasets/, the example's base model) resolve as they do for a user
    in the checkout, and outputs land in `folder`, not in the checkout. Run from it."""
    (folder / "datasets").symlink_to(REPO / "datasets")
    base = Path("aitk", "models", "example", "base")
    (folder / base.parent).mkdir(parents=True)
    (folder / base).symlink_to(REPO / base)
    return folder


def write_config(path: Path, config: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(config))
    return path
