"""PRX LoRAs as peft adapter folders: diffusers has no LoRA loader for PRX, peft has one.

A folder holds `adapter_config.json` (the peft config the adapter was trained with) and
`adapter_model.safetensors` (peft's names: `base_model.model.` + the transformer's module
paths). Load it onto diffusers' transformer with

    transformer = PRXTransformer2DModel.from_pretrained(model, subfolder="transformer")
    PeftModel.from_pretrained(transformer, folder)  # injects the LoRA in place
    pipe = PRXPixelPipeline.from_pretrained(model, transformer=transformer)

The trainer writes `peft/` beside its LoRA files on every save (the latest one); any
saved LoRA file converts with

    python -m aitk.models.prx_pixel.peft_adapter my_lora_000000500.safetensors folder/

(LoRA files only; a LoKr run's `peft/` folder carries its LoKr config).
"""

from __future__ import annotations

import copy
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from aitk.adapters.keys import from_public_keys, module_of, split_alphas
from aitk.cli.boundary import boundary
from aitk.errors import PeftExportError, UsageError
from aitk_common.files import staged_dir

PEFT_PREFIX = "base_model.model."
WEIGHTS_NAME = "adapter_model.safetensors"
ADAPTER_NAME = "default"


def read_lora_file(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, float],
                                        dict[str, str]]:
    """An aitk LoRA file -> (internal-name weights, {module: alpha}, metadata)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            metadata = dict(fh.metadata() or {})
            public = {k: fh.get_tensor(k) for k in fh.keys()}
        weights, alphas = split_alphas(from_public_keys(public))
    except Exception as exc:  # noqa: BLE001 - safetensors raises several types
        raise PeftExportError(f"{path}: not a readable aitk LoRA file: {exc}") from None
    return weights, alphas, metadata


def write_adapter(folder: Path, config: Any, weights: dict[str, torch.Tensor],
                  source: str | None = None) -> Path:
    """Publish `folder` atomically: the peft config and the weights in peft's names."""
    from safetensors.torch import save_file

    meta = {"format": "pt"}
    if source:
        meta["aitk_lora_file"] = source
    with staged_dir(Path(folder)) as tmp:
        config.save_pretrained(str(tmp))
        save_file({PEFT_PREFIX + k: v.contiguous() for k, v in weights.items()},
                  str(tmp / WEIGHTS_NAME), metadata=meta)
    return Path(folder)


def write_network(network: Any, folder: Path, source: str) -> Path:
    """The trained adapter as just saved in `source` (a file beside `folder`): its peft
    config as trained, its weights as saved (the save dtype)."""
    config = copy.deepcopy(network.module.peft_config[ADAPTER_NAME])
    weights, _, _ = read_lora_file(Path(folder).parent / source)
    return write_adapter(folder, config, weights, source=source)


def lora_config_for(weights: dict[str, torch.Tensor], alphas: dict[str, float]) -> Any:
    """A LoraConfig for a LoRA file: the most common rank / alpha, patterns for others."""
    from peft import LoraConfig

    ranks = {module_of(k): int(v.shape[0]) for k, v in weights.items()
             if k.endswith(".lora_A.weight")}
    if not ranks or any(".lokr_" in k for k in weights):
        raise PeftExportError("only LoRA files convert (no lora_A weights found); a LoKr "
                              "run writes its peft/ folder while training")
    alpha_of = {m: float(alphas.get(m, r)) for m, r in ranks.items()}
    rank = Counter(ranks.values()).most_common(1)[0][0]
    alpha = Counter(alpha_of.values()).most_common(1)[0][0]
    return LoraConfig(r=rank, lora_alpha=alpha, target_modules=sorted(ranks), bias="none",
                      rank_pattern={m: r for m, r in ranks.items() if r != rank},
                      alpha_pattern={m: a for m, a in alpha_of.items() if a != alpha})


def convert_file(lora_file: Path, folder: Path) -> Path:
    weights, alphas, _ = read_lora_file(Path(lora_file))
    return write_adapter(folder, lora_config_for(weights, alphas), weights,
                         source=Path(lora_file).name)


@boundary()
def main(argv: list[str] | None = None) -> int:
    """`python -m aitk.models.prx_pixel.peft_adapter LORA FOLDER`: 0 done, 2 bad input
    (PeftExportError: not an aitk LoRA file)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        raise UsageError("usage: python -m aitk.models.prx_pixel.peft_adapter "
                         "LORA.safetensors FOLDER")
    out = convert_file(Path(args[0]), Path(args[1]))
    print(f"wrote the peft adapter folder {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
