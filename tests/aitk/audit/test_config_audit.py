"""`aitk audit config`: the preflight plus conflicts, each finding with level and field
path; the bundled example is clean; a config that does not load is a list of findings."""

from __future__ import annotations

import json
from pathlib import Path

from aitk.audit.config import audit_config
from aitk.cli.audit import main as audit_main
from aitk.findings import Level
from tests.aitk.aitk_testing import REPO, job_config, scratch_checkout, write_config

EXAMPLE = REPO / "config" / "examples" / "train_lora_example_cpu.yaml"
P = "config.process[0]"


def _config(tmp_path: Path, **overrides) -> str:
    (tmp_path / "model").mkdir(exist_ok=True)
    cfg = job_config("ca", tmp_path / "out", tmp_path / "model", **overrides)
    return str(write_config(tmp_path / "ca.yml", cfg))


def found(report) -> set[tuple[Level, str]]:
    return {(f.level, f.path) for f in report.findings}


def test_the_bundled_example_is_clean(capsys, tmp_path, monkeypatch):
    # From a scratch checkout: its `training_folder: output` must not be the real
    # checkout's, which holds a finished run once the quick start has trained it.
    monkeypatch.chdir(scratch_checkout(tmp_path))
    assert audit_main(["config", str(EXAMPLE)]) == 0
    assert capsys.readouterr().out.strip().endswith("OK: 0 errors, 0 warnings, 0 notes")


def test_conflicts_are_reported_with_level_and_field_path(tmp_path):
    ds = {"folder_path": str(REPO / "datasets" / "example"), "resolution": [32],
          "shuffle_tokens": True, "token_dropout_rate": 0.1, "random_triggers": ["x"]}
    report = audit_config(_config(
        tmp_path, datasets=[ds],
        train={"cache_text_embeddings": True, "diff_output_preservation": True},
        trigger_word=None))
    got = found(report)
    for key in ("shuffle_tokens", "token_dropout_rate", "random_triggers"):
        assert (Level.WARNING, f"{P}.datasets[0].{key}") in got, key
    assert (Level.ERROR, f"{P}.train.diff_output_preservation") in got
    assert (Level.ERROR, f"{P}.train.diff_output_preservation_class") in got
    assert report.exit_code == 1


def test_sample_prompts_without_the_trigger(tmp_path):
    report = audit_config(_config(tmp_path))  # job_config's 2nd prompt lacks [trigger]
    assert (Level.WARNING, f"{P}.sample.prompts[1]") in found(report)
    assert (Level.WARNING, f"{P}.sample.prompts[0]") not in found(report)


def test_an_output_folder_it_would_resume_is_reported(tmp_path):
    path = _config(tmp_path)
    (tmp_path / "out" / "ca" / "checkpoints" / "step_000000002").mkdir(parents=True)
    report = audit_config(path)
    assert (Level.INFO, f"{P}.training_folder") in found(report)


def test_a_config_that_does_not_load_becomes_findings(tmp_path, capsys):
    cfg = job_config("ca", tmp_path / "out", tmp_path / "model",
                     train={"stpes": 3, "lr": -1})
    path = write_config(tmp_path / "bad.yml", cfg)
    assert audit_main(["config", str(path), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    paths = {(f["level"], f["path"]) for f in doc["findings"]}
    assert paths == {("error", f"{P}.train.stpes"), ("error", f"{P}.train.lr")}
