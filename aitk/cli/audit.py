"""`python -m aitk audit config|dataset|adapter ... [--json]`

Each prints a short summary (findings grouped by kind, a few of each), or with --json one
JSON document on stdout: {audit, subject, ok, counts, summary, findings: [{level, path,
message, fix, code}]}. Exit codes: 0 no error finding (warnings allowed); 1 an error
finding; 2 bad arguments, or a path that does not exist or is not the right kind of file.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from aitk.cli.boundary import boundary
from aitk.errors import UsageError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m aitk audit",
                                     description="Audit a job config, a dataset folder or "
                                                 "an adapter file.")
    sub = parser.add_subparsers(dest="what", required=True)
    cfg = sub.add_parser("config", help="the preflight plus conflicting settings")
    cfg.add_argument("config", help="config file, or a name under config/")
    ds = sub.add_parser("dataset", help="images, captions, sizes, buckets, duplicates")
    ds.add_argument("folder", type=Path)
    ds.add_argument("--control", type=Path, action="append", default=[], metavar="DIR",
                    help="a control-image folder to pair with (repeatable)")
    ds.add_argument("--resolution", type=int, action="append", metavar="N",
                    help="training resolution (repeatable; default 512)")
    ds.add_argument("--arch", help="model arch: sets the bucket divisibility")
    ds.add_argument("--caption-ext", default="txt")
    ds.add_argument("--trigger", help="trigger word to look for in captions")
    ds.add_argument("--videos", action="store_true",
                    help="count video files as training files (num_frames above 1)")
    ad = sub.add_parser("adapter", help="a LoRA/LoKr .safetensors file")
    ad.add_argument("file", type=Path)
    for p in (cfg, ds, ad):
        p.add_argument("--json", action="store_true", help="print one JSON document")
    return parser


@boundary(prefix="aitk audit: ")
def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:  # argparse: 2 on bad usage, 0 on --help
        return int(exc.code or 0)
    if args.what == "config":
        from aitk.audit.config import audit_config

        report = audit_config(args.config)
    elif args.what == "dataset":
        from aitk.audit.dataset import DatasetOptions, audit_dataset

        if not args.folder.is_dir():
            raise UsageError(f"{args.folder} is not a folder")
        if args.arch is not None:
            from aitk.models import catalog

            if args.arch not in catalog.builtin_archs():
                raise UsageError(f"--arch {args.arch!r} is not a built-in arch; known: "
                                 f"{', '.join(sorted(catalog.builtin_archs()))}")
        report = audit_dataset(DatasetOptions(
            args.folder, controls=args.control, resolutions=args.resolution or [512],
            arch=args.arch, caption_ext=args.caption_ext, trigger=args.trigger,
            videos=args.videos))
    else:
        from aitk.audit.adapter import audit_adapter

        if not args.file.is_file():
            raise UsageError(f"{args.file} is not a file")
        report = audit_adapter(args.file)  # AdapterFileError: not safetensors (exit 2)
    if args.json:
        report.write_json(sys.stdout)
    else:
        report.write_text(sys.stdout)
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
