"""Config parsing and every error class; the real `python run.py` on a bad config."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from aitk.config import upstream_keys as uk
from aitk.config.loading import load_config, parse_job, read_config_file, resolve_config_path
from aitk.errors import ConfigError
from tests.aitk.aitk_testing import REPO, run_py

EXAMPLE = REPO / "config" / "examples" / "train_lora_example_cpu.yaml"
def check_arch(arch: str) -> str | None:
    return None if arch == "example" else f"unknown arch {arch!r}; known archs: example"


def example_raw() -> dict:
    return copy.deepcopy(read_config_file(EXAMPLE))


def parse(raw: dict, env: dict | None = None, **kw):
    return parse_job(raw, "job.yml", env=env or {}, check_arch=check_arch, **kw)


def proc(raw: dict) -> dict:
    return raw["config"]["process"][0]


def problems(raw: dict, env: dict | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse(raw, env)
    return info.value.problems


def test_example_config_parses_with_defaults_filled():
    loaded = parse(example_raw())
    p = loaded.job.config.process[0]
    assert loaded.name == "example_lora" and loaded.warnings == []
    assert p.network.dim == 16 and p.network.scale_alpha == 16.0
    assert p.datasets[0].resolutions == [64]
    assert p.train.accumulation == 1 and p.model.quantize_te is False
    assert [i.prompt for i in p.sample.items][0].startswith("[trigger]")


def test_name_tag_and_env_vars_are_substituted():
    raw = example_raw()
    proc(raw)["training_folder"] = "${OUT_ROOT}/runs/[name]"
    loaded = parse(raw, env={"OUT_ROOT": "/data"})
    assert loaded.job.config.process[0].training_folder == "/data/runs/example_lora"
    assert loaded.raw["meta"]["name"] == "example_lora"
    assert parse(raw, env={"OUT_ROOT": "/d"}, name_override="other").raw["meta"]["name"] \
        == "other"


def test_env_values_are_used_but_never_recorded():
    # config.yaml and the LoRA metadata come from `recorded`: a token passed through the
    # environment must not be written to disk next to the weights.
    raw = example_raw()
    proc(raw)["training_folder"] = "${OUT_ROOT}/runs"
    raw["meta"]["source"] = "${HF_TOKEN}"
    loaded = parse(raw, env={"OUT_ROOT": "/data", "HF_TOKEN": "hf_secret123"})
    assert loaded.job.config.process[0].training_folder == "/data/runs"
    assert "hf_secret123" not in repr(loaded.recorded)
    assert loaded.recorded["meta"]["source"] == "${HF_TOKEN}"
    assert proc(loaded.recorded)["training_folder"] == "${OUT_ROOT}/runs"
    assert loaded.recorded["meta"]["name"] == "example_lora"  # [name] is still filled in


def test_missing_env_var_is_an_error_naming_it_and_the_field():
    raw = example_raw()
    proc(raw)["model"]["name_or_path"] = "${MODELS_DIR}/example"
    assert problems(raw) == ["config.process[0].model.name_or_path: environment variable "
                             "MODELS_DIR is not set"]


def test_wrong_type_names_the_path_and_what_was_expected():
    raw = example_raw()
    proc(raw)["train"]["lr"] = "fast"
    proc(raw)["train"]["optimizer"] = "sgd"
    found = problems(raw)
    assert any(p.startswith("config.process[0].train.lr: input should be a valid number")
               and "'fast'" in p for p in found)
    assert any(p.startswith("config.process[0].train.optimizer: input should be 'adamw', "
                            "'adam', ") and "'sgd'" in p for p in found)


def test_out_of_range_value_inside_a_union_reports_the_precise_item():
    raw = example_raw()
    proc(raw)["datasets"][0]["resolution"] = [64, 0]
    assert problems(raw) == ["config.process[0].datasets[0].resolution[1]: input should be "
                             "greater than or equal to 1 (got 0)"]


def test_misspelt_key_is_an_error_suggesting_the_near_key():
    raw = example_raw()
    proc(raw)["train"]["stpes"] = 10
    proc(raw)["sample"]["sample_evry"] = 10
    assert sorted(problems(raw)) == [
        "config.process[0].sample.sample_evry: unknown key (did you mean 'sample_every'?)",
        "config.process[0].train.stpes: unknown key (did you mean 'steps'?)",
    ]


def test_unknown_key_without_a_near_match_has_no_suggestion():
    raw = example_raw()
    proc(raw)["model"]["zzzz"] = 1
    assert problems(raw) == ["config.process[0].model.zzzz: unknown key"]


def test_upstream_only_keys_warn_and_are_dropped():
    raw = example_raw()
    proc(raw)["train"]["correct_pred_norm"] = True
    proc(raw)["train"]["learnable_snr_gos"] = True
    proc(raw)["datasets"][0]["standardize_images"] = True
    loaded = parse(raw)
    said = "valid upstream but not acted on by aitk: "
    assert loaded.warnings == [
        "config.process[0].datasets[0].standardize_images: " + said + uk.DROPPED[
            ("datasets", "standardize_images")],
        "config.process[0].train.correct_pred_norm: " + said + uk.DROPPED[
            ("train", "correct_pred_norm")],
        "config.process[0].train.learnable_snr_gos: " + said + uk.DROPPED[
            ("train", "learnable_snr_gos")],
    ]
    assert "correct_pred_norm" not in proc(loaded.raw)["train"]


def test_unknown_arch_lists_the_known_ones():
    raw = example_raw()
    proc(raw)["model"]["arch"] = "flux9"
    assert problems(raw) == ["config.process[0].model.arch: unknown arch 'flux9'; known "
                             "archs: example"]


def test_all_problems_are_collected_in_one_error():
    raw = example_raw()
    proc(raw)["train"]["stepz"] = 1
    proc(raw)["train"]["lr"] = -1
    proc(raw)["model"]["arch"] = "nope"
    del proc(raw)["datasets"]
    assert len(problems(raw)) == 4


def test_upstream_process_type_aliases_and_legacy_accumulation():
    raw = example_raw()
    proc(raw)["type"] = "ui_trainer"
    proc(raw)["train"]["gradient_accumulation"] = 1
    proc(raw)["train"]["gradient_accumulation_steps"] = 4
    assert parse(raw).job.config.process[0].train.accumulation == 4
    proc(raw)["train"]["gradient_accumulation"] = 2
    assert any("not both" in p for p in problems(raw))
    proc(raw)["type"] = "extract_lora"
    assert any(p.startswith("config.process[0].type:") for p in problems(raw))


def test_config_names_resolve_like_upstream(tmp_path: Path, monkeypatch):
    (tmp_path / "config").mkdir()
    target = tmp_path / "config" / "mine.yaml"
    target.write_text("job: extension\n")
    monkeypatch.chdir(tmp_path)
    assert resolve_config_path("mine") == tmp_path / "config" / "mine.yaml"
    assert resolve_config_path("mine.yaml") == tmp_path / "config" / "mine.yaml"
    assert resolve_config_path(str(target)) == target
    assert resolve_config_path("examples/train_lora_example_cpu") == EXAMPLE
    with pytest.raises(ConfigError, match="no such config file"):
        resolve_config_path("absent")


def test_json_configs_load_and_broken_yaml_is_one_error(tmp_path: Path):
    (tmp_path / "job.json").write_text('{"job": "extension"}')
    assert read_config_file(tmp_path / "job.json") == {"job": "extension"}
    (tmp_path / "bad.yml").write_text("config: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML at line 2, column 1") as info:
        read_config_file(tmp_path / "bad.yml")
    assert len(info.value.render().splitlines()) == 1


def test_unreadable_config_file_is_one_error_not_a_traceback(tmp_path: Path, monkeypatch):
    (tmp_path / "latin1.yml").write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="not a UTF-8 text file"):
        read_config_file(tmp_path / "latin1.yml")

    def denied(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "open", denied)
    with pytest.raises(ConfigError, match=r"cannot read the file \(Permission denied\)"):
        read_config_file(tmp_path / "latin1.yml")


def test_non_utf8_config_through_the_cli_exits_2_with_one_line(tmp_path: Path, capsys):
    from aitk.cli.run import main

    path = tmp_path / "bad.yml"
    path.write_bytes(b"\xff\xfe")
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"config error in {path}: not a UTF-8 text file")
    assert len(err.strip().splitlines()) == 1


def test_unknown_arch_through_the_real_registry(tmp_path: Path):
    raw = example_raw()
    proc(raw)["model"]["arch"] = "not_an_arch"
    path = tmp_path / "job.yml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as info:
        load_config(str(path))
    assert info.value.problems[0].startswith(
        "config.process[0].model.arch: unknown model arch 'not_an_arch'; known archs: ")
    assert "example" in info.value.problems[0]


@pytest.mark.slow
def test_bad_config_through_run_py_exits_2_with_one_message(tmp_path: Path):
    raw = example_raw()
    proc(raw)["train"]["stpes"] = 10
    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump(raw))
    done = run_py(str(path), cwd=tmp_path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr + done.stdout
    assert done.stderr.strip() == (f"config error in {path}: config.process[0].train.stpes: "
                                   "unknown key (did you mean 'steps'?)")


UPSTREAM_STYLE = """\
---
job: extension
config:
  name: "my_first_lora_v1"
  process:
    - type: 'sd_trainer'
      training_folder: "output"
      device: cuda:0
      network:
        type: "lora"
        linear: 16
        linear_alpha: 16
      save:
        dtype: float16
        save_every: 250
        max_step_saves_to_keep: 4
        push_to_hub: false
      datasets:
        - folder_path: "/path/to/images/folder"
          caption_ext: "txt"
          caption_dropout_rate: 0.05
          shuffle_tokens: false
          cache_latents_to_disk: true
          resolution: [ 512, 768, 1024 ]
      train:
        batch_size: 1
        steps: 2000
        gradient_accumulation_steps: 1
        train_unet: true
        train_text_encoder: false
        gradient_checkpointing: true
        noise_scheduler: "flowmatch"
        optimizer: "adamw8bit"
        lr: 1e-4
        ema_config:
          use_ema: true
          ema_decay: 0.99
        dtype: bf16
      model:
        name_or_path: "/models/example"
        arch: example
        quantize: true
      sample:
        sampler: "flowmatch"
        sample_every: 250
        width: 1024
        height: 1024
        prompts:
          - "woman with red hair, playing chess at the park"
        neg: ""
        seed: 42
        walk_seed: true
        guidance_scale: 4
        sample_steps: 20
meta:
  name: "[name]"
  version: '1.0'
"""


def test_an_upstream_style_config_loads_with_warnings_only_where_it_matters(tmp_path):
    path = tmp_path / "upstream.yaml"
    path.write_text(UPSTREAM_STYLE)
    loaded = load_config(str(path), check_arch=check_arch)
    p = loaded.job.config.process[0]
    assert p.train.lr == 1e-4  # YAML reads `1e-4` as a string; it is still a number
    assert p.datasets[0].resolutions == [512, 768, 1024]
    assert p.model.quantize_te is True  # follows quantize, as upstream
    # push_to_hub: false / shuffle_tokens: false change nothing and stay quiet; the EMA
    # trains as upstream's.
    assert loaded.warnings == []
    assert p.train.ema_config.use_ema and p.train.ema_config.ema_decay == 0.99


# ---- bounded loading: hostile or broken files are one error, in bounded time/memory ---
def billion_laughs(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + f"\nconfig: {{name: x, process: *a{levels}}}\n"


@pytest.mark.parametrize("text", [
    billion_laughs(),  # 10**9 values from about 1 KB
    "a: &a [*a]\n",  # a list that holds itself
    "b0: &b0 {k0: 1}\n" + "".join(f"b{i}: &b{i} {{<<: [*b{i - 1}, *b{i - 1}], k{i}: 1}}\n"
                                  for i in range(1, 40)),  # merge keys doubling per level
], ids=["billion-laughs", "self-reference", "merge-keys"])
def test_yaml_alias_bombs_are_refused_in_bounded_time(tmp_path: Path, text: str):
    path = tmp_path / "bomb.yml"
    path.write_text(text)
    assert len(text) < 2500
    # Depth-first: a self-reference or deep merge chain may hit the depth limit first.
    with pytest.raises(ConfigError, match="too large once its aliases are expanded|"
                                          "nested more than 64 levels"):
        read_config_file(path)


def test_an_alias_bomb_through_the_cli_exits_2_with_one_line(tmp_path: Path, capsys):
    from aitk.cli.run import main

    path = tmp_path / "bomb.yml"
    path.write_text(billion_laughs())
    assert main([str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"config error in {path}: too large") and "\n" not in err


@pytest.mark.parametrize("text,message", [
    ("a: " + "[" * 3000 + "]" * 3000 + "\n", "nested"),
    ("a: " + "[" * 100 + "]" * 100 + "\n", "nested more than 64 levels"),
    ("k: " + "x" * (1 << 20) + "\n", "larger than 1024 KiB"),
])
def test_deep_or_huge_config_files_are_one_error(tmp_path: Path, text: str, message: str):
    for suffix in (".yml", ".json"):
        path = tmp_path / f"c{suffix}"
        path.write_text(text if suffix == ".yml" or "k:" in text else
                        '{"a": ' + text[3:-1] + "}")
        with pytest.raises(ConfigError, match=message):
            read_config_file(path)


@pytest.mark.parametrize("name", ["../escape", "a/b", "/abs/path", "..", ".", "a\\b", ""])
def test_the_job_name_is_one_path_component(name: str):
    raw = example_raw()
    raw["config"]["name"] = name
    found = problems(raw)
    assert len(found) == 1 and found[0].startswith("config.name: ")
    raw["config"]["name"] = "fine"
    with pytest.raises(ConfigError, match="config.name: must be one folder name"):
        parse(raw, name_override=name or "..")


def test_name_option_names_the_run_even_when_the_config_has_a_name():
    raw = example_raw()
    assert raw["config"]["name"] == "example_lora"
    loaded = parse(raw, name_override="run1")
    assert loaded.name == "run1" and loaded.recorded["config"]["name"] == "run1"
    assert loaded.raw["meta"]["name"] == "run1"
