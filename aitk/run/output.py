"""The output folder `training_folder/NAME/`: one trainer at a time, only aitk's own
files touched.

    NAME.safetensors                 final LoRA (public keys + metadata)
    NAME_000000250.safetensors       every `save_every` steps (and on Ctrl+C); the newest
                                     `max_step_saves_to_keep` are kept
    checkpoints/step_000000250/      full training state for resume (aitk.run.checkpoint)
    samples/000000250_0.jpg          previews (aitk.run.sampling)
    config.yaml                      the config as run ([name] replaced, ${VAR} kept)
    loss_log.jsonl                   one JSON object per step: step, loss, lr, time
    .aitk.lock, .aitk.lock.json      one trainer per output folder; who holds it
    status.json                      phase, step, totals, exit code (aitk.run.status)

The trainer only removes or overwrites files it recognises as its own: checkpoints by
their manifest (aitk.run.checkpoint), LoRA files by their `software` metadata,
config.yaml by its first line, previews by their EXIF mark (aitk.run.sampling), the
loss log by its lines (aitk.run.metrics), all read through aitk.run.ownership. Anything
else in the output folder is left as it is.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from aitk.config.loading import LoadedConfig, dump_yaml
from aitk.errors import OutputFolderError
from aitk.run.ownership import CONFIG_HEADER, lora_header_is_ours, lora_is_ours
from aitk_common import records
from aitk_common.files import atomic_write_text, temp_target


@contextmanager
def output_lock(out_dir: Path, config: Path) -> Iterator[None]:
    """Hold `out_dir/.aitk.lock` for the whole run: two trainers writing one folder would
    mix their checkpoints into one LoRA. The OS drops the lock when its holder dies (even
    by kill -9), so a stale lock never blocks a resume; `.aitk.lock.json` names the
    holder (aitk_common.records)."""
    from filelock import FileLock, Timeout

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(out_dir / records.LOCK_NAME))
        lock.acquire(timeout=0)
    except Timeout:
        holder = records.read_lock_holder(out_dir)
        raise OutputFolderError(
            f"output folder {out_dir} is in use by another trainer "
            f"({holder.describe() if holder else 'holder unknown'}); wait for it to "
            "finish (or stop it), or give this run another name") from None
    except OSError as exc:
        raise OutputFolderError(f"cannot use the output folder {out_dir}: "
                                f"{exc.strerror or exc}") from None
    try:
        records.write_lock_holder(out_dir, records.LockHolder(os.getpid(), str(config),
                                                              records.utc_now()))
        yield
    finally:
        records.remove_lock_holder(out_dir)
        lock.release()


def foreign_loras(out_dir: Path, name: str, suffixes: Sequence[str] = ("",),
                  folders: bool = False) -> list[Path]:
    """LoRA-named files in `out_dir` that aitk did not write (it would overwrite them).
    `suffixes`: the model's per-file suffixes (`_high_noise`, ... for multi-expert).
    With `folders`, also folders at those names without aitk's model marker (a full
    fine-tune's diffusers outputs: `NAME/`, `NAME_000000250/`)."""
    from aitk.run.ownership import model_folder_is_ours

    if not out_dir.is_dir():
        return []
    finals = {f"{name}{s}.safetensors" for s in suffixes}
    found = [p for p in out_dir.iterdir() if (p.name in finals
                                              or step_lora_step(p, name, suffixes) is not None)
             and not lora_is_ours(p)]
    if folders:
        found += [p for p in out_dir.iterdir() if p.is_dir() and (
            p.name == name or step_lora_step(p.with_name(p.name + ".safetensors"), name)
            is not None) and not model_folder_is_ours(p)]
    return found


def refuse_foreign_loras(out_dir: Path, name: str, suffixes: Sequence[str] = ("",),
                         folders: bool = False) -> None:
    """Stop (exit 2) before anything is trained when a LoRA file (with `folders`, a
    model folder) this run would write is someone else's."""
    foreign = foreign_loras(out_dir, name, suffixes, folders)
    if foreign:
        raise OutputFolderError(f"{', '.join(str(p) for p in foreign)} "
                                f"{'was' if len(foreign) == 1 else 'were'} not written by "
                                "aitk and would be overwritten; move them away or give this "
                                "run another name")


def claim(out_dir: Path, name: str, suffixes: Sequence[str],
          say: Callable[[str], None], folders: bool = False) -> None:
    """Rank 0, once the model (and so every LoRA file name) is known: refuse LoRA files
    (with `folders`, a full fine-tune's model folders) aitk did not write, and remove
    the temp files of a LoRA write that was killed."""
    refuse_foreign_loras(out_dir, name, suffixes, folders)
    remove_interrupted_lora_writes(out_dir, name, suffixes, say)


def interrupted_lora_writes(out_dir: Path, name: str,
                            suffixes: Sequence[str] = ("",)) -> list[Path]:
    """Temp files of LoRA writes that were killed (kill -9, a crash, power loss: an
    atomic write cleans up after anything else): named like aitk_common.files' temp
    file of one of this run's LoRA names, with a header that names aitk."""
    if not out_dir.is_dir():
        return []
    finals = {f"{name}{s}.safetensors" for s in suffixes}
    found = []
    for path in out_dir.iterdir():
        target = temp_target(path)
        if target is None or not (target in finals or step_lora_step(
                out_dir / target, name, suffixes) is not None):
            continue
        if lora_header_is_ours(path):
            found.append(path)
    return sorted(found)


def remove_interrupted_lora_writes(out_dir: Path, name: str, suffixes: Sequence[str],
                                   say: Callable[[str], None]) -> None:
    leftovers = interrupted_lora_writes(out_dir, name, suffixes)
    for path in leftovers:
        path.unlink(missing_ok=True)
    if leftovers:
        say(f"removed {len(leftovers)} temp file{'s' * (len(leftovers) > 1)} of an "
            f"interrupted save in {out_dir}")


def write_run_config(path: Path, loaded: LoadedConfig, say: Callable[[str], None]) -> None:
    """config.yaml: ours (first line CONFIG_HEADER, or exactly this config as an earlier
    aitk wrote it) is rewritten; anyone else's is left alone."""
    if path.exists() or path.is_symlink():
        try:
            with open(path, "rb") as fh:
                head = fh.read(1 << 20).decode("utf-8")
            import yaml

            ours = head.startswith(CONFIG_HEADER) or yaml.safe_load(head) == loaded.recorded
        except (OSError, ValueError, yaml.YAMLError):
            ours = False
        if not ours or path.is_symlink():
            say(f"{path} was not written by aitk; left as it is (the config as run is "
                "in the LoRA file's metadata)")
            return
    atomic_write_text(path, CONFIG_HEADER + dump_yaml(loaded.recorded))


def step_lora_name(name: str, step: int) -> str:
    return f"{name}_{step:09d}.safetensors"


def step_lora_step(path: Path, name: str, suffixes: Sequence[str] = ("",)) -> int | None:
    # Not glob(): a name like "lora[v2]" would read as a pattern and match nothing.
    prefix = f"{name}_"
    if path.suffix != ".safetensors" or not path.stem.startswith(prefix):
        return None
    rest = path.stem[len(prefix):]
    for suffix in suffixes:
        digits = rest[:len(rest) - len(suffix)] if suffix else rest
        if rest.endswith(suffix) and len(digits) == 9 and digits.isdigit():
            return int(digits)
    return None
