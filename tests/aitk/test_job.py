"""The example job end to end, in process: outputs, metadata, loss falls, the LoRA
changes and reproduces the sampler's output, resume re-runs nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file

from aitk.config.loading import load_config
from aitk.errors import EXIT_OK
from aitk.models.base import BaseModel
from aitk.run.assembly import create_network, load_model
from aitk.run.job import run_job
from aitk.run.output import step_lora_name
from aitk.run.sampling import image_configs
from aitk.run.saving import prune_step_loras
from aitk.run.train import compute_loss, step_generator
from tests.aitk.aitk_testing import job_config, write_config

STEPS = 24


@pytest.fixture(scope="module")
def trained(tmp_path_factory, example_model_dir: Path):
    root = tmp_path_factory.mktemp("job")
    cfg = job_config("demo", root / "out", example_model_dir, steps=STEPS,
                     save={"save_every": 10, "max_step_saves_to_keep": 2},
                     sample={"sample_every": 12},
                     train={"lr_scheduler": "constant", "lr": 3e-3})
    loaded = load_config(str(write_config(root / "demo.yml", cfg)))
    unloads: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        original = BaseModel.unload_text_encoder

        def record(self) -> None:
            unloads.append(self.arch)
            original(self)

        mp.setattr(BaseModel, "unload_text_encoder", record)
        assert run_job(loaded) == EXIT_OK
    assert unloads == ["example"]  # text embeddings cached -> text encoder freed
    cache = Path(os.environ["AITK_CACHE_DIR"])
    assert (cache / "latents").is_dir() and (cache / "text_embeds").is_dir()
    assert cache.is_relative_to(tmp_path_factory.getbasetemp())  # never the checkout's
    # Weight digests are remembered across runs: a big model is hashed once, not per start.
    digests = json.loads((cache / "model_digests.json").read_text())["digests"]
    assert any("diffusion_pytorch_model.safetensors" in k for k in digests)
    return loaded, root / "out" / "demo"


def fresh(loaded):
    proc = loaded.job.config.process[0]
    model = load_model(proc, torch.device("cpu"))
    return model, create_network(model, proc), proc


@pytest.mark.slow
def test_outputs_have_the_upstream_names(trained):
    _, out = trained
    assert sorted(p.name for p in out.iterdir()) == [
        ".aitk.lock", "checkpoints", "config.yaml", "demo.safetensors",
        "demo_000000010.safetensors", "demo_000000020.safetensors", "loss_log.jsonl",
        "samples", "status.json"]  # the lock's holder file (.aitk.lock.json) goes at the end
    # max_step_saves_to_keep: 2 -> the newest two of each kind
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000000020",
                                                                       "step_000000024"]
    assert sorted(p.name for p in (out / "samples").iterdir()) == [
        f"{s:09d}_{i}.png" for s in (0, 12, 24) for i in (0, 1)]
    rows = [json.loads(x) for x in (out / "loss_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_lora_file_has_public_keys_and_metadata(trained):
    loaded, out = trained
    with safe_open(str(out / "demo.safetensors"), "pt") as fh:
        meta = fh.metadata()
        keys = list(fh.keys())
    assert keys and all(k.startswith("diffusion_model.") for k in keys)
    assert json.loads(meta["software"])["name"] == "aitk"
    info = json.loads(meta["training_info"])
    assert info["step"] == STEPS and info["epoch"] >= 1
    assert meta["base_model_arch"] == "example"
    assert json.loads(meta["config"]) == loaded.raw
    assert yaml.safe_load((out / "config.yaml").read_text()) == loaded.raw


@pytest.mark.slow
def test_lora_records_the_provenance_block_and_audits_clean(trained):
    """The same block `manager info` shows; the trained file passes the adapter audit."""
    from aitk.audit.adapter import audit_adapter
    from aitk.run import provenance

    _, out = trained
    with safe_open(str(out / "demo.safetensors"), "pt") as fh:
        recorded = json.loads(fh.metadata()["aitk_info"])
    assert recorded == json.loads(json.dumps(provenance.collect()))
    assert recorded["version"] and recorded["packages"]["torch"] == torch.__version__
    report = audit_adapter(out / "demo.safetensors")
    assert report.exit_code == 0, [f.line() for f in report.findings]
    assert report.summary["arch"] == "example"
    assert report.summary["layout"].startswith("ComfyUI / aitk")


@pytest.mark.slow
def test_loss_on_fixed_batches_falls(trained):
    loaded, out = trained
    model, network, proc = fresh(loaded)
    from aitk.data.dataset import load_pixels, scan_folder

    items = scan_folder(Path(proc.datasets[0].folder_path), trigger_word=proc.trigger_word,
                        resolutions=[32], divisibility=model.get_bucket_divisibility())
    from aitk.data.batch import DataBatch

    def mean_loss() -> float:
        total = 0.0
        with torch.no_grad():
            for n, item in enumerate(items):
                latents = model.encode_images(load_pixels(item)[None])
                batch = DataBatch(captions=[item.caption], latents=latents,
                                  prompt_embeds=model.get_prompt_embeds([item.caption]))
                for k in range(4):
                    total += compute_loss(model, batch, step_generator(99, n, k)).item()
        return total / (4 * len(items))

    base = mean_loss()
    network.load_file(out / "demo.safetensors")
    assert mean_loss() < base * 0.97


@pytest.mark.slow
def test_lora_changes_the_sampler_and_reloads_to_the_same_images(trained):
    loaded, out = trained
    model, network, proc = fresh(loaded)
    configs = image_configs(proc.sample, proc.trigger_word)
    before = np.asarray(model.generate_images(configs[:1])[0], dtype=np.int16)
    network.load_file(out / "demo.safetensors")  # via convert_lora_weights_before_load
    after = np.asarray(model.generate_images(configs[:1])[0], dtype=np.int16)
    assert np.abs(after - before).max() > 2
    during_training = np.asarray(Image.open(out / "samples" / f"{STEPS:09d}_0.png"),
                                 dtype=np.int16)
    assert np.abs(after - during_training).max() <= 1


@pytest.mark.slow
def test_running_the_config_again_resumes_and_does_nothing(trained):
    loaded, out = trained
    before = (out / "demo.safetensors").read_bytes()
    assert run_job(loaded) == EXIT_OK
    assert (out / "demo.safetensors").read_bytes() == before
    assert len((out / "loss_log.jsonl").read_text().splitlines()) == STEPS


@pytest.mark.slow
def test_resuming_with_another_network_is_a_clear_input_error(tmp_path: Path,
                                                              example_model_dir: Path,
                                                              capsys):
    cfg = job_config("net", tmp_path / "out", example_model_dir, steps=2,
                     sample={"sample_every": 100})
    assert run_job(load_config(str(write_config(tmp_path / "a.yml", cfg)))) == EXIT_OK
    cfg["config"]["process"][0]["network"]["linear"] = 8
    assert run_job(load_config(str(write_config(tmp_path / "b.yml", cfg)))) == 2
    err = capsys.readouterr().err
    assert "was trained with another network config" in err and "Traceback" not in err


@pytest.mark.slow
def test_a_lora_file_lost_after_its_checkpoint_is_written_on_resume(tmp_path: Path,
                                                                   example_model_dir: Path):
    # A second Ctrl+C (or a crash) between publishing the final checkpoint and writing
    # the final LoRA file: running the config again must still deliver the LoRA.
    cfg = job_config("lost", tmp_path / "out", example_model_dir, steps=1,
                     train={"disable_sampling": True})
    loaded = load_config(str(write_config(tmp_path / "l.yml", cfg)))
    assert run_job(loaded) == EXIT_OK
    final = tmp_path / "out" / "lost" / "lost.safetensors"

    def contents() -> tuple[dict, dict]:
        with safe_open(str(final), "pt") as fh:
            return fh.metadata(), {k: fh.get_tensor(k) for k in fh.keys()}

    meta, tensors = contents()
    final.unlink()
    assert run_job(loaded) == EXIT_OK
    meta_again, tensors_again = contents()
    assert meta_again == meta and tensors_again.keys() == tensors.keys()
    assert all(torch.equal(tensors[k], tensors_again[k]) for k in tensors)


def aitk_lora(path: Path) -> None:
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(1)}, str(path),
              metadata={"software": json.dumps({"name": "aitk", "version": "0"})})


@pytest.mark.parametrize("name", ["plain", "lora[v2]", "a*b?"])
def test_step_loras_are_pruned_to_the_newest_whatever_the_name(tmp_path: Path, name: str):
    for step in (10, 20, 30):
        aitk_lora(tmp_path / step_lora_name(name, step))
    aitk_lora(tmp_path / f"{name}.safetensors")
    (tmp_path / f"{name}_notes.safetensors").write_bytes(b"other")
    prune_step_loras(tmp_path, name, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([
        step_lora_name(name, 20), step_lora_name(name, 30), f"{name}.safetensors",
        f"{name}_notes.safetensors"])


def test_pruning_never_deletes_a_step_lora_aitk_did_not_write(tmp_path: Path):
    # A user's file with a step-LoRA name (no aitk metadata) is neither counted nor removed.
    (tmp_path / step_lora_name("n", 5)).write_bytes(b"the user's own file")
    for step in (10, 20):
        aitk_lora(tmp_path / step_lora_name("n", step))
    prune_step_loras(tmp_path, "n", keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == [step_lora_name("n", 5),
                                                          step_lora_name("n", 20)]


def test_missing_dataset_folder_exits_2(tmp_path: Path, example_model_dir: Path, capsys):
    cfg = job_config("nodata", tmp_path / "out", example_model_dir, steps=2,
                     datasets=[{"folder_path": str(tmp_path / "absent")}])
    assert run_job(load_config(str(write_config(tmp_path / "c.yml", cfg)))) == 2
    assert f"dataset folder {tmp_path / 'absent'} does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_non_finite_loss_stops_the_job_with_exit_1_naming_the_step(tmp_path: Path,
                                                                   example_model_dir: Path,
                                                                   capsys):
    cfg = job_config("nan", tmp_path / "out", example_model_dir, steps=5,
                     sample={"sample_every": 100}, train={"lr": 1e30, "max_grad_norm": 0.0})
    assert run_job(load_config(str(write_config(tmp_path / "n.yml", cfg)))) == 1
    err = capsys.readouterr().err
    assert "error: loss is " in err and " at step " in err and "Traceback" not in err
    assert not (tmp_path / "out" / "nan" / "nan.safetensors").exists()


def test_sample_start_step_leaves_no_previews_before_it(tmp_path, example_model_dir):
    cfg = job_config("late", tmp_path / "out", example_model_dir, steps=6,
                     sample={"sample_every": 1, "sample_start_step": 4},
                     train={"skip_first_sample": True})
    assert run_job(load_config(str(write_config(tmp_path / "late.yml", cfg)))) == EXIT_OK
    steps = {int(p.name.split("_")[0]) for p in (tmp_path / "out" / "late" / "samples"
                                                 ).iterdir()}
    assert steps == {4, 5, 6}


def test_pretrained_lora_path_starts_the_adapter_from_the_file(tmp_path, example_model_dir):
    """Upstream's network.pretrained_lora_path: a run with (almost) no learning rate ends
    where the file is; without it the adapter starts fresh (LoRA up weights zero)."""
    first = job_config("first", tmp_path / "out", example_model_dir, steps=2,
                       sample={"prompts": []})
    assert run_job(load_config(str(write_config(tmp_path / "first.yml", first)))) == EXIT_OK
    lora = tmp_path / "out" / "first" / "first.safetensors"
    trained = load_file(lora)

    def ends(name: str, network: dict) -> dict:
        cfg = job_config(name, tmp_path / "out", example_model_dir, steps=1,
                         network={"type": "lora", "linear": 4, "linear_alpha": 4, **network},
                         train={"lr": 1e-12, "optimizer": "adamw"}, sample={"prompts": []})
        assert run_job(load_config(str(write_config(tmp_path / f"{name}.yml", cfg)))) \
            == EXIT_OK
        return load_file(tmp_path / "out" / name / f"{name}.safetensors")

    started = ends("started", {"pretrained_lora_path": str(lora)})
    assert started.keys() == trained.keys()
    assert all(torch.allclose(started[k], trained[k], atol=1e-6) for k in trained)
    fresh = ends("fresh", {})
    assert not all(torch.allclose(fresh[k], trained[k], atol=1e-6) for k in trained)
    missing = job_config("missing", tmp_path / "out", example_model_dir, steps=1,
                         network={"type": "lora", "linear": 4,
                                  "pretrained_lora_path": str(tmp_path / "nope.safetensors")})
    assert run_job(load_config(str(write_config(tmp_path / "missing.yml", missing)))) == 2


def test_a_pretrained_lora_of_another_rank_is_one_line(tmp_path, example_model_dir, capsys):
    first = job_config("r4", tmp_path / "out", example_model_dir, steps=1,
                       sample={"prompts": []})
    assert run_job(load_config(str(write_config(tmp_path / "r4.yml", first)))) == EXIT_OK
    other = job_config("r8", tmp_path / "out", example_model_dir, steps=1,
                       network={"type": "lora", "linear": 8, "pretrained_lora_path":
                                str(tmp_path / "out" / "r4" / "r4.safetensors")})
    capsys.readouterr()
    assert run_job(load_config(str(write_config(tmp_path / "r8.yml", other)))) == 2
    err = capsys.readouterr().err
    assert "network.pretrained_lora_path: adapter weight shapes differ" in err
    assert "Traceback" not in err


def test_model_lora_path_fuses_the_lora_into_the_frozen_base(tmp_path, example_model_dir):
    """Upstream's model.lora_path: training starts from the base model with the LoRA at
    weight 1 in it (the same predictions as the base plus that LoRA as an adapter), and
    the trained adapter starts fresh."""
    from aitk.errors import ModelLoadError
    from aitk.run.assembly import load_model as load_for

    first = job_config("base_lora", tmp_path / "out", example_model_dir, steps=2,
                       sample={"prompts": []})
    assert run_job(load_config(str(write_config(tmp_path / "b.yml", first)))) == EXIT_OK
    lora = tmp_path / "out" / "base_lora" / "base_lora.safetensors"

    def proc(**model):
        cfg = job_config("fused", tmp_path / "out", example_model_dir, steps=1,
                         model={"arch": "example", "name_or_path": str(example_model_dir),
                                **model})
        return load_config(str(write_config(tmp_path / "f.yml", cfg))).job.config.process[0]

    cpu = torch.device("cpu")
    fused = load_for(proc(lora_path=str(lora)), cpu)
    plain_proc = proc()
    plain = load_for(plain_proc, cpu)
    with torch.no_grad():
        latents = plain.encode_images(torch.zeros(1, 3, 32, 32))
        latents = torch.randn(latents.shape, generator=torch.Generator().manual_seed(0))
        t = torch.tensor([500.0])
        embeds = plain.get_prompt_embeds(["a red circle"])
        before = plain.get_noise_prediction(latents, t, embeds)
        network = create_network(plain, plain_proc)
        network.load_file(lora)
        expected = plain.get_noise_prediction(latents, t, embeds)
        got = fused.get_noise_prediction(latents, t, embeds)
    assert not torch.allclose(before, expected, atol=1e-5)  # the LoRA changes the model
    assert torch.allclose(got, expected, atol=1e-5)
    other = tmp_path / "other.safetensors"
    from safetensors.torch import save_file

    save_file({"diffusion_model.nope.lora_A.weight": torch.zeros(4, 8),
               "diffusion_model.nope.lora_B.weight": torch.zeros(8, 4)}, str(other))
    with pytest.raises(ModelLoadError, match="model.lora_path .* does not fit"):
        load_for(proc(lora_path=str(other)), cpu)
