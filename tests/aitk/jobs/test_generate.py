"""`job: generate` on the example arch: images named by prompt and seed, the settings
in their metadata, the same seed the same image, a LoRA's weight (and `--m`) applied."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from aitk.config.loading import load_config
from aitk.errors import EXIT_OK
from aitk.run.job import run_job
from aitk.run.ownership import image_is_ours
from tests.aitk.aitk_testing import write_config
from tests.aitk.jobs.test_merge import _lora


def _generate(tmp_path: Path, model: Path, out: Path, prompts, loras=(), **generate
              ) -> int:
    settings = {"width": 32, "height": 32, "sample_steps": 3, "guidance_scale": 2.0,
                "seed": 11, "ext": ".png", "prompts": prompts, **generate}
    config = {"job": "generate", "config": {"name": "gen", "process": [{
        "type": "to_folder", "output_folder": str(out), "device": "cpu",
        "generate": settings, "model": {"name_or_path": str(model), "dtype": "bf16",
                                        "is_xl": False},
        "loras": list(loras)}]}}
    return run_job(load_config(str(write_config(tmp_path / "gen.yaml", config))))


def pixels(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.int16)


def test_images_are_named_by_prompt_and_seed_with_their_settings(tmp_path,
                                                                 example_model_dir):
    out = tmp_path / "gen"
    assert _generate(tmp_path, example_model_dir, out,
                     ["a red circle", "a blue square --n green --seed 5 --w 48"],
                     prompt_file=True) == EXIT_OK
    names = sorted(p.name for p in out.iterdir())
    assert names == ["0000_a-red-circle_11.png", "0000_a-red-circle_11.txt",
                     "0001_a-blue-square_5.png", "0001_a-blue-square_5.txt"]
    with Image.open(out / "0001_a-blue-square_5.png") as im:
        meta = json.loads(im.text["aitk"])
        assert im.size == (48, 32)
        assert im.text["parameters"].startswith("a blue square\nNegative prompt: green\n")
    assert meta["seed"] == 5 and meta["negative_prompt"] == "green"
    assert meta["arch"] == "example" and meta["steps"] == 3
    assert image_is_ours(out / "0001_a-blue-square_5.png")
    assert (out / "0000_a-red-circle_11.txt").read_text() == "a red circle\n"


def test_the_same_seed_gives_the_same_image(tmp_path, example_model_dir):
    first, second = tmp_path / "one", tmp_path / "two"
    prompts = ["a red circle --seed 3", "a red circle --seed 4"]
    assert _generate(tmp_path, example_model_dir, first, prompts) == EXIT_OK
    assert _generate(tmp_path, example_model_dir, second, prompts[::-1]) == EXIT_OK
    a3, a4 = pixels(first / "0000_a-red-circle_3.png"), pixels(first / "0001_a-red-circle_4.png")
    assert np.array_equal(a3, pixels(second / "0001_a-red-circle_3.png"))  # order-free
    assert np.array_equal(a4, pixels(second / "0000_a-red-circle_4.png"))
    assert not np.array_equal(a3, a4)


def test_seed_minus_one_records_the_seed_it_drew(tmp_path, example_model_dir):
    out = tmp_path / "rand"
    assert _generate(tmp_path, example_model_dir, out, ["a cat"], seed=-1,
                     num_repeats=2) == EXIT_OK
    files = sorted(out.glob("*.png"))
    assert len(files) == 2
    for path in files:
        with Image.open(path) as im:
            seed = json.loads(im.text["aitk"])["seed"]
        assert path.stem.endswith(f"_{seed}") and seed >= 0


@pytest.fixture(scope="module")
def strong_lora(tmp_path_factory, example_model_dir) -> Path:
    path = tmp_path_factory.mktemp("lora") / "strong.safetensors"
    return _lora(example_model_dir, path, 5, rank=4, alpha=4.0)


def test_a_lora_at_a_weight_and_the_m_flag(tmp_path, example_model_dir, strong_lora):
    plain, lora = tmp_path / "plain", tmp_path / "lora"
    prompts = ["a red circle", "a red circle --m 0"]
    assert _generate(tmp_path, example_model_dir, plain, prompts[:1]) == EXIT_OK
    assert _generate(tmp_path, example_model_dir, lora, prompts,
                     loras=[{"path": str(strong_lora), "weight": 1.0}]) == EXIT_OK
    without = pixels(plain / "0000_a-red-circle_11.png")
    assert not np.array_equal(pixels(lora / "0000_a-red-circle_11.png"), without)
    assert np.array_equal(pixels(lora / "0001_a-red-circle_11.png"), without)  # --m 0
    with Image.open(lora / "0000_a-red-circle_11.png") as im:
        assert json.loads(im.text["aitk"])["loras"] == [{"path": str(strong_lora),
                                                         "weight": 1.0}]


def test_a_users_image_at_a_name_is_left_alone(tmp_path, example_model_dir):
    out = tmp_path / "gen"
    out.mkdir()
    theirs = out / "0000_a-red-circle_11.png"
    Image.new("RGB", (4, 4)).save(theirs)
    before = theirs.read_bytes()
    assert _generate(tmp_path, example_model_dir, out, ["a red circle"]) == EXIT_OK
    assert theirs.read_bytes() == before


def _settings(**keys):
    from aitk.config.generate import GenerateSettings

    return GenerateSettings(prompts=["a cat"], **keys)


def test_random_prompts_join_random_picks_and_follow_the_seed():
    from aitk.jobs.generate import prompt_list

    listed = ["red", "green", "blue", "gold"]
    g = _settings(random_prompts=True, max_random_per_prompt=3, max_images=40, seed=7)
    made = prompt_list(listed, g)
    assert len(made) == 40
    parts = [m.split(", ") for m in made]
    assert {len(p) for p in parts} == {1, 2, 3}  # 1..max_random_per_prompt each
    assert {w for p in parts for w in p} == set(listed)
    assert prompt_list(listed, g) == made  # the same seed, the same prompts
    assert prompt_list(listed, _settings(random_prompts=True, max_random_per_prompt=3,
                                         max_images=40, seed=8)) != made
    assert all(", " not in m for m in prompt_list(listed, _settings(random_prompts=True,
                                                                    seed=1)))


def test_shuffle_reorders_the_listed_prompts_by_seed_and_plain_keeps_them():
    from aitk.jobs.generate import prompt_list

    listed = [f"p{i}" for i in range(12)]
    assert prompt_list(listed, _settings(seed=3)) == listed
    once = prompt_list(listed, _settings(shuffle=True, seed=3))
    assert sorted(once) == sorted(listed) and once != listed
    assert prompt_list(listed, _settings(shuffle=True, seed=3)) == once


def test_random_prompts_refuse_prompts_with_flags():
    from aitk.errors import PromptFlagError
    from aitk.jobs.generate import prompt_list

    with pytest.raises(PromptFlagError, match="their flags would clash"):
        prompt_list(["a cat --seed 3", "a dog"], _settings(random_prompts=True, seed=1))


def test_a_random_prompts_job_makes_the_same_images_by_seed(tmp_path, example_model_dir):
    keys = {"random_prompts": True, "max_random_per_prompt": 2, "max_images": 3,
            "shuffle": True, "num_repeats": 2}
    first, second = tmp_path / "one", tmp_path / "two"
    prompts = ["a red circle", "a blue square", "a green dot"]
    assert _generate(tmp_path, example_model_dir, first, prompts, **keys) == EXIT_OK
    assert _generate(tmp_path, example_model_dir, second, prompts, **keys) == EXIT_OK
    names = sorted(p.name for p in first.iterdir())
    assert len(names) == 6  # max_images prompts, num_repeats times
    assert names == sorted(p.name for p in second.iterdir())
    for name in names:
        assert np.array_equal(pixels(first / name), pixels(second / name))
    with Image.open(first / names[0]) as im:
        prompt = json.loads(im.text["aitk"])["prompt"]
    assert set(prompt.split(", ")) <= set(prompts)
