"""The captioning model: a Qwen-VL folder or hub id loaded through transformers, and one
caption per picture.

Families (config.json's `model_type`) whose classes the installed transformers has:
Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen3-VL-MoE. They share the chat markup and the
vision tokens, so one input builder serves them all: transformers' PIL-backend image
processor read from the model's own preprocessor_config.json (patch 14 or 16, merge 2)
and aitk.models.qwen_image_edit.vision.VisionTextInputs for the pad-token expansion. The
families' `AutoProcessor` is not used: its video processor needs torchvision, which the
trainer does without (and one path everywhere is the path the tests run).

Every way loading fails (a folder that is not such a model, a hub id offline with no
local copy, a gated repo, another model type) is one ModelLoadError line (exit 2), found
from config.json before any weights are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from aitk.errors import DeviceUnavailable, ModelLoadError, UsageError

HUB_FIX = ("download it first (huggingface-cli download ID, or a run with HF_HUB_OFFLINE "
           "unset; a gated model needs HF_TOKEN and its license accepted; downloads are "
           "kept under HF_HOME), or pass --model a local model folder")


@dataclass(frozen=True)
class Family:
    name: str  # in messages
    model_class: str  # the transformers class (checked to exist in the installed one)
    system: str | None  # the system turn the family's chat template puts first


FAMILIES = {
    "qwen2_vl": Family("Qwen2-VL", "Qwen2VLForConditionalGeneration",
                       "You are a helpful assistant."),
    "qwen2_5_vl": Family("Qwen2.5-VL", "Qwen2_5_VLForConditionalGeneration",
                         "You are a helpful assistant."),
    "qwen3_vl": Family("Qwen3-VL", "Qwen3VLForConditionalGeneration", None),
    "qwen3_vl_moe": Family("Qwen3-VL-MoE", "Qwen3VLMoeForConditionalGeneration", None),
}


def supported_families() -> dict[str, Family]:
    """The FAMILIES whose model class the installed transformers has."""
    import transformers

    return {k: f for k, f in FAMILIES.items() if hasattr(transformers, f.model_class)}


def chat_text(family: Family, prompt: str) -> str:
    """One user turn holding the picture and the instruction, then the assistant's turn
    opened (the families' chat templates with add_generation_prompt)."""
    from aitk.models.qwen_image_edit.vision import VISION_TOKENS

    system = f"<|im_start|>system\n{family.system}<|im_end|>\n" if family.system else ""
    return (f"{system}<|im_start|>user\n{''.join(VISION_TOKENS)}{prompt}<|im_end|>\n"
            "<|im_start|>assistant\n")


def pick_device(requested: str | None) -> str:
    """The device to run on: `requested` (cpu, cuda, cuda:N, mps) when this machine has
    it; None: cuda when present, else cpu. DeviceUnavailable / UsageError otherwise."""
    import torch

    if requested is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        kind = torch.device(requested).type
    except (RuntimeError, ValueError):
        raise UsageError(f"--device {requested!r} is not a device (cpu, cuda, cuda:N, mps)"
                         ) from None
    if kind not in ("cpu", "cuda", "mps"):
        raise UsageError(f"--device {requested!r}: captioning runs on cpu, cuda or mps")
    if kind == "cuda" and not torch.cuda.is_available():
        raise DeviceUnavailable(f"--device {requested}: CUDA is not available here; "
                                "use --device cpu")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise DeviceUnavailable(f"--device {requested}: MPS is not available here; "
                                "use --device cpu")
    return requested


def _dtype(device: str) -> Any:
    import torch

    if device.startswith("cuda"):  # a 7B model: 15 GB in bf16, 30 GB in fp32
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float16 if device == "mps" else torch.float32


def _where(source: str) -> str:
    path = Path(source).expanduser()
    return f"model folder {path}" if path.is_dir() else f"model {source!r}"


def _load_error(source: str, exc: BaseException) -> ModelLoadError:
    detail = " ".join(str(exc).split())[:300] or type(exc).__name__
    path = Path(source).expanduser()
    fix = ("it must be a transformers model folder (config.json, weights, tokenizer, "
           "preprocessor_config.json)" if path.is_dir() else HUB_FIX)
    return ModelLoadError(f"cannot load the captioning {_where(source)}: {detail}; {fix}")


def resolve_family(source: str) -> Family:
    """The family of the model at `source` from its config.json alone (a hub id fetches
    only that file), or one ModelLoadError line."""
    from transformers import AutoConfig

    path = Path(source).expanduser()
    if not path.is_dir() and (path.exists() or source.startswith((".", "/", "~"))
                              or source.count("/") != 1):
        raise ModelLoadError(f"captioning model {source} is neither a model folder nor a "
                             "hub id owner/name")
    try:
        config = AutoConfig.from_pretrained(str(path) if path.is_dir() else source)
    except (OSError, ValueError, KeyError) as exc:
        raise _load_error(source, exc) from None
    families = supported_families()
    kind = getattr(config, "model_type", None)
    if kind not in families:
        known = ", ".join(f.name for f in families.values())
        raise ModelLoadError(f"captioning {_where(source)} is a {kind!r} model; captioning "
                             f"runs {known} models (e.g. Qwen/Qwen2.5-VL-7B-Instruct)")
    return families[kind]


class Captioner:
    """One model, loaded once; `caption(picture)` is the model's answer to the prompt."""

    def __init__(self, source: str, prompt: str, device: str,
                 max_new_tokens: int) -> None:
        import transformers
        from transformers import AutoImageProcessor, AutoTokenizer

        from aitk.models.qwen_image_edit.vision import VisionTextInputs

        self.family = resolve_family(source)
        where = str(Path(source).expanduser()) if Path(source).expanduser().is_dir() \
            else source
        try:
            tokenizer = AutoTokenizer.from_pretrained(where)
            image_processor = AutoImageProcessor.from_pretrained(where, backend="pil")
            model_class = getattr(transformers, self.family.model_class)
            # Straight onto the device: a 7B model never sits whole in RAM first.
            self.model = model_class.from_pretrained(where, dtype=_dtype(device),
                                                     device_map=device)
        except (OSError, ValueError, KeyError) as exc:
            raise _load_error(source, exc) from None
        self.model.eval()
        self.tokenizer, self.device, self.max_new_tokens = tokenizer, device, max_new_tokens
        self.inputs = VisionTextInputs(tokenizer, image_processor)
        self.text = chat_text(self.family, prompt)

    def caption(self, picture: Image.Image) -> str:
        import torch

        batch = self.inputs(text=self.text, images=[picture]).to(self.device)
        batch["pixel_values"] = batch["pixel_values"].to(self.model.dtype)
        with torch.inference_mode():
            out = self.model.generate(**batch, max_new_tokens=self.max_new_tokens,
                                      do_sample=False)
        answer = out[0, batch["input_ids"].shape[1]:]
        return self.tokenizer.decode(answer, skip_special_tokens=True)
