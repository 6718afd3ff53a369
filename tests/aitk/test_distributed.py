"""Data-parallel training through torchrun on this CPU (gloo): two processes train
exactly what one process with the same global batch trains, a SIGTERM to one rank
stops both at one step with one valid checkpoint, a 2-process run resumes in one
process at the right step, and two "machines" meet through c10d on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from aitk.cli.run import main as cli_main
from aitk.cli.run import strip_rank_flags
from aitk.errors import LaunchError
from aitk.run import checkpoint as ckpt
from aitk.run import torchrun
from tests.aitk.aitk_testing import REPO, job_config, write_config
from tests.aitk.test_job_signals import PAUSED_RUN, wait_for

STEPS = 4


def config(tmp: Path, model_dir: Path, folder: str, accumulation: int) -> Path:
    cfg = job_config("dp", tmp / folder, model_dir, steps=STEPS,
                     save={"save_every": 2, "max_step_saves_to_keep": 4, "dtype": "float32"},
                     train={"batch_size": 1, "gradient_accumulation": accumulation,
                            "steps": STEPS, "lr": 2e-3, "seed": 7,
                            "cache_text_embeddings": True, "disable_sampling": True})
    return write_config(tmp / f"{folder}.yml", cfg)


def lora(tmp: Path, folder: str) -> dict[str, torch.Tensor]:
    return load_file(tmp / folder / "dp" / "dp.safetensors")


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PYTHONUNBUFFERED": "1", **env})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, example_model_dir: Path) -> dict[str, torch.Tensor]:
    """One process, accumulation 2: the same global batch as 2 ranks x accumulation 1."""
    tmp = tmp_path_factory.mktemp("dp-ref")
    assert cli_main([str(config(tmp, example_model_dir, "one", accumulation=2))]) == 0
    return lora(tmp, "one")


@pytest.mark.slow
def test_two_processes_train_what_one_process_trains(tmp_path: Path,
                                                     example_model_dir: Path, reference):
    path = config(tmp_path, example_model_dir, "two", accumulation=1)
    done = run([str(REPO / "run.py"), str(path), "--gpus", "2"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "starting torchrun with 2 CPU processes" in done.stderr
    assert max_diff(lora(tmp_path, "two"), reference) <= 1e-5
    log = (tmp_path / "two" / "dp" / "loss_log.jsonl").read_text().splitlines()
    assert len(log) == STEPS  # rank 0 alone writes, one line per step


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_both_then_one_process_resumes(
        tmp_path: Path, example_model_dir: Path, reference, capsys):
    path = config(tmp_path, example_model_dir, "two", accumulation=1)
    markers = tmp_path / "markers"
    markers.mkdir()
    # Rank 1 pauses in its 3rd loss computation (step 3) until the signal arrives.
    launcher = ("import sys; from aitk.run import torchrun; sys.exit(torchrun.launch("
                "sys.argv[1:], 2, 0))")
    proc = subprocess.Popen(
        [sys.executable, "-c", launcher, "--standalone", "--nproc-per-node", "2",
         str(PAUSED_RUN), str(path)], cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "AITK_TEST_MARKERS": str(markers),
             "PYTHONPATH": str(REPO),
             "AITK_TEST_PAUSE_CALL": "3", "AITK_TEST_PAUSE_RANK": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for("step", tmp_path, proc)
    os.kill(int((markers / "step").read_text()), signal.SIGTERM)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 130 and "Traceback" not in output, output
    root = tmp_path / "two" / "dp" / "checkpoints"
    found = ckpt.find_resumable(root, report=pytest.fail)
    assert found is not None and found.step == 3, output  # both stopped after step 3
    assert sorted(p.name for p in root.iterdir()) == ["step_000000002", "step_000000003"]

    # Resume the 2-process run in one process: accumulation 2 keeps the global batch.
    one = config(tmp_path, example_model_dir, "two", accumulation=2)
    capsys.readouterr()
    assert cli_main([str(one)]) == 0
    assert "resuming dp from step 3" in capsys.readouterr().err
    assert max_diff(lora(tmp_path, "two"), reference) <= 1e-5


@pytest.mark.slow
def test_a_rank_killed_outright_leaves_its_peer_one_line_not_a_gloo_traceback(
        tmp_path: Path, example_model_dir: Path):
    """kill -9 of one rank mid-step: the other, waiting in a collective for it, says in
    one line that a peer is gone; the checkpoints already saved stay valid."""
    path = config(tmp_path, example_model_dir, "two", accumulation=1)
    markers = tmp_path / "markers"
    markers.mkdir()
    launcher = ("import sys; from aitk.run import torchrun; sys.exit(torchrun.launch("
                "sys.argv[1:], 2, 0))")
    proc = subprocess.Popen(
        [sys.executable, "-c", launcher, "--standalone", "--nproc-per-node", "2",
         str(PAUSED_RUN), str(path)], cwd=tmp_path,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "AITK_TEST_MARKERS": str(markers),
             "PYTHONPATH": str(REPO),
             "AITK_TEST_PAUSE_CALL": "3", "AITK_TEST_PAUSE_RANK": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for("step", tmp_path, proc)
    os.kill(int((markers / "step").read_text()), signal.SIGKILL)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode not in (0, 130), output
    assert "Traceback" not in output and "Connection closed" not in output, output
    assert "error: another training process of this run ended unexpectedly, so rank 0 " \
        "of 2 stopped too; the last saved checkpoint is kept" in output, output
    assert "error: a training process failed" in output, output
    root = tmp_path / "two" / "dp" / "checkpoints"
    found = ckpt.find_resumable(root, report=pytest.fail)
    assert found is not None and found.step == 2, output


@pytest.mark.slow
def test_two_machines_meet_through_c10d_on_loopback(tmp_path: Path, example_model_dir: Path,
                                                    reference):
    path = config(tmp_path, example_model_dir, "nodes", accumulation=1)
    port = str(free_port())
    node = [str(REPO / "run.py"), str(path), "--gpus", "1", "--nnodes", "2",
            "--master-addr", "127.0.0.1", "--master-port", port]
    procs = [subprocess.Popen([sys.executable, *node, "--node-rank", str(rank)],
                              cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
             for rank in (0, 1)]
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert max_diff(lora(tmp_path, "nodes"), reference) <= 1e-5


def test_torchrun_command_line_decisions():
    script = Path("run.py")
    one_node = torchrun.torchrun_args(torchrun.RankRequest(gpus=4), script, ["c.yml"],
                                      cuda_gpus=8)
    assert one_node == ["--nproc-per-node", "4", "--shutdown-timeout", "600",
                        "--standalone", "run.py", "c.yml"]
    nodes = torchrun.torchrun_args(
        torchrun.RankRequest(gpus=2, nnodes=2, node_rank=1, master_addr="10.0.0.5",
                             master_port=1234), script, ["c.yml"], cuda_gpus=2)
    assert nodes[4:] == ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                         "10.0.0.5:1234", "--rdzv-id", "aitk", "--node-rank", "1",
                         "run.py", "c.yml"]
    with pytest.raises(LaunchError, match="this machine has 2"):
        torchrun.torchrun_args(torchrun.RankRequest(gpus=4), script, [], cuda_gpus=2)
    with pytest.raises(LaunchError, match="needs --master-addr"):
        torchrun.torchrun_args(torchrun.RankRequest(nnodes=2), script, [], 0)
    assert torchrun.failure_code([130, 130]) == 130
    assert torchrun.failure_code([130, -15]) == 130  # the agent ended the late rank
    assert torchrun.failure_code([2, 130]) == 2
    assert torchrun.failure_code([-9, -9]) == 137
    assert strip_rank_flags(["a.yml", "--gpus", "2", "--nnodes=2", "--recover"]) == \
        ["a.yml", "--recover"]


def test_more_gpus_than_present_is_one_line_exit_2(tmp_path: Path, example_model_dir: Path,
                                                   monkeypatch, capsys):
    monkeypatch.setattr(torchrun, "cuda_gpu_count", lambda: 1)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    path = config(tmp_path, example_model_dir, "x", accumulation=1)
    assert cli_main([str(path), "--gpus", "3"]) == 2
    assert capsys.readouterr().err.strip() == \
        "error: 3 GPUs asked for, but this machine has 1; use --gpus 1 or fewer"


def test_config_gpus_is_read_without_validating(tmp_path: Path, example_model_dir: Path):
    cfg = job_config("g", tmp_path, example_model_dir, gpus=3)
    path = write_config(tmp_path / "g.yml", cfg)
    assert torchrun.config_gpus([str(path), str(tmp_path / "missing.yml")]) == 3
