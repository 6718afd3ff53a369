"""`manager doctor`'s checks, one module per group.

    check.py        Check/Status, running probes in isolation with a timeout, redaction
    interpreter.py  the Python running the manager, the venv and its Python
    torchstack.py   spec, torch + companions in the venv, GPU visible to torch
    venv_probe.py   stdlib-only script the venv's Python runs to report its torch stack
    install.py      requirements in sync, state file, migrations, optional accelerators
    tooling.py      uv, node, ffmpeg, git: which copy and its version
    checkout.py     the git checkout and free disk where models and outputs go
    hazards.py      environment hazards and secrets (shown as set/unset only)
    secrets.py      which variables hold secrets; scrubbing their values from output

Each group has pure `judge_*` functions over plain data and a thin `probe` that gathers
the data. A probe never crashes doctor: check.run_probes turns an exception or a
timeout into a "could not check" line for every id the probe owns.
"""
