"""The memory forecast (aitk.memory.forecast, aitk.memory.plan): the storage table, each
setting moving the peaks the way it must, hints that do make the run fit, the upstream
24 GB configs on a 24 GB card, part sizes from a folder's safetensors headers, and
`run.py --check --json`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from aitk.cli.run import main
from aitk.config.loading import load_config
from aitk.memory import forecast as fc
from aitk.memory.forecast import PartLoad, Plan, forecast, weight_bytes
from aitk.memory.plan import count_folder, plan_of
from aitk.models import catalog
from tests.aitk.aitk_testing import REPO, job_config, write_config

GIB = 1024 ** 3
EXAMPLES = REPO / "config" / "examples"


def flux_plan(**change) -> Plan:
    """FLUX.1 dev at 1024 px, bf16, rank 16, checkpointing, on a CUDA device."""
    desc = catalog.description("flux")
    parts = tuple(PartLoad(p.subfolder, p.role.value, p.params, p.blocks, p.block_params,
                           "fp32" if p.float32 else "bf16", "fp32" if p.float32 else "bf16")
                  for p in desc.variant("dev").parts)
    return replace(Plan("cuda", parts, resolution=1024), **change)


@pytest.mark.parametrize(("kind", "size"), [
    ("float32", 4), ("bf16", 2), ("qfloat8", 1), ("qint8", 1), ("float8", 1), ("int8", 1),
    ("uint8", 1), ("qint4", 0.53125), ("int4", 0.53125), ("uint4", 0.53125),
    ("uint3", 0.40625), ("uint2", 0.28125), ("qint2", 0.28125), ("uint7", 0.90625),
    ("uint3|ostris/accuracy_recovery_adapters/x.safetensors", 0.40625)])
def test_bytes_per_weight(kind, size):
    assert weight_bytes(kind) == pytest.approx(size)


def test_an_unknown_format_is_a_key_error():
    with pytest.raises(KeyError):
        weight_bytes("nvfp4")


def test_each_setting_moves_the_peaks_its_way():
    base = forecast(flux_plan())
    quantized = forecast(flux_plan(parts=tuple(
        replace(p, stored_as="qfloat8") if p.role == "denoiser" else p
        for p in flux_plan().parts)))
    assert quantized.device_peak_bytes < base.device_peak_bytes - 10 * GIB  # 12B at 1 byte
    offloaded = forecast(flux_plan(parts=tuple(
        replace(p, offload_share=0.5) if p.role == "denoiser" else p
        for p in flux_plan().parts)))
    assert offloaded.device_peak_bytes < base.device_peak_bytes - 8 * GIB
    assert offloaded.host_peak_bytes >= base.host_peak_bytes
    # Without checkpointing autograd keeps every block's weights: offloading saves nothing
    # in training, and the activations of all 57 blocks at 1024 px are tens of GiB.
    no_ckpt = flux_plan(gradient_checkpointing=False)
    assert forecast(no_ckpt).device_peak_bytes > base.device_peak_bytes + 10 * GIB
    assert fc.activation_bytes(flux_plan(resolution=512)) < fc.activation_bytes(flux_plan())
    cached = flux_plan(parts=tuple(replace(p, dropped_after_caching=p.role == "text_encoder")
                                   for p in flux_plan().parts))
    assert fc.device_weights(cached, training=True) < fc.device_weights(flux_plan(), True)
    low_vram = flux_plan(parts=tuple(replace(p, idle_on_host=p.role != "denoiser")
                                     for p in flux_plan().parts))
    assert forecast(low_vram).device_peak_bytes < base.device_peak_bytes
    assert fc.adapter_params(flux_plan(rank=32)) == 2 * fc.adapter_params(flux_plan())


def test_quantizing_while_loading_lowers_only_the_quantized_parts_load_peak():
    """An arch whose loader quantizes block by block never holds a quantized part whole
    in float; its unquantized parts load as before."""
    float_only = flux_plan()
    assert fc.loading(float_only) == fc.loading(replace(float_only,
                                                         quantizes_while_loading=True))
    parts = tuple(replace(p, stored_as="qfloat8") if p.role == "denoiser" else p
                  for p in float_only.parts)
    whole, streamed = (replace(float_only, parts=parts, quantizes_while_loading=on)
                       for on in (False, True))
    [denoiser] = [p for p in parts if p.role == "denoiser"]
    assert fc.loading(streamed)[0] < fc.loading(whole)[0] - 0.9 * denoiser.float_bytes


def test_the_adapter_estimate_is_near_the_real_flux_lora():
    # rank 16 on every Linear of FLUX.1's 57 blocks: 16 * 5,369,856 (the meta-device
    # build of the real config, see the forecast's sources)
    assert fc.adapter_params(flux_plan()) == pytest.approx(16 * 5_369_856, rel=0.2)


def test_the_hints_each_make_the_run_fit():
    plan = flux_plan(device_free_bytes=24 * GIB, host_free_bytes=128 * GIB)
    result = forecast(plan)
    assert result.fits is False and result.hints
    order = [text for text, _ in fc._changes(plan)]
    changes = dict(fc._changes(plan))
    for hint in result.hints:
        assert forecast(changes[hint], with_hints=False).fits, hint
    assert [order.index(h) for h in result.hints] == sorted(order.index(h)
                                                            for h in result.hints)
    # bf16 Flux needs 4-bit weights or offloading; with its text embeddings cached (the
    # encoders gone before training) 8-bit weights are enough, the cheapest fix
    assert "uint4" in result.hints[0]
    cached = replace(plan, parts=tuple(
        replace(p, dropped_after_caching=p.role == "text_encoder") for p in plan.parts))
    assert forecast(cached).hints[0] == "model.quantize: true, qtype: qfloat8"


def test_a_run_that_fits_has_no_hints_and_unknown_free_memory_no_verdict():
    big = forecast(flux_plan(device_free_bytes=140 * GIB, host_free_bytes=256 * GIB))
    assert big.fits is True and big.hints == ()
    assert forecast(flux_plan()).fits is None


@pytest.mark.parametrize(("config", "fits"), [
    ("train_lora_flux_24gb.yaml", True),  # qfloat8 on a 24 GB card: upstream's own claim
    ("train_lora_qwen_image_24gb.yaml", False)])  # 20B at 8 bits does not: uint3 + ARA
def test_upstream_24gb_configs_on_a_24gb_card(config, fits):
    proc = load_config(str(EXAMPLES / config)).job.config.process[0]
    plan = plan_of(proc, catalog.description(proc.model.arch), "cuda", 23 * GIB,
                   128 * GIB)
    result = forecast(plan)
    assert result.fits is fits
    if not fits:
        assert any("uint4" in h or "uint3" in h or "layer_offloading" in h
                   for h in result.hints)


def test_a_guidance_denoiser_is_quantized_with_the_denoiser_and_idles_on_the_host():
    """Ideogram 4's unconditional transformer (PartRole.GUIDANCE, previews only): its
    weights at `model.qtype` with `model.quantize`, on the CPU with `low_vram`, and the
    24 GB example fits a 24 GB card."""
    proc = load_config(str(EXAMPLES / "train_lora_ideogram4_24gb.yaml")).job.config.process[0]
    plan = plan_of(proc, catalog.description("ideogram4"), "cuda", 23 * GIB, 128 * GIB)
    [guidance] = [p for p in plan.parts if p.role == "guidance"]
    assert (guidance.stored_as, guidance.idle_on_host) == ("qfloat8", True)
    assert forecast(plan).fits is True
    proc.model.quantize, proc.model.low_vram = False, False
    plan = plan_of(proc, catalog.description("ideogram4"), "cuda", 23 * GIB, 128 * GIB)
    [guidance] = [p for p in plan.parts if p.role == "guidance"]
    assert (guidance.stored_as, guidance.idle_on_host) == ("bf16", False)


def test_part_sizes_come_from_the_folders_safetensors_headers(example_model_dir: Path):
    import torch
    from safetensors.torch import load_file

    counted = count_folder(example_model_dir / "transformer")
    assert counted is not None
    weights = {k: v for f in (example_model_dir / "transformer").glob("*.safetensors")
               for k, v in load_file(f).items()}
    assert counted.params == sum(t.numel() for t in weights.values())
    assert counted.block_params == sum(t.numel() for k, t in weights.items()
                                       if k.split(".")[1].isdigit())
    assert counted.blocks > 0
    assert isinstance(next(iter(weights.values())), torch.Tensor)


def test_check_json_prints_one_object_per_run(tmp_path: Path, example_model_dir: Path,
                                              capsys):
    cfg = job_config("checked", tmp_path / "out", example_model_dir)
    cfg["config"]["process"].append(cfg["config"]["process"][0])
    path = write_config(tmp_path / "job.yml", cfg)
    assert main([str(path), "--check", "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["process"] for r in records] == [0, 1]
    for r in records:
        memory = r["memory"]
        assert r["ok"] is True and r["problems"] == []
        assert set(memory) == {"device", "device_peak_bytes", "host_peak_bytes",
                               "device_free_bytes", "fits", "hints"}
        assert memory["device"] == "cpu" and memory["fits"] is True
        assert 0.3 * GIB < memory["host_peak_bytes"] < 2 * GIB  # a tiny model on torch


def test_check_json_reports_a_config_that_does_not_load(tmp_path: Path, capsys):
    path = tmp_path / "bad.yml"
    path.write_text("job: extension\nconfig: {name: x, process: [{type: sd_trainer}]}\n")
    assert main([str(path), "--check", "--json"]) == 2
    record = json.loads(capsys.readouterr().out.strip())
    assert record["ok"] is False and record["problems"] and record["memory"] is None


def test_a_gpu_run_that_cannot_fit_is_a_preflight_error(tmp_path: Path,
                                                        example_model_dir: Path,
                                                        monkeypatch):
    from aitk.audit import preflight as checks
    from aitk.memory import plan as memory_plan

    tight = forecast(flux_plan(device_free_bytes=24 * GIB, host_free_bytes=128 * GIB))
    monkeypatch.setattr(memory_plan, "memory_forecast", lambda proc: tight)
    cfg = job_config("tight", tmp_path / "out", example_model_dir)
    loaded = load_config(str(write_config(tmp_path / "job.yml", cfg)))
    found = [f for f in checks.preflight(loaded) if f.code == "memory"]
    assert len(found) == 1 and found[0].level.value == "error"
    assert "forecast to need 38.3 GiB of cuda memory" in found[0].message
    assert "24.0 GiB is free" in found[0].message
    assert found[0].fix == " or ".join(tight.hints) and "uint4" in found[0].fix


def test_a_cpu_run_that_cannot_fit_warns(tmp_path: Path, example_model_dir: Path,
                                         monkeypatch, capsys):
    from aitk.memory import plan as memory_plan

    monkeypatch.setattr(memory_plan, "host_available", lambda: 64 * 1024 * 1024)
    cfg = job_config("tight", tmp_path / "out", example_model_dir)
    path = write_config(tmp_path / "job.yml", cfg)
    assert main([str(path), "--check"]) == 0
    err = capsys.readouterr().err
    assert "warning: config.process[0].model: this run is forecast to need" in err
    assert "0.1 GiB is free" in err


# ---- full fine-tunes and sliders -----------------------------------------------------------
def fine_tune_plan(**change) -> Plan:
    """FLUX.1 dev's transformer trained whole in bf16."""
    return flux_plan(full_fine_tune=True, trained=("transformer",), rank=0, **change)


def test_the_optimizer_term_grows_with_the_optimizers_bytes_per_weight():
    from aitk.config.optimizers import OPTIMIZERS

    [transformer] = [p for p in fine_tune_plan().parts if p.name == "transformer"]
    per_weight = {name: spec.state_per_weight(2.0) for name, spec in OPTIMIZERS.items()}
    assert per_weight["adamw"] == 4.0 and per_weight["prodigy"] == 8.0  # bf16 copies
    assert per_weight["adamw8bit"] == pytest.approx(2.03, abs=0.01)
    terms = {name: fc.optimizer_bytes(fine_tune_plan(optimizer=name)) for name in OPTIMIZERS}
    for name, term in terms.items():
        assert term == pytest.approx(transformer.params * per_weight[name])
    for a in OPTIMIZERS:
        for b in OPTIMIZERS:
            if per_weight[a] < per_weight[b]:
                assert terms[a] < terms[b], (a, b)
                assert forecast(fine_tune_plan(optimizer=a)).device_peak_bytes < \
                    forecast(fine_tune_plan(optimizer=b)).device_peak_bytes, (a, b)
    # the adapter's state is counted at float32, as it trains
    assert fc.optimizer_bytes(flux_plan()) == pytest.approx(fc.adapter_params(flux_plan()) * 8)


def test_a_full_fine_tune_adds_gradients_and_state_in_the_weights_dtype():
    [transformer] = [p for p in fine_tune_plan().parts if p.name == "transformer"]
    # bf16 weights: a bf16 gradient and two bf16 moments (torch's AdamW: zeros_like)
    assert fc.trained_bytes(fine_tune_plan()) == pytest.approx(transformer.params * 6)
    with_ema = fc.trained_bytes(fine_tune_plan(ema=True))
    assert with_ema == pytest.approx(transformer.params * 8)
    lora = forecast(flux_plan()).device_peak_bytes
    full = forecast(fine_tune_plan()).device_peak_bytes
    assert full - lora > transformer.params * 5  # ~60 GB more for FLUX.1's 12B weights


def test_a_full_fine_tunes_hints_never_quantize_or_offload_what_trains():
    plan = fine_tune_plan(optimizer="prodigy", ema=True, device_free_bytes=80 * GIB,
                          host_free_bytes=512 * GIB)
    result = forecast(plan)
    assert result.fits is False
    texts = [text for text, _ in fc._changes(plan)]
    assert "train.optimizer: adamw8bit" in texts and "train.ema_config.use_ema: false" in texts
    assert not any("quantize" in t or "layer_offloading" in t for t in texts)
    for hint in result.hints:
        assert "quantize" not in hint and "layer_offloading" not in hint


def test_plans_of_a_full_fine_tune_and_of_a_slider(tmp_path: Path, example_model_dir: Path):
    cfg = job_config("ft", tmp_path / "out", example_model_dir,
                     train={"train_text_encoder": True, "cache_text_embeddings": False,
                            "ema_config": {"use_ema": True}})
    del cfg["config"]["process"][0]["network"]
    proc = load_config(str(write_config(tmp_path / "ft.yml", cfg))).job.config.process[0]
    plan = plan_of(proc, catalog.description("example"), "cpu", None, None)
    assert plan is not None and plan.full_fine_tune and plan.ema
    roles = {p.name: p.role for p in plan.parts}
    assert {roles[name] for name in plan.trained} == {"denoiser", "text_encoder"}
    assert fc.trained_weights(plan) == [(p.params, p.load_as) for p in plan.parts
                                        if p.name in plan.trained]

    from tests.aitk.test_slider import slider_job

    slider = load_config(str(slider_job(tmp_path, example_model_dir, 4))).job.config.process[0]
    assert not slider.datasets
    plan = plan_of(slider, catalog.description(slider.model.arch), "cpu", None, None)
    # no datasets: its own latents at slider.resolutions' largest side, as LoRA training
    assert plan is not None and not plan.full_fine_tune and plan.rank == 4
    assert plan.resolution == 48 and plan.frames == 1


def test_check_json_forecasts_a_full_fine_tune_and_a_slider(tmp_path: Path,
                                                             example_model_dir: Path,
                                                             capsys):
    from tests.aitk.test_slider import slider_job

    cfg = job_config("ft", tmp_path / "out", example_model_dir)
    del cfg["config"]["process"][0]["network"]
    for path in (write_config(tmp_path / "ft.yml", cfg),
                 slider_job(tmp_path, example_model_dir, 4)):
        assert main([str(path), "--check", "--json"]) == 0
        record = json.loads(capsys.readouterr().out.strip())
        assert record["ok"] is True and record["memory"] is not None
        assert record["memory"]["fits"] is True
        assert 0.3 * GIB < record["memory"]["host_peak_bytes"] < 2 * GIB


def test_a_full_fine_tune_that_cannot_fit_warns_and_never_hints_quantizing(
        tmp_path: Path, example_model_dir: Path, monkeypatch, capsys):
    from aitk.memory import plan as memory_plan

    monkeypatch.setattr(memory_plan, "host_available", lambda: 64 * 1024 * 1024)
    cfg = job_config("tight", tmp_path / "out", example_model_dir)
    del cfg["config"]["process"][0]["network"]
    assert main([str(write_config(tmp_path / "job.yml", cfg)), "--check"]) == 0
    err = capsys.readouterr().err
    assert "warning: config.process[0].model: this run is forecast to need" in err
    assert "quantize" not in err


def test_check_json_of_a_file_job_has_no_forecast(tmp_path: Path, example_model_dir: Path,
                                                  capsys):
    """A generate job trains nothing: `memory` is null (it was a traceback: the forecast
    read the process's `train`)."""
    config = {"job": "generate", "config": {"name": "gen", "process": [{
        "type": "to_folder", "output_folder": str(tmp_path / "gen"), "device": "cpu",
        "generate": {"width": 32, "height": 32, "sample_steps": 2, "prompts": ["a"]},
        "model": {"name_or_path": str(example_model_dir)}}]}}
    assert main([str(write_config(tmp_path / "gen.yml", config)), "--check", "--json"]) == 0
    record = json.loads(capsys.readouterr().out.strip())
    assert record["ok"] is True and record["memory"] is None
