"""The trainer's command lines: `python run.py` and `python -m aitk VERB`.

    run.py            `python run.py CONFIG ...` / `python -m aitk run`: load, preflight,
                      run each job (aitk.run), map its outcome to the exit code
    models.py         `python -m aitk models`: the archs and where each comes from
    example_model.py  `python -m aitk example-model DIR`: build the tiny example model
    audit.py          `python -m aitk audit config|dataset|adapter`
    venv_check.py     stdlib only: is this Python the one the trainer runs in?

Importing this package imports nothing, so `run.py` can check its interpreter first.
"""
