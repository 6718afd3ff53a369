"""`python -m aitk caption DATASET_DIR [--model ID_OR_DIR] [--prompt TEXT]
[--trigger WORD] [--overwrite] [--limit N] [--device cpu|cuda|mps]`

Captions the images and videos (their first frame) of a dataset folder that have no
caption yet (all of them with --overwrite) with a vision-language model (aitk.caption).
Progress is a `captioned N/M: NAME` line per file, and the status file when
$AITK_STATUS_FILE is set. Ctrl+C stops after the current file.

Exit codes: 0 done (also: nothing to caption); 2 bad arguments, a folder that is not a
dataset (missing, not writable, no pictures) or a model that cannot be loaded (not a
Qwen-VL model, a hub id offline with no local copy, CUDA asked for but absent); 130
stopped; 1 anything else (its message).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aitk.caption.settings import DEFAULT_MODEL, DEFAULT_PROMPT, MAX_NEW_TOKENS, CaptionSettings
from aitk.cli.boundary import boundary
from aitk.errors import UsageError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m aitk caption",
        description="Caption a dataset folder's images and videos (their first frame) "
                    "with a vision-language model; only files without a caption unless "
                    "--overwrite.")
    parser.add_argument("dataset", type=Path, metavar="DATASET_DIR")
    parser.add_argument("--model", default=DEFAULT_MODEL, metavar="ID_OR_DIR",
                        help=f"a Qwen2-VL/2.5-VL/3-VL hub id or model folder (default "
                             f"{DEFAULT_MODEL})")
    parser.add_argument("--prompt", default=DEFAULT_PROMPT, metavar="TEXT",
                        help="the instruction the model gets with each picture")
    parser.add_argument("--trigger", metavar="WORD",
                        help="put WORD in front of every new caption (\"WORD, caption\")")
    parser.add_argument("--overwrite", action="store_true",
                        help="caption every file again, replacing existing captions")
    parser.add_argument("--limit", type=int, metavar="N",
                        help="caption at most N files (try a prompt on a few first)")
    parser.add_argument("--device", metavar="cpu|cuda|mps",
                        help="where the model runs (default: cuda when present, else cpu)")
    parser.add_argument("--caption-ext", default="txt", metavar="EXT",
                        help="caption file extension (default txt)")
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS, metavar="N",
                        help=f"longest caption in tokens (default {MAX_NEW_TOKENS})")
    return parser


def settings_from(args: argparse.Namespace) -> CaptionSettings:
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit {args.limit}: give a number of files, 1 or more")
    if args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens {args.max_new_tokens}: 1 or more")
    if not args.prompt.strip():
        raise UsageError("--prompt is empty")
    ext = args.caption_ext.lstrip(".")
    if not ext or "/" in ext or "\\" in ext:
        raise UsageError(f"--caption-ext {args.caption_ext!r} is not a file extension")
    return CaptionSettings(dataset=args.dataset, model=args.model, prompt=args.prompt,
                           trigger=args.trigger or None, overwrite=args.overwrite,
                           limit=args.limit, device=args.device, caption_ext=ext,
                           max_new_tokens=args.max_new_tokens)


@boundary(prefix="aitk caption: ")
def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # argparse: 2 on bad usage, 0 on --help
        return int(exc.code or 0)
    from aitk.caption import job

    outcome = job.run(settings_from(args))
    if outcome.total:
        verb = "stopped" if outcome.stopped else "done"
        print(f"{verb}: captioned {outcome.captioned} of {outcome.total}"
              + (f", {outcome.skipped} skipped" if outcome.skipped else "")
              + (f"; {outcome.kept} kept their caption" if outcome.kept else ""), flush=True)
    return outcome.exit_code


if __name__ == "__main__":
    sys.exit(main())
