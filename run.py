"""`python run.py CONFIG [CONFIG ...] [--recover] [--name NAME] [--log FILE]`

Runs aitk training jobs written in the upstream AI Toolkit YAML format. See
aitk/cli/run.py for the options and exit codes. Up to the environment check this file
imports only the standard library, so a Python without the trainer's packages gets one
line saying how to run it (exit 2), not a traceback.
"""

import sys

from aitk.cli import venv_check

if __name__ == "__main__":
    wrong_python = venv_check.check(["run.py"], sys.argv[1:])
    if wrong_python is not None:
        sys.exit(wrong_python)

    from aitk.cli.run import main

    sys.exit(main())
