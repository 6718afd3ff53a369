"""`aitk audit adapter`: fixture files built here for each finding; layout, rank/alpha,
norms, metadata and the SHA-256 are reported."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from aitk.audit.adapter import archs_writing, audit_adapter, block_of, layout_of
from aitk.cli.audit import main as audit_main
from aitk.findings import Level

MODULES = ("transformer_blocks.0.attn.to_q", "transformer_blocks.1.attn.to_q")


def lora(path: Path, prefix: str = "diffusion_model.", *, rank: int = 4, alpha: bool = True,
         up: float = 0.1, meta: dict[str, str] | None = None,
         poison: str | None = None) -> Path:
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for i, module in enumerate(MODULES):
        r = rank + i if poison == "mixed" else rank
        tensors[f"{prefix}{module}.lora_A.weight"] = torch.randn(r, 16, generator=gen)
        tensors[f"{prefix}{module}.lora_B.weight"] = torch.full((16, r), up)
        if alpha:
            tensors[f"{prefix}{module}.alpha"] = torch.tensor(float(r))
    if poison == "nan":
        tensors[f"{prefix}{MODULES[0]}.lora_B.weight"][0, 0] = float("nan")
    if poison == "one_zero":
        tensors[f"{prefix}{MODULES[1]}.lora_B.weight"].zero_()
    save_file(tensors, str(path), metadata=meta)
    return path


def codes(report) -> set[tuple[Level, str, str]]:
    return {(f.level, f.code, f.path) for f in report.findings}


def test_a_sound_file_reports_layout_ranks_norms_metadata_and_hash(tmp_path):
    path = lora(tmp_path / "ok.safetensors", meta={"base_model_arch": "example",
                                                   "training_info": '{"step": 10}'})
    report = audit_adapter(path)
    s = report.summary
    assert report.exit_code == 0 and report.findings == []
    assert s["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    assert s["layout"].startswith("ComfyUI / aitk") and "ComfyUI" in s["loaded_by"]
    assert s["arch"] == "example" and s["ranks"] == {4: 2}
    assert s["metadata"]["training_info"] == {"step": 10}
    assert set(s["block_norms"]) == {"diffusion_model.transformer_blocks.0",
                                     "diffusion_model.transformer_blocks.1"}
    mod = next(m for m in s["per_module"] if m["module"].endswith("blocks.0.attn.to_q"))
    assert mod["rank"] == 4 and mod["alpha"] == 4.0 and mod["norm"] > 0


def test_norm_matches_the_dense_product(tmp_path):
    path = lora(tmp_path / "n.safetensors", rank=2)
    report = audit_adapter(path)
    from safetensors.torch import load_file

    t = load_file(str(path))
    key = f"diffusion_model.{MODULES[0]}"
    dense = (t[f"{key}.lora_B.weight"] @ t[f"{key}.lora_A.weight"]).norm().item()
    got = next(m["norm"] for m in report.summary["per_module"] if m["module"] == key)
    assert got == pytest.approx(dense, rel=1e-4)


@pytest.mark.parametrize("poison,expected", [
    ("nan", (Level.ERROR, "non_finite",
             f"diffusion_model.{MODULES[0]}.lora_B.weight")),
    ("one_zero", (Level.WARNING, "some_zero", "")),
    ("mixed", (Level.INFO, "mixed_ranks", "")),
])
def test_each_defect_is_reported(tmp_path, poison, expected):
    assert expected in codes(audit_adapter(lora(tmp_path / "x.safetensors", poison=poison)))


def test_all_zero_up_tensors_is_an_error(tmp_path):
    report = audit_adapter(lora(tmp_path / "z.safetensors", up=0.0))
    assert (Level.ERROR, "all_zero", "") in codes(report) and report.exit_code == 1


def test_missing_alpha_and_metadata_are_noted(tmp_path):
    found = codes(audit_adapter(lora(tmp_path / "a.safetensors", alpha=False)))
    assert (Level.INFO, "no_alpha", f"diffusion_model.{MODULES[0]}") in found
    assert (Level.INFO, "no_metadata", "") in found


def test_layouts_name_the_tools_that_load_them(tmp_path):
    assert layout_of(["transformer.x.lora_A.weight"])[0].startswith("diffusers")
    assert layout_of(["lora_unet_down_blocks_0.lora_down.weight"])[0].startswith("kohya")
    report = audit_adapter(lora(tmp_path / "u.safetensors", prefix="weird."))
    assert (Level.WARNING, "unknown_layout", "") in codes(report)
    assert block_of("transformer.single_transformer_blocks.12.attn") == \
        "transformer.single_transformer_blocks.12"


def test_cli_json_and_exit_codes(tmp_path, capsys):
    good = lora(tmp_path / "g.safetensors")
    assert audit_main(["adapter", str(good), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["audit"] == "adapter" and doc["ok"] is True
    bad = lora(tmp_path / "b.safetensors", poison="nan")
    assert audit_main(["adapter", str(bad)]) == 1
    out = capsys.readouterr().out
    assert "1 NaN/Inf values" in out and out.strip().endswith("1 errors, 0 warnings, 1 notes")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{bad}")
    assert audit_main(["adapter", str(junk)]) == 2
    assert "not a safetensors file" in capsys.readouterr().err
    assert audit_main(["adapter", str(tmp_path / "missing.safetensors")]) == 2


def test_without_metadata_the_arch_is_read_from_the_arch_descriptions(tmp_path):
    """No `base_model_arch` in the file: the archs whose own description writes this
    key layout (prefix and PEFT/kohya style) are named, not a guess from module names."""
    from aitk.models.catalog import descriptions

    s = audit_adapter(lora(tmp_path / "t.safetensors", prefix="transformer.")).summary
    writes = {d.name: d.lora.writes for d in descriptions()}
    want = [n for n, w in writes.items() if w.prefix == "transformer." and w.style == "peft"]
    assert want and s["archs_with_this_layout"] == want
    assert s["arch"] == "one of " + ", ".join(want)
    kohya = archs_writing(["lora_unet_down_blocks_0_attn1_to_q.lora_down.weight"])
    assert {"sdxl", "sd1", "sd2"} <= set(kohya) and "flux" not in kohya
    # a kohya-style key under a PEFT arch's prefix is no arch's file
    assert archs_writing(["transformer.x.lora_down.weight"]) == []
    assert audit_adapter(lora(tmp_path / "u.safetensors", prefix="mine.")).summary[
        "arch"] == "unknown"
