from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from aitk.cli.example_model import main as example_model_main
from aitk.errors import ModelLoadError
from aitk.models.example.model import ExampleModel
from aitk.models.registry import load_model
from tests.aitk.aitk_testing import REPO


def test_cli_writes_every_part_deterministically(tmp_path: Path, example_dir: Path) -> None:
    for part in ("transformer", "text_encoder", "tokenizer", "vae", "scheduler"):
        assert (example_dir / part).is_dir()
    again, other = tmp_path / "again", tmp_path / "other"
    assert example_model_main([str(again), "--seed", "0"]) == 0
    assert example_model_main([str(other), "--seed", "1"]) == 0
    for part in ("transformer", "text_encoder", "vae"):
        [weights] = (example_dir / part).glob("*.safetensors")
        assert weights.read_bytes() == (again / part / weights.name).read_bytes()
        assert weights.read_bytes() != (other / part / weights.name).read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp left


def test_cli_refuses_a_non_empty_folder(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    assert example_model_main([str(tmp_path)]) == 2
    assert "--force" in capsys.readouterr().err
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_loads_through_the_registry(model) -> None:
    assert isinstance(model, ExampleModel)
    assert model.transformer is model.model and model.unet is model.model
    assert model.get_bucket_divisibility() == 8  # vae factor 4 * patch 2
    assert not any(p.requires_grad for p in model.model.parameters())


def test_missing_folder_or_part_is_a_clear_load_error(tmp_path: Path, example_dir: Path,
                                                      make_cfg) -> None:
    with pytest.raises(ModelLoadError, match="example-model"):
        load_model(make_cfg(name_or_path=str(tmp_path / "nowhere")))
    partial = tmp_path / "partial"
    shutil.copytree(example_dir, partial)
    shutil.rmtree(partial / "vae")
    with pytest.raises(ModelLoadError, match="lacks vae/"):
        load_model(make_cfg(name_or_path=str(partial)))


def test_encode_decode_and_prompt_embeds(model) -> None:
    pixels = torch.rand(2, 3, 64, 96) * 2 - 1
    latents = model.encode_images(pixels)
    assert latents.shape == (2, 4, 16, 24)
    assert torch.equal(latents, model.encode_images(pixels))  # mean, not a sample
    decoded = model.decode_latents(latents)
    assert decoded.shape == (2, 3, 64, 96)
    embeds = model.get_prompt_embeds(["a cat", "a much longer prompt about a dog", ""])
    lengths = [t.shape[0] for t in embeds.text_embeds]
    assert lengths == [6, 33, 1]  # bytes + EOS, at the natural length
    assert all(t.dim() == 2 and t.shape[1] == 64 for t in embeds.text_embeds)


def test_padding_does_not_change_a_prediction(model, inputs) -> None:
    """An item's prediction is the same alone and beside a longer prompt (mask works)."""
    latents, timesteps, embeds = inputs
    with torch.no_grad():
        together = model.get_noise_prediction(latents, timesteps, embeds)
        alone = model.get_noise_prediction(latents[1:], timesteps[1:], embeds.select([1]))
    assert torch.allclose(together[1:], alone, atol=1e-5)


def test_timestep_convention_and_loss_target(model) -> None:
    clean, noise = torch.randn(2, 4, 8, 8), torch.randn(2, 4, 8, 8)
    mixed = model.add_noise(clean, noise, torch.tensor([0.0, 1000.0]))
    assert torch.allclose(mixed[0], clean[0]) and torch.allclose(mixed[1], noise[1])
    from aitk.data.batch import DataBatch

    target = model.get_loss_target(noise=noise, batch=DataBatch(captions=["a", "b"],
                                                                latents=clean))
    assert torch.equal(target, noise - clean)


def _loss_and_grads(model, inputs, checkpointing: bool, training: bool):
    latents, timesteps, embeds = inputs
    transformer = model.model
    transformer.requires_grad_(True)
    transformer.train(training)
    if checkpointing:
        transformer.enable_gradient_checkpointing()
    else:
        transformer.disable_gradient_checkpointing()
    calls = []
    hook = transformer.blocks[0].register_forward_pre_hook(lambda *a: calls.append(1))
    transformer.zero_grad()
    loss = F.mse_loss(model.get_noise_prediction(latents, timesteps, embeds), latents)
    loss.backward()
    hook.remove()
    grads = {n: p.grad.clone() for n, p in transformer.named_parameters()}
    return loss.detach(), grads, len(calls)


@pytest.mark.parametrize("training", [True, False])
def test_gradient_checkpointing_gives_the_same_loss_and_grads(model, inputs,
                                                              training: bool) -> None:
    loss_off, grads_off, calls_off = _loss_and_grads(model, inputs, False, training)
    loss_on, grads_on, calls_on = _loss_and_grads(model, inputs, True, training)
    assert calls_off == 1
    assert calls_on == 2  # the block re-ran in backward, also in eval mode
    assert torch.equal(loss_on, loss_off)
    for name, grad in grads_off.items():
        assert torch.allclose(grads_on[name], grad, atol=1e-6), name


def test_checkpointing_is_skipped_without_grad(model, inputs) -> None:
    latents, timesteps, embeds = inputs
    model.model.enable_gradient_checkpointing()
    calls = []
    model.model.blocks[0].register_forward_pre_hook(lambda *a: calls.append(1))
    with torch.no_grad():
        model.get_noise_prediction(latents, timesteps, embeds)
    assert calls == [1]


def test_identity_follows_weight_content(tmp_path: Path, example_dir: Path,
                                         make_cfg) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(example_dir, copy)
    a = load_model(make_cfg(name_or_path=str(example_dir)))
    b = load_model(make_cfg(name_or_path=str(copy)))
    assert a.identity() == a.identity() == b.identity()  # content, not the path
    qte = ExampleModel(make_cfg(name_or_path=str(copy), quantize_te=True))
    assert qte.identity() != b.identity()  # quantized TE -> different text embeds
    config = copy / "vae" / "config.json"
    config.write_text(config.read_text().replace('"scaling_factor": 1.0',
                                                 '"scaling_factor": 0.5'))
    assert b.identity() != a.identity()


def test_save_model_writes_a_loadable_folder(model, inputs, tmp_path: Path,
                                             make_cfg) -> None:
    latents, timesteps, embeds = inputs
    with torch.no_grad():
        for p in model.model.parameters():
            p.mul_(1.01)  # as a full fine-tune would change them
        expected = model.get_noise_prediction(latents, timesteps, embeds)
    out = tmp_path / "finetuned"
    model.save_model(str(out))
    again = load_model(make_cfg(name_or_path=str(out)))
    with torch.no_grad():
        assert torch.equal(again.get_noise_prediction(latents, timesteps, embeds), expected)
    assert [p.name for p in tmp_path.iterdir()] == ["finetuned"]


def test_bf16_base_with_float32_lora(example_dir: Path, make_cfg, inputs, net_cfg) -> None:
    from aitk.adapters import AdapterNetwork

    model = load_model(make_cfg(name_or_path=str(example_dir)), dtype=torch.bfloat16)
    net = AdapterNetwork.attach(model, net_cfg())
    latents, timesteps, _ = inputs
    embeds = model.get_prompt_embeds(["a red square on grey", "cat"])
    assert embeds.text_embeds[0].dtype == torch.bfloat16
    pred = model.get_noise_prediction(latents, timesteps, embeds)
    assert pred.dtype == torch.bfloat16
    F.mse_loss(pred.float(), latents).backward()
    assert all(p.dtype == torch.float32 and p.grad is not None
               for p in net.trainable_parameters())


def test_identity_digest_cache_is_reused_and_survives_damage(tmp_path: Path,
                                                             example_dir: Path) -> None:
    import json

    from aitk.models import identity

    cache = tmp_path / "digests.json"
    first = identity.weights_identity("example", str(example_dir), digest_cache=cache)
    stored = json.loads(cache.read_text())["digests"]
    assert len(stored) == sum(1 for p in example_dir.rglob("*") if p.is_file())
    # A digest found in the cache is used as is: poison one to prove it is read.
    identity._MEMORY.clear()
    key = next(iter(stored))
    cache.write_text(json.dumps({"version": 1, "digests": {**stored, key: "0" * 64}}))
    assert identity.weights_identity("example", str(example_dir),
                                     digest_cache=cache) != first
    identity._MEMORY.clear()
    cache.write_text("{ torn")
    assert identity.weights_identity("example", str(example_dir),
                                     digest_cache=cache) == first
    assert json.loads(cache.read_text())["digests"] == stored
    assert identity.weights_identity("example", "org/some-hub-id") != first


def test_encode_prompts_matches_one_at_a_time(model) -> None:
    prompts = ["a cat", "a much longer prompt about a dog", "", "a cat"]
    batched = model.encode_prompts(prompts, batch_size=2)
    assert list(batched) == ["a cat", "a much longer prompt about a dog", ""]
    for prompt, embeds in batched.items():
        alone = model.get_prompt_embeds([prompt])
        assert len(embeds) == 1
        assert torch.allclose(embeds.text_embeds[0], alone.text_embeds[0], atol=1e-5)


def test_sample_size_must_fit_the_divisibility(model) -> None:
    from aitk.models.base import GenerateImageConfig

    with pytest.raises(ValueError, match="multiple of 8"):
        model.generate_images([GenerateImageConfig("x", width=60, height=64)])


def test_pretraining_is_deterministic_and_fits_the_vae_scale(tmp_path: Path) -> None:
    """A few steps of the real pre-training, twice: same seed, same bytes."""
    from aitk.models.example.build import build_example_model
    from aitk.models.example.pretrain import PretrainPlan

    plan = PretrainPlan(images=8, image_size=16, vae_steps=2, vae_batch=2, vae_crop=16,
                        transformer_steps=2, transformer_batch=2)
    lines: list[str] = []
    a = build_example_model(tmp_path / "a", seed=5, pretrain=plan, report=lines.append)
    b = build_example_model(tmp_path / "b", seed=5, pretrain=plan, report=lines.append)
    for part in ("transformer", "vae"):
        [weights] = (a / part).glob("*.safetensors")
        assert weights.read_bytes() == (b / part / weights.name).read_bytes()
    import json

    scale = json.loads((a / "vae" / "config.json").read_text())["scaling_factor"]
    assert scale != 1.0  # set from the latents' spread
    assert any("pre-training the VAE" in line for line in lines)
    assert any("pre-training the transformer" in line for line in lines)


def test_shape_pictures_are_deterministic_flat_and_captioned_with_what_they_show() -> None:
    from aitk.models.example.shapes import COLOURS, dot_backgrounds, shape_images

    images, captions = shape_images(40, 16, seed=1)
    again, same = shape_images(40, 16, seed=1)
    assert images.shape == (40, 16, 16, 3) and (images == again).all() and captions == same
    rgb = {v: k for k, v in COLOURS.items()}
    on_background = 0
    for image, caption in zip(images, captions, strict=True):
        colours = {rgb[tuple(int(c) for c in px)] for px in image.reshape(-1, 3)}
        assert len(colours) == 2  # one shape on one plain background: no dots
        shape = next(s for s in ("circle", "square") if s in caption)
        background = rgb[tuple(int(c) for c in image[0, 0])]
        [fg] = colours - {background}
        article = "an" if fg[0] in "aeiou" else "a"
        if " background" in caption:
            on_background += 1
            bg_article = "an" if background[0] in "aeiou" else "a"
            assert caption == f"{article} {fg} {shape} on {bg_article} {background} background"
        else:
            assert caption == f"{article} {fg} {shape}"
    assert 10 < on_background < 30  # both forms, about half each
    # The VAE's copy: the same pictures, some with dots over the background only.
    dotted = dot_backgrounds(images, 0.6, seed=1)
    changed = [(d != i).any() for d, i in zip(dotted, images, strict=True)]
    assert 10 < sum(changed) < 40


def test_the_shipped_base_was_made_by_this_code() -> None:
    """aitk/models/example/base/pretrain.json records the recipe, sizes, seed and a
    digest of the generated data; a change to any of them needs the base rebuilt (the
    command is in the base's README)."""
    import json

    from aitk.models.example.build import RECIPE_FILE, pretrain_record
    from aitk.models.example.pretrain import PretrainPlan
    from aitk.models.example.sizes import PRETRAINED_SIZES

    base = REPO / "aitk" / "models" / "example" / "base"
    recorded = json.loads((base / RECIPE_FILE).read_text(encoding="utf-8"))
    assert {k: v for k, v in recorded.items() if k != "torch"} == pretrain_record(
        PretrainPlan(), PRETRAINED_SIZES, recorded["seed"])
    transformer = json.loads((base / "transformer" / "config.json").read_text())
    assert (transformer["hidden_size"], transformer["num_layers"]) == (
        PRETRAINED_SIZES.hidden_size, PRETRAINED_SIZES.num_layers)
