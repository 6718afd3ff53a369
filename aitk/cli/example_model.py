"""`python -m aitk example-model DIR [--seed N] [--pretrain] [--force]`

Writes a tiny `example` model folder (transformer/ text_encoder/ tokenizer/ vae/
scheduler/); nothing is downloaded. The weights are random-initialised (previews are
noise); `--pretrain` then pre-trains the VAE and transformer on generated pictures of
coloured shapes (aitk.models.example.pretrain; about half an hour of one CPU core): how
the example job's base, aitk/models/example/base/, was made. The same seed gives the
same weights.

Exit codes: 0 written; 2 bad arguments or DIR exists and is not empty (without --force).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aitk.cli.boundary import boundary
from aitk.errors import UsageError


@boundary()
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m aitk example-model",
        description="Write a tiny `example` model folder (transformer/ text_encoder/ "
                    "tokenizer/ vae/ scheduler/); no download.")
    parser.add_argument("dir", type=Path, help="folder to create")
    parser.add_argument("--seed", type=int, default=0, help="weights seed (default 0)")
    parser.add_argument("--pretrain", action="store_true",
                        help="pre-train on generated coloured shapes (about half an hour "
                             "of one CPU core; how aitk/models/example/base was made)")
    parser.add_argument("--force", action="store_true", help="replace an existing folder")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits 2 on bad input and 0 on --help
        return int(exc.code or 0)

    from transformers.utils import logging as hf_logging

    from aitk.models.example.build import build_example_model
    from aitk.models.example.pretrain import PretrainPlan

    hf_logging.disable_progress_bar()  # a 1-shard save of a 1 MB model needs no bar

    try:
        out = build_example_model(args.dir, seed=args.seed, overwrite=args.force,
                                  pretrain=PretrainPlan() if args.pretrain else None)
    except FileExistsError as exc:
        raise UsageError(str(exc), hint="pass --force to replace it") from None
    except OSError as exc:
        raise UsageError(f"cannot write {args.dir}: {exc}") from None
    kind = "pre-trained" if args.pretrain else "random"
    print(f"wrote example model to {out} ({kind}, seed {args.seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
