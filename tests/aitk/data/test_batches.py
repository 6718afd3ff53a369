"""The batch source over several datasets (aitk.data.batches): per-dataset batch sizes,
regularization datasets on every other step with their weight and no trigger, a
prior_reg batch trained toward the base model, and the whole position resumable."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from aitk.data.batch import DataBatch
from aitk.data.batches import BatchSource
from aitk.data.dataset import DatasetError
from aitk.models.prompt_embeds import AdvancedPromptEmbeds
from aitk.run.assembly import Reporter, dataset_rules, scan_datasets
from tests.aitk.aitk_testing import write_image
from tests.aitk.test_config import example_raw, parse, proc


def embeds(captions: list[str]) -> AdvancedPromptEmbeds:
    return AdvancedPromptEmbeds(text_embeds=[torch.zeros(2, 4) for _ in captions])


def folder(root: Path, name: str, count: int, caption: str) -> Path:
    for k in range(count):
        write_image(root / name / f"{k}.png", (32, 32), (10 * k, 80, 160), caption)
    return root / name


def process(tmp_path: Path, datasets: list[dict], **train):
    raw = example_raw()
    proc(raw)["datasets"] = [{"resolution": [32], **d} for d in datasets]
    proc(raw)["train"].update(train)
    proc(raw)["trigger_word"] = "p1xel"
    return parse(raw).job.config.process[0]


def source(p, accumulation: int = 1) -> BatchSource:
    items = scan_datasets(p, 8, Reporter(io.StringIO()))
    return BatchSource(items, p.train.batch_size, p.train.seed, None,
                       lambda x: x[:, :1].clone(), embeds, None, dataset_rules(p, True),
                       accumulation)


def test_each_dataset_batches_at_its_own_size_and_alone(tmp_path: Path):
    p = process(tmp_path, [
        {"folder_path": str(folder(tmp_path, "a", 6, "a thing")), "batch_size": 3},
        {"folder_path": str(folder(tmp_path, "b", 4, "b thing"))}], batch_size=2)
    src = source(p)
    seen = []
    for _ in range(12):  # several epochs
        batch = src.next()
        names = {Path(f).parent.name for f in batch.file_paths}
        assert len(names) == 1  # a batch never mixes datasets
        seen.append((names.pop(), len(batch)))
    assert {size for name, size in seen if name == "a"} == {3}
    assert {size for name, size in seen if name == "b"} == {2}  # train.batch_size


def test_reg_batches_on_even_steps_with_their_weight_and_no_trigger(tmp_path: Path):
    p = process(tmp_path, [
        {"folder_path": str(folder(tmp_path, "subject", 4, "a thing"))},
        {"folder_path": str(folder(tmp_path, "reg", 4, "a thing")), "is_reg": True,
         "loss_multiplier": 0.5}], reg_weight=0.3, gradient_accumulation=2,
        batch_size=1)
    src = source(p, accumulation=2)
    kinds = []
    for _ in range(8):  # 4 optimizer steps of 2 micro-batches
        batch = src.next()
        reg = Path(batch.file_paths[0]).parent.name == "reg"
        kinds.append(reg)
        if reg:
            assert batch.captions == ["a thing"]  # upstream adds no trigger to reg images
            assert batch.loss_weights == [pytest.approx(0.15)]  # loss_multiplier * reg_weight
        else:
            assert batch.captions == ["p1xel, a thing"] and batch.loss_weights is None
    assert kinds == [True, True, False, False, True, True, False, False]


def test_batch_weights_multiply_the_schedules():
    batch = DataBatch(captions=["a", "b"], loss_weights=[0.5, 0.5])
    assert torch.equal(batch.weigh(None), torch.tensor([0.5, 0.5]))
    assert torch.equal(batch.weigh(torch.tensor([2.0, 4.0])), torch.tensor([1.0, 2.0]))
    assert DataBatch(captions=["a"]).weigh(None) is None


def test_the_position_resumes_exactly_with_reg_and_caption_changes(tmp_path: Path):
    p = process(tmp_path, [
        {"folder_path": str(folder(tmp_path, "a", 5, "p1xel, red, round, small, shiny")),
         "shuffle_tokens": True, "keep_tokens": 1, "token_dropout_rate": 0.3,
         "random_triggers": ["ohwx", "sks"], "caption_dropout_rate": 0.2},
        {"folder_path": str(folder(tmp_path, "r", 3, "thing")), "is_reg": True}],
        batch_size=1)
    whole = source(p)
    expected = [(whole.next().file_paths, whole.next().captions) for _ in range(10)]
    first = source(p)
    got = [(first.next().file_paths, first.next().captions) for _ in range(4)]
    state = first.state_dict()
    resumed = source(p)
    resumed.load_state_dict(state)
    got += [(resumed.next().file_paths, resumed.next().captions) for _ in range(6)]
    assert got == expected
    assert len({c for _, caps in expected for c in caps}) > 3  # captions really vary


def test_only_reg_datasets_is_an_error(tmp_path: Path):
    p = process(tmp_path, [{"folder_path": str(folder(tmp_path, "r", 2, "x")),
                            "is_reg": True}])
    with pytest.raises(DatasetError, match="at least one must hold the images"):
        source(p)


def test_random_triggers_from_a_file(tmp_path: Path):
    (tmp_path / "triggers.txt").write_text("ohwx\n\nsks\n")
    p = process(tmp_path, [{"folder_path": str(folder(tmp_path, "a", 1, "thing")),
                            "random_triggers": str(tmp_path / "triggers.txt")}])
    [rules] = dataset_rules(p, True)
    assert rules.captions.random_triggers == ("ohwx", "sks")
    assert dataset_rules(p, False)[0].captions.active is False  # cached text embeddings


def test_prior_reg_batches_target_the_base_models_prediction(tmp_path: Path,
                                                            example_model_dir: Path):
    from aitk.config.loading import load_config
    from aitk.diffusion.noise import diffusion_loss
    from aitk.run.assembly import create_network, load_model
    from aitk.run.objectives import Objective
    from aitk.run.train import compute_loss, step_generator
    from tests.aitk.aitk_testing import job_config, write_config

    cfg = job_config("prior", tmp_path / "out", example_model_dir)
    loaded = load_config(str(write_config(tmp_path / "prior.yml", cfg)))
    p = loaded.job.config.process[0]
    model = load_model(p, torch.device("cpu"))
    model.configure_training(p.train)
    network = create_network(model, p)
    torch.manual_seed(0)
    for param in network.trainable_parameters():  # a LoRA that changes the output
        param.data.normal_(0, 0.2)
    latents = torch.randn(1, *model.encode_images(torch.zeros(1, 3, 32, 32)).shape[1:])
    prompt = model.get_prompt_embeds(["a red circle"])
    batch = DataBatch(captions=["x"], latents=latents, prompt_embeds=prompt,
                      prior_reg=True)
    loss = compute_loss(model, batch, step_generator(1, 2, 3), Objective(adapter=network))

    schedule = model.training_schedule
    gen = step_generator(1, 2, 3)
    noise = schedule.sample_noise(latents, gen)
    t = schedule.sample_timesteps(latents, gen)
    noisy = model.condition_noisy_latents(model.add_noise(latents, noise, t), batch)
    with torch.no_grad():
        pred = model.get_noise_prediction(noisy, t, prompt, batch=batch)
        network.disable()
        base = model.get_noise_prediction(noisy, t, prompt, batch=batch)
        network.enable()
    assert not torch.allclose(pred, base)
    assert torch.allclose(loss, diffusion_loss(pred, base, schedule.loss_weights(t)))
    assert loss.requires_grad  # the adapter still learns from it


def wide_folder(root: Path, name: str, count: int) -> Path:
    """Images with a left-right and top-bottom gradient, so every crop differs."""
    import numpy as np
    from PIL import Image

    (root / name).mkdir(parents=True, exist_ok=True)
    x = np.linspace(0, 255, 64)[None, :, None]
    y = np.linspace(0, 255, 32)[:, None, None]
    for k in range(count):
        arr = np.concatenate([np.broadcast_to(x, (32, 64, 1)), np.broadcast_to(y, (32, 64, 1)),
                              np.full((32, 64, 1), 40.0 * k)], axis=2)
        Image.fromarray(arr.astype("uint8")).save(root / name / f"{k}.png")
        (root / name / f"{k}.txt").write_text("a thing")
    return root / name


@pytest.mark.parametrize("key", ["random_crop", "random_scale"])
def test_random_crops_are_drawn_per_draw_from_the_seed_and_resume_exactly(
        tmp_path: Path, key: str):
    p = process(tmp_path, [{"folder_path": str(wide_folder(tmp_path, "w", 3)), key: True}],
                batch_size=1)
    whole = source(p)
    expected = [whole.next() for _ in range(9)]
    crops = [(b.file_paths[0], b.crops[0]) for b in expected]
    assert len({c for _, c in crops}) > 3  # not the centre every time
    first = source(p)
    got = [first.next() for _ in range(4)]
    resumed = source(p)
    resumed.load_state_dict(first.state_dict())
    got += [resumed.next() for _ in range(5)]
    for a, b in zip(got, expected, strict=True):
        assert a.crops == b.crops and a.file_paths == b.file_paths
        assert torch.equal(a.latents, b.latents)  # the same pixels, cropped alike
        assert a.crop_coords_top_left == [(b.crops[0].top, b.crops[0].left)]
    other = process(tmp_path, [{"folder_path": str(tmp_path / "w"), key: True}],
                    batch_size=1, seed=p.train.seed + 1)
    assert [b.crops for b in (source(other).next() for _ in range(9))] != \
        [b.crops for b in expected]  # another seed, other crops


def test_without_random_crop_every_draw_is_the_centre(tmp_path: Path):
    p = process(tmp_path, [{"folder_path": str(wide_folder(tmp_path, "w", 2))}],
                batch_size=1)
    batch = source(p).next()
    assert batch.crops is None
    assert batch.crop_coords_top_left == [(2, 0)]  # 64x32 -> 40x20, bucket 40x16


def _weighted_setup(tmp_path: Path, example_model_dir: Path):
    from aitk.config.loading import load_config
    from aitk.run.assembly import create_network, load_model
    from tests.aitk.aitk_testing import job_config, write_config

    cfg = job_config("weighted", tmp_path / "out", example_model_dir)
    p = load_config(str(write_config(tmp_path / "w.yml", cfg))).job.config.process[0]
    model = load_model(p, torch.device("cpu"))
    model.configure_training(p.train)
    network = create_network(model, p)
    torch.manual_seed(0)
    for param in network.trainable_parameters():  # a LoRA that changes the output
        param.data.normal_(0, 0.2)
    return model, network


def test_network_weight_scales_the_lora_for_its_batches(tmp_path: Path,
                                                        example_model_dir: Path):
    from aitk.run.objectives import Objective, network_weight
    from aitk.run.train import compute_loss, step_generator

    model, network = _weighted_setup(tmp_path, example_model_dir)
    layer = network._layers()[0]
    x = torch.randn(2, layer.base_layer.in_features)
    with torch.no_grad():
        full, base = layer(x), layer.base_layer(x)
        with network_weight(network, 0.0):
            assert torch.allclose(layer(x), base)  # weight 0: the base model's output
        with network_weight(network, 0.5):
            assert torch.allclose(layer(x) - base, (full - base) / 2, atol=1e-6)
    assert network.multiplier == 1.0 and torch.allclose(layer(x), full)  # restored

    latents = torch.randn(1, *model.encode_images(torch.zeros(1, 3, 32, 32)).shape[1:])
    prompt = model.get_prompt_embeds(["a red circle"])

    def loss(weight: float, objective: Objective) -> torch.Tensor:
        batch = DataBatch(captions=["x"], latents=latents, prompt_embeds=prompt,
                          network_weight=weight)
        return compute_loss(model, batch, step_generator(1, 2, 3), objective).detach()

    plain = loss(1.0, Objective())
    with network.disabled():
        alone = loss(1.0, Objective())
    network.set_multiplier(0.5)
    half = loss(1.0, Objective())
    network.set_multiplier(1.0)
    assert not torch.allclose(plain, alone)
    assert torch.equal(loss(0.0, Objective(network=network)), alone)
    assert torch.equal(loss(0.5, Objective(network=network)), half)
    assert torch.equal(loss(1.0, Objective(network=network)), plain)


def test_each_batch_carries_its_datasets_network_weight(tmp_path: Path):
    p = process(tmp_path, [
        {"folder_path": str(folder(tmp_path, "a", 2, "a thing")), "network_weight": 0.5},
        {"folder_path": str(folder(tmp_path, "b", 2, "b thing"))}], batch_size=1)
    src = source(p)
    weights = {Path(b.file_paths[0]).parent.name: b.network_weight
               for b in (src.next() for _ in range(8))}
    assert weights == {"a": 0.5, "b": 1.0}


def test_network_weight_without_an_adapter_is_a_config_error(tmp_path: Path):
    from aitk.errors import ConfigError

    raw = example_raw()
    proc(raw)["datasets"] = [{"folder_path": str(tmp_path), "network_weight": 0.5}]
    del proc(raw)["network"]
    with pytest.raises(ConfigError, match="full fine-tune has no adapter"):
        parse(raw)
