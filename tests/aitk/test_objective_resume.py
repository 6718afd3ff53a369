"""Resume stays exact with each loss switch on: a run stopped at a step boundary (its own
SIGINT handler called mid-step, in process) and resumed ends bit for bit where an
uninterrupted run ends: adapter, optimizer-independent EMA, LoRA file and losses."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from safetensors.torch import load_file

from aitk.config.loading import load_config
from aitk.run import train as train_module
from aitk.run.job import EXIT_INTERRUPTED, EXIT_OK, run_job
from aitk.run.signals import StopFlag
from tests.aitk.aitk_testing import REPO, job_config, write_config

STEPS = 4
IMAGE = REPO / "datasets" / "example" / "red_circle_blue.png"


def masks(tmp: Path) -> str:
    """A mask per example image: its left half left out."""
    folder = tmp / "masks"
    folder.mkdir(exist_ok=True)
    for image in (REPO / "datasets" / "example").iterdir():
        if image.suffix in (".png", ".jpg", ".webp"):
            with Image.open(image) as img:
                w, h = img.size
            arr = np.full((h, w), 255, np.uint8)
            arr[:, : w // 2] = 0
            Image.fromarray(arr).save(folder / f"{image.stem}.png")
    return str(folder)


SWITCHES: dict[str, dict[str, Any]] = {
    "diff_output_preservation": {"train": {"diff_output_preservation": True,
                                           "diff_output_preservation_class": "shape"}},
    "blank_prompt_preservation": {"train": {"blank_prompt_preservation": True}},
    "ema": {"train": {"ema_config": {"use_ema": True, "ema_decay": 0.7}}},
    "ema_feedback": {"train": {"ema_config": {"use_ema": True, "ema_decay": 0.7,
                                              "use_feedback": True,
                                              "param_multiplier": 0.99}}},
    "mae": {"train": {"loss_type": "mae"}},
    "pseudo_huber": {"train": {"loss_type": "pseudo_huber"}},
    "wavelet": {"train": {"loss_type": "wavelet"}},
    "stepped": {"train": {"loss_type": "stepped"}},
    "lognorm_blend": {"train": {"timestep_type": "lognorm_blend"}},
    "next_sample": {"train": {"timestep_type": "next_sample"}},
    "content_or_style": {"train": {"content_or_style": "style"}},
    "max_loss": {"train": {"max_loss": 0.3, "blank_prompt_preservation": True}},
    "pretrained_lora": {"network": {"type": "lora", "linear": 4, "linear_alpha": 4,
                                    "pretrained_lora_path": "start"}},
    "model_lora_path": {"model": {"lora_path": "start"}},
    "denoising_steps": {"train": {"min_denoising_steps": 100, "max_denoising_steps": 600,
                                  "unet_lr": 1e-3}},
    "guidance_loss": {"train": {"do_guidance_loss": True,
                                "guidance_loss_target": [2.0, 4.0]}},
    "masked_loss": {"train": {"inverted_mask_prior": True}, "datasets": "masks"},
    "validation": {"train": {"validation_config": {
        "validation_items": [{"image_path": str(IMAGE), "prompt": "[trigger] a circle"}],
        "resolution": 32, "validate_every_n_steps": 1, "validation_sigmas": [0.5]}}},
    # the data and network switches (aitk.data.batches, aitk.adapters.network)
    "dora": {"network": {"type": "dora", "linear": 4, "linear_alpha": 4}},
    "flip_and_augments": {"datasets": {"flip_x": True, "flip_y": True,
                                       "augments": ["ColorJitter", "RandomEqualize"]}},
    "crops_and_weights": {"datasets": {"random_scale": True, "scale": 0.75,
                                       "replacements": ["circle|ring"]},
                          "reg": {"is_reg": True, "network_weight": 0.5,
                                  "random_crop": True}},
    "caption_changes": {"train": {"cache_text_embeddings": False},
                        "datasets": {"shuffle_tokens": True, "keep_tokens": 1,
                                     "token_dropout_rate": 0.3,
                                     "random_triggers": ["ohwx", "sks"]}},
    "prompt_dropout": {"train": {"cache_text_embeddings": False,
                                 "prompt_dropout_prob": 0.5}},
    "reg_dataset": {"reg": {"is_reg": True, "loss_multiplier": 0.5, "batch_size": 1},
                    "train": {"reg_weight": 0.5}},
    "prior_reg_dataset": {"reg": {"is_reg": True, "prior_reg": True}},
    "trackers": {"logging": {"use_wandb": True}, "log_dir": "tensorboard"},
}


def start_lora(tmp: Path, example_model_dir: Path) -> str:
    """A LoRA file of the example arch, trained for two steps (made once)."""
    path = tmp / "out" / "start" / "start.safetensors"
    if not path.exists():
        cfg = job_config("start", tmp / "out", example_model_dir, steps=2,
                         sample={"prompts": []})
        assert run_job(load_config(str(write_config(tmp / "start.yml", cfg)))) == EXIT_OK
    return str(path)


def write_job(tmp: Path, name: str, example_model_dir: Path, switch: str) -> Path:
    sections = {k: v for k, v in SWITCHES[switch].items() if k not in ("datasets", "reg")}
    if sections.get("network", {}).get("pretrained_lora_path") == "start":
        sections["network"] = {**sections["network"],
                               "pretrained_lora_path": start_lora(tmp, example_model_dir)}
    if sections.get("model", {}).get("lora_path") == "start":
        sections["model"] = {"arch": "example", "name_or_path": str(example_model_dir),
                             "lora_path": start_lora(tmp, example_model_dir)}
    if "log_dir" in sections:
        sections["log_dir"] = str(tmp / sections["log_dir"])
    train = {"batch_size": 2, "steps": STEPS, "lr": 2e-3, "optimizer": "adamw",
             "gradient_checkpointing": False, "cache_text_embeddings": True, "seed": 7,
             **sections.pop("train", {})}
    cfg = job_config(name, tmp / "out", example_model_dir, steps=STEPS, train=train,
                     save={"dtype": "float32", "save_every": 2,
                           "max_step_saves_to_keep": 4},
                     sample={"sample_every": 100, "prompts": []}, **sections)
    datasets = cfg["config"]["process"][0]["datasets"]
    extra = SWITCHES[switch].get("datasets")
    if extra == "masks":
        datasets[0]["mask_path"] = masks(tmp)
    elif extra is not None:
        datasets[0].update(extra)
    if "reg" in SWITCHES[switch]:  # the same images as a regularization dataset
        datasets.append({**datasets[0], **SWITCHES[switch]["reg"]})
    return write_config(tmp / f"{name}.yml", cfg)


def stopped_then_resumed(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    flags: list[StopFlag] = []
    original_init, original_loss = StopFlag.__init__, train_module.compute_loss
    calls: list[int] = []

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        flags.append(self)

    def loss(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:  # during step 2: it finishes, saves and stops
            flags[-1].handle(signal.SIGINT, None)
        return original_loss(*args, **kwargs)

    with monkeypatch.context() as mp:
        mp.setattr(StopFlag, "__init__", init)
        mp.setattr(train_module, "compute_loss", loss)
        assert run_job(load_config(str(path))) == EXIT_INTERRUPTED
    assert run_job(load_config(str(path))) == EXIT_OK


def final(out: Path, name: str) -> dict[str, Any]:
    ckpt = out / "checkpoints" / f"step_{STEPS:09d}"
    entries = [json.loads(x) for x in (out / "loss_log.jsonl").read_text().splitlines()]
    return {"adapter": load_file(ckpt / "adapter.safetensors"),
            "lora": load_file(out / f"{name}.safetensors"),
            "ema": (ckpt / "ema.pt").read_bytes() if (ckpt / "ema.pt").exists() else None,
            "losses": sorted(json.dumps([e["step"], e.get("loss"), e.get("val_loss")])
                             for e in entries)}


@pytest.mark.parametrize("switch", sorted(SWITCHES))
def test_resume_is_exact_with_the_switch_on(switch: str, tmp_path: Path,
                                            example_model_dir: Path,
                                            monkeypatch: pytest.MonkeyPatch):
    if switch == "trackers":  # no network, no wandb service: a fake module, offline
        from tests.aitk.test_trackers import fake_wandb

        monkeypatch.setitem(sys.modules, "wandb", fake_wandb())
        monkeypatch.setenv("WANDB_MODE", "offline")
    straight = write_job(tmp_path, "straight", example_model_dir, switch)
    assert run_job(load_config(str(straight))) == EXIT_OK
    resumed = write_job(tmp_path, "resumed", example_model_dir, switch)
    stopped_then_resumed(resumed, monkeypatch)
    a = final(tmp_path / "out" / "straight", "straight")
    b = final(tmp_path / "out" / "resumed", "resumed")
    assert a["adapter"].keys() == b["adapter"].keys()
    assert all((a["adapter"][k] == b["adapter"][k]).all() for k in a["adapter"])
    assert all((a["lora"][k] == b["lora"][k]).all() for k in a["lora"])
    assert a["ema"] == b["ema"]
    assert a["losses"] == b["losses"] and len(a["losses"]) >= STEPS
