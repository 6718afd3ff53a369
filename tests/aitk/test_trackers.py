"""Trackers beside the loss log (aitk.run.trackers): wandb (a fake module: no network, no
service process) and TensorBoard event files (tensorboardX, read back); a missing
package is one warning line; the config keys load without a warning."""

from __future__ import annotations

import io
import struct
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from aitk.run.metrics import Metrics
from aitk.run.trackers import Trackers, open_trackers, wandb_mode
from tests.aitk.test_config import example_raw, parse, problems, proc


class FakeRun:
    def __init__(self, dir: str) -> None:  # noqa: A002 - wandb's name
        self.dir = str(Path(dir) / "wandb" / "offline-run-1" / "files")
        self.logged: list[tuple[int, dict]] = []
        self.finished = False

    def log(self, values: dict, step: int) -> None:
        self.logged.append((step, values))

    def finish(self) -> None:
        self.finished = True


def fake_wandb() -> types.ModuleType:
    module = types.ModuleType("wandb")
    module.runs = []  # type: ignore[attr-defined]

    def init(**kwargs):
        run = FakeRun(kwargs["dir"])
        run.kwargs = kwargs  # type: ignore[attr-defined]
        module.runs.append(run)  # type: ignore[attr-defined]
        return run

    module.init = init  # type: ignore[attr-defined]
    return module


def logging_cfg(**kw) -> SimpleNamespace:
    return SimpleNamespace(**{"use_wandb": True, "project_name": "ai-toolkit",
                              "run_name": None, **kw})


@pytest.fixture
def no_wandb_login(monkeypatch, tmp_path: Path) -> None:
    for key in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.setenv(key, "")  # so the mode an offline run sets is undone after
        monkeypatch.delenv(key)
    (tmp_path / "netrc").write_text("")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))


def test_wandb_is_offline_without_a_key_and_the_users_mode_wins(no_wandb_login, tmp_path):
    assert wandb_mode() == "offline"
    assert wandb_mode({"WANDB_API_KEY": "k"}) == "online"
    assert wandb_mode({"WANDB_API_KEY": "k", "WANDB_MODE": "disabled"}) == "disabled"
    (tmp_path / "netrc").write_text("machine api.wandb.ai login user password k\n")
    assert wandb_mode({"NETRC": str(tmp_path / "netrc")}) == "online"


def test_wandb_gets_the_loss_logs_entries(no_wandb_login, monkeypatch, tmp_path: Path):
    wandb = fake_wandb()
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    lines: list[str] = []
    warnings: list[str] = []
    trackers = open_trackers(logging_cfg(), None, "my_lora", tmp_path / "out",
                             {"job": "extension"}, lines.append, warnings.append)
    [run] = wandb.runs
    assert run.kwargs["mode"] == "offline" and run.kwargs["name"] == "my_lora"
    assert run.kwargs["project"] == "ai-toolkit" and run.kwargs["config"] == {
        "job": "extension"}
    where = tmp_path / "out" / "wandb" / "offline-run-1"
    assert lines == [f"wandb: offline run in {where}; upload it with `wandb sync {where}`"]
    metrics = Metrics(tmp_path / "out" / "loss_log.jsonl", 10, 0, "my_lora",
                      stream=io.StringIO(), trackers=trackers)
    metrics.log(1, 0.5, 1e-4)
    metrics.record({"step": 1, "val_loss": 0.25, "time": 1.0})
    metrics.close()
    assert run.logged == [(1, {"loss": 0.5, "lr": 1e-4}), (1, {"val_loss": 0.25})]
    assert run.finished and not warnings


def test_a_missing_package_is_one_warning_and_the_run_goes_on(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    monkeypatch.setitem(sys.modules, "tensorboardX", None)
    warnings: list[str] = []
    trackers = open_trackers(logging_cfg(), str(tmp_path / "tb"), "x", tmp_path,
                             {}, print, warnings.append)
    assert trackers.members == [] and len(warnings) == 2
    assert warnings[0].startswith("logging.use_wandb: the wandb package is not installed")
    assert warnings[1].startswith("log_dir: the tensorboardX package is not installed")
    trackers.scalars(1, {"loss": 1.0})  # nothing to feed: no error


def test_a_failing_tracker_is_dropped_with_one_warning():
    class Broken:
        name = "wandb"

        def scalars(self, step, values):
            raise RuntimeError("socket closed")

        def close(self):
            pass

    warnings: list[str] = []
    trackers = Trackers([Broken()], warnings.append)
    trackers.scalars(1, {"loss": 1.0})
    trackers.scalars(2, {"loss": 1.0})
    assert trackers.members == [] and len(warnings) == 1 and "socket closed" in warnings[0]


def read_scalars(folder: Path) -> list[tuple[str, int, float]]:
    """The scalars of TensorBoard event files (TFRecord framing: length, crc, data, crc)."""
    from tensorboardX.proto import event_pb2

    found = []
    for path in sorted(folder.rglob("events.out.tfevents.*")):
        data = path.read_bytes()
        at = 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at:at + 8])
            event = event_pb2.Event.FromString(data[at + 12:at + 12 + length])
            at += 12 + length + 4
            found += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
    return found


def test_tensorboard_event_files_hold_loss_lr_and_val_loss(monkeypatch, tmp_path: Path):
    monkeypatch.setitem(sys.modules, "wandb", None)
    lines: list[str] = []
    trackers = open_trackers(logging_cfg(use_wandb=False), str(tmp_path / "tb dir"),
                             "my_lora", tmp_path / "out", {}, lines.append, print)
    [folder] = (tmp_path / "tb dir").iterdir()
    assert folder.name.startswith("my_lora_") and lines == [
        f"TensorBoard: event files in {folder}"]
    metrics = Metrics(None, 10, 0, "my_lora", stream=io.StringIO(), trackers=trackers)
    metrics.log(1, 0.5, 1e-4)
    metrics.log(2, 0.25, 5e-5)
    metrics.record({"step": 2, "val_loss": 0.125, "time": 1.0})
    metrics.close()
    assert read_scalars(folder) == [("loss", 1, 0.5), ("lr", 1, pytest.approx(1e-4)),
                                    ("loss", 2, 0.25), ("lr", 2, pytest.approx(5e-5)),
                                    ("val_loss", 2, 0.125)]


def test_the_logging_keys_and_log_dir_load_without_a_warning():
    raw = example_raw()
    proc(raw)["logging"] = {"use_wandb": True, "project_name": "p", "run_name": "r",
                            "log_every": 10, "use_ui_logger": True, "verbose": True}
    proc(raw)["log_dir"] = "tb"
    raw["config"]["log_dir"] = "tb2"
    loaded = parse(raw)
    assert loaded.warnings == []
    p = loaded.job.config.process[0]
    assert p.logging.use_wandb and p.logging.run_name == "r" and p.log_dir == "tb"
    assert loaded.job.config.log_dir == "tb2"


def test_push_to_hub_without_a_repo_is_a_config_error():
    raw = example_raw()
    proc(raw)["save"]["push_to_hub"] = True
    assert problems(raw) == ["config.process[0].save: push_to_hub needs hf_repo_id (the "
                             "repo to upload to, e.g. your-name/my-lora)"]
    proc(raw)["save"].update({"hf_repo_id": "me/lora", "hf_private": True})
    assert parse(raw).warnings == []


@pytest.mark.slow  # the real package starts its wandb-core service (~20 s)
def test_the_real_wandb_offline_writes_a_run_to_sync_later(no_wandb_login, tmp_path):
    pytest.importorskip("wandb")
    lines: list[str] = []
    trackers = open_trackers(logging_cfg(), None, "my_lora", tmp_path / "out", {"a": 1},
                             lines.append, pytest.fail)
    trackers.scalars(1, {"loss": 0.5, "lr": 1e-4})
    trackers.close()
    [line] = lines  # wandb's own banner is silenced
    # ... and its analytics stay off too: an offline run reaches no server
    # (tests/network_guard.py caught their thread posting to wandb's).
    from wandb.analytics.opentelemetry.opentelemetry_proxy import get_open_telemetry_proxy

    assert get_open_telemetry_proxy() is None
    [run] = (tmp_path / "out" / "wandb").glob("offline-run-*")
    assert line == f"wandb: offline run in {run}; upload it with `wandb sync {run}`"
    assert list(run.glob("run-*.wandb"))
