"""aitk manager: installs, updates, checks and launches the toolkit.

Imports nothing on purpose: `python3 -m manager` runs this package from a bare Python
before any dependency exists (see __main__.py).
"""

__version__ = "0.1.0"
