"""What the Flux-family tests (test_flux.py, test_chroma.py, test_flux_kontext.py) share,
beside arch_checks.py and pipeline_checks.py: the prediction inputs of a 32x48 image
pair, the gradient-checkpointing comparison on them, the random LoRA file saved in
diffusers' `transformer.` names, aitk's older `diffusion_model.` layout read back, and
the offline hub id of a job. Each arch's file keeps its layers, its pipeline's call and
its tolerances.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from aitk.adapters import AdapterNetwork
from aitk.config.loading import load_config
from aitk.errors import EXIT_INPUT
from aitk.models.base import BaseModel
from aitk.run.job import run_job
from tests.aitk.aitk_testing import job_config, write_config
from tests.aitk.models.arch_checks import assert_reads_back, prediction_grads, randomise
from tests.aitk.models.conftest import NetCfg


def prediction_inputs(model: BaseModel) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """Seeded latents of a 32x48 image pair, timesteps 250 and 800, and the embeds of
    two prompts of unequal length: `prediction_grads`' inputs."""
    gen = torch.Generator().manual_seed(0)
    latents = torch.randn(2, 4, 4, 6, generator=gen)  # a 32x48 image pair
    embeds = model.get_prompt_embeds(["a red square on grey", "cat"])
    return latents, torch.tensor([250.0, 800.0]), embeds


def assert_checkpointing_keeps_the_prediction_grads(
        model: BaseModel, net: AdapterNetwork, inputs: tuple[Any, Any, Any],
        reached: Callable[[list[bool]], bool] = any) -> None:
    """`prediction_grads` on `inputs` with the transformer's gradient checkpointing off,
    then on: the same loss and the same LoRA gradients, and `reached` (`any`, `all`)
    holds of which got a nonzero one."""
    loss_off, grads_off = prediction_grads(model, net, inputs, False)
    loss_on, grads_on = prediction_grads(model, net, inputs, True)
    assert torch.equal(loss_on, loss_off)
    assert reached([bool(g.abs().sum() > 0) for g in grads_off])
    for a, b in zip(grads_off, grads_on, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def save_random_lora(model: BaseModel, path: Path) -> Path:
    """A rank-4, alpha-8 LoRA on `model` made random (`randomise`), saved to `path` in
    float32 with a step in its metadata: keys in diffusers' `transformer.` names, the
    alphas kept."""
    net = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=8.0))
    randomise(net)
    net.save_file(path, {"step": "1"}, dtype=torch.float32)
    keys = list(load_file(path))
    assert all(k.startswith("transformer.") for k in keys)
    assert "transformer.transformer_blocks.0.attn.to_q.alpha" in keys
    return path


def assert_old_layout_reads_back(model: BaseModel, tmp_path: Path,
                                 extra: dict[str, torch.Tensor] | None = None) -> None:
    """A random rank-4 LoRA (alpha 4) written in aitk's older `diffusion_model.` layout
    (the file's conversion of its weights and `extra`, the prefix swapped) reads back
    exactly."""
    net = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=4.0))
    randomise(net)
    expected = net.state_dict()
    old = {("diffusion_model." + k.removeprefix("transformer.")): v
           for k, v in model.convert_lora_weights_before_save(
               {**expected, **(extra or {})}).items()}
    save_file(old, str(tmp_path / "old.safetensors"))
    assert_reads_back(net, tmp_path / "old.safetensors", expected, seed=2)


def assert_hub_job_is_one_line(tmp_path: Path, model_dir: Path, arch: str, hub_id: str,
                               capsys: Any) -> None:
    """A job on the uncached `hub_id` with the hub offline (the `hub_offline` fixture),
    run in this process: exit 2 and one `error:` line naming the id and HF_TOKEN, no
    traceback."""
    cfg = job_config("hub", tmp_path / "out", model_dir,
                     model={"arch": arch, "name_or_path": hub_id})
    loaded = load_config(str(write_config(tmp_path / "hub.yml", cfg)))
    assert run_job(loaded) == EXIT_INPUT
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in err
    assert hub_id in errors[0] and "HF_TOKEN" in errors[0]
