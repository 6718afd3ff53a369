"""Upstream's own example configs for the other job kinds (tests/aitk/upstream_examples.py)
on tiny models, with only what points at the user's machine swapped (model paths,
devices, dataset and output folders): each passes `run.py --check` or stops with the one
line that says what this checkout lacks, and each that can run here runs: extract, mod
and generate to the end, the slider and the web UI's concept slider until a Ctrl+C,
which saves and exits 130."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file, save_file

from aitk.cli.run import main as run_main
from aitk.config.loading import load_config
from aitk.run import checkpoint as ckpt
from aitk.run.job import EXIT_OK, run_job
from tests.aitk.aitk_testing import REPO
from tests.aitk.upstream_examples import EXAMPLES, localized

HAS_BNB = importlib.util.find_spec("bitsandbytes") is not None
# What stops an example here, when something does: the start of its one line.
STOPS = {
    "flex_redux": "config.process[0].adapter: this process trains an adapter (redux) "
                  "instead of the model, which aitk does not do",
    # the web UI's default optimizer needs bitsandbytes (CUDA boxes)
    **({} if HAS_BNB else {"ui_concept_slider": "config.process[0].train.optimizer: "
                                                "adamw8bit needs bitsandbytes"}),
}


@pytest.fixture(scope="module")
def machine(tmp_path_factory, example_model_dir: Path) -> dict[str, str]:
    """The tiny models and inputs the examples' paths are swapped for."""
    from aitk.models.flux.model import FluxModel
    from aitk.models.stable_diffusion.model import SD1Model
    from tests.aitk.jobs.test_merge import _lora

    root = tmp_path_factory.mktemp("machine")
    FluxModel.build_tiny(root / "flux")
    SD1Model.build_tiny(root / "sd1")
    tuned = root / "tuned"  # the example model with its transformer nudged
    shutil.copytree(example_model_dir, tuned)
    weights = tuned / "transformer" / "diffusion_pytorch_model.safetensors"
    state = load_file(weights)
    save_file({k: v * 1.01 if v.ndim == 2 else v for k, v in state.items()}, weights)
    lora = _lora(example_model_dir, root / "lora.safetensors", 1, rank=4, alpha=4.0)
    return {"flux": str(root / "flux"), "sd1": str(root / "sd1"),
            "base": str(example_model_dir),
            "tuned": str(tuned), "device": "cpu", "lora": str(lora),
            "dataset": str(REPO / "datasets" / "example")}


# The slider example is SD 1.5's (no is_* flag, noise_scheduler ddpm): a tiny SD 1.x. The
# others get a tiny Flux (the full fine-tunes and the UI's slider name Flex.1; generate's
# 1024 px images would take minutes on a tiny UNet's full-resolution attention).
SD1_EXAMPLES = ("train_slider",)


def write(tmp_path: Path, name: str, machine: dict[str, str]) -> Path:
    model = machine["sd1"] if name in SD1_EXAMPLES else machine["flux"]
    paths = {**machine, "model": model, "out": str(tmp_path / "out")}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(localized(name, paths), sort_keys=False))
    return path


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_each_example_passes_check_or_says_what_this_checkout_lacks(name, tmp_path,
                                                                    machine, capsys):
    code = run_main([str(write(tmp_path, name, machine)), "--check"])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if name not in STOPS:
        assert code == 0, err
        assert "valid upstream but not acted on" not in err, err
        return
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert STOPS[name] in lines[0]


def test_the_extract_example_writes_every_process(tmp_path, machine):
    loaded = load_config(str(write(tmp_path, "extract", machine)))
    assert loaded.job.config.arch == "example"  # read from the folder
    assert run_job(loaded) == EXIT_OK
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == [
        "absolute_output.safetensors", "name_of_your_model_4.safetensors",
        "name_of_your_model_64_32.safetensors", "name_of_your_model_q05.safetensors",
        "name_of_your_model_ratio_02.safetensors"]
    rank4 = load_file(out / "name_of_your_model_4.safetensors")
    assert {v.shape[0] for k, v in rank4.items() if k.endswith("lora_A.weight")} == {4}


def test_the_mod_example_rescales(tmp_path, machine):
    assert run_job(load_config(str(write(tmp_path, "mod_lora_scale", machine)))) == EXIT_OK
    assert (tmp_path / "out" / "output_lora_v1.safetensors").is_file()


@pytest.mark.slow  # four 1024x1024 images, 20 steps each: about half a minute here
def test_the_generate_example_draws_its_four_prompts(tmp_path, machine):
    loaded = load_config(str(write(tmp_path, "generate", machine)))
    assert loaded.job.config.process[0].model.arch == "flux"  # read from the folder
    assert run_job(loaded) == EXIT_OK
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert [n.split("_")[1] for n in names] == ["photo-of-batman", "photo-of-superman",
                                                "photo-of-spiderman", "photo-of-a-superhero"]


def run_until_trained(path: Path, tmp_path: Path, status: Path, steps: int = 2) -> str:
    """run.py on the config until `steps` steps are trained, then Ctrl+C; its output."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "AITK_STATUS_FILE": str(status)}
    proc = subprocess.Popen([sys.executable, str(REPO / "run.py"), str(path)], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.monotonic() + 900
    try:
        while True:
            fields = json.loads(status.read_text()) if status.is_file() else {}
            if fields.get("phase") == "training" and fields.get("step", 0) >= steps:
                break
            if proc.poll() is not None:
                pytest.fail(f"run ended ({proc.returncode}):\n{proc.stdout.read()}")
            if time.monotonic() > deadline:
                pytest.fail("run never trained")
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output
    assert "Traceback" not in output
    return output


@pytest.mark.slow
@pytest.mark.parametrize("name", ["train_slider", "ui_concept_slider"])
def test_the_sliders_train_until_ctrl_c_and_save(name, tmp_path, machine):
    path = write(tmp_path, name, machine)
    config = yaml.safe_load(path.read_text())
    proc = config["config"]["process"][0]
    if name in STOPS:  # no bitsandbytes here: the one setting the machine cannot run
        proc["train"]["optimizer"] = "adamw"
    if name == "train_slider":  # 512 px previews and latents: many minutes on a tiny
        proc["train"]["skip_first_sample"] = True  # UNet's full-resolution attention
        proc["slider"]["resolutions"] = [[64, 64]]
    path.write_text(yaml.safe_dump(config))
    loaded = load_config(str(path))
    out = loaded.job.output_dir()
    run_until_trained(path, tmp_path, tmp_path / "status.json")
    saved = ckpt.find_resumable(out / "checkpoints", report=pytest.fail)
    assert saved is not None and saved.step >= 2
    lora = load_file(out / f"{loaded.name}_{saved.step:09d}.safetensors")
    prefix = "lora_unet_" if name == "train_slider" else "transformer."  # kohya / Flux
    assert lora and all(k.startswith(prefix) for k in lora)
    assert json.loads((tmp_path / "status.json").read_text())["phase"] == "stopped"
