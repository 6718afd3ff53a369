"""`manager doctor` end to end against a temporary checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from manager.commands.doctor import all_probes
from manager.paths import Paths
from tests.manager.health.conftest import REPO, base_python

IDS = [
    "python", "venv", "spec", "torch", "torchvision", "torchaudio", "gpu", "requirements",
    "accelerators", "state", "migrations", "tool.uv", "tool.node", "tool.ffmpeg", "tool.git",
    "webui.build", "webui.port",
    "checkout", "disk", "env.pythonpath", "env.conda", "env.venv", "env.path", "env.secrets",
]


def test_healthy_checkout_is_all_ok(healthy, doctor_json):
    code, checks = doctor_json()
    assert list(checks) == IDS
    assert {i: c["status"] for i, c in checks.items() if c["status"] != "OK"} == {}
    assert code == 0
    assert checks["torch"]["detail"] == "torch 2.13.0+cpu (CPU build), as pinned"


def test_every_probe_declares_the_ids_it_reports(tmp_path):
    declared = [i for p in all_probes(Paths(tmp_path), {}) for i in p.ids]
    assert declared == IDS


def test_json_schema(healthy, run_cli):
    healthy.package("torchaudio", "raise ImportError('libsox.so: cannot open')\n")
    code, out, _ = run_cli("doctor", "--json")
    document = json.loads(out)
    assert set(document) == {"schema_version", "command", "ok", "exit_code", "data",
                             "messages", "error"}
    assert document["command"] == "doctor" and document["exit_code"] == code
    data = document["data"]
    assert set(data) == {"status", "counts", "checks"}
    for check in data["checks"]:
        assert set(check) == {"id", "status", "detail", "fix"}
        assert check["status"] in ("OK", "WARN", "FAIL")
        assert isinstance(check["detail"], str) and check["detail"]
        assert (check["fix"] is None) == (check["status"] == "OK")
    assert data["counts"] == {s: sum(c["status"] == s for c in data["checks"])
                              for s in ("OK", "WARN", "FAIL")}
    assert data["status"] == "WARN"


def test_broken_companion_warns_when_optional(healthy, doctor_json):
    healthy.package("torchvision", "raise ImportError('undefined symbol: _ZN3c10')\n")
    code, checks = doctor_json()
    assert checks["torchvision"]["status"] == "WARN"
    assert "undefined symbol" in checks["torchvision"]["detail"]
    assert checks["torchvision"]["fix"] == "python3 -m manager sync --verify"
    assert checks["torch"]["status"] == "OK"
    assert code == 0


def test_companion_at_the_wrong_version_fails_when_required(healthy, doctor_json, monkeypatch):
    import spec as spec_module

    make = spec_module.make_spec

    def required_companions(detection, *, cpu=False):
        made = make(detection, cpu=cpu)
        companions = tuple(type(c)(c.name, c.version, c.local, True, c.import_name)
                           for c in made.companions)
        return type(made)(**{**made.__dict__, "companions": companions})

    monkeypatch.setattr(spec_module, "make_spec", required_companions)
    healthy.stack(torchaudio="2.10.0+cpu")
    code, checks = doctor_json()
    assert checks["torchaudio"]["status"] == "FAIL"
    assert "2.10.0+cpu installed; the spec pins 2.11.0+cpu" in checks["torchaudio"]["detail"]
    assert code == 1


def test_torch_not_installed_points_at_install(healthy, doctor_json):
    import shutil

    from tests.manager.health.conftest import site_packages

    for name in ("torch", "torchvision"):
        shutil.rmtree(site_packages(healthy.venv) / name)
    code, checks = doctor_json()
    assert checks["torch"]["detail"] == "torch is not installed"
    assert checks["torch"]["status"] == "FAIL" and "install" in checks["torch"]["fix"]
    assert checks["torchvision"]["status"] == "WARN"
    assert checks["gpu"]["detail"] == "skipped: torch does not import"
    assert code == 1


def test_companion_the_last_sync_could_not_install(healthy, doctor_json):
    import shutil

    from tests.manager.health.conftest import site_packages

    shutil.rmtree(site_packages(healthy.venv) / "torchvision")
    healthy.state(companions={"torchvision": {
        "status": "install_failed", "version": "0.28.0+cpu",
        "detail": "there is no version of torchvision==0.28.0+cpu"}})
    code, checks = doctor_json()
    check = checks["torchvision"]
    assert check["status"] == "WARN"
    assert "could not be installed by the last sync" in check["detail"]
    assert "AITK_TORCH_INDEX_URL" in check["fix"] and check["fix"] != "python3 -m manager sync"
    assert code == 0


def test_torch_of_another_backend_fails(healthy, doctor_json):
    healthy.stack(torch="2.13.0+cu130")
    code, checks = doctor_json()
    assert checks["torch"]["status"] == "FAIL"
    assert "the spec pins 2.13.0+cpu" in checks["torch"]["detail"]
    assert code == 1


def test_missing_venv_fails_with_the_install_hint(healthy, doctor_json):
    import shutil

    shutil.rmtree(healthy.venv)
    code, checks = doctor_json()
    assert checks["venv"]["status"] == "FAIL"
    assert "install" in checks["venv"]["fix"]
    assert checks["torch"]["status"] == "WARN" and "no venv" in checks["torch"]["detail"]
    assert code == 1


def test_corrupt_state_fails_with_its_hint(healthy, doctor_json):
    (healthy.venv / "aitk_manager_state.json").write_text("{not json", encoding="utf-8")
    code, checks = doctor_json()
    assert checks["state"]["status"] == "FAIL"
    assert "corrupt" in checks["state"]["detail"]
    assert checks["migrations"]["status"] == "WARN"
    assert checks["requirements"]["detail"] == "skipped: the state file is unreadable"
    assert code == 1


def test_failed_accelerator_is_a_warning(healthy, doctor_json):
    healthy.state(optional={"flash-attn": {"status": "failed", "detail": "no wheel for sm_120"},
                            "triton": {"status": "ok"}})
    code, checks = doctor_json()
    assert checks["accelerators"]["status"] == "WARN"
    assert "flash-attn failed (no wheel for sm_120)" in checks["accelerators"]["detail"]
    assert "triton ok" in checks["accelerators"]["detail"]
    assert code == 0


def test_dirty_tree_warns(healthy, doctor_json):
    (healthy.root / "run.py").write_text("print('edited')\n", encoding="utf-8")
    code, checks = doctor_json()
    assert checks["checkout"]["status"] == "WARN"
    assert "run.py" in checks["checkout"]["detail"]
    assert "git stash" in checks["checkout"]["fix"]
    assert code == 0


def test_pythonpath_and_active_environments_warn(healthy, doctor_json, monkeypatch, tmp_path):
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("CONDA_DEFAULT_ENV", "base")
    monkeypatch.setenv("VIRTUAL_ENV", str(tmp_path / "other-venv"))
    code, checks = doctor_json()
    assert checks["env.pythonpath"]["status"] == "WARN"
    assert checks["env.pythonpath"]["fix"] == "unset PYTHONPATH"
    assert checks["env.conda"]["status"] == "WARN"
    assert checks["env.venv"]["status"] == "WARN"
    assert code == 0


def test_out_of_sync_lists_the_reasons(healthy, doctor_json, monkeypatch):
    from manager import envstatus

    monkeypatch.setattr(envstatus, "quick_status", lambda paths, cpu=None: envstatus.SyncStatus(
        False, ("requirements.txt changed", "torch is 2.12.0")))
    code, checks = doctor_json()
    assert checks["requirements"]["status"] == "WARN"
    assert checks["requirements"]["detail"] == (
        "out of sync: requirements.txt changed; torch is 2.12.0")
    assert code == 0


def test_a_probe_that_raises_becomes_a_line(healthy, doctor_json, monkeypatch):
    from manager import tools

    def broken(paths):
        raise RuntimeError("boom")

    monkeypatch.setattr(tools, "report_tools", broken)
    code, checks = doctor_json()
    for name in ("uv", "node", "ffmpeg", "git"):
        assert checks[f"tool.{name}"]["status"] == "WARN"
        assert checks[f"tool.{name}"]["detail"] == "could not check: RuntimeError: boom"
    assert code == 0


def test_secrets_never_appear(healthy, run_cli, monkeypatch):
    token = "hf_SuperSecretValue1234"
    monkeypatch.setenv("HF_TOKEN", token)
    monkeypatch.setenv("MY_SERVICE_PASSWORD", "pw-" + token)
    from manager import repo

    def leaky(root, fetch=False, timeout=20.0):  # e.g. a remote URL with credentials
        raise RuntimeError(f"cannot read https://bot:{token}@git.example/aitk.git")

    monkeypatch.setattr(repo, "status", leaky)
    outputs = [run_cli("doctor", "--json"), run_cli("doctor")]
    for _code, out, err in outputs:
        assert token not in out + err
    checks = {c["id"]: c for c in json.loads(outputs[0][1])["data"]["checks"]}
    secrets = checks["env.secrets"]["detail"]
    assert "HF_TOKEN set" in secrets and "MY_SERVICE_PASSWORD set" in secrets
    assert "AITK_AUTH unset" in secrets
    assert "https://***@git.example" in checks["checkout"]["detail"]


def test_contracts_as_they_are_never_crash(checkout):
    """Whatever the other parts return (or raise), doctor answers with every check.

    Runs through the bootstrap with a caller PYTHONPATH: doctor must see it although
    the bootstrap removes it before re-executing inside .venv."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(AITK_ROOT=str(checkout.root), PYTHONPATH=str(checkout.root / "elsewhere"),
               HF_TOKEN="hf_EndToEndSecret999")
    python = base_python() if (REPO / ".venv" / "aitk_bootstrap.txt").exists() else sys.executable
    done = subprocess.run([python, "-m", "manager", "doctor", "--json"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert "hf_EndToEndSecret999" not in done.stdout + done.stderr
    document = json.loads(done.stdout)
    checks = {c["id"]: c for c in document["data"]["checks"]}
    assert list(checks) == IDS
    assert done.returncode == document["exit_code"] == (
        1 if any(c["status"] == "FAIL" for c in checks.values()) else 0)
    if python != sys.executable:
        assert checks["env.pythonpath"]["status"] == "WARN"


def test_path_with_spaces_is_fine(tmp_path, venv_template):
    """Spaces work (install.sh and the launchers are tested in such a path): no warning.
    What does break is the PATH separator, which splits the tools' folders on PATH."""
    from manager.health.hazards import judge_path
    from tests.manager.health.conftest import make_checkout

    made = make_checkout(tmp_path / "my aitk", venv_template)
    assert judge_path(made.root).status.value == "OK"
    split = judge_path(tmp_path / "a:b", pathsep=":")
    assert split.status.value == "WARN" and "PATH" in split.detail
    # Moving the checkout alone leaves a venv whose scripts point at the old path.
    assert "delete its .venv" in split.fix
    assert judge_path(tmp_path / "caf\u00e9").status.value == "WARN"
    assert judge_path(tmp_path / "plain").status.value == "OK"


def test_a_path_separator_really_splits_the_tool_folders(tmp_path):
    """Why env.path warns about it: compose_env puts the checkout's folders on PATH."""
    from manager.tools import compose_env

    folder = tmp_path / "a:b" / ".node" / "bin"
    env = compose_env(("linux", "x86_64"), [folder], [], {"PATH": "/usr/bin"}, tmp_path)
    assert str(folder) not in env["PATH"].split(":")


def test_long_details_reach_json_whole_and_wrap_on_a_terminal():
    from rich.console import Console

    from manager.commands.doctor import render, summarize
    from manager.health.check import warn

    tail = "the-end-of-a-long-detail"
    detail = "word " * 80 + "/a/very/long/path/" + "x" * 120 + " " + tail
    data = summarize([warn("tool.ffmpeg", detail, "fix it")]).data
    assert data["checks"][0]["detail"] == " ".join(detail.split())  # nothing cut
    console = Console(width=60, record=True, no_color=True)
    render(console, data)
    shown = console.export_text()
    assert "…" not in shown
    assert tail in shown and "".join(shown.split()).count("x" * 120) == 1
