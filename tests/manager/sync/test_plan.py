"""plan.make_plan is pure: plain data in, steps out."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from manager.plan import Inputs, make_plan, requirements_hash
from manager.reqfiles import GitPin, ReqFile, parse_git_pin
from manager.state import State
from manager.venv import Dist, Observed
from spec import Optional_, Spec, Wheel

SPEC = Spec(
    backend="cpu", flavour="cpu", torch_index_url="https://example.invalid/whl/cpu",
    torch=Wheel("torch", "2.13.0", "cpu"),
    companions=(Wheel("torchvision", "0.28.0", "cpu", required=False),),
    requirements_file="requirements.txt",
    accelerators=(Optional_("fa", "fa==1", "fa"),
                  Optional_("nope", "nope==1", "nope", available=False, reason="no wheel")),
)
PIN = GitPin("gitpkg", "gitpkg @ git+https://x/gitpkg@abc1234", "abc1234")
REQ = ReqFile("requirements.txt", Path("requirements.txt"), "h1", (PIN,))


def _dist(name: str, version: str, rev: str | None = None) -> Dist:
    direct = {"vcs_info": {"vcs": "git", "requested_revision": rev}} if rev else None
    return Dist(name, version, Path(name), direct)


SYNCED_DISTS = {"torch": _dist("torch", "2.13.0+cpu"),
                "torchvision": _dist("torchvision", "0.28.0+cpu"),
                "gitpkg": _dist("gitpkg", "0.1.0", "abc1234"), "fa": _dist("fa", "1")}
SYNCED = State(
    spec_fingerprint=SPEC.install_fingerprint(), venv_fingerprint="fp",
    requirement_files={"requirements.txt": "h1"}, requirements_hash="x",
    git_pins={"gitpkg": "abc1234"},
    optional={"fa": {"status": "ok", "requirement": "fa==1"},
              "nope": {"status": "unavailable", "detail": "no wheel"}},
    tools={"uv": {"status": "ok"}},
)


def _inputs(**changes: object) -> Inputs:
    base = Inputs(spec=SPEC, observed=Observed(True, "3.11.7", SYNCED_DISTS, "fp"),
                  state=SYNCED, requirement_files=(REQ,), requirements_hash="x",
                  machine="x86_64")
    return dataclasses.replace(base, **changes)


def _kinds(**changes: object) -> list[str]:
    return list(make_plan(_inputs(**changes)).kinds())


def test_in_sync_is_an_empty_plan() -> None:
    assert make_plan(_inputs()).empty


def test_changed_manager_pins_rerun_the_requirements_pass() -> None:
    # The overall hash covers manager/requirements.txt (its pins constrain every pass).
    plan = make_plan(_inputs(requirements_hash="y"))
    assert list(plan.kinds()) == ["install-requirements", "verify"]
    assert "manager's pins" in plan.steps[0].describe()


def test_fresh_checkout_plans_everything_in_order() -> None:
    kinds = _kinds(observed=Observed(False), state=State())
    assert kinds == ["create-venv", "install-torch", "install-companion",
                     "install-requirements", "tools", "try-optional", "record-unavailable",
                     "verify"]


def test_torch_of_another_build_is_force_reinstalled() -> None:
    dists = {**SYNCED_DISTS, "torch": _dist("torch", "2.14.0")}
    plan = make_plan(_inputs(observed=Observed(True, "3.11.7", dists, "other")))
    torch = plan.steps[0]
    assert (torch.kind, torch.force) == ("install-torch", True)
    assert "2.14.0 installed, 2.13.0+cpu wanted" in torch.describe()
    assert "install-requirements" in plan.kinds()  # re-run under the restored pins


def test_changed_venv_is_reverified_not_trusted() -> None:
    plan = make_plan(_inputs(observed=Observed(True, "3.11.7", SYNCED_DISTS, "changed")))
    assert plan.kinds() == ("install-requirements", "verify")
    assert "packages changed since the last verified sync" in plan.steps[-1].reason


def test_corrupt_state_means_verify() -> None:
    plan = make_plan(_inputs(state=dataclasses.replace(SYNCED), state_problem="bad json"))
    assert "verify" in plan.kinds()
    assert any("unusable (bad json)" in r for r in plan.reasons())


def test_requirements_edit_and_moved_git_pin() -> None:
    moved = GitPin("gitpkg", "gitpkg @ git+https://x/gitpkg@def5678", "def5678")
    req = ReqFile("requirements.txt", Path("requirements.txt"), "h2", (moved,))
    plan = make_plan(_inputs(requirement_files=(req,)))
    assert plan.kinds() == ("install-requirements", "reinstall-git-pin", "verify")
    assert plan.steps[1].force and "installed at abc1234" in plan.steps[1].reason


def test_recorded_failures_are_not_retried_until_forced() -> None:
    dists = {k: v for k, v in SYNCED_DISTS.items() if k != "torchvision"}
    state = dataclasses.replace(SYNCED, companions={
        "torchvision": {"status": "removed", "version": "0.28.0+cpu"}})
    observed = Observed(True, "3.11.7", dists, "fp")
    assert make_plan(_inputs(observed=observed, state=state)).empty
    forced = make_plan(_inputs(observed=observed, state=state, force=True))
    assert "install-companion" in forced.kinds()


def test_wrong_python_or_architecture_rebuilds() -> None:
    spec = dataclasses.replace(SPEC, python="==3.12.*")
    assert _kinds(spec=spec)[0] == "rebuild-venv"
    state = dataclasses.replace(SYNCED, python={"machine": "x86_64"})
    assert _kinds(state=state, machine="aarch64")[0] == "rebuild-venv"
    assert make_plan(_inputs(state=state, machine="amd64")).empty


def test_pending_migrations_and_verify_flag() -> None:
    assert _kinds(pending_migrations=("0001",)) == ["migrate"]
    assert _kinds(verify=True) == ["verify"]


def test_requirements_hash_covers_spec_and_every_file() -> None:
    one = requirements_hash(SPEC, {"requirements.txt": "a", "dgx_requirements.txt": "b"})
    assert one != requirements_hash(SPEC, {"requirements.txt": "a", "dgx_requirements.txt": "c"})
    other = dataclasses.replace(SPEC, notes=("prose only",))
    assert one == requirements_hash(other, {"requirements.txt": "a",
                                            "dgx_requirements.txt": "b"})


def test_parse_git_pin() -> None:
    pin = parse_git_pin("Pkg_Name @ git+https://host/org/repo.git@v1.2 ; python_version>'3'")
    assert pin == GitPin("pkg-name", pin.line, "v1.2")
    assert parse_git_pin("pkg @ git+https://host/org/repo.git") is None  # not pinned
    assert parse_git_pin("pkg==1.0") is None
    assert parse_git_pin("pkg @ git+ssh://git@host/repo.git@abc") == GitPin(
        "pkg", "pkg @ git+ssh://git@host/repo.git@abc", "abc")


def test_a_skipped_tool_that_can_be_provisioned_now_reruns_the_tools_step() -> None:
    """FFmpeg was skipped (no verifiable pin); a new pin or the opt-in unblocks it."""
    plan = make_plan(_inputs(tools_unblocked=frozenset({"ffmpeg"})))
    assert list(plan.kinds()) == ["tools"]
    assert "ffmpeg can be provisioned now" in plan.steps[0].describe()
    assert make_plan(_inputs(tools=False, tools_unblocked=frozenset({"ffmpeg"}))).empty


def test_a_provisioned_tool_that_is_gone_reruns_the_tools_step() -> None:
    """`rm -rf .node` after a sync: the state still says node is there (issue 21)."""
    plan = make_plan(_inputs(tools_gone=frozenset({"node", "ffmpeg"})))
    assert list(plan.kinds()) == ["tools"]
    assert "ffmpeg, node provisioned before and gone now" in plan.steps[0].describe()
    assert make_plan(_inputs(tools=False, tools_gone=frozenset({"node"}))).empty
