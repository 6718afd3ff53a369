"""Each built-in arch's description (aitk/models/<arch>/arch.py) says what its model
does: checked on the arch's tiny random model (built once per session), through the
real loading code, and on its real configs where the tiny model is smaller in the way
that matters. A description that disagrees with its model fails here."""

from __future__ import annotations

import ast
import typing
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file

from aitk.adapters import AdapterNetwork
from aitk.data.batch import DataBatch
from aitk.errors import AdapterError
from aitk.models import base, catalog
from aitk.models.base import BaseModel
from aitk.models.description import ArchDescription, ArchKwargs, KeyStyle, ModuleNames, PartRole
from aitk.models.registry import discover, load_model
from tests.aitk.models.arch_checks import model_cfg, train_cfg
from tests.aitk.models.conftest import NetCfg
from tests.aitk.models.real_configs import REAL_PARTS, build

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ARCHS = [d.name for d in catalog.descriptions()]
EXAMPLES = Path(__file__).resolve().parents[3] / "config" / "examples"
MODELS_DIR = Path(__file__).resolve().parents[3] / "aitk" / "models"
# Tiny models smaller in what sets the size multiple: checked on the real configs.
TINY_SHRINKS_SIZE = {"sdxl": "the tiny VAE and UNet have 2 levels each (real: 4 and 3)",
                     **{arch: "the tiny VAE and UNet have 2 levels each (real: 4 and 4)"
                        for arch in ("sd1", "sd2")}}
# As the tiny example configs load them: references at the training size, not ~1 MP.
TINY_KWARGS = {"qwen_image_edit_plus": {"match_target_res": True}}


def cls_of(arch: str) -> type[BaseModel]:
    return discover(include_repo_extensions=False).get(arch)


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory):
    """arch -> the folder of its tiny random model, each built once per session."""
    built: dict[str, Path] = {}

    def folder(arch: str) -> Path:
        if arch not in built:
            target = tmp_path_factory.mktemp(f"tiny_{arch}") / "model"
            cls_of(arch).build_tiny(target)
            built[arch] = target
        return built[arch]

    return folder


@pytest.fixture
def loaded(tiny_folder):
    def load(arch: str, **cfg: Any) -> BaseModel:
        cfg.setdefault("model_kwargs", dict(TINY_KWARGS.get(arch, {})))
        model = load_model(model_cfg(arch, tiny_folder(arch), **cfg))
        model.configure_training(train_cfg())
        return model

    return load


# ---- the description on its own ----------------------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_description_is_complete_and_names_its_class(arch: str) -> None:
    desc = catalog.description(arch)
    assert desc.summary and len(desc.summary) <= 100
    for field in ("size_multiple", "capabilities", "schedule", "lora", "defaults"):
        assert getattr(desc, field) is not None, field
    assert desc.variants and all(v.repos and v.parts for v in desc.variants)
    for variant in desc.variants:
        roles = [p.role for p in variant.parts]
        assert roles.count(PartRole.DENOISER) == max(1, len(desc.capabilities.experts))
        assert all(p.float32 == (p.role is PartRole.VAE) for p in variant.parts)
    cls = cls_of(arch)
    assert cls.arch == arch and cls.describe() is desc
    assert desc.schedule.noise_schedulers[0] == desc.schedule.kind


@pytest.mark.parametrize("arch", ARCHS)
def test_quantizes_while_loading_is_what_its_loader_does(arch: str) -> None:
    """The forecast trusts `quantizes_while_loading`: it holds exactly when the arch's
    model class (or a base it inherits from) loads its denoiser through
    BaseModel.load_denoiser, the block-by-block quantizing loader."""
    import importlib
    import inspect

    desc = catalog.description(arch)
    module, _, name = desc.model_class.partition(":")
    cls = getattr(importlib.import_module(module), name)
    ours = [k for k in cls.__mro__ if k.__module__.startswith("aitk.models.")
            and k is not BaseModel]
    uses = any("self.load_denoiser(" in inspect.getsource(k) for k in ours)
    assert desc.quantizes_while_loading == uses


@pytest.mark.parametrize("arch", ARCHS)
def test_examples_exist_run_this_arch_and_give_its_defaults(arch: str) -> None:
    """The shipped examples name this arch (or a sibling of its folder, whose example
    says to set `model.arch`); the web UI's defaults are the 24 GB example's values."""
    desc = catalog.description(arch)
    module = desc.model_class.rsplit(".", 1)[0]
    siblings = {d.name for d in catalog.descriptions()
                if d.model_class.rsplit(".", 1)[0] == module}
    for name in filter(None, (desc.examples.tiny, desc.examples.full)):
        config = yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))
        model = config["config"]["process"][0]["model"]
        assert model["arch"] in siblings | {arch}
        assert desc.check_model_kwargs(model.get("model_kwargs")) == []
    full = yaml.safe_load((EXAMPLES / (desc.examples.full or desc.examples.tiny))
                          .read_text(encoding="utf-8"))["config"]["process"][0]
    defaults = desc.defaults
    assert list(defaults.resolution) == full["datasets"][0]["resolution"]
    assert defaults.steps == full["train"]["steps"]
    assert (defaults.rank, defaults.alpha) == (full["network"]["linear"],
                                               full["network"]["linear_alpha"])
    assert defaults.lr == full["train"]["lr"]
    assert defaults.timestep_type == full["train"].get("timestep_type")
    assert defaults.quantize == bool(full["model"].get("quantize", False))


# ---- the description against the tiny model --------------------------------------------
@pytest.mark.parametrize("arch", ARCHS)
def test_size_multiple_is_the_models_bucket_divisibility(arch: str, loaded) -> None:
    desc = catalog.description(arch)
    tiny = loaded(arch).get_bucket_divisibility()
    if arch in TINY_SHRINKS_SIZE:
        assert tiny < desc.size_multiple, TINY_SHRINKS_SIZE[arch]
    else:
        assert tiny == desc.size_multiple


@pytest.mark.parametrize("arch", sorted(TINY_SHRINKS_SIZE))
def test_size_multiple_on_the_real_configs(arch: str) -> None:
    """The arch's own get_bucket_divisibility() over its real parts on the meta device."""
    desc = catalog.description(arch)
    [variant, *_] = desc.variants
    model = cls_of(arch).__new__(cls_of(arch))
    for part in variant.parts:
        if part.role in (PartRole.DENOISER, PartRole.VAE):
            module = build(REAL_PARTS[(variant.repos[0], part.subfolder)])
            setattr(model, "model" if part.role is PartRole.DENOISER else "vae", module)
    assert model.get_bucket_divisibility() == desc.size_multiple


@pytest.mark.parametrize("arch", ARCHS)
def test_video_and_its_frame_rule(arch: str, loaded) -> None:
    """A video arch's VAE packs clips of step*k + 1 frames into k + 1 latent frames and
    gives them back; an image arch is not video."""
    desc = catalog.description(arch)
    model = loaded(arch)
    frames = desc.capabilities.video
    assert model.is_video == (frames is not None)
    if frames is None:
        return
    side = desc.size_multiple
    for k in range(3):
        clip = torch.rand(1, 3, frames.step * k + 1, side, side) * 2 - 1
        latents = model.encode_images(clip)
        assert latents.shape[2] == k + 1
        assert model.decode_latents(latents).shape[2] == frames.step * k + 1
    assert frames.allows(frames.step + 1) and not frames.allows(frames.step)


@pytest.mark.parametrize("arch", ARCHS)
def test_sound_is_said_where_the_model_takes_it(arch: str, loaded) -> None:
    """`capabilities.audio` exactly where the model says which PCM it trains on (and
    so where `do_audio` is acted on), and only for a video arch."""
    desc = catalog.description(arch)
    model = loaded(arch)
    fmt = model.audio_format()
    assert desc.capabilities.audio == (fmt is not None)
    if fmt is not None:
        rate, channels = fmt
        assert model.is_video and rate > 0 and channels in (1, 2)


@pytest.mark.parametrize("arch", ARCHS)
def test_control_images_first_frame_and_experts(arch: str, loaded) -> None:
    """What `condition_noisy_latents` makes of a batch with n control images: an edit
    arch uses up to `control_images` of them and no more, an image-to-video arch adds
    the clip's first frame with or without them, any other arch passes the noise on."""
    caps = catalog.description(arch).capabilities
    model = loaded(arch)
    side = 2 * catalog.size_multiple(arch)
    gen = torch.Generator().manual_seed(0)
    pixels = torch.rand(1, 3, side, side, generator=gen) * 2 - 1
    if caps.video:
        pixels = pixels.unsqueeze(2)
    latents = model.encode_images(pixels)
    noisy = torch.randn(latents.shape, generator=gen)
    controls = [torch.rand(1, 3, side, side, generator=gen) for _ in range(4)]

    def conditioned(n: int) -> torch.Tensor:
        batch = DataBatch(captions=["a"], tensor=pixels, latents=latents,
                          control_tensor=controls[0] if n else None,
                          control_tensor_list=controls[:n] or None)
        with torch.no_grad():
            return model.condition_noisy_latents(noisy, batch)

    def same(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.shape == b.shape and torch.equal(a, b)

    plain = conditioned(0)
    assert same(plain, noisy) != caps.first_frame
    for n in range(1, 5):
        assert same(conditioned(n), conditioned(n - 1)) == (n > caps.control_images), n
    assert type(model).has_multiple_control_images == (caps.control_images > 1)
    assert len(getattr(model, "transformers", [model.model])) == max(1, len(caps.experts))
    for expert in caps.experts:
        assert isinstance(getattr(model.model, expert), torch.nn.Module)


@pytest.mark.parametrize("arch", ARCHS)
def test_schedule_kind_is_the_training_schedules(arch: str, loaded) -> None:
    """Flow matching mixes x_t = (1 - t/1000) clean + t/1000 noise; DDPM does not."""
    kind = catalog.description(arch).schedule.kind
    schedule = loaded(arch).training_schedule
    gen = torch.Generator().manual_seed(0)
    clean, noise = torch.randn(2, 4, 8, 8, generator=gen), torch.randn(2, 4, 8, 8, generator=gen)
    mixed = schedule.add_noise(clean, noise, torch.tensor([500.0, 500.0]))
    is_flow = torch.allclose(mixed, 0.5 * clean + 0.5 * noise, atol=1e-5)
    assert is_flow == (kind == "flowmatch")


def _module_paths(model: BaseModel) -> set[str]:
    return {name for name, _ in model.get_model_to_train().named_modules()}


@pytest.mark.parametrize("arch", ARCHS)
def test_saved_lora_has_the_layout_the_description_says(arch: str, loaded,
                                                        tmp_path: Path) -> None:
    lora = catalog.description(arch).lora
    model = loaded(arch)
    network = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=8))
    network.save_file(tmp_path / "lora.safetensors")
    assert model.lora_file_suffixes() == lora.files
    keys = lora.writes
    suffixes = ((".lora_A.weight", ".lora_B.weight") if keys.style is KeyStyle.PEFT
                else (".lora_down.weight", ".lora_up.weight")) + (".alpha",)
    paths = _module_paths(model)
    kohya_paths = {p.replace(".", "_") for p in paths}
    for suffix in lora.files:
        weights = load_file(tmp_path / f"lora{suffix}.safetensors")
        assert any(k.endswith(".alpha") for k in weights) == lora.alpha_keys
        modules = set()
        for key in weights:
            assert key.startswith(keys.prefix) and key.endswith(suffixes), key
            modules.add(next(key[len(keys.prefix):-len(s)] for s in suffixes
                             if key.endswith(s)))
        known = kohya_paths if keys.style is KeyStyle.KOHYA else paths
        if keys.names is ModuleNames.DIFFUSERS:
            assert modules <= known, sorted(modules - known)[:3]
        else:  # the authors' names: not the diffusers model's own
            assert modules - known, "these are diffusers names"
        if keys.style is KeyStyle.KOHYA:
            assert not any("." in m for m in modules)


@pytest.mark.parametrize("arch", ARCHS)
def test_text_encoder_lora_is_what_the_description_says(arch: str, loaded,
                                                        tmp_path: Path) -> None:
    """An arch whose description names text-encoder keys trains one adapter per text
    encoder part and writes each under its layout's prefix; any other refuses
    `train_text_encoder` when the adapter attaches."""
    lora = catalog.description(arch).lora
    model = loaded(arch)
    cfg = NetCfg(linear=4, linear_alpha=8, train_text_encoder=True)
    assert catalog.trains_text_encoders(arch) == bool(lora.text_encoders)
    if not lora.text_encoders:
        with pytest.raises(AdapterError, match="trains its denoiser only"):
            AdapterNetwork.attach(model, cfg)
        return
    assert len(model.text_encoder_parts()) == len(lora.text_encoders)
    AdapterNetwork.attach(model, cfg).save_file(tmp_path / "lora.safetensors")
    keys = set(load_file(tmp_path / "lora.safetensors"))
    prefixes = [lora.writes.prefix, *(k.prefix for k in lora.text_encoders)]
    for prefix in prefixes:
        assert any(k.startswith(prefix) for k in keys), prefix
    assert all(any(k.startswith(p) for p in prefixes) for k in keys)


@pytest.mark.parametrize("arch", [a for a in ARCHS
                                  if catalog.description(a).lora.files == ("",)])
def test_lora_read_layouts_load_back(arch: str, loaded, tmp_path: Path) -> None:
    """A file in each read layout with diffusers' names (`prefix` + module path) loads
    back to the same adapter."""
    from safetensors.torch import save_file

    lora = catalog.description(arch).lora
    model = loaded(arch)
    network = AdapterNetwork.attach(model, NetCfg(linear=4, linear_alpha=4))
    with torch.no_grad():
        for i, p in enumerate(network.trainable_parameters()):
            p.copy_(torch.full_like(p, 0.01 * (i + 1)))
    internal = {k: v.clone() for k, v in network.state_dict().items()}
    for keys in lora.reads:
        if keys.names is not ModuleNames.DIFFUSERS or keys.style is not KeyStyle.PEFT:
            continue  # the authors' names: the arch's own tests cover those tables
        path = tmp_path / f"{keys.prefix.strip('.')}.safetensors"
        save_file({keys.prefix + k: v for k, v in internal.items()}, str(path))
        with torch.no_grad():
            for p in network.trainable_parameters():
                p.zero_()
        network.load_file(path)
        for k, v in network.state_dict().items():
            assert torch.equal(v, internal[k]), (keys.prefix, k)


def _knobs_that_matter(kwargs: type[ArchKwargs]) -> set[str]:
    """Declared knobs, less those pinned to one value (accepted from upstream's forms,
    nothing to read)."""
    pinned = {name for name, f in kwargs.model_fields.items()
              if typing.get_origin(f.annotation) is typing.Literal
              and len(typing.get_args(f.annotation)) == 1}
    return set(kwargs.model_fields) - pinned


class Watched:
    """A model's typed model_kwargs that remembers which knobs were read."""

    def __init__(self, kwargs: ArchKwargs, seen: set[str]) -> None:
        self._kwargs, self._seen = kwargs, seen

    def __getattr__(self, name: str) -> Any:
        self._seen.add(name)
        return getattr(self._kwargs, name)


# What reads a knob beyond loading, the schedule and a prompt's embedding.
MORE_READS = {"qwen_image_edit_plus": lambda m: m.control_size((32, 32), (32, 32)),
              "flux2": lambda m: m.reference_size((32, 32), (32, 32))}


@pytest.mark.parametrize("arch", ARCHS)
def test_model_kwargs_are_the_knobs_the_arch_reads(arch: str, tiny_folder,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    desc = catalog.description(arch)
    seen: set[str] = set()

    def watched(description: ArchDescription, raw: Any) -> Watched:
        return Watched(description.parse_model_kwargs(raw), seen)

    monkeypatch.setattr(base, "parse_model_kwargs", watched)
    model = load_model(model_cfg(arch, tiny_folder(arch),
                                 model_kwargs=dict(TINY_KWARGS.get(arch, {}))))
    model.configure_training(train_cfg())
    assert model.text_embedding_space_version
    control = [torch.rand(1, 3, 32, 32)] if desc.capabilities.control_images else None
    model.get_prompt_embeds(["a red square"], control_images=control)
    MORE_READS.get(arch, lambda m: None)(model)
    assert seen == _knobs_that_matter(desc.model_kwargs)


def test_models_read_model_kwargs_only_through_the_typed_knobs() -> None:
    """No arch module reads `model_config.model_kwargs` (or a `model_kwargs` key) itself:
    BaseModel.model_kwargs is the one reader, so every knob is typed and watched."""
    offenders = []
    for path in sorted(MODELS_DIR.rglob("*.py")):
        if path.name in ("base.py", "description.py", "catalog.py", "arch.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            reads_attr = (isinstance(node, ast.Attribute) and node.attr == "model_kwargs"
                          and not (isinstance(node.value, ast.Name) and node.value.id == "self"))
            reads_key = isinstance(node, ast.Constant) and node.value == "model_kwargs"
            if reads_attr or reads_key:
                offenders.append(f"{path.relative_to(MODELS_DIR)}:{node.lineno}")
    assert offenders == []
