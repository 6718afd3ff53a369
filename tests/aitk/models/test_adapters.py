from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from aitk.adapters import AdapterNetwork
from aitk.adapters.keys import from_public_keys, to_public_keys
from aitk.errors import AdapterError, AdapterKeyError


def predict(model, inputs) -> torch.Tensor:
    latents, timesteps, embeds = inputs
    with torch.no_grad():
        return model.get_noise_prediction(latents, timesteps, embeds)


def randomize(net: AdapterNetwork, seed: int = 0) -> None:
    """Give every adapter weight (LoRA B included) non-zero values, as training would."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.trainable_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


@pytest.mark.parametrize("kind", ["lora", "lokr"])
def test_fresh_adapter_is_identity_until_trained(model, inputs, net_cfg, kind: str) -> None:
    base = predict(model, inputs)
    net = AdapterNetwork.attach(model, net_cfg(type=kind))
    assert net.trainable_parameters()
    assert all(p.requires_grad and p.dtype == torch.float32
               for p in net.trainable_parameters())
    assert torch.equal(predict(model, inputs), base)
    randomize(net)
    assert not torch.allclose(predict(model, inputs), base, atol=1e-4)


def test_targets_are_block_linears_filtered_by_patterns(model, net_cfg) -> None:
    net = AdapterNetwork.attach(model, net_cfg(network_kwargs={
        "only_if_contains": ["attn"], "ignore_if_contains": ["cross_attn", "to_out"]}))
    assert net.target_modules == [f"blocks.{b}.attn.to_{x}" for b in (0, 1)
                                  for x in ("q", "k", "v")]


def test_no_matching_layer_is_an_error(model, net_cfg) -> None:
    with pytest.raises(AdapterError, match="no Linear layers"):
        AdapterNetwork.attach(model, net_cfg(network_kwargs={"only_if_contains": ["nope"]}))
    with pytest.raises(AdapterError, match="'loha' is not supported"):
        AdapterNetwork.attach(model, net_cfg(type="loha"))
    AdapterNetwork.attach(model, net_cfg())
    with pytest.raises(AdapterError, match="already has an adapter"):
        AdapterNetwork.attach(model, net_cfg())


def test_dora_is_refused_where_the_arch_has_no_place_for_its_magnitude(
        model, net_cfg, monkeypatch) -> None:
    monkeypatch.setattr(type(model), "supports_dora", False)
    with pytest.raises(AdapterError, match="no place for DoRA's per-layer magnitude"):
        AdapterNetwork.attach(model, net_cfg(type="dora"))


def test_conv_on_an_arch_without_conv_blocks_trains_no_convs(model, net_cfg) -> None:
    """Upstream's form writes `conv` into every job; a transformer arch has none."""
    cfg = net_cfg()
    cfg.conv, cfg.conv_alpha = 8, 8.0
    net = AdapterNetwork.attach(model, cfg)
    module = model.get_model_to_train()
    assert net.target_modules and net.alphas == {}
    assert all(isinstance(module.get_submodule(t).get_base_layer(), torch.nn.Linear)
               for t in net.target_modules)


@pytest.mark.parametrize("kind", ["lora", "lokr"])
def test_saved_file_reloads_into_a_fresh_model_exactly(make_model, inputs, net_cfg,
                                                       tmp_path: Path, kind: str) -> None:
    model = make_model()
    net = AdapterNetwork.attach(model, net_cfg(type=kind, linear_alpha=8.0))
    randomize(net)
    trained = predict(model, inputs)
    path = tmp_path / "lora.safetensors"
    net.save_file(path, {"step": "7", "base_arch": "example"})

    with safe_open(str(path), framework="pt") as fh:
        keys, meta = list(fh.keys()), fh.metadata()
        alpha = fh.get_tensor("diffusion_model.blocks.0.attn.to_q.alpha")
    assert keys and all(k.startswith("diffusion_model.blocks.") for k in keys)
    suffix = ".lora_A.weight" if kind == "lora" else ".lokr_w1"
    assert f"diffusion_model.blocks.0.attn.to_q{suffix}" in keys
    assert float(alpha) == 8.0
    assert meta["step"] == "7" and meta["network_type"] == kind
    assert meta["network_rank"] == "4"

    fresh = make_model()
    other = AdapterNetwork.attach(fresh, net_cfg(type=kind, linear_alpha=8.0))
    assert other.load_file(path)["step"] == "7"
    assert torch.equal(predict(fresh, inputs), trained)


def test_file_alpha_is_honoured(make_model, inputs, net_cfg, tmp_path: Path) -> None:
    model = make_model()
    net = AdapterNetwork.attach(model, net_cfg(linear_alpha=8.0))
    randomize(net)
    trained = predict(model, inputs)
    net.save_file(tmp_path / "a8.safetensors")
    fresh = make_model()
    AdapterNetwork.attach(fresh, net_cfg(linear_alpha=2.0)).load_file(
        tmp_path / "a8.safetensors")
    assert torch.allclose(predict(fresh, inputs), trained, atol=1e-5)


def test_a_file_of_another_rank_does_not_fit(make_model, net_cfg, tmp_path: Path) -> None:
    net = AdapterNetwork.attach(make_model(), net_cfg(linear=4))
    net.save_file(tmp_path / "r4.safetensors")
    other = AdapterNetwork.attach(make_model(), net_cfg(linear=8))
    with pytest.raises(AdapterError, match="shapes differ"):
        other.load_file(tmp_path / "r4.safetensors")
    narrow = AdapterNetwork.attach(make_model(), net_cfg(
        network_kwargs={"only_if_contains": ["mlp"]}))
    with pytest.raises(AdapterError, match="unexpected"):
        narrow.load_file(tmp_path / "r4.safetensors")
    (tmp_path / "torn.safetensors").write_bytes(b"\x10\x00garbage")
    with pytest.raises(AdapterError, match="unreadable"):
        net.load_file(tmp_path / "torn.safetensors")


def test_state_dict_round_trip_uses_internal_names(make_model, inputs, net_cfg) -> None:
    model = make_model()
    net = AdapterNetwork.attach(model, net_cfg())
    randomize(net)
    sd = net.state_dict()
    assert "blocks.0.attn.to_q.lora_B.weight" in sd
    trained = predict(model, inputs)
    fresh = make_model()
    AdapterNetwork.attach(fresh, net_cfg()).load_state_dict(sd)
    assert torch.equal(predict(fresh, inputs), trained)


def test_multiplier_and_disable(model, inputs, net_cfg) -> None:
    base = predict(model, inputs)
    net = AdapterNetwork.attach(model, net_cfg())
    randomize(net)
    full = predict(model, inputs)
    net.set_multiplier(0.0)
    assert torch.allclose(predict(model, inputs), base, atol=1e-6)
    net.set_multiplier(1.0)
    net.disable()
    assert torch.equal(predict(model, inputs), base)
    net.enable()
    assert torch.equal(predict(model, inputs), full)
    assert all(p.requires_grad for p in net.trainable_parameters())


def test_public_key_conversion() -> None:
    t = torch.zeros(1)
    internal = {"blocks.0.attn.to_q.lora_A.weight": t, "blocks.0.attn.to_q.alpha": t}
    assert from_public_keys(to_public_keys(internal)) == internal
    assert set(from_public_keys({"transformer.b.lora_down.weight": t,
                                 "diffusion_model.b.lora_up.weight": t})) == {
        "b.lora_A.weight", "b.lora_B.weight"}
    with pytest.raises(AdapterKeyError, match="lacks the 'diffusion_model.' prefix"):
        from_public_keys({"lora_unet_blocks_0.lora_down.weight": t})
