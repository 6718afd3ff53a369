"""`low_vram` lives once, on BaseModel, read from `model_config.low_vram`: every built-in
arch reports it, parks idle parts on the CPU through `idle_device`, and lets a part visit
the device only inside `on_device` (aitk.models.offload's one mechanism)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from aitk.models import catalog
from aitk.models.base import BaseModel
from aitk.models.registry import get_model_class


def model_cfg(arch: str = "example", **overrides: object) -> SimpleNamespace:
    base = dict(arch=arch, name_or_path="unused", quantize=False, quantize_te=False,
                qtype="qfloat8", qtype_te="qfloat8", model_kwargs={})
    return SimpleNamespace(**{**base, **overrides})


class Spy(torch.nn.Module):
    """Records where it is sent instead of moving."""

    def __init__(self) -> None:
        super().__init__()
        self.moves: list[str] = []

    def to(self, *args: object, **kwargs: object) -> Spy:
        self.moves.append(str(args[0]))
        return self


@pytest.mark.parametrize("arch", sorted(catalog.builtin_archs()))
def test_every_arch_reads_low_vram_from_the_config_through_base_model(arch: str) -> None:
    cls = get_model_class(arch)
    owners = [k.__name__ for k in cls.__mro__ if "low_vram" in vars(k)]
    assert owners == ["BaseModel"], f"{arch} defines low_vram itself: {owners}"
    for flag in (False, True):
        # Before load_model: the flag is the config's, not something loading sets.
        model = cls(model_cfg(arch, low_vram=flag), device=torch.device("cuda", 1))
        assert model.low_vram is flag
        assert model.idle_device == (torch.device("cpu") if flag else torch.device("cuda", 1))


def test_a_config_without_low_vram_means_off() -> None:
    model = BaseModel(model_cfg(), device="cpu")
    assert model.low_vram is False and model.idle_device == torch.device("cpu")


def test_setting_low_vram_writes_the_config_it_is_read_from() -> None:
    cfg = model_cfg(low_vram=False)
    model = BaseModel(cfg)
    model.low_vram = True
    assert cfg.low_vram is True and model.low_vram is True


def test_on_device_visits_only_with_low_vram_and_always_goes_back() -> None:
    model = BaseModel(model_cfg(low_vram=True), device=torch.device("cuda", 1))
    text, vae = Spy(), Spy()
    with model.on_device(text, None, vae):  # None: a part the model does not have
        assert text.moves == ["cuda:1"] and vae.moves == ["cuda:1"]
    assert text.moves == ["cuda:1", "cpu"] and vae.moves == ["cuda:1", "cpu"]

    with pytest.raises(RuntimeError), model.on_device(text):
        raise RuntimeError("the part failed while on the device")
    assert text.moves[-1] == "cpu"

    model.low_vram = False
    idle = Spy()
    with model.on_device(idle):
        pass
    assert idle.moves == []


def test_place_loaded_puts_working_parts_on_the_device_and_idle_ones_where_they_wait() -> None:
    for flag, idle_at in ((False, "cuda:1"), (True, "cpu")):
        model = BaseModel(model_cfg(low_vram=flag), device=torch.device("cuda", 1))
        denoiser, text = Spy(), Spy()
        model.place_loaded([denoiser], idle=[text])
        assert denoiser.moves == ["cuda:1"] and text.moves == [idle_at]
