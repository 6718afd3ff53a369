"""`python run.py CONFIG [CONFIG ...] [--recover] [--name NAME] [--log FILE]`

Runs aitk training jobs written in the upstream AI Toolkit YAML format. See
aitk/cli_run.py for the options and exit codes.
"""

import sys

from aitk.cli_run import main

if __name__ == "__main__":
    sys.exit(main())
