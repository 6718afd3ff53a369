"""`python run.py` / `python -m aitk run`: several configs, --recover, --log, --name."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from aitk.cli.run import main
from tests.aitk.aitk_testing import REPO, job_config, write_config


def configs(tmp_path: Path, model_dir: Path) -> tuple[Path, Path]:
    bad = job_config("bad", tmp_path / "out", model_dir)
    bad["config"]["process"][0]["train"]["stepz"] = 2
    good = job_config("[name]", tmp_path / "out", model_dir, steps=2,
                      sample={"sample_every": 100}, save={"save_every": 100})
    return write_config(tmp_path / "bad.yml", bad), write_config(tmp_path / "good.yml", good)


@pytest.mark.slow
def test_a_failure_stops_the_list_unless_recover(tmp_path: Path, example_model_dir: Path,
                                                 capsys):
    bad, good = configs(tmp_path, example_model_dir)
    assert main([str(bad), str(good), "--name", "named"]) == 2
    assert not (tmp_path / "out" / "named").exists()
    assert "unknown key (did you mean 'steps'?)" in capsys.readouterr().err

    log = tmp_path / "logs" / "run.log"
    assert main([str(bad), str(good), "--recover", "--name", "named", "--log", str(log)]) == 2
    assert (tmp_path / "out" / "named" / "named.safetensors").exists()  # [name] -> --name
    text = log.read_text()
    assert "unknown key" in text and "saved named.safetensors" in text


def test_usage_errors_exit_2_and_help_exits_0(capsys):
    assert main([]) == 2
    assert main(["--help"]) == 0
    assert "usage: python run.py" in capsys.readouterr().out


@pytest.mark.slow
def test_python_m_aitk_run_is_the_same_entry(tmp_path: Path):
    done = subprocess.run([sys.executable, "-m", "aitk", "run", str(tmp_path / "nope.yml")],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.strip().endswith("no such config file (looked for it as a path and "
                                        "under config/, with and without .yml/.yaml/.json)")
