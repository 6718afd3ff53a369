"""`job: extract`: a LoRA (or LoCon) from the difference of a fine-tuned model and its
base, written in the arch's LoRA layout (aitk.jobs.extract).

    job: extract
    config:
      name: my_extract
      base_model: /models/base            # diffusers folders (or the denoiser's own
      extract_model: /models/finetuned    # folder, or one safetensors file of it)
      output_folder: output/extracted
      dtype: fp16                         # saved dtype (each process may override)
      device: cpu
      arch: flux                          # aitk: unset = read from the folder
      process:
        - {type: locon, filename: "[name]_64_32.safetensors", mode: fixed, linear: 64, conv: 32}
        - {type: lora, output_path: /abs/path/x.safetensors, mode: quantile, linear: 0.5}

Modes (upstream's, from LyCORIS): `fixed` keeps `linear` (`conv`) singular values;
`threshold` those above the value; `ratio` those above value x the largest; `quantile`
the fewest whose sum reaches value x the total (a fixed share of the difference). `lora`
extracts Linear layers only, `locon` Conv layers too (`conv`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from aitk.config.schema import JobBase, JobName, SaveDtype, _Strict

MODES = ("fixed", "threshold", "ratio", "quantile")
# Upstream's defaults per (type, mode): (linear, conv).
DEFAULTS: dict[tuple[str, str], tuple[float, float]] = {
    ("locon", "fixed"): (64, 32), ("lora", "fixed"): (4, 0),
    **{(kind, "threshold"): (0.0, 0.0) for kind in ("locon", "lora")},
    ("locon", "ratio"): (0.5, 0.5), ("lora", "ratio"): (0.5, 0.0),
    ("locon", "quantile"): (0.5, 0.5), ("lora", "quantile"): (0.5, 0.0),
}


class ExtractProcess(_Strict):
    type: Literal["locon", "lora"]
    filename: str | None = None  # in output_folder
    output_path: str | None = None  # wins over filename
    dtype: SaveDtype | None = None  # None: the job's
    mode: Literal[MODES] = "fixed"  # type: ignore[valid-type]
    linear: float | None = None  # None: upstream's default for the type and mode
    conv: float | None = None

    @model_validator(mode="after")
    def _params_fit_the_mode(self) -> ExtractProcess:
        lin, conv = DEFAULTS[(self.type, self.mode)]
        self.linear = lin if self.linear is None else self.linear
        self.conv = conv if self.conv is None else self.conv
        if self.type == "lora" and self.conv:
            raise ValueError("conv: a `lora` extraction takes Linear layers only; use "
                             "type: locon for Conv layers too")
        for key in ("linear", "conv"):
            value = getattr(self, key)
            if self.mode == "fixed" and (value != int(value) or value < 0):
                raise ValueError(f"{key}: mode fixed takes a rank (a whole number >= 0), "
                                 f"got {value}")
            if self.mode in ("ratio", "quantile") and not 0 <= value <= 1:
                raise ValueError(f"{key}: mode {self.mode} takes a share between 0 and 1, "
                                 f"got {value}")
            if value < 0:
                raise ValueError(f"{key}: must be >= 0, got {value}")
        if self.mode == "fixed" and self.linear == 0 and not self.conv:
            raise ValueError("linear: rank 0 extracts nothing")
        return self

    def target(self, output_folder: str, index: int, count: int) -> Path:
        """The file this process writes: `output_path`, else output_folder/`filename`,
        else a name from the mode (upstream's rule; `_N` when several processes)."""
        if self.output_path:
            return Path(self.output_path).expanduser()
        if self.filename:
            return Path(output_folder).expanduser() / self.filename
        params = f"{self.linear:g}_{self.conv:g}" if self.type == "locon" else f"{self.linear:g}"
        suffix = f"_{index}" if count > 1 else ""
        return Path(output_folder).expanduser() / f"{self.type}_{self.mode}_{params}{suffix}" \
            ".safetensors"


class ExtractSection(_Strict):
    name: JobName
    base_model: str
    extract_model: str
    output_folder: str
    dtype: SaveDtype = "fp16"
    device: str = "cpu"
    arch: str | None = None  # derived from is_v2/is_xl/arch, or read from the folder
    process: Annotated[list[ExtractProcess], Field(min_length=1)]


class ExtractJob(JobBase):
    job: Literal["extract"]
    config: ExtractSection

    def output_dir(self) -> Path:
        return Path(self.config.output_folder).expanduser()

    def targets(self) -> list[Path]:
        procs = self.config.process
        return [p.target(self.config.output_folder, i, len(procs)) for i, p in
                enumerate(procs)]


SECTIONS: dict[Any, str] = {ExtractJob: "job", ExtractSection: "extract",
                            ExtractProcess: "extract.process"}
