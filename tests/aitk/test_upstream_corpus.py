"""Upstream-format configs (tests/aitk/upstream_corpus.py) through the real entry point:
each either validates or stops with exactly one line, and nothing prints a traceback."""

from __future__ import annotations

import copy
import typing
from pathlib import Path

import pytest
import yaml

from aitk.audit.preflight import preflight
from aitk.cli.run import main as run_main
from aitk.config import upstream_keys
from aitk.config.loading import load_config, parse_job
from aitk.config.schema import TrainConfig
from aitk.errors import ConfigError
from aitk.findings import Level
from aitk.models import catalog
from tests.aitk.aitk_testing import run_py, write_image
from tests.aitk.upstream_corpus import CORPUS, RUNS, corpus_entry

# Settings upstream configs carry switched off or at upstream's default: never a warning.
QUIET_IN_CORPUS = ("ema_config", "sample_start_step", "sqlite_db_path", "save_format",
                   "push_to_hub", "shuffle_tokens", "layer_offloading",
                   "performance_log_every", "logging", "train_unet", "train_text_encoder",
                   "mask_min_value", "diff_output_preservation",
                   "lokr_full_rank", "content_or_style", "is_flux", "is_v3", "is_xl",
                   "is_lumina2", "controls", "network_weight", "compile")


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    folder = tmp_path / "images"
    write_image(folder / "a.png", (64, 64), (200, 30, 30), "p3r5on a red thing")
    write_image(folder / "b.jpg", (64, 48), (30, 200, 30), "p3r5on a green thing")
    return folder


def _arch(config: dict) -> str | None:
    """The arch the config's first model names; None for jobs without a model (mod,
    merge), which validate whatever the arch."""
    model = config["config"]["process"][0].get("model")
    return upstream_keys.derive_arch(model) if model is not None else None


def _write(tmp_path: Path, name: str, config: dict) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_each_upstream_config_validates_or_stops_with_one_line(name, tmp_path, dataset,
                                                               capsys):
    config, expected = corpus_entry(name, str(dataset))
    path = _write(tmp_path, name, config)
    code = run_main([str(path), "--check"])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    if expected == RUNS and _arch(config) in {*catalog.builtin_archs(), None}:
        load_config(str(path))  # the config itself is valid; the machine may still lack
        assert code in (0, 2)   # what it asks for (CUDA, bitsandbytes): listed at once
        return
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    if expected == RUNS:  # an upstream arch aitk does not have yet
        supported = ", ".join(sorted(catalog.builtin_archs()))
        assert lines[0].endswith(f"config.process[0].model.arch: arch {_arch(config)!r} is "
                                 f"not supported yet; supported: {supported}")
    else:
        assert f": {expected}" in lines[0]


def _accepted_timestep_types() -> tuple[str, ...]:
    annotation = TrainConfig.model_fields["timestep_type"].annotation
    return typing.get_args(annotation)


@pytest.mark.parametrize("name", sorted(n for n, (c, e) in CORPUS.items() if e == RUNS
                                         and c["job"] == "extension"))
def test_every_upstream_key_in_the_corpus_is_accepted_on_a_built_in_arch(name, dataset):
    """The same shapes on the built-in `example` arch: only values aitk cannot honour
    warn, and nothing switched off or left at upstream's default does."""
    config, _ = corpus_entry(name, str(dataset))
    model = config["config"]["process"][0]["model"]
    for flag, _arch_name in upstream_keys.ARCH_FLAGS:
        model.pop(flag, None)
    model["arch"] = "example"
    train = config["config"]["process"][0]["train"]
    train.pop("noise_scheduler", None)  # the original arch's schedule name (sdxl: ddpm)
    timestep = train.get("timestep_type")
    if timestep is not None and timestep not in _accepted_timestep_types():
        with pytest.raises(ConfigError) as info:
            parse_job(config, "job.yml", env={}, check_arch=lambda a: None)
        assert [path for path, _ in info.value.records] == [
            "config.process[0].train.timestep_type"]
        return
    loaded = parse_job(config, "job.yml", env={}, check_arch=lambda a: None)
    for warning in loaded.warnings:
        assert not any(key in warning for key in QUIET_IN_CORPUS), warning


def test_the_ui_job_warns_only_about_what_it_switches_on(dataset):
    config, _ = corpus_entry("ui_flex1", str(dataset))
    config["config"]["process"][0]["model"]["arch"] = "example"
    loaded = parse_job(config, "job.yml", env={}, check_arch=lambda a: None)
    assert loaded.warnings == []  # conv/conv_alpha: LoCon where the arch has convs
    proc = loaded.job.config.process[0]
    assert (proc.network.conv, proc.network.conv_alpha) == (16, 16)
    assert proc.save.save_format == "diffusers" and proc.type == "diffusion_trainer"


def test_the_ui_jobs_loss_switches_train_without_a_warning(dataset):
    """The web form's preservation, EMA, loss, timestep, mask and validation settings,
    switched on as it writes them: none is dropped."""
    config, _ = corpus_entry("ui_flex1", str(dataset))
    proc = config["config"]["process"][0]
    proc["model"]["arch"] = "example"
    proc["trigger_word"] = "p3r5on"
    proc["datasets"][0]["mask_path"] = str(dataset)
    proc["train"].update({
        "diff_output_preservation": True, "diff_output_preservation_multiplier": 0.8,
        "ema_config": {"use_ema": True, "ema_decay": 0.99}, "loss_type": "wavelet",
        "timestep_type": "shift", "content_or_style": "content",
        "inverted_mask_prior": True, "inverted_mask_prior_multiplier": 0.5,
        "validation_config": {"validation_items": [{"image_path": "", "prompt": ""}],
                              "resolution": 1024, "validate_every_n_steps": 1,
                              "validation_sigmas": [0.5]}})
    loaded = parse_job(config, "job.yml", env={}, check_arch=lambda a: None)
    assert loaded.warnings == []
    train = loaded.job.config.process[0].train
    assert train.diff_output_preservation_class == "person" and train.ema_config.use_ema
    for switch in ({"blank_prompt_preservation": True, "diff_output_preservation": False},
                   {"loss_type": "stepped", "timestep_type": "lognorm_blend"},
                   {"loss_type": "mae", "timestep_type": "next_sample"},
                   {"loss_type": "pseudo_huber", "do_guidance_loss": True,
                    "guidance_loss_target": [2, 4]}):
        proc["train"].update(switch)
        assert parse_job(config, "job.yml", env={},
                         check_arch=lambda a: None).warnings == loaded.warnings


@pytest.mark.parametrize("name", ["ui_sdxl", "ui_sd15", "sdxl", "sd15_legacy", "sd2"])
def test_ddpm_jobs_list_only_this_machines_problems(name, dataset):
    """Upstream's DDPM jobs (its web UI's SDXL and SD 1.5 forms write `noise_scheduler:
    ddpm`) pass the preflight but for what this machine lacks (CUDA, bitsandbytes)."""
    config, _ = corpus_entry(name, str(dataset))
    loaded = parse_job(config, "job.yml", env={})
    assert loaded.job.config.process[0].train.noise_scheduler == "ddpm"
    errors = [f for f in preflight(loaded) if f.level is Level.ERROR]
    assert {f.code for f in errors} <= {"device", "optimizer"}, errors


def test_unsupported_arch_stops_before_any_other_problem(tmp_path, dataset, capsys):
    config, _ = corpus_entry("hidream", str(dataset))
    config["config"]["process"][0]["model"]["arch"] = "omnigen2"  # upstream's, not aitk's
    config["config"]["process"][0]["train"]["stpes"] = 5  # would be an error too
    assert "omnigen2" not in catalog.builtin_archs()
    code = run_main([str(_write(tmp_path, "omnigen2", config)), "--check"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "arch 'omnigen2' is not supported yet" in err


def test_refusals_through_the_real_run_py(tmp_path, dataset):
    """A child process, as a user runs it: exit 2, one line, no traceback."""
    for name in ("flex_redux", "train_vae"):
        config, expected = corpus_entry(name, str(dataset))
        done = run_py(str(_write(tmp_path, name, config)), "--check", cwd=tmp_path)
        assert done.returncode == 2
        assert "Traceback" not in done.stdout + done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and expected in done.stderr


def test_yaml_that_does_not_parse_is_one_line_with_line_and_column(tmp_path, capsys):
    path = tmp_path / "broken.yaml"
    path.write_text('job: extension\nconfig:\n  name: "x\n  process: []\n')
    assert run_main([str(path), "--check"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith(f"config error in {path}: not valid YAML at line ")
    assert ", column " in err


def test_corpus_entries_are_independent_copies(dataset):
    first, _ = corpus_entry("flux", str(dataset))
    first["config"]["name"] = "changed"
    assert corpus_entry("flux", str(dataset))[0]["config"]["name"] == "my_first_lora_v1"
    assert copy.deepcopy(CORPUS["flux"][0])["config"]["name"] == "my_first_lora_v1"
