"""The verbs' edges: the spec refusing the machine, `test` falling back to CPU,
`install --no-launch`, and Options.to_argv for `update`."""

from __future__ import annotations

import json

import pytest

import spec as spec_module
from manager import errors, specsource
from manager.commands import install, sync
from manager.commands import test as test_cmd
from manager.commands.test import PARALLEL
from tests.manager.sync.conftest import Checkout, make_spec


def test_spec_refusal_is_unsupported_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(detection: object, *, cpu: bool = False) -> object:
        raise spec_module.SpecRefused("no supported GPU found")

    class Probe:
        def to_dict(self) -> dict:
            return {}

    monkeypatch.delenv("AITK_SPEC_FILE", raising=False)
    monkeypatch.setattr(spec_module, "make_spec", refuse)
    monkeypatch.setattr("manager.detect.probe", lambda: Probe())
    with pytest.raises(errors.UnsupportedMachine) as caught:
        specsource.current_spec(cpu=False)
    assert caught.value.exit_code == 3 and "--cpu" in (caught.value.hint or "")


def test_manager_test_uses_the_cpu_build_without_a_gpu(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: object) -> None:
    asked: list[bool] = []

    def current_spec(cpu: bool | None) -> object:
        asked.append(bool(cpu))
        raise errors.UnsupportedMachine("no GPU")

    monkeypatch.setenv("AITK_ROOT", str(tmp_path))
    monkeypatch.setattr(test_cmd, "current_spec", current_spec)
    assert test_cmd._needs_cpu(False) is True and asked == [False]
    assert test_cmd._needs_cpu(True) is True


def test_options_round_trip_to_argv() -> None:
    options = sync.Options(cpu=True, force=True, verify=True)
    assert options.to_argv() == ["--cpu", "--force", "--verify"]
    assert install.Options(sync=options, launch=False).to_argv()[-1] == "--no-launch"


def test_install_no_launch_dry_run(uv_checkout: Checkout) -> None:
    done = uv_checkout.manager("install", "--no-launch", "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    envelope = json.loads(done.stdout)
    assert envelope["command"] == "install" and envelope["data"]["plan"]
    assert not uv_checkout.venv.exists()


def test_manager_test_passes_pytests_exit_code_through(uv_checkout: Checkout) -> None:
    checkout = uv_checkout
    checkout.write_spec(make_spec(checkout.world, companions=(), accelerators=()))
    (checkout.root / "requirements-test.txt").write_text("pytest==0.0.1\n")
    for code in ("0", "1", "5"):  # 5: pytest collected nothing; not turned into success
        done = checkout.manager("test", code)
        assert done.returncode == int(code), done.stderr
        # after the workers' arguments (manager test runs on every core)
        assert f"stand-in pytest {[*PARALLEL, code]}" in done.stdout


def test_manager_test_fails_loudly_when_the_environment_cannot_be_set_up(
        uv_checkout: Checkout) -> None:
    checkout = uv_checkout
    checkout.write_spec(make_spec(checkout.world, companions=(), accelerators=()))
    (checkout.root / "requirements-test.txt").write_text("pytest==0.0.1\n")
    checkout.requirements("does-not-exist-anywhere==1.0")
    done = checkout.manager("test", "0")
    assert done.returncode == 1
    assert "installing requirements.txt failed" in done.stderr
    assert "stand-in pytest" not in done.stdout  # the tests never ran on a broken venv
