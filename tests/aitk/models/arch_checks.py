"""What the per-arch model tests (test_flux.py, test_qwen_image.py, ...) share: the tiny
model folder, stand-ins for the trainer's `model:` and `train:` sections, the small
end-to-end LoRA job, the checks on what a job leaves behind (a trained LoRA file and its
preview; a Ctrl+C then a resume that ends on the uninterrupted run's weights), and the
gradient-checkpointing, quantization and diffusers-interop checks that are the same
logic in several archs, and the small pieces those archs' tests had each written again
(loading the tiny model, a training batch, the job's run, the Turbo training adapter,
the offline hub-id error). The renders held against diffusers' pipelines are built in
pipeline_checks.py beside it. Each arch's file keeps what is its own: its shapes and
layers, its LoRA layout, its settings and tolerances where they differ.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from aitk.adapters import AdapterNetwork
from aitk.cli.run import main as cli_main
from aitk.config.loading import load_config
from aitk.data.batch import DataBatch
from aitk.errors import EXIT_INTERRUPTED, EXIT_OK
from aitk.models.base import BaseModel, GenerateImageConfig
from aitk.models.registry import load_model
from aitk.run import train as train_module
from aitk.run.job import run_job
from aitk.run.signals import StopFlag
from aitk.run.train import compute_loss, step_generator
from tests.aitk.aitk_testing import REPO, job_config, write_config
from tests.aitk.models.conftest import ModelCfg, NetCfg

STEPS = 4  # the end-to-end job's length; the Ctrl+C checks stop it during step 2
ALPHA = 8  # the job's LoRA alpha, != rank 4: the file must carry the scale other tools apply


# ---- the model and the trainer's sections, as a model reads them -------------------------
def tiny_model_folder(cls: type[BaseModel],
                      scope: Literal["module", "session"] = "module") -> Any:
    """A fixture, to bind to a module-level name (`flux_dir = tiny_model_folder(FluxModel)`):
    the folder of `cls.build_tiny`'s random model, built once per `scope`."""

    @pytest.fixture(scope=scope)
    def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
        target = tmp_path_factory.mktemp(cls.arch) / "model"
        cls.build_tiny(target)
        return target

    return folder


def model_cfg(arch: str, path: Path | str, **overrides: Any) -> ModelCfg:
    """The `model:` section for the model of `arch` at `path`."""
    return ModelCfg(name_or_path=str(path), arch=arch, **overrides)


def load_tiny(cls: type[BaseModel], path: Path | str, **overrides: Any) -> Any:
    """A `cls` on the model at `path` (its `model:` section: `model_cfg(cls.arch, ...)`),
    loaded."""
    model = cls(model_cfg(cls.arch, path, **overrides))
    model.load_model()
    return model


def loaded_for_training(arch: str, path: Path | str, train: SimpleNamespace | None = None,
                        **overrides: Any) -> Any:
    """The model of `arch` at `path` as the registry loads it (`overrides` in its
    `model:` section), configured for training by `train` (default `train_cfg()`)."""
    model = load_model(model_cfg(arch, path, **overrides))
    model.configure_training(train if train is not None else train_cfg())
    return model


def image_batch(model: BaseModel, size: int = 2) -> DataBatch:
    """A training batch of `size` (at most 2) seeded random 32x32 images, encoded, with the
    prompts "a red circle" and "blue"."""
    prompts = ["a red circle", "blue"][:size]
    pixels = torch.rand(size, 3, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    return DataBatch(captions=prompts, latents=model.encode_images(pixels),
                     prompt_embeds=model.get_prompt_embeds(prompts))


def unseeded_batch(model: BaseModel, size: int = 2, width: int = 32) -> DataBatch:
    """A training batch of `size` (at most 2) random images (32 high, `width` wide) from
    torch's global generator, encoded, captioned "a" and "b", with the prompts "a red
    circle" and "blue"."""
    return DataBatch(captions=["a", "b"][:size],
                     latents=model.encode_images(torch.rand(size, 3, 32, width) * 2 - 1),
                     prompt_embeds=model.get_prompt_embeds(["a red circle", "blue"][:size]))


def clip_batch(model: BaseModel, frames: int, side: int, seed: int = 0) -> DataBatch:
    """A training batch of two seeded random clips (`frames` frames, `side` x `side`),
    kept as pixels and encoded, with the prompts "a red circle" and "blue"."""
    gen = torch.Generator().manual_seed(seed)
    pixels = torch.rand(2, 3, frames, side, side, generator=gen) * 2 - 1
    return DataBatch(captions=["a", "b"], tensor=pixels, latents=model.encode_images(pixels),
                     prompt_embeds=model.get_prompt_embeds(["a red circle", "blue"]))


def train_cfg(**overrides: Any) -> SimpleNamespace:
    """The `train:` section as `configure_training` reads it, at the trainer's defaults."""
    base = dict(timestep_type="sigmoid", noise_offset=0.0, min_snr_gamma=None,
                cfg_scale=1.0, bypass_guidance_embedding=False)
    return SimpleNamespace(**{**base, **overrides})


def randomise(net: AdapterNetwork, seed: int = 1, scale: float = 0.3) -> None:
    """Every adapter weight random: a fresh LoRA's zero B would hide what it does."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.trainable_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * scale)


# ---- the end-to-end job ------------------------------------------------------------------
def last_step_sample(**extra: Any) -> dict[str, Any]:
    """The job's `sample:` section: one 2-step 32x32 preview, fixed prompt and seed, at the
    last step."""
    return {"sample_every": STEPS, "width": 32, "height": 32, "sample_steps": 2,
            "prompts": ["[trigger] a red circle"], "seed": 1, "format": "png", **extra}


def lora_job_config(root: Path, name: str, arch: str, model_dir: Path,
                    **sections: Any) -> dict[str, Any]:
    """aitk_testing.job_config's job, made the arch tests' STEPS-step LoRA job on the model
    of `arch` at `model_dir`, training into `root/out/<name>`: rank 4 with alpha ALPHA,
    float32 saves every 2 steps (2 kept), `last_step_sample()`. Each of `sections`
    replaces one of these sections whole; job_config merges the result over its own."""
    settings: dict[str, Any] = {
        "network": {"type": "lora", "linear": 4, "linear_alpha": ALPHA},
        "model": {"arch": arch, "name_or_path": str(model_dir)},
        "save": {"dtype": "float32", "save_every": 2, "max_step_saves_to_keep": 2},
        "sample": last_step_sample(),
        **sections,
    }
    return job_config(name, root / "out", model_dir, steps=STEPS, **settings)


def write_lora_job(root: Path, name: str, arch: str, model_dir: Path,
                   **sections: Any) -> Path:
    """`lora_job_config(...)`, written to `root/<name>.yml`."""
    return write_config(root / f"{name}.yml",
                        lora_job_config(root, name, arch, model_dir, **sections))


def write_flow_job(root: Path, name: str, arch: str, model_dir: Path, timestep_type: str,
                   guidance_scale: float, lr: float = 5e-3,
                   preview: dict[str, Any] | None = None, **sections: Any) -> Path:
    """`write_lora_job(...)` as the flow-matching archs train it: learning rate `lr`,
    gradient checkpointing, seed 3, `timestep_type`; the preview at `guidance_scale`
    (`preview`'s keys added to its `sample:` section). Each of `sections` replaces one
    section whole."""
    settings = dict(
        train={"lr": lr, "gradient_checkpointing": True, "seed": 3,
               "timestep_type": timestep_type},
        sample=last_step_sample(**(preview or {}), guidance_scale=guidance_scale),
    )
    return write_lora_job(root, name, arch, model_dir, **{**settings, **sections})


def write_edit_job(root: Path, name: str, arch: str, model_dir: Path,
                   pairs: list[dict[str, Any]], samples: list[dict[str, Any]],
                   guidance_scale: float, **sections: Any) -> Path:
    """`write_flow_job(...)`'s edit form, without a trigger word: training on the
    datasets `pairs` (images and their controls) with `shift` timesteps, previewing each
    of `samples` (a prompt and its control images) at `guidance_scale` at the last step.
    Each of `sections` replaces one section whole."""
    settings = dict(
        datasets=pairs,
        train={"lr": 5e-3, "gradient_checkpointing": True, "seed": 3, "timestep_type": "shift"},
        sample={"sample_every": STEPS, "width": 32, "height": 32, "sample_steps": 2,
                "samples": samples, "seed": 1, "format": "png",
                "guidance_scale": guidance_scale},
    )
    cfg = lora_job_config(root, name, arch, model_dir, **{**settings, **sections})
    cfg["config"]["process"][0].pop("trigger_word")
    return write_config(root / f"{name}.yml", cfg)


def write_video_job(root: Path, name: str, arch: str, model_dir: Path, side: int,
                    **sections: Any) -> Path:
    """`write_flow_job(...)` for a video arch: `shift` timesteps, previews at `side` x
    `side` and guidance 1, the example images at `side` px with their latents cached to
    disk. Each of `sections` replaces one section whole."""
    settings = dict(
        train={"lr": 5e-3, "gradient_checkpointing": True, "seed": 3, "timestep_type": "shift"},
        sample=last_step_sample(width=side, height=side, guidance_scale=1.0),
        datasets=[{"folder_path": str(REPO / "datasets" / "example"), "resolution": [side],
                   "cache_latents_to_disk": True}],
    )
    return write_lora_job(root, name, arch, model_dir, **{**settings, **sections})


def job_folder(config: Path) -> Path:
    """Where the job written to `<root>/<name>.yml` (write_lora_job) trains: `root/out/<name>`."""
    return config.parent / "out" / config.stem


def ran_in_process(config: Path) -> Path:
    """The job at `config` (written to `<root>/<name>.yml`) run in this process to the
    end (exit 0); its job folder."""
    assert run_job(load_config(str(config))) == EXIT_OK
    return job_folder(config)


def assert_stop_flag_resume_matches(config: Path, straight: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`interrupt_via_stop_flag_then_resume` on the job at `config` (its step-2 save the
    checkpoint), whose final LoRA file then holds the weights of the same job run
    straight through into `straight`."""
    out, name = job_folder(config), config.stem
    interrupt_via_stop_flag_then_resume(config, out / f"{name}_000000002.safetensors",
                                        monkeypatch)
    assert_same_weights(out / f"{name}.safetensors", straight / f"{name}.safetensors")


def run_to_the_end(config: Path) -> Path:
    """`python run.py <config>` in this process: it must exit 0. Returns its job folder."""
    assert cli_main([str(config)]) == 0
    return job_folder(config)


def assert_hub_id_offline_is_one_line(config: Path, hub_id: str, capsys: Any,
                                      says: tuple[str, ...] = ("huggingface-cli download",),
                                      traceback_anywhere: bool = False) -> None:
    """`python run.py <config>` on a model named by `hub_id` with the hub offline (the
    `hub_offline` fixture): exit 2 and one `error` line, naming the id and each of `says`,
    no traceback in it (`traceback_anywhere`: none in all of stderr)."""
    assert cli_main([str(config)]) == 2
    stderr = capsys.readouterr().err
    err = [line for line in stderr.splitlines() if line.startswith("error")]
    assert len(err) == 1 and hub_id in err[0] and "Traceback" not in err[0]
    assert all(words in err[0] for words in says), err[0]
    if traceback_anywhere:
        assert "Traceback" not in stderr


# ---- what a job leaves behind ------------------------------------------------------------
def assert_trained_lora(out: Path, name: str, key_prefix: str) -> None:
    """The job folder `out` after the whole job: STEPS finite losses logged, the final
    `<name>.safetensors` with only `key_prefix` keys and up (B) weights that left their
    zero init, and the last step's preview."""
    losses = [json.loads(x)["loss"] for x in (out / "loss_log.jsonl").read_text()
              .splitlines()]
    assert len(losses) == STEPS and all(np.isfinite(losses))
    lora = load_file(out / f"{name}.safetensors")
    ups = [v for k, v in lora.items() if k.endswith(".lora_B.weight")]
    assert ups and all(k.startswith(key_prefix) for k in lora)
    assert any(v.abs().sum() > 0 for v in ups)  # trained away from the zero init
    assert (out / "samples" / f"{STEPS:09d}_0.png").is_file()


def assert_lora_file(path: Path, key_prefix: str, arch: str) -> None:
    """A trained LoRA file in a diffusers-named layout: only `key_prefix` keys, alpha
    ALPHA on every module, finite up (B) weights that left their zero init, and the arch
    in its metadata."""
    weights = load_file(path)
    assert weights and all(k.startswith(key_prefix) for k in weights)
    alphas = {k: v for k, v in weights.items() if k.endswith(".alpha")}
    assert alphas and all(float(v) == ALPHA for v in alphas.values())
    ups = [v for k, v in weights.items() if k.endswith("lora_B.weight")]
    assert ups and all(torch.isfinite(v).all() for v in ups)
    assert any(v.abs().max() > 0 for v in ups)  # trained: B left zero-init
    with safe_open(str(path), "pt") as fh:
        assert fh.metadata()["base_model_arch"] == arch


def tagged_process(root: Path, model_dir: Path, arch: str, **model: Any) -> Any:
    """The process of the job `lora_job_config(root, "tag", <arch's base>, model_dir)`
    as loaded from `root/tag.yml`, with `model.arch` = `arch` (an upstream tag such as
    `zimage:turbo`) and only `model`'s keys besides it (no name_or_path unless given),
    no sample settings."""
    config = lora_job_config(root, "tag", arch.split(":")[0], model_dir)
    proc = config["config"]["process"][0]
    proc["model"] = {"arch": arch, **model}
    proc["sample"] = {"sample_every": 4, "prompts": ["a"]}
    return load_config(str(write_config(root / "tag.yml", config))).job.config.process[0]


# ---- Ctrl+C, then resume -----------------------------------------------------------------
def interrupt_via_stop_flag_then_resume(config: Path, checkpoint: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs the job at `config` in this process with its own SIGINT handler (the StopFlag)
    called during step 2's loss: it must finish the step, save `checkpoint` and exit 130.
    Then runs it again: it must resume and finish. Wraps whatever `train.compute_loss` is
    at the call."""
    flags: list[StopFlag] = []
    original_init, original_loss = StopFlag.__init__, train_module.compute_loss

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        flags.append(self)

    calls = []

    def loss(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            flags[-1].handle(signal.SIGINT, None)
        return original_loss(*args, **kwargs)

    with monkeypatch.context() as mp:
        mp.setattr(StopFlag, "__init__", init)
        mp.setattr(train_module, "compute_loss", loss)
        assert run_job(load_config(str(config))) == EXIT_INTERRUPTED
    assert checkpoint.exists()
    assert run_job(load_config(str(config))) == EXIT_OK


def interrupt_via_sigint_then_resume(argv: list[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`python run.py <argv>` (aitk.cli.run) in this process, a real SIGINT sent to it
    during step 2's loss: exit 130. Then the same again, undisturbed: it must resume and
    finish (exit 0)."""
    real = train_module.compute_loss
    calls = []

    def signalling(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return real(*args, **kwargs)

    monkeypatch.setattr(train_module, "compute_loss", signalling)
    assert cli_main(argv) == 130
    monkeypatch.setattr(train_module, "compute_loss", real)
    assert cli_main(argv) == 0


def assert_reads_back(network: AdapterNetwork, lora: Path,
                      internal: dict[str, torch.Tensor], seed: int) -> None:
    """`network`, its weights made random again (`seed`), then loaded from `lora`, holds
    `internal` exactly."""
    randomise(network, seed=seed)
    network.load_file(lora)
    assert all(torch.equal(network.state_dict()[k], v) for k, v in internal.items())


def with_alpha_keys(internal: dict[str, torch.Tensor],
                    prefix: str) -> dict[str, torch.Tensor]:
    """An adapter's `internal` weights as a file of other trainers writes them: `prefix`
    before each name, and an `.alpha` of ALPHA for each module."""
    weights = {f"{prefix}{k}": v for k, v in internal.items()}
    weights.update({f"{prefix}{k.rsplit('.lora_', 1)[0]}.alpha": torch.tensor(float(ALPHA))
                    for k in internal})
    return weights


def assert_same_weights(resumed: Path, straight: Path) -> None:
    """The interrupted-and-resumed run's LoRA file holds the uninterrupted run's weights."""
    ours, theirs = load_file(resumed), load_file(straight)
    assert ours.keys() == theirs.keys()
    assert max((ours[k] - theirs[k]).abs().max().item() for k in theirs) <= 1e-6


def assert_ctrl_c_then_resume_matches(config: Path, trained: Path,
                                      monkeypatch: pytest.MonkeyPatch,
                                      argv: tuple[str, ...] = ()) -> None:
    """`interrupt_via_sigint_then_resume` on the job at `config` (`argv` after it), whose
    final LoRA file then holds the weights of the same job run straight through into
    `trained`."""
    interrupt_via_sigint_then_resume([str(config), *argv], monkeypatch)
    name = f"{config.stem}.safetensors"
    assert_same_weights(job_folder(config) / name, trained / name)


# ---- memory: gradient checkpointing, quantization -----------------------------------------
def prediction_grads(model: BaseModel, net: AdapterNetwork, inputs: tuple[Any, Any, Any],
                     checkpointing: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The loss (the squared prediction on `inputs`: latents, timesteps, embeds) and the
    LoRA's gradients of one backward pass, with the transformer's gradient checkpointing
    on or off."""
    latents, timesteps, embeds = inputs
    if checkpointing:
        model.model.enable_gradient_checkpointing()
    else:
        model.model.disable_gradient_checkpointing()
    for p in net.trainable_parameters():
        p.grad = None
    loss = model.get_noise_prediction(latents, timesteps, embeds).pow(2).mean()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in net.trainable_parameters()]


def step_grads_without_and_with_checkpointing(
        model: BaseModel, params: list[torch.Tensor], batch: DataBatch,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The gradients on `params` of one training step's loss on `batch` (zeros where
    none reached), in train mode: first as loaded, then with the transformer's gradient
    checkpointing on."""

    def grads() -> list[torch.Tensor]:
        for p in params:
            p.grad = None
        compute_loss(model, batch, step_generator(1, 0, 0)).backward()
        return [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]

    model.model.train()
    plain = grads()
    model.model.enable_gradient_checkpointing()
    return plain, grads()


def more_than_half(reached: list[bool]) -> bool:
    """For `assert_checkpointing_keeps_the_lora_gradients`: most adapters got a gradient."""
    return sum(reached) > len(reached) // 2


def normal_factors(network: AdapterNetwork) -> None:
    """Every adapter weight drawn from N(0, 0.05^2) (torch's global generator)."""
    with torch.no_grad():
        for p in network.trainable_parameters():
            p.normal_(0.0, 0.05)


def small_random_factors(network: AdapterNetwork) -> None:
    """`randomise(network, scale=0.05)`: seeded, small."""
    randomise(network, scale=0.05)


def assert_checkpointing_keeps_the_lora_gradients(
        model: BaseModel, batch: Callable[[BaseModel], DataBatch],
        reached: Callable[[list[bool]], bool] = all,
        init: Callable[[AdapterNetwork], None] = normal_factors,
        **network_kwargs: Any) -> None:
    """A rank-4 LoRA (alpha 4, `network_kwargs` choosing its layers) on `model`, both
    factors made random by `init` (B starts at zero): one training step on `batch(model)`
    (made after that) gives the same LoRA gradients with and without gradient
    checkpointing, and `reached` holds of which adapters got a nonzero one (`all`, `any`,
    `more_than_half`)."""
    network = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=4.0,
                                                  **network_kwargs))
    params = list(network.trainable_parameters())
    init(network)
    plain, checkpointed = step_grads_without_and_with_checkpointing(model, params,
                                                                    batch(model))
    assert reached([bool(g.abs().max() > 0) for g in plain])
    for a, b in zip(plain, checkpointed, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def assert_a_step_moves_only_the_lora(model: BaseModel, net: AdapterNetwork,
                                      prompt: str) -> None:
    """One AdamW step on the squared error of a 1x4x4x4 (flux-family) latent's
    prediction with `prompt`: the loss is finite, only `.lora_` weights of the
    transformer change, and only the LoRA's parameters require grad."""
    tr = model.model
    before = {k: v.clone() for k, v in tr.state_dict().items()}
    opt = torch.optim.AdamW(net.trainable_parameters(), lr=1e-2)
    embeds = model.get_prompt_embeds([prompt])
    latents = torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(0))
    loss = (model.get_noise_prediction(latents, torch.tensor([500.0]), embeds) - latents
            ).pow(2).mean()
    assert torch.isfinite(loss)
    loss.backward()
    opt.step()
    trained = {id(p) for p in net.trainable_parameters()}
    changed = [k for k, v in tr.state_dict().items() if not torch.equal(before[k], v)]
    assert changed and all(".lora_" in k for k in changed)
    assert all(p.requires_grad == (id(p) in trained) for p in tr.parameters())


def assert_a_step_reaches_only_the_lora(model: BaseModel, network: AdapterNetwork,
                                        batch: DataBatch) -> None:
    """One training step's loss on `batch` is finite and its gradients reach the
    transformer's LoRA parameters only (a quantized base must stay frozen)."""
    loss = compute_loss(model, batch, step_generator(0, 0, 0))
    loss.backward()
    assert torch.isfinite(loss)
    trainable = {id(p) for p in network.trainable_parameters()}
    with_grad = [n for n, p in model.model.named_parameters() if p.grad is not None]
    assert with_grad and all("lora_" in n for n in with_grad)
    assert all(id(p) in trainable for p in model.model.parameters() if p.requires_grad)


# ---- a training adapter (a Turbo model's de-distillation LoRA) ----------------------------
def assert_adapter_merged_for_training_and_out_of_previews(
        plain: BaseModel, turbo: BaseModel, name: str, down: torch.Tensor,
        up: torch.Tensor) -> None:
    """`turbo`, loaded as `plain` with a training adapter (`down`, `up` on the layer
    `name`, alpha = rank): the adapter is merged into the frozen transformer and training
    sees it; previews are the model without it, as upstream samples Turbo; and training
    after a preview has it back."""
    assert torch.allclose(turbo.model.get_submodule(name).weight,
                          plain.model.get_submodule(name).weight + up @ down, atol=1e-5)
    assert not any(p.requires_grad for p in turbo.model.parameters())
    latents = torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(1))
    embeds = plain.get_prompt_embeds(["a red circle"])
    with torch.no_grad():
        before = plain.get_noise_prediction(latents, torch.tensor([500.0]), embeds)
        after = turbo.get_noise_prediction(latents, torch.tensor([500.0]), embeds)
    assert (before - after).abs().max() > 1e-3
    gen = GenerateImageConfig(prompt="a red circle", width=32, height=32, sample_steps=2,
                              seed=3, guidance_scale=1.0)
    assert np.abs(image_array(turbo.generate_images([gen])[0])
                  - image_array(plain.generate_images([gen])[0])).max() <= 1 / 255
    with torch.no_grad():
        again = turbo.get_noise_prediction(latents, torch.tensor([500.0]), embeds)
    assert torch.equal(again, after)


# ---- interop with diffusers' pipelines ---------------------------------------------------
def image_array(image: Any) -> np.ndarray:
    """A PIL image as floats in [0, 1], to compare renders pixel by pixel."""
    return np.asarray(image, dtype=np.float32) / 255.0


def assert_loaded_lora_reproduces(ours: np.ndarray, pipe: Any, lora: Path,
                                  render: Callable[[], np.ndarray],
                                  changed_by: float = 4 / 255) -> None:
    """diffusers' `pipe`, after `load_lora_weights(lora)`, renders (`render()`) the
    trainer's preview `ours` up to PNG rounding; before it, a visibly different image
    (more than `changed_by` off somewhere)."""
    base = render()
    pipe.load_lora_weights(str(lora))
    assert any("lora_B" in n for n, _ in pipe.transformer.named_parameters())
    with_lora = render()
    # Same float32 CPU math on both sides; PNG-level rounding is the only slack.
    assert np.abs(with_lora - ours).max() <= 2 / 255
    assert np.abs(with_lora - base).max() > changed_by  # the LoRA really changed it














def amplified(lora: Path, out: Path, factor: float = 30.0) -> Path:
    """The trained file with every up weight (`lora_B`, or kohya's `lora_up`) scaled: four
    tiny steps move a random model's image by a pixel level; this makes the LoRA's effect
    plain to measure while keeping the trainer's keys, alphas and metadata."""
    with safe_open(str(lora), "pt") as fh:
        meta = fh.metadata()
    weights = {k: v * factor if k.endswith(("lora_B.weight", "lora_up.weight")) else v
               for k, v in load_file(lora).items()}
    save_file(weights, str(out), metadata=meta)
    return out
