"""train.prompt_dropout_prob reaches training: the key loads without the dropped-key
warning, p = 1 trains exactly as captions all empty do, and with cached text
embeddings one warning says it does not act."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aitk.config.loading import load_config
from aitk.errors import ConfigError
from aitk.run.job import EXIT_OK, run_job
from tests.aitk.aitk_testing import job_config, write_config

pytestmark = pytest.mark.slow
STEPS = 3


def run(tmp: Path, name: str, model_dir: Path, train: dict, dataset: dict | None = None
        ) -> list[float]:
    cfg = job_config(name, tmp / "out", model_dir, steps=STEPS,
                     train={"cache_text_embeddings": False, **train},
                     sample={"sample_every": 100, "prompts": []})
    cfg["config"]["process"][0]["datasets"][0].update(dataset or {})
    assert run_job(load_config(str(write_config(tmp / f"{name}.yml", cfg)))) == EXIT_OK
    log = tmp / "out" / name / "loss_log.jsonl"
    return [json.loads(line)["loss"] for line in log.read_text().splitlines()]


def test_p_one_trains_as_empty_captions(tmp_path: Path, example_model_dir: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    dropped = run(tmp_path, "dropped", example_model_dir, {"prompt_dropout_prob": 1.0})
    out = capsys.readouterr()
    assert "prompt_dropout_prob" not in out.out + out.err  # acted on: no warning
    empty = run(tmp_path, "empty", example_model_dir, {}, {"caption_dropout_rate": 1.0})
    plain = run(tmp_path, "plain", example_model_dir, {})
    assert len(dropped) == STEPS
    assert dropped == empty
    assert dropped != plain


def test_cached_embeddings_say_once_it_does_not_act(tmp_path: Path, example_model_dir: Path,
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    cached = run(tmp_path, "cached", example_model_dir,
                 {"prompt_dropout_prob": 0.5, "cache_text_embeddings": True})
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if "prompt_dropout_prob" in line]
    assert len(lines) == 1 and "cached" in lines[0], lines
    plain = run(tmp_path, "plain", example_model_dir, {"cache_text_embeddings": True})
    assert cached == plain  # trains normally


@pytest.mark.parametrize("p", [-0.1, 1.5])
def test_a_probability_outside_0_1_is_the_schemas_one_line_error(
        p: float, tmp_path: Path, example_model_dir: Path) -> None:
    cfg = job_config("bad", tmp_path / "out", example_model_dir,
                     train={"prompt_dropout_prob": p})
    with pytest.raises(ConfigError) as err:
        load_config(str(write_config(tmp_path / "bad.yml", cfg)))
    assert "prompt_dropout_prob" in str(err.value) and "\n" not in str(err.value).strip()


def test_preservation_prompts_take_the_dropout_too(tmp_path: Path,
                                                   example_model_dir: Path) -> None:
    """Upstream encodes the diff_output_preservation prompts with prompt_dropout_prob as
    well: at p = 1 the class-word prompt is blanked, so the term is the blank-prompt
    preservation term and the two runs log the same losses (not so at p = 0)."""
    dataset = {"trigger_word": "sks"}
    dop = {"diff_output_preservation": True, "diff_output_preservation_class": "person"}
    bpp = {"blank_prompt_preservation": True}
    dropped = run(tmp_path, "dop", example_model_dir, {**dop, "prompt_dropout_prob": 1.0},
                  dataset)
    blank = run(tmp_path, "bpp", example_model_dir, {**bpp, "prompt_dropout_prob": 1.0},
                dataset)
    kept = run(tmp_path, "dop0", example_model_dir, dop, dataset)
    assert dropped == blank
    assert kept != run(tmp_path, "bpp0", example_model_dir, bpp, dataset)
