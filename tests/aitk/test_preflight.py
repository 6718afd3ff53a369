"""Preflight: every problem knowable without weights, listed at once, before any model
loads; `run.py --check` runs only that, without importing torch when nothing needs it."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from aitk.audit.preflight import preflight
from aitk.cli.run import main as run_main
from aitk.config.loading import load_config
from aitk.findings import Level
from tests.aitk.aitk_testing import (
    REPO,
    job_config,
    scratch_checkout,
    write_config,
    write_image,
)

EXAMPLE = REPO / "config" / "examples" / "train_lora_example_cpu.yaml"


def _loaded(tmp_path: Path, training_folder: Path | None = None, **overrides):
    model_dir = tmp_path / "model"
    model_dir.mkdir(exist_ok=True)
    cfg = job_config("pf", training_folder or tmp_path / "out", model_dir, **overrides)
    return load_config(str(write_config(tmp_path / "pf.yml", cfg)))


def _by_path(findings):
    return {(f.level, f.path): f for f in findings}


def test_the_bundled_example_passes_check_without_importing_torch(tmp_path):
    code = ("import sys; from aitk.cli.run import main; rc = main([sys.argv[1], '--check']);"
            "print('torch' in sys.modules, 'diffusers' in sys.modules); sys.exit(rc)")
    # From a scratch checkout, so `training_folder: output` is not the real checkout's.
    done = subprocess.run([sys.executable, "-c", code, str(EXAMPLE)],
                          cwd=scratch_checkout(tmp_path), capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]
    assert done.stderr.strip().splitlines()[-1] == f"check passed: example_lora ({EXAMPLE})"


def test_clean_job_has_no_error_and_check_exits_0(tmp_path, capsys):
    loaded = _loaded(tmp_path)
    assert [f for f in preflight(loaded) if f.level is Level.ERROR] == []
    assert run_main([str(loaded.source), "--check"]) == 0
    assert "check passed: pf" in capsys.readouterr().err


def test_every_problem_is_listed_at_once(tmp_path, capsys):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the output folder should go")
    loaded = _loaded(
        tmp_path, training_folder=blocker,
        datasets=[{"folder_path": str(tmp_path / "missing")}],
        model={"arch": "example", "name_or_path": str(tmp_path / "no-model")},
        train={"optimizer": "adamw8bit"})
    found = _by_path(preflight(loaded))
    p = "config.process[0]"
    expected = {f"{p}.datasets[0].folder_path", f"{p}.training_folder",
                f"{p}.model.name_or_path"}
    if importlib.util.find_spec("bitsandbytes") is None:
        expected.add(f"{p}.train.optimizer")
    assert {path for level, path in found if level is Level.ERROR} == expected
    assert run_main([str(loaded.source), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"config errors in {loaded.source}:")
    assert len(err.strip().splitlines()) == 1 + len(expected)


def test_quantizing_without_optimum_quanto(tmp_path, monkeypatch):
    loaded = _loaded(tmp_path, model={"arch": "example", "name_or_path": str(tmp_path),
                                      "quantize": True, "qtype": "qint8"})
    assert not [f for f in preflight(loaded) if f.level is Level.ERROR]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "optimum.quanto" else real(name, *a))
    found = _by_path(preflight(loaded))
    assert "optimum-quanto" in found[(Level.ERROR, "config.process[0].model.quantize")].message


def test_cuda_asked_for_on_a_machine_without_it(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    found = _by_path(preflight(_loaded(tmp_path, device="cuda:0")))
    assert (Level.ERROR, "config.process[0].device") in found
    assert "not available" in found[(Level.ERROR, "config.process[0].device")].message


def test_dataset_problems_are_summarised_per_kind(tmp_path):
    folder = tmp_path / "imgs"
    for i in range(4):
        write_image(folder / f"{i}.png", (64, 64))  # no captions
    (folder / "broken.png").write_bytes(b"not an image")
    found = preflight(_loaded(tmp_path, datasets=[{"folder_path": str(folder),
                                                   "resolution": [32]}]))
    path = "config.process[0].datasets[0].folder_path"
    kinds = {(f.level, f.code): f for f in found if f.path == path}
    assert "4 files" in kinds[(Level.WARNING, "missing_caption")].message
    # the trainer skips an unreadable image: a warning, not a reason to refuse the run
    assert "broken.png" in kinds[(Level.WARNING, "unreadable")].message
    assert not [f for f in found if f.level is Level.ERROR]


def test_control_folders_must_pair(tmp_path):
    """aitk ignores control_path (an upstream-only key), so a gap warns."""
    folder, control = tmp_path / "imgs", tmp_path / "ctrl"
    write_image(folder / "a.png", (64, 64), caption="a")
    write_image(folder / "b.png", (64, 64), caption="b")
    write_image(control / "a.jpg", (64, 64))
    found = preflight(_loaded(tmp_path, datasets=[{"folder_path": str(folder),
                                                   "control_path": str(control)}]))
    pairs = [f for f in found if f.code == "missing_control"]
    assert [f.level for f in pairs] == [Level.WARNING] and "b.png" in pairs[0].message
    assert not [f for f in found if f.level is Level.ERROR]


def test_output_folder_resume_and_overwrite_are_reported(tmp_path):
    loaded = _loaded(tmp_path)
    out = tmp_path / "out" / "pf"
    (out / "checkpoints" / "step_000000003").mkdir(parents=True)
    found = {f.code: f for f in preflight(loaded)}
    assert found["resume"].level is Level.INFO and "step 3" in found["resume"].message
    (out / "checkpoints" / "step_000000003").rmdir()
    (out / "pf_000000003.safetensors").write_bytes(b"x")
    found = {f.code: f for f in preflight(loaded)}
    assert found["overwrite"].level is Level.WARNING
    (out / "checkpoints" / "step_000000006").mkdir()  # steps: 6 -> finished
    assert {f.code for f in preflight(loaded)} >= {"finished"}


def test_check_reports_every_config_even_after_a_failure(tmp_path, capsys):
    bad = tmp_path / "bad.yml"
    bad.write_text("job: ensemble\nconfig: {name: x, process: []}\n")
    assert run_main([str(bad), str(EXAMPLE), "--check"]) == 2
    err = capsys.readouterr().err
    assert "job: 'ensemble'" in err and "check passed: example_lora" in err


def test_text_encoder_lr_without_a_training_text_encoder_is_a_warning(tmp_path):
    loaded = _loaded(tmp_path, model={"arch": "sd1", "name_or_path": str(tmp_path)},
                     train={"text_encoder_lr": 1e-5})
    found = _by_path(preflight(loaded))
    assert (Level.WARNING, "config.process[0].train.text_encoder_lr") in found
    assert not any(level is Level.ERROR for level, _ in found)


def test_a_missing_pretrained_lora_is_found_before_the_model_loads(tmp_path):
    loaded = _loaded(tmp_path, network={"type": "lora", "linear": 4,
                                        "pretrained_lora_path": str(tmp_path / "no.safetensors")})
    assert (Level.ERROR, "config.process[0].network.pretrained_lora_path") in \
        _by_path(preflight(loaded))
    (tmp_path / "yes.safetensors").write_bytes(b"")
    loaded = _loaded(tmp_path, network={"type": "lora", "linear": 4,
                                        "pretrained_lora_path": str(tmp_path / "yes.safetensors")})
    assert "config.process[0].network.pretrained_lora_path" not in \
        {path for _, path in _by_path(preflight(loaded))}


def test_a_missing_fused_lora_is_found_before_the_model_loads(tmp_path):
    model = {"arch": "example", "name_or_path": str(tmp_path / "model")}
    loaded = _loaded(tmp_path, model={**model, "lora_path": str(tmp_path / "no.safetensors")})
    assert (Level.ERROR, "config.process[0].model.lora_path") in _by_path(preflight(loaded))
    loaded = _loaded(tmp_path, model={**model, "lora_path": "owner/repo/x.safetensors"})
    assert "config.process[0].model.lora_path" not in \
        {path for _, path in _by_path(preflight(loaded))}  # a hub file: fetched at load


def test_unet_lr_with_no_training_denoiser_is_a_warning(tmp_path):
    loaded = _loaded(tmp_path, network=None, train={"unet_lr": 1e-5, "train_unet": False,
                                                    "train_text_encoder": True,
                                                    "cache_text_embeddings": False})
    assert (Level.WARNING, "config.process[0].train.unet_lr") in _by_path(preflight(loaded))


def test_an_accuracy_recovery_adapter_that_cannot_be_had(tmp_path, monkeypatch):
    from huggingface_hub import constants

    model = {"arch": "example", "name_or_path": str(tmp_path), "quantize": True}
    field = (Level.ERROR, "config.process[0].model.qtype")
    loaded = _loaded(tmp_path, model={**model, "qtype": "uint3|nowhere.safetensors"})
    assert "nowhere.safetensors does not exist" in _by_path(preflight(loaded))[field].message
    adapter = tmp_path / "ara.safetensors"
    adapter.write_bytes(b"")
    loaded = _loaded(tmp_path, model={**model, "qtype": f"uint3|{adapter}"})
    assert field not in _by_path(preflight(loaded))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    loaded = _loaded(tmp_path, model={**model, "qtype": "uint4",
                                      "accuracy_recovery_adapter": "o/r/ara.safetensors"})
    found = _by_path(preflight(loaded))
    assert "HF_HUB_OFFLINE" in found[(Level.ERROR, "config.process[0].model."
                                                   "accuracy_recovery_adapter")].message
