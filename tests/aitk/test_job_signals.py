"""Ctrl+C on a real `python run.py` process: the step finishes, a checkpoint is saved,
exit 130; resuming gives exactly the weights of an uninterrupted run. A second Ctrl+C
stops at once and still corrupts nothing.

The interrupted runs pause at a known point until the signal has arrived
(paused_run.py), so the tests hold on a loaded machine: no race with the run's speed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from aitk.cli.run import main as cli_main
from aitk.run import checkpoint as ckpt
from tests.aitk.aitk_testing import REPO, job_config, write_config

STEPS = 12
# Everything random in a step: caption dropout, LoRA dropout (global RNG), noise and
# timesteps, the data order across epochs, accumulation, and previews in between.
OVERRIDES = dict(
    network={"type": "lora", "linear": 4, "linear_alpha": 4, "dropout": 0.1},
    datasets=[{"folder_path": str(REPO / "datasets" / "example"), "resolution": [32, 48],
               "caption_dropout_rate": 0.3, "cache_latents_to_disk": True}],
    train={"gradient_accumulation": 2, "lr_scheduler": "cosine",
           "lr_scheduler_params": {"warmup_steps": 3}},
    save={"save_every": 5, "max_step_saves_to_keep": 2},
    sample={"sample_every": 4},
)


def config(tmp_path: Path, model_dir: Path, name: str) -> Path:
    cfg = job_config(name, tmp_path / "out", model_dir, steps=STEPS, **OVERRIDES)
    return write_config(tmp_path / f"{name}.yml", cfg)


PAUSED_RUN = Path(__file__).with_name("paused_run.py")


def start(path: Path, tmp_path: Path, **pauses: str) -> subprocess.Popen:
    """run.py in a real process that waits at a known point for the test's signal
    (see paused_run.py), so where the signal lands never depends on timing."""
    markers = tmp_path / "markers"
    markers.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "AITK_TEST_MARKERS": str(markers),
           **{f"AITK_TEST_PAUSE_{k.upper()}": v for k, v in pauses.items()}}
    return subprocess.Popen([sys.executable, str(PAUSED_RUN), str(path)], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def wait_for(marker: str, tmp_path: Path, proc: subprocess.Popen,
             timeout: float = 600) -> None:
    """Until the run reaches `marker` (a generous limit only against a hung run)."""
    deadline = time.monotonic() + timeout
    while not (tmp_path / "markers" / marker).exists():
        if proc.poll() is not None:
            pytest.fail(f"run ended before {marker!r} ({proc.returncode}):\n"
                        f"{proc.stdout.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"run never reached {marker!r}")
        time.sleep(0.01)


def resume(path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Run the config again, in this process (the stop was the real-process part);
    returns its "resuming ..." line."""
    capsys.readouterr()
    assert cli_main([str(path)]) == 0
    err = capsys.readouterr().err
    return next((line.split(" (")[0] for line in err.splitlines()
                 if line.startswith("resuming")), err)


def weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(path)


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def straight(tmp_path_factory, example_model_dir: Path) -> dict[str, torch.Tensor]:
    """The uninterrupted run (in this process: only the stopped runs need their own)."""
    tmp = tmp_path_factory.mktemp("straight")
    assert cli_main([str(config(tmp, example_model_dir, "run"))]) == 0
    return weights(tmp / "out" / "run" / "run.safetensors")


@pytest.mark.slow
def test_ctrl_c_saves_at_a_step_boundary_and_resume_is_exact(tmp_path: Path,
                                                             example_model_dir: Path,
                                                             straight, capsys):
    path = config(tmp_path, example_model_dir, "run")
    out = tmp_path / "out" / "run"
    # Loss computation 5 is the first micro-step of step 3 (2 micro-steps per step):
    # Ctrl+C lands mid-step, which must finish (backward, second micro-step, optimizer).
    proc = start(path, tmp_path, call="5")
    wait_for("step", tmp_path, proc)
    running = json.loads((REPO / ".aitk-run" / f"{proc.pid}.json").read_text())
    assert running["pid"] == proc.pid and running["name"] == "run"
    assert running["config"] == str(path)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 130, output
    assert "stopping after this step" in output and "Traceback" not in output
    assert not (REPO / ".aitk-run" / f"{proc.pid}.json").exists()

    assert len((out / "loss_log.jsonl").read_text().splitlines()) == 3
    saved = ckpt.find_resumable(out / "checkpoints", report=pytest.fail)
    assert saved is not None and saved.step == 3  # nothing lost, nothing re-run
    assert (out / "run_000000003.safetensors").exists()

    assert resume(path, capsys) == "resuming run from step 3"
    assert max_diff(weights(out / "run.safetensors"), straight) <= 1e-6
    steps = [json.loads(x)["step"] for x in (out / "loss_log.jsonl").read_text().splitlines()]
    assert steps == list(range(1, STEPS + 1))


@pytest.mark.slow
def test_second_ctrl_c_stops_at_once_without_corrupting(tmp_path: Path,
                                                        example_model_dir: Path, straight,
                                                        capsys):
    path = config(tmp_path, example_model_dir, "run")
    out = tmp_path / "out" / "run"
    # First Ctrl+C mid-step 7 (step 5 is already saved); the second one arrives while
    # the step-7 checkpoint is half written.
    proc = start(path, tmp_path, call="13", save="1")
    wait_for("step", tmp_path, proc)
    proc.send_signal(signal.SIGINT)
    wait_for("save", tmp_path, proc)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 130, output
    assert "Traceback" not in output
    # The cut save left nothing behind; the previous checkpoint is whole.
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_000000005"]
    ckpt.validate(out / "checkpoints" / "step_000000005")
    assert not (out / "run_000000007.safetensors").exists()

    assert resume(path, capsys) == "resuming run from step 5"
    assert max_diff(weights(out / "run.safetensors"), straight) <= 1e-6


@pytest.fixture(scope="module")
def paused(tmp_path_factory, example_model_dir: Path) -> Iterator[SimpleNamespace]:
    """One run paused mid-step 3, shared by the tests below that check independent
    things while it waits (another trainer is refused) and when it stops (SIGHUP saves):
    one trainer process instead of two. Whichever test runs alone gets its own."""
    tmp = tmp_path_factory.mktemp("paused")
    path = config(tmp, example_model_dir, "run")
    proc = start(path, tmp, call="5")  # mid-step 3, as in the Ctrl+C test
    wait_for("step", tmp, proc)
    yield SimpleNamespace(path=path, out=tmp / "out" / "run", proc=proc)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=600)


@pytest.mark.slow
def test_a_second_trainer_on_the_same_output_folder_exits_2_naming_the_first(paused, capsys):
    lines_before = (paused.out / "loss_log.jsonl").read_text()
    capsys.readouterr()
    # The second trainer runs in this process: a process of its own, as the lock needs.
    assert cli_main([str(paused.path)]) == 2
    err = capsys.readouterr().err
    assert f"error: output folder {paused.out} is in use by another trainer (pid " \
           f"{paused.proc.pid}, started 20" in err
    assert "Traceback" not in err
    assert (paused.out / "loss_log.jsonl").read_text() == lines_before  # it trained nothing
    assert paused.proc.poll() is None  # the first one is untouched


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP on this platform")
def test_closing_the_terminal_sighup_saves_like_ctrl_c(paused):
    proc, out = paused.proc, paused.out
    proc.send_signal(signal.SIGHUP)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 130, output
    assert "SIGHUP: stopping after this step" in output and "Traceback" not in output
    saved = ckpt.find_resumable(out / "checkpoints", report=pytest.fail)
    assert saved is not None and saved.step == 3
    assert (out / "run_000000003.safetensors").exists()
    assert not (out / ".aitk.lock.json").exists()  # the holder note goes with the holder


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="no SIGHUP on this platform")
def test_sighup_after_the_console_is_gone_still_saves(tmp_path: Path,
                                                      example_model_dir: Path):
    """The launcher's terminal closed: SIGHUP arrives and nothing reads the output any
    more (writes fail with EPIPE/EIO). The save must not depend on being heard."""
    path = config(tmp_path, example_model_dir, "run")
    out = tmp_path / "out" / "run"
    proc = start(path, tmp_path, call="5")
    wait_for("step", tmp_path, proc)
    proc.stdout.close()  # the reading end: every later write of the run fails
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=600) == 130
    saved = ckpt.find_resumable(out / "checkpoints", report=pytest.fail)
    assert saved is not None and saved.step == 3
    assert (out / "run_000000003.safetensors").exists()


STOP_SIGNALS = [s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None),
                            getattr(signal, "SIGBREAK", None)) if s is not None]


@pytest.mark.parametrize("signum", STOP_SIGNALS)
def test_sigint_and_sigterm_request_a_stop_then_stop_at_once(signum: int):
    from aitk.run.signals import StopFlag

    said: list[str] = []
    before = signal.getsignal(signum)
    with StopFlag(say=said.append).installed() as stop:
        os.kill(os.getpid(), signum)
        assert stop.requested and said and "stopping after this step" in said[0]
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signum)
            time.sleep(5)  # the handler raises here at the latest; never waits this long
    assert signal.getsignal(signum) is before  # handlers restored after the job


# Windows' `signal` module has SIGBREAK (21) and no SIGHUP; its values, as plain data.
WINDOWS_SIGNALS = SimpleNamespace(SIGINT=2, SIGTERM=15, SIGBREAK=21, SIGABRT=22)
LINUX_SIGNALS = SimpleNamespace(SIGINT=2, SIGTERM=15, SIGHUP=1, SIGABRT=6)


def test_on_windows_ctrl_break_is_a_stop_that_saves_like_ctrl_c():
    """Issue 14: the launcher and the web UI stop a trainer on Windows with
    CTRL_BREAK_EVENT, which reaches it as SIGBREAK: that must be a stop-and-save signal
    there (the decision, tested on Linux; the handler is the same for every one)."""
    from aitk.run.signals import stop_signals

    assert stop_signals(WINDOWS_SIGNALS) == (2, 15, 21)
    assert stop_signals(LINUX_SIGNALS) == (2, 15, 1)
    assert set(stop_signals()) >= {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
