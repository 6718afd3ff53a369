"""`python -m aitk run|models|example-model|audit|caption ...`

Standard library only up to the environment check (aitk.cli.venv_check): a Python without
the trainer's packages gets one line saying how to run it (exit 2).
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    verbs = {
        "run": "aitk.cli.run",  # same as `python run.py`
        "models": "aitk.cli.models",  # list archs and where each comes from
        "example-model": "aitk.cli.example_model",  # build a tiny random example model
        "audit": "aitk.cli.audit",  # audit a config, a dataset folder or an adapter file
        "caption": "aitk.cli.caption",  # caption a dataset's pictures with a VLM
    }
    if not args or args[0] in ("-h", "--help") or args[0] not in verbs:
        print("usage: python -m aitk {run,models,example-model,audit,caption} ...",
              file=sys.stderr)
        print("  run CONFIG [CONFIG ...] [--recover] [--name NAME] [--log FILE]", file=sys.stderr)
        print("  models                  list model archs and their source", file=sys.stderr)
        print("  example-model DIR       write a tiny random-initialised example model",
              file=sys.stderr)
        print("  audit config|dataset|adapter ...  check a job, a dataset or a LoRA file",
              file=sys.stderr)
        print("  caption DATASET_DIR     caption pictures that have none (a VLM)",
              file=sys.stderr)
        return 0 if args and args[0] in ("-h", "--help") else 2
    from aitk.cli import venv_check

    wrong_python = venv_check.check(["-m", "aitk"], args)
    if wrong_python is not None:
        return wrong_python
    import importlib

    return importlib.import_module(verbs[args[0]]).main(args[1:])


if __name__ == "__main__":
    sys.exit(main())
