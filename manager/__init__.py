"""aitk manager: installs, updates, checks and launches the toolkit.

Imports nothing but sys on purpose: `python3 -m manager` runs this package from a bare
Python before any dependency exists (see __main__.py).
"""

import sys as _sys

# `python -m manager` imports this package before __main__.py, which an old Python
# (2.7 on older systems) cannot even parse: say what is needed here, in syntax any
# Python reads. (The same line as manager.__main__.python_too_old.)
_MIN_PYTHON = (3, 10)
if _sys.version_info < _MIN_PYTHON:
    _sys.stderr.write("aitk: Python 3.10 or newer is required (this is {}.{}.{})\n".format(
        *_sys.version_info[:3]))
    raise SystemExit(1)

__version__ = "0.1.0"
